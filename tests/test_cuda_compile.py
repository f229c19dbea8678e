"""Every CUDA kernel of the package compiles to PTX for compute capability 9.0 (H100/H200).

Numba's simulator, which runs the CUDA tests here, does not type-check: a kernel can pass every
simulated test and still fail to compile on a GPU (numba 0.68's CUDA target, for one, cannot
compile `max(float32, float32)`). Compiling to PTX needs no GPU, only the real numba.cuda, so
the check runs in a subprocess without NUMBA_ENABLE_CUDASIM (this session has the simulator
on). It covers every module of the package that defines a kernel (a line starts `@cuda.jit`):
each lists its kernels in `KERNELS`, and each listed kernel must compile.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pipesgd_ref"
# Every module whose source defines a CUDA kernel or device function.
KERNEL_MODULES = sorted(
    ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    for path in PACKAGE.rglob("*.py")
    if re.search(r"^@cuda\.jit", path.read_text(encoding="utf-8"), re.MULTILINE)
)

_SCRIPT = textwrap.dedent(
    """
    import importlib, json, sys
    from numba.cuda.dispatcher import CUDADispatcher
    from pipesgd_ref.ops.cuda_support import compile_kernels

    report = {}
    for name in sys.argv[1:]:
        module = importlib.import_module(name)
        listed = {getattr(k, "py_func", k).__name__ for k, _ in module.KERNELS}
        kernels = {  # every cuda.jit kernel (not device function) defined in the module
            attr for attr, obj in vars(module).items()
            if isinstance(obj, CUDADispatcher) and not obj.targetoptions.get("device")
            and obj.py_func.__module__ == name
        }
        ptx = compile_kernels(module.KERNELS, cc=(9, 0))
        report[name] = {
            "unlisted": sorted(kernels - listed),
            "n_listed": len(module.KERNELS),
            "sm_90": {k: ".target sm_90" in p for k, p in ptx.items()},
        }
    print(json.dumps(report))
    """
)


@pytest.mark.slow  # 2-5 s: kept out of the fast subset
def test_every_kernel_compiles_for_sm_90():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, *KERNEL_MODULES],
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, (
        f"compiling the CUDA kernels for cc 9.0 failed (exit {proc.returncode}); the compiler "
        f"said:\n{proc.stderr[-4000:]}"
    )
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    for module in ("pipesgd_ref.ops.cuda_matmul", "pipesgd_ref.codecs.cuda_kernels"):
        assert module in KERNEL_MODULES, f"{module} was not found among {KERNEL_MODULES}"
    assert sorted(report) == KERNEL_MODULES, f"not every kernel module was compiled: {report}"
    for module, r in report.items():
        assert not r["unlisted"], (
            f"{module}: kernels {r['unlisted']} are missing from KERNELS, so nothing checks "
            "that they compile; add each with an example signature"
        )
        assert len(r["sm_90"]) == r["n_listed"], f"{module}: two KERNELS entries share a name"
        bad = [k for k, ok in r["sm_90"].items() if not ok]
        assert not bad, f"{module}: PTX without '.target sm_90' for {bad}"
