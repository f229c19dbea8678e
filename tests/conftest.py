"""Test-wide settings: hypothesis profiles.

`ci` (chosen when the CI environment variable is set): derandomized, so a CI run is
reproducible; no deadline, because a shared machine has noisy timings. `dev` (default):
random examples, also without deadlines (Numba compiles on the first call of each op).
Choose another with HYPOTHESIS_PROFILE=name.

The documentation site (`site`): built once per session at CI's size by docs/build.py, for
tests/test_site.py (its pages and notebooks) and tests/test_browser.py (the same pages in
Chromium); a run that selects neither never builds it.

auto's AllReduce figures: the package's own (PIPESGD_ALLREDUCE_MODELS points at them), so
the figures a user of this machine fitted into ~/.cache/pipesgd (or a broken file there) do not
change what the suite's jobs choose. Tests of the user's file set or unset the variable.

CUDA: the kernels run in Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1, set here before
anything imports numba) unless PIPESGD_GPU_TESTS=1, which runs them on the real GPU, together
with the tests marked `gpu` (large sizes); those are skipped elsewhere, saying why.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ["PIPESGD_ALLREDUCE_MODELS"] = str(
    Path(__file__).resolve().parents[1] / "pipesgd_ref" / "comm" / "allreduce_models.json"
)

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


@pytest.fixture(scope="session")
def site(tmp_path_factory):
    """The documentation site, built at the tutorials' small size into a temporary folder
    (`site/` the pages, `pages/` the executed notebooks, `build.json` the report)."""
    pytest.importorskip("mkdocs_jupyter", reason="the docs extra: pip install -e '.[docs]'")
    pytest.importorskip("matplotlib", reason="the tutorials' figures need the plot extra")
    root = Path(__file__).parent.parent
    out = tmp_path_factory.mktemp("docs")
    env = {**os.environ, "PIPESGD_TUTORIAL_SMALL": "1"}
    done = subprocess.run(
        [sys.executable, str(root / "docs" / "build.py"), "--small", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=1500,
        env=env,
        cwd=out,
    )
    assert done.returncode == 0, (
        f"docs/build.py failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    )
    return out
