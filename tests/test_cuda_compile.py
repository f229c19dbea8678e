"""Every CUDA kernel of the package compiles to PTX for compute capability 9.0 (H100/H200).

Numba's simulator, which runs the CUDA tests here, does not type-check: a kernel can pass every
simulated test and still fail to compile on a GPU (numba 0.68's CUDA target, for one, cannot
compile `max(float32, float32)`). Compiling to PTX needs no GPU, only the real numba.cuda, so
the check runs in a subprocess without NUMBA_ENABLE_CUDASIM (this session has the simulator
on). It covers every module that lists its kernels in `KERNELS`: ops/cuda_ops.py, and
codecs/cuda_kernels.py when that module exists.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

_SCRIPT = textwrap.dedent(
    """
    import importlib, json
    from numba.cuda.dispatcher import CUDADispatcher
    from pipesgd_ref.ops.cuda_support import compile_kernels

    report = {}
    for name in ("pipesgd_ref.ops.cuda_ops", "pipesgd_ref.codecs.cuda_kernels"):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:  # the module exists but something it imports does not
                raise
            continue
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


def test_every_kernel_compiles_for_sm_90():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=280
    )
    assert proc.returncode == 0, (
        f"compiling the CUDA kernels for cc 9.0 failed (exit {proc.returncode}); the compiler "
        f"said:\n{proc.stderr[-4000:]}"
    )
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "pipesgd_ref.ops.cuda_ops" in report, f"cuda_ops was not compiled: {report}"
    for module, r in report.items():
        assert not r["unlisted"], (
            f"{module}: kernels {r['unlisted']} are missing from KERNELS, so nothing checks "
            "that they compile; add each with an example signature"
        )
        assert len(r["sm_90"]) == r["n_listed"], f"{module}: two KERNELS entries share a name"
        bad = [k for k, ok in r["sm_90"].items() if not ok]
        assert not bad, f"{module}: PTX without '.target sm_90' for {bad}"
