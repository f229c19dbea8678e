"""The elementwise ops as CUDA kernels: ReLU and its gradient, add, scale, the SGD step, fill.

Each is a grid-stride loop: thread t of a grid of T threads handles elements t, t + T, ...;
consecutive threads touch consecutive addresses (coalesced), and the bounded grid of
cuda_support.launch_1d covers any length with the same launch. Any float dtype.
"""

from __future__ import annotations

from typing import no_type_check

from numba import cuda


@cuda.jit
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
def relu_forward_kernel(z, a):
    """a[i] = max(z[i], 0) for i in range(n). Grid-stride loop, coalesced."""
    for i in range(cuda.grid(1), z.shape[0], cuda.gridsize(1)):
        # Two stores, not `z[i] if z[i] > 0 else 0`: that expression unifies float32 with an
        # int and computes in float64 (visible in the PTX as .f64 instructions).
        if z[i] > 0:
            a[i] = z[i]
        else:
            a[i] = 0


@cuda.jit
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
def relu_backward_kernel(z, da, dz):
    """dz[i] = da[i] if z[i] > 0 else 0 for i in range(n). Grid-stride loop, coalesced."""
    for i in range(cuda.grid(1), z.shape[0], cuda.gridsize(1)):
        if z[i] > 0:  # two stores: no float64 detour (see relu_forward_kernel)
            dz[i] = da[i]
        else:
            dz[i] = 0


@cuda.jit
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
def add_into_kernel(dst, src):
    """dst[i] += src[i] for i in range(n). Grid-stride loop, coalesced."""
    for i in range(cuda.grid(1), dst.shape[0], cuda.gridsize(1)):
        dst[i] += src[i]


@cuda.jit
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
def scale_kernel(x, alpha):
    """x[i] *= alpha for i in range(n). Grid-stride loop, coalesced."""
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        x[i] *= alpha


@cuda.jit
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
def sgd_step_kernel(params, grads, lr):
    """params[i] -= lr * grads[i] for i in range(n). Grid-stride loop, coalesced."""
    for i in range(cuda.grid(1), params.shape[0], cuda.gridsize(1)):
        params[i] -= lr * grads[i]


@cuda.jit
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
def fill_kernel(x, value):
    """x[i] = value for i in range(n) (used by `zeros`). Grid-stride loop, coalesced."""
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        x[i] = value


_V = "float32[::1]"
# Every kernel with one example signature: tests/test_cuda_compile.py compiles each to PTX.
KERNELS = [
    (relu_forward_kernel, f"({_V}, {_V})"),
    (relu_backward_kernel, f"({_V}, {_V}, {_V})"),
    (add_into_kernel, f"({_V}, {_V})"),
    (scale_kernel, f"({_V}, float32)"),
    (sgd_step_kernel, f"({_V}, {_V}, float32)"),
    (fill_kernel, f"({_V}, float32)"),
]
