"""Test-wide settings: hypothesis profiles.

`ci` (chosen when the CI environment variable is set): derandomized, so a CI run is
reproducible; no deadline, because a shared machine has noisy timings. `dev` (default):
random examples, also without deadlines (Numba compiles on the first call of each op).
Choose another with HYPOTHESIS_PROFILE=name.

CUDA: the kernels run in Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1, set here before
anything imports numba) unless PIPESGD_GPU_TESTS=1, which runs them on the real GPU, together
with the tests marked `gpu` (large sizes); those are skipped elsewhere, saying why.
"""

import os

if os.environ.get("PIPESGD_GPU_TESTS") != "1":
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))
