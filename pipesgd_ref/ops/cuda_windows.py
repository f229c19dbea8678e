"""Convolution as im2col + matmul, and max-pooling, as CUDA kernels on NHWC float32 maps.

One thread per OUTPUT element in all four, so every store is a plain store by its only writer:
the gradients (col2im, maxpool_backward) are gathers, each dX pixel summing the window positions
that read it, instead of scatters with atomicAdd. No atomics: deterministic, and the sums are
added in float32 in the reference's (u, v) order, so every result is BITWISE equal to NumPy's
(im2col and maxpool_forward copy and compare; the gathers only add: nothing for a compiler to
fuse into an FMA). Flat thread index e -> (b, y, x, c) with c fastest, so a warp's stores are
consecutive addresses (coalesced), and so are most of its loads (neighbouring c, then x).

Ho = (H + 2 pad - kh) // stride + 1 is numpy_ops.conv_out itself, compiled as a device
function (`_conv_out`); a flat index walks the 4-D arrays as `_unflatten` splits it. The pixel
(y, x) is read by window row i at kernel row u exactly when i*stride + u - pad == y: u runs over
(y + pad) % stride, that + stride, ... < kh, with i = (y + pad - u) // stride (exact), which must
lie in [0, Ho); columns likewise.
"""

from __future__ import annotations

from typing import no_type_check

from numba import cuda, float32

from pipesgd_ref.ops.numpy_ops import conv_out

_conv_out = cuda.jit(device=True)(conv_out)


@cuda.jit(device=True)
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
def _unflatten(e, n1, n2, n3):
    """(a, b, c, d) of the flat row-major index e into an array of shape (_, n1, n2, n3)."""
    r = e // n3
    d = e - r * n3
    r2 = r // n2
    c = r - r2 * n2
    a = r2 // n1
    return a, r2 - a * n1, c, d


@cuda.jit
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
def im2col_kernel(X, kh, kw, stride, pad, cols):
    """cols[(b*Ho + i)*Wo + j, (u*kw + v)*C + c] = X[b, i*stride + u - pad, j*stride + v - pad, c]
    (0 outside X), as numpy_ops.im2col.

    Optimisations: one thread per element of cols, grid-stride; consecutive threads write
    consecutive addresses of cols (coalesced) and read consecutive channels, then pixels, of X;
    the padding is a bounds test, not a padded copy of X. Bitwise equal to NumPy (a copy).
    """
    B, H, W, C = X.shape
    Ho, Wo = _conv_out(H, kh, stride, pad), _conv_out(W, kw, stride, pad)
    K = kh * kw * C
    for e in range(cuda.grid(1), cols.shape[0] * K, cuda.gridsize(1)):
        row = e // K
        col = e - row * K
        _, u, v, c = _unflatten(col, kh, kw, C)  # col = (u*kw + v)*C + c
        b, i, j, _ = _unflatten(row, Ho, Wo, 1)  # row = (b*Ho + i)*Wo + j
        y = i * stride + u - pad
        x = j * stride + v - pad
        if 0 <= y < H and 0 <= x < W:
            cols[row, col] = X[b, y, x, c]
        else:
            cols[row, col] = float32(0.0)


@cuda.jit
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
def col2im_kernel(cols, kh, kw, stride, pad, dX):
    """dX[b, y, x, c] = the sum of every cols entry that im2col read from (b, y, x, c), as
    numpy_ops.col2im.

    Optimisations: a gather, one thread per pixel of dX (grid-stride, coalesced stores): at
    most ceil(kh/stride) * ceil(kw/stride) reads each, no atomics, no zeroing pass (the sum
    starts at 0 in a register and is stored once). The terms are added in float32 in the
    reference's (u, v) row-major order, so the result is BITWISE equal to NumPy's (only adds:
    no multiply for the compiler to fuse into an FMA).
    """
    B, H, W, C = dX.shape
    Ho, Wo = _conv_out(H, kh, stride, pad), _conv_out(W, kw, stride, pad)
    for e in range(cuda.grid(1), B * H * W * C, cuda.gridsize(1)):
        b, y, x, c = _unflatten(e, H, W, C)
        acc = float32(0.0)
        for u in range((y + pad) % stride, kh, stride):  # the kernel rows that read y
            i = (y + pad - u) // stride  # exact: u = y + pad (mod stride)
            if 0 <= i < Ho:
                for v in range((x + pad) % stride, kw, stride):
                    j = (x + pad - v) // stride
                    if 0 <= j < Wo:
                        acc += cols[(b * Ho + i) * Wo + j, (u * kw + v) * C + c]
        dX[b, y, x, c] = acc


@cuda.jit
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
def maxpool_forward_kernel(X, k, stride, Y, argmax):
    """Y[b, i, j, c] = max over u, v < k of X[b, i*stride + u, j*stride + v, c] and argmax the
    first u*k + v that attains it, as numpy_ops.maxpool_forward.

    Optimisations: one thread per output element, grid-stride, coalesced along c; the running
    max and its index stay in registers, each output is stored once. Bitwise equal to NumPy
    (compares and copies only).
    """
    B, Ho, Wo, C = Y.shape
    for e in range(cuda.grid(1), B * Ho * Wo * C, cuda.gridsize(1)):
        b, i, j, c = _unflatten(e, Ho, Wo, C)
        y0 = i * stride
        x0 = j * stride
        m = X[b, y0, x0, c]
        best = 0
        for u in range(k):
            for v in range(k):
                val = X[b, y0 + u, x0 + v, c]
                # Strict >: a tie keeps the first maximum. A NaN wins once and then stays, as
                # in np.max / np.argmax: a diverged input is not hidden by the pool.
                if val > m or (val != val and m == m):
                    m = val
                    best = u * k + v
        Y[b, i, j, c] = m
        argmax[b, i, j, c] = best


@cuda.jit
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
def maxpool_backward_kernel(dY, argmax, k, stride, dX):
    """dX[b, y, x, c] = the sum of dY over the windows whose argmax is (y, x), as
    numpy_ops.maxpool_backward.

    Optimisations: a gather as in col2im_kernel (pad 0), one thread per pixel of dX, no atomics
    although windows overlap when stride < k; the hits are added in float32 in the reference's
    (u, v) order (its other terms are +0.0, which change no sum), so the result is BITWISE
    equal to NumPy's.
    """
    B, H, W, C = dX.shape
    Ho, Wo = dY.shape[1], dY.shape[2]
    for e in range(cuda.grid(1), B * H * W * C, cuda.gridsize(1)):
        b, y, x, c = _unflatten(e, H, W, C)
        acc = float32(0.0)
        for u in range(y % stride, k, stride):
            i = (y - u) // stride
            if 0 <= i < Ho:
                for v in range(x % stride, k, stride):
                    j = (x - v) // stride
                    if 0 <= j < Wo and argmax[b, i, j, c] == u * k + v:
                        acc += dY[b, i, j, c]
        dX[b, y, x, c] = acc


_M = "float32[:, ::1]"
_T = "float32[:, :, :, ::1]"  # an NHWC feature map
_I = "int32[:, :, :, ::1]"  # max-pooling's argmax
# Every kernel with one example signature: tests/test_cuda_compile.py compiles each to PTX.
KERNELS = [
    (im2col_kernel, f"({_T}, int64, int64, int64, int64, {_M})"),
    (col2im_kernel, f"({_M}, int64, int64, int64, int64, {_T})"),
    (maxpool_forward_kernel, f"({_T}, int64, int64, {_T}, {_I})"),
    (maxpool_backward_kernel, f"({_T}, {_I}, int64, int64, {_T})"),
]
