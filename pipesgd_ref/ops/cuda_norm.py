"""Batch norm and global average pooling as CUDA kernels, on rows (N, C) of NHWC float32 maps.

Batch norm needs per-channel sums over all N = B*H*W rows: the mean, the variance, and in the
backward sum(dY) and sum(dY * xhat). A sum over N rows is done in two deterministic stages:

    partial_sums_kernel   a grid of (channel tiles) x (row chunks) blocks; block (tile, r)
                          sums its rows of up to CHANNEL_TILE channels (a narrow map, C < 32,
                          gets C: no idle threads), lanes of ROW_LANES threads each taking every
                          ROW_LANES-th row, then a tree over the lanes in shared memory:
                          partial[r, c]
    finish_sums_kernel    one thread per channel adds its chunks' partials in order r = 0, 1, ...

so the work spreads over many blocks even when C is 16 (a single block per channel tile would
leave an H100 idle), and no atomics: repeated runs give identical bits. The rest is
elementwise (one thread per element, grid-stride, coalesced along c): normalise-scale-shift,
the input gradient, the evaluation map, the running averages, and the pooling's backward.
The pooling's forward is one thread per (b, c), each summing its channel over the pixels
(consecutive threads, consecutive channels: coalesced loads).

Float32 throughout (each partial and finish sum too); the NumPy reference sums pairwise in
float32, so the results agree within float32 rounding, not bitwise.
"""

from __future__ import annotations

import math
from typing import no_type_check

from numba import cuda, float32

CHANNEL_TILE = 32  # threads along the channels: one warp reads 32 consecutive floats of a row
ROW_LANES = 8  # threads along the rows: a block is CHANNEL_TILE x ROW_LANES = 256 threads
ROWS_PER_CHUNK = 256  # rows one block sums (32 per lane): a chunk is worth a launch
MAX_CHUNKS = 256  # at most this many partial rows; a larger map strides the chunks over them


def channel_tile(n_channels: int) -> int:
    """Channels a block of partial_sums_kernel covers: CHANNEL_TILE, or C when fewer."""
    return max(1, min(CHANNEL_TILE, n_channels))


