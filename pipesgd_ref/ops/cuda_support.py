"""What every CUDA module of the package shares: launch geometry, the GPU check, compilation.

The CUDA code (ops/cuda_ops.py and the kernel modules beside it: the model's ops;
codecs/cuda_kernels.py: the codecs) runs three ways, chosen by the environment before numba is
imported:

    a real GPU                    numba.cuda.is_available() is True
    Numba's CUDA simulator        NUMBA_ENABLE_CUDASIM=1: the kernels run as Python threads on
                                  the CPU (about 0.1 ms per simulated thread: tiny sizes only);
                                  it does not type-check, so ...
    compile only                  `compile_kernels(..., cc=(9, 0))` turns every kernel into PTX
                                  for the H100/H200 generation without a GPU: a kernel that would
                                  not compile on a real GPU fails there (tests/test_cuda_compile.py)

Every kernel module lists its kernels with one example signature each in `KERNELS`, so the
compile check covers every kernel that exists.
"""

from __future__ import annotations

import os

THREADS_PER_BLOCK = 256  # 1-D kernels: 8 warps, enough to hide latency, many blocks per SM
TILE = 16  # 2-D kernels (matmul): 16 x 16 threads, one tile of each operand in shared memory
MAX_BLOCKS = 65535  # grid-stride loops cover the rest: any size launches the same grid


def simulated() -> bool:
    """Whether numba.cuda is the CPU simulator (NUMBA_ENABLE_CUDASIM=1)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "") not in ("", "0")


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def launch_1d(n: int, threads: int = THREADS_PER_BLOCK) -> tuple[int, int]:
    """(blocks, threads) for n elements with a grid-stride loop: one thread per element up to
    MAX_BLOCKS blocks, at least one block (a launch of zero blocks is an error)."""
    return max(1, min(ceil_div(n, threads), MAX_BLOCKS)), threads


def launch_2d(rows: int, cols: int, tile: int = TILE) -> tuple[tuple[int, int], tuple[int, int]]:
    """((grid x, grid y), (tile, tile)) covering a rows x cols output with one thread per
    element: x runs along columns (coalesced row-major access), y along rows."""
    return (max(1, ceil_div(cols, tile)), max(1, ceil_div(rows, tile))), (tile, tile)


def gpu_problem() -> str | None:
    """None when CUDA kernels can run here (a GPU, or the simulator); else why not, and what
    to do, in one line."""
    if simulated():
        return None
    try:
        from numba import cuda
    except ImportError as e:  # pragma: no cover - numba is a dependency
        return f"numba.cuda cannot be imported ({e}); pip install 'pipesgd_ref[cuda]'"
    if cuda.is_available():
        return None
    return (
        "no usable CUDA GPU: numba.cuda.is_available() is False (no NVIDIA GPU, no driver, or "
        "CUDA_VISIBLE_DEVICES hides them); check `nvidia-smi`, install the cuda extra "
        "(pip install 'pipesgd_ref[cuda]'), or run on the CPU (--device cpu), or set "
        "NUMBA_ENABLE_CUDASIM=1 to run the kernels in Numba's simulator (slow, tiny sizes)"
    )


_checked = False  # whether `launch` has found that kernels can run here


def launch(kernel, geometry, *args) -> None:
    """kernel[grid, block](*args): the one place every op launches a kernel.

    `geometry` is (grid, block), e.g. from launch_1d / launch_2d. The first launch checks that
    kernels can run here at all and says what to do if not (instead of a driver error).
    """
    global _checked
    if not _checked:
        problem = gpu_problem()
        if problem is not None:
            raise RuntimeError(f"cuda backend: {problem}")
        _checked = True
    grid, block = geometry
    kernel[grid, block](*args)


def compile_kernels(kernels, cc: tuple[int, int] = (9, 0)) -> dict[str, str]:
    """PTX for every (kernel, signature) in `kernels`, for compute capability `cc`, without a
    GPU: {kernel name: ptx}. Raises what the compiler raises for a kernel that does not
    compile (a type error the simulator would not notice). Not available in the simulator.
    Meant for a compile-only process: device functions stay compiled for `cc` afterwards."""
    if simulated():
        raise RuntimeError("compile_kernels needs the real numba.cuda: unset NUMBA_ENABLE_CUDASIM")
    from numba import cuda
    from numba.cuda import dispatcher

    class _Target:  # stands in for the GPU that is not there
        compute_capability = cc

    # A kernel that calls a cuda.jit(device=True) function compiles it on the way, and Numba
    # asks the current device for its compute capability there: with no GPU that raises
    # "CUDA driver library cannot be found". Answer `cc` instead, for the duration of the call.
    real_get_current_device = dispatcher.get_current_device
    dispatcher.get_current_device = lambda: _Target
    out = {}
    try:
        for kernel, signature in kernels:
            fn = getattr(kernel, "py_func", kernel)
            ptx, _ = cuda.compile_ptx(fn, signature, cc=cc)
            out[fn.__name__] = ptx
    finally:
        dispatcher.get_current_device = real_get_current_device
    return out