def chunks(n_rows: int) -> int:
    """How many partial sums per channel the first stage writes for N rows (at least 1)."""
    return max(1, min(-(-n_rows // ROWS_PER_CHUNK), MAX_CHUNKS))


@cuda.jit
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
def partial_sums_kernel(A, B, center, mode, partial):
    """partial[r, c] = the sum over the rows of chunk r of one of, by `mode`:

        0: A[n, c]                      (the mean's sum; B and center unused)
        1: (A[n, c] - center[c])^2      (the variance's sum, around the mean)
        2: A[n, c] * B[n, c]            (dgamma's sum: dY * xhat)

    Launched on grid (ceil(C / T), R), block (T, ROW_LANES) with T <= CHANNEL_TILE channels a
    block (`channel_tile`); R rows of partial, chunk r holding rows r*ROW_LANES + lane,
    stepping by R*ROW_LANES (a grid-stride loop over the rows). `mode` is the same for the
    whole grid: its branch never diverges.
    """
    buf = cuda.shared.array((ROW_LANES, CHANNEL_TILE), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    c = cuda.blockIdx.x * cuda.blockDim.x + tx
    N, C = A.shape
    s = float32(0.0)
    if c < C:
        step = cuda.gridDim.y * ROW_LANES
        for n in range(cuda.blockIdx.y * ROW_LANES + ty, N, step):
            if mode == 0:
                s += A[n, c]
            elif mode == 1:
                d = A[n, c] - center[c]
                s += d * d
            else:
                s += A[n, c] * B[n, c]
    buf[ty, tx] = s
    cuda.syncthreads()
    half = ROW_LANES // 2
    while half > 0:  # tree over the lanes, in a fixed order
        if ty < half:
            buf[ty, tx] += buf[ty + half, tx]
        cuda.syncthreads()
        half //= 2
    if ty == 0 and c < C:
        partial[cuda.blockIdx.y, c] = buf[0, tx]


@cuda.jit
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
def finish_sums_kernel(partial, scale, out):
    """out[c] = scale * sum_r partial[r, c], r in order: one thread per channel."""
    R, C = partial.shape
    for c in range(cuda.grid(1), C, cuda.gridsize(1)):
        s = float32(0.0)
        for r in range(R):
            s += partial[r, c]
        out[c] = s * scale


@cuda.jit
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
def batchnorm_apply_kernel(X, gamma, beta, mean, var, eps, xhat, Y, keep_xhat):
    """xhat[n, c] = (X[n, c] - mean[c]) / sqrt(var[c] + eps), Y = gamma[c] xhat + beta[c].

    Training (keep_xhat = 1: xhat stored for the backward) and evaluation (the running
    statistics as mean and var; xhat not stored) alike. One thread per element, grid-stride.
    """
    N, C = X.shape
    for e in range(cuda.grid(1), N * C, cuda.gridsize(1)):
        n = e // C
        c = e - n * C
        h = (X[n, c] - mean[c]) / math.sqrt(var[c] + eps)
        if keep_xhat:
            xhat[n, c] = h
        Y[n, c] = gamma[c] * h + beta[c]


@cuda.jit
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
def batchnorm_input_grad_kernel(dY, xhat, gamma, var, eps, dbeta, dgamma, inv_n, dX):
    """dX = gamma / sqrt(var + eps) * (dY - dbeta / N - xhat * dgamma / N), per element
    (dbeta and dgamma the channel sums finish_sums_kernel wrote). One thread per element."""
    N, C = dY.shape
    for e in range(cuda.grid(1), N * C, cuda.gridsize(1)):
        n = e // C
        c = e - n * C
        k = gamma[c] / math.sqrt(var[c] + eps)
        dX[n, c] = k * (dY[n, c] - dbeta[c] * inv_n - xhat[n, c] * (dgamma[c] * inv_n))


@cuda.jit
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
def running_average_kernel(running, batch, momentum, correction):
    """running[c] = (1 - momentum) running[c] + momentum correction batch[c]."""
    for c in range(cuda.grid(1), running.shape[0], cuda.gridsize(1)):
        running[c] = (float32(1.0) - momentum) * running[c] + momentum * correction * batch[c]


@cuda.jit
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
def global_avgpool_forward_kernel(X, Y):
    """Y[b, c] = sum_{y, x} X[b, y, x, c] / (H W): one thread per (b, c), summing in
    row-major pixel order; a warp reads 32 consecutive channels of a pixel (coalesced)."""
    B, H, W, C = X.shape
    hw = float32(H * W)
    for e in range(cuda.grid(1), B * C, cuda.gridsize(1)):
        b = e // C
        c = e - b * C
        s = float32(0.0)
        for y in range(H):
            for x in range(W):
                s += X[b, y, x, c]
        Y[b, c] = s / hw


@cuda.jit
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
def global_avgpool_backward_kernel(dY, dX):
    """dX[b, y, x, c] = dY[b, c] / (H W): one thread per element of dX, grid-stride."""
    B, H, W, C = dX.shape
    hw = float32(H * W)
    for e in range(cuda.grid(1), B * H * W * C, cuda.gridsize(1)):
        c = e % C
        b = e // (H * W * C)
        pixel = e // C - b * H * W
        y = pixel // W
        dX[b, y, pixel - y * W, c] = dY[b, c] / hw


_M = "float32[:, ::1]"
_V = "float32[::1]"
_T = "float32[:, :, :, ::1]"  # an NHWC feature map
# Every kernel with one example signature: tests/test_cuda_compile.py compiles each to PTX.
KERNELS = [
    (partial_sums_kernel, f"({_M}, {_M}, {_V}, int64, {_M})"),
    (finish_sums_kernel, f"({_M}, float32, {_V})"),
    (batchnorm_apply_kernel, f"({_M}, {_V}, {_V}, {_V}, {_V}, float32, {_M}, {_M}, int64)"),
    (
        batchnorm_input_grad_kernel,
        f"({_M}, {_M}, {_V}, {_V}, float32, {_V}, {_V}, float32, {_M})",
    ),  # fmt: skip
    (running_average_kernel, f"({_V}, {_V}, float32, float32)"),
    (global_avgpool_forward_kernel, f"({_T}, {_M})"),
    (global_avgpool_backward_kernel, f"({_M}, {_T})"),
]
