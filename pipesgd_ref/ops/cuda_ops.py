"""CUDA versions of the named ops (Numba `cuda.jit`): same signatures and meaning as `numpy_ops`.

The third rung of the ladder numpy_ops -> numba_ops -> cuda_ops. Every argument is a Numba
CUDA device array (`to_device`, `empty`, `zeros` below make them); outputs are written into
preallocated device arrays, as in every backend. Only `softmax_xent_grad` returns to the host,
with one scalar (the loss). The labels `y` may be a device or a host int array (int64 from
data.py, or int32); a host array is copied over (B integers).

Optimisations, and why:
- Register tiling (`_matmul_register_tiled`, for products of 64 x 64 outputs and more): each
  thread keeps a 4 x 4 micro-tile of the output in registers and feeds 16 multiply-adds from 8
  shared-memory reads, in 64 x 64 block tiles; below that size the simple tiled kernel.
- Tiled matrix multiply: each block computes a TILE x TILE tile of the output; the operands
  are staged through shared memory one TILE x TILE tile at a time, so every element fetched
  from global memory is used TILE times (arithmetic intensity up by TILE). `cuda.syncthreads()`
  separates loading a tile from using it, and using it from overwriting it.
- Coalescing: consecutive threads (threadIdx.x) touch consecutive addresses of a row-major
  array. A transposed operand is read along its rows and transposed on the way into shared
  memory, so X^T dY and dY W^T read global memory as fast as X W.
- Fusion: the bias is added in the matmul's epilogue; softmax, loss and gradient are one
  kernel per row (max, sum of exp, write) with block reductions in shared memory.
- Grid-stride loops: the elementwise kernels launch a bounded grid (cuda_support.launch_1d)
  and each thread walks n / (grid size) elements, so any length uses the same launch.
- Deterministic reductions: column sums and the loss are shared-memory trees in a fixed order
  (no atomics), so repeated runs give identical bits.
- Gathers, not atomics, for the window gradients (col2im, maxpool_backward): one thread per
  pixel of dX sums the window positions that read it, in the reference's order, so the result
  is deterministic and bitwise equal to NumPy's; im2col and maxpool_forward are one thread per
  output element. Consecutive threads take consecutive channels of NHWC maps: coalesced.

dtype: the matrix kernels (dense_forward, dense_backward) stage tiles in float32 shared memory
and accept float32 only, the training dtype; gradient checks in float64 use the numpy backend.
The window ops take float32 maps (and an int32 argmax) only, likewise. The elementwise kernels
take any float dtype.
"""

from __future__ import annotations

import math
import threading

import numpy as np
from numba import cuda, float32

from pipesgd_ref.ops.cuda_support import (
    MAX_BLOCKS,
    THREADS_PER_BLOCK,
    TILE,
    gpu_problem,
    launch_1d,
    launch_2d,
)
from pipesgd_ref.ops.numpy_ops import conv_out
from pipesgd_ref.ops.windows import check_im2col, check_pool

ROW_THREADS = 32  # softmax: one warp per row; a row has C classes (10 here), rarely more than 32


# ---------------------------------------------------------------------------------------------
# Kernels


@cuda.jit
def _matmul_tiled(A, B, bias, C, trans_a, trans_b):
    """C = op(A) @ op(B) (+ bias), op(M) = M^T when its flag is set, else M.

    As a loop, with op(A) (M, K) and op(B) (K, N):
        for i in M, j in N: C[i, j] = (bias[j] if len(bias) else 0) + sum_k op(A)[i, k] op(B)[k, j]
    Used three ways: X @ W + b (forward), X^T @ dY (dW), dY @ W^T (dX); an empty `bias` means none.

    Optimisations: one thread per output element, one block per TILE x TILE output tile; tiles
    of op(A) and op(B) staged in shared memory (global reads cut by a factor TILE); coalesced
    global reads even for a transposed operand (threadIdx.x walks the stored rows; the transpose
    happens on the write into shared memory); zero padding at ragged edges, so no shape needs to
    be a multiple of TILE. The flags are the same for the whole grid: the branches on them never
    diverge within a warp, and one kernel serves all three products (one tile loop to read).
    """
    As = cuda.shared.array((TILE, TILE), float32)  # As[r, k] = op(A)[row0 + r, k0 + k]
    Bs = cuda.shared.array((TILE, TILE), float32)  # Bs[k, c] = op(B)[k0 + k, col0 + c]
    tx = cuda.threadIdx.x  # along columns of C: consecutive threads, consecutive addresses
    ty = cuda.threadIdx.y
    row0 = cuda.blockIdx.y * TILE
    col0 = cuda.blockIdx.x * TILE
    M, N = C.shape
    K = A.shape[0] if trans_a else A.shape[1]
    acc = float32(0.0)
    for k0 in range(0, K, TILE):
        # Load phase: each thread fetches one element of each operand tile (0 past the edge).
        if trans_a:  # op(A)[r, k] = A[k, r]: read A[k0 + ty, row0 + tx] (coalesced), transpose
            k, r = k0 + ty, row0 + tx
            As[tx, ty] = A[k, r] if k < K and r < M else float32(0.0)
        else:
            r, k = row0 + ty, k0 + tx
            As[ty, tx] = A[r, k] if r < M and k < K else float32(0.0)
        if trans_b:  # op(B)[k, c] = B[c, k]: read B[col0 + ty, k0 + tx] (coalesced), transpose
            c, k = col0 + ty, k0 + tx
            Bs[tx, ty] = B[c, k] if c < N and k < K else float32(0.0)
        else:
            k, c = k0 + ty, col0 + tx
            Bs[ty, tx] = B[k, c] if k < K and c < N else float32(0.0)
        cuda.syncthreads()  # the whole tile is loaded before anyone reads it
        for kk in range(TILE):  # zero padding makes the ragged last tile harmless
            acc += As[ty, kk] * Bs[kk, tx]
        cuda.syncthreads()  # everyone is done with this tile before the next load overwrites it
    i, j = row0 + ty, col0 + tx
    if i < M and j < N:  # the epilogue: guard the store, fuse the bias
        if bias.shape[0] > 0:
            acc += bias[j]
        C[i, j] = acc


# Register tiling: the block tile, its depth, and each thread's micro-tile of C.
RT_BM = RT_BN = 64  # a block computes a 64 x 64 tile of C ...
RT_BK = 16  # ... from 64 x 16 and 16 x 64 tiles of the operands in shared memory ...
RT_TM = RT_TN = 4  # ... each of its 16 x 16 threads a 4 x 4 micro-tile, held in registers
RT_THREADS = RT_BM // RT_TM  # 16 threads a side: 256 a block
# elements of each operand tile that each thread loads
RT_LOADS = RT_BM * RT_BK // (RT_THREADS * RT_THREADS)
REGISTER_TILED_FROM = 64 * 64  # outputs from which dense ops use the register-tiled kernel


@cuda.jit
def _matmul_register_tiled(A, B, bias, C, trans_a, trans_b):
    """C = op(A) @ op(B) (+ bias): the same product as `_matmul_tiled`, one rung up.

    The shared-memory tile cut global reads by TILE; what limits `_matmul_tiled` next is shared
    memory itself: every multiply-add reads two floats from it. Here each thread computes an
    RT_TM x RT_TN micro-tile of C in registers (`acc`): per step kk of the block's depth it
    reads RT_TM floats of the A tile and RT_TN of the B tile into registers (`a`, `b`) and does
    RT_TM * RT_TN multiply-adds with them, so each shared read feeds RT_TN (or RT_TM) of them
    instead of one. The block tile grows to RT_BM x RT_BN with the same 256 threads, so each
    global read is reused RT_BM times too.

        block (bx, by): C[by*BM : by*BM + BM, bx*BN : bx*BN + BN]
        thread (tx, ty): rows by*BM + ty*TM + (0..TM-1), columns bx*BN + tx*TN + (0..TN-1)
        As[k, r] = op(A)[row0 + r, k0 + k]   (stored k-major: a thread's TM rows are adjacent)
        Bs[k, c] = op(B)[k0 + k, col0 + c]

    Loads: each of the 256 threads fetches RT_LOADS elements of each operand tile, consecutive
    threads consecutive addresses of the stored (row-major) operand whatever the transpose flag
    (0 past the edges). Two barriers per depth step, as in `_matmul_tiled`. Sums run over k in
    the same order for every element (deterministic), not in `_matmul_tiled`'s order: the two
    kernels agree to float32 rounding, not bitwise.
    """
    As = cuda.shared.array((RT_BK, RT_BM), float32)
    Bs = cuda.shared.array((RT_BK, RT_BN), float32)
    acc = cuda.local.array((RT_TM, RT_TN), float32)
    a = cuda.local.array(RT_TM, float32)
    b = cuda.local.array(RT_TN, float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    tid = ty * RT_THREADS + tx
    row0 = cuda.blockIdx.y * RT_BM
    col0 = cuda.blockIdx.x * RT_BN
    M, N = C.shape
    K = A.shape[0] if trans_a else A.shape[1]
    for i in range(RT_TM):
        for j in range(RT_TN):
            acc[i, j] = float32(0.0)
    for k0 in range(0, K, RT_BK):
        for n in range(RT_LOADS):
            e = n * RT_THREADS * RT_THREADS + tid  # this thread's n-th element of the tile
            if trans_a:  # A is (K, M): walk its rows (r fastest): coalesced
                k, r = e // RT_BM, e % RT_BM
                As[k, r] = A[k0 + k, row0 + r] if k0 + k < K and row0 + r < M else float32(0.0)
            else:  # A is (M, K): walk its rows (k fastest): coalesced
                r, k = e // RT_BK, e % RT_BK
                As[k, r] = A[row0 + r, k0 + k] if row0 + r < M and k0 + k < K else float32(0.0)
            if trans_b:  # B is (N, K): k fastest
                c, k = e // RT_BK, e % RT_BK
                Bs[k, c] = B[col0 + c, k0 + k] if col0 + c < N and k0 + k < K else float32(0.0)
            else:  # B is (K, N): c fastest
                k, c = e // RT_BN, e % RT_BN
                Bs[k, c] = B[k0 + k, col0 + c] if k0 + k < K and col0 + c < N else float32(0.0)
        cuda.syncthreads()  # both tiles are loaded before anyone reads them
        for kk in range(RT_BK):
            for i in range(RT_TM):
                a[i] = As[kk, ty * RT_TM + i]
            for j in range(RT_TN):
                b[j] = Bs[kk, tx * RT_TN + j]
            for i in range(RT_TM):  # RT_TM * RT_TN multiply-adds from RT_TM + RT_TN reads
                for j in range(RT_TN):
                    acc[i, j] += a[i] * b[j]
        cuda.syncthreads()  # everyone is done with these tiles before the next load
    for i in range(RT_TM):
        r = row0 + ty * RT_TM + i
        for j in range(RT_TN):
            c = col0 + tx * RT_TN + j
            if r < M and c < N:
                value = acc[i, j]
                if bias.shape[0] > 0:
                    value += bias[c]
                C[r, c] = value


def _matmul(A, B, bias, C, trans_a: bool, trans_b: bool) -> None:
    """C = op(A) @ op(B) (+ bias) with the kernel for its size: the register-tiled one from
    REGISTER_TILED_FROM outputs (where its 64 x 64 block tiles are mostly full), the
    shared-memory tiled one below (a small product would leave most of a 64 x 64 tile idle)."""
    M, N = C.shape
    if M * N >= REGISTER_TILED_FROM:
        grid = (max(1, -(-N // RT_BN)), max(1, -(-M // RT_BM)))
        _launch(_matmul_register_tiled, (grid, (RT_THREADS, RT_THREADS)), A, B, bias, C,
                trans_a, trans_b)  # fmt: skip
    else:
        _launch(_matmul_tiled, launch_2d(M, N), A, B, bias, C, trans_a, trans_b)


@cuda.jit
def _column_sum(dY, db):
    """db[j] = sum_i dY[i, j] (the bias gradient).

    As a loop: for j in n_out: db[j] = 0; for i in B: db[j] += dY[i, j].

    Optimisations: a block owns TILE columns and has TILE x TILE threads; thread (ty, tx) sums
    rows ty, ty + TILE, ... of column col0 + tx (a row of threads reads a contiguous run of a
    row of dY: coalesced), then the TILE partial sums of each column are combined by a tree
    reduction in shared memory (log2(TILE) steps, fixed order: deterministic).
    """
    partial = cuda.shared.array((TILE, TILE), float32)
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    j = cuda.blockIdx.x * TILE + tx
    B, N = dY.shape
    acc = float32(0.0)
    if j < N:
        for i in range(ty, B, TILE):
            acc += dY[i, j]
    partial[ty, tx] = acc
    cuda.syncthreads()
    half = TILE // 2  # TILE is a power of two: every step halves the rows still summing
    while half > 0:
        if ty < half:
            partial[ty, tx] += partial[ty + half, tx]
        cuda.syncthreads()  # this step's sums are written before the next step reads them
        half //= 2
    if ty == 0 and j < N:
        db[j] = partial[0, tx]


@cuda.jit(device=True)
def _block_sum(buf, tid, n_threads):
    """Tree sum of buf[0:n_threads] (n_threads a power of two) into buf[0], in shared memory."""
    half = n_threads // 2
    while half > 0:
        if tid < half:
            buf[tid] += buf[tid + half]
        cuda.syncthreads()
        half //= 2


@cuda.jit(device=True)
def _block_max(buf, tid, n_threads):
    """Tree max of buf[0:n_threads] (n_threads a power of two) into buf[0], in shared memory."""
    half = n_threads // 2
    while half > 0:
        # A comparison, not max(a, b): numba 0.68's CUDA target resolves max(float32, float32)
        # to a generic overload that fails to compile (the simulator runs it without noticing).
        if tid < half and buf[tid + half] > buf[tid]:
            buf[tid] = buf[tid + half]
        cuda.syncthreads()
        half //= 2


@cuda.jit
def _softmax_xent_rows(logits, y, dlogits, row_loss):
    """Per-row softmax cross-entropy and its gradient.

    As a loop, for each row i (B rows, C classes), m = max_j logits[i, j]:
        s            = sum_j exp(logits[i, j] - m)
        row_loss[i]  = log(s) + m - logits[i, y[i]]
        dlogits[i, j] = (exp(logits[i, j] - m) / s - [j == y[i]]) / B

    Optimisations: one block of ROW_THREADS threads per row (rows grid-strided over blocks);
    the threads stride across the row (coalesced) and combine max and sum by tree reductions in
    shared memory; the gradient is written in the same kernel (fused: one row's logits are read
    three times, from cache after the first, and no probabilities are stored).
    """
    buf = cuda.shared.array(ROW_THREADS, float32)
    tid = cuda.threadIdx.x
    B, C = logits.shape
    inv_B = float32(1.0) / float32(B)
    for i in range(cuda.blockIdx.x, B, cuda.gridDim.x):
        m = logits[i, 0]  # a real entry (not -inf): the max keeps the logits' dtype
        for j in range(tid, C, ROW_THREADS):
            if logits[i, j] > m:  # not max(): see _block_max
                m = logits[i, j]
        buf[tid] = m
        cuda.syncthreads()
        _block_max(buf, tid, ROW_THREADS)
        m = buf[0]
        cuda.syncthreads()  # all have read the max before buf is reused for the sum
        s = float32(0.0)
        for j in range(tid, C, ROW_THREADS):
            s += math.exp(logits[i, j] - m)
        buf[tid] = s
        cuda.syncthreads()
        _block_sum(buf, tid, ROW_THREADS)
        s = buf[0]
        label = y[i]
        for j in range(tid, C, ROW_THREADS):
            p = math.exp(logits[i, j] - m) / s
            dlogits[i, j] = (p - float32(1.0)) * inv_B if j == label else p * inv_B
        if tid == 0:
            row_loss[i] = math.log(s) + m - logits[i, label]
        cuda.syncthreads()  # all have read buf[0] before the next row overwrites it


@cuda.jit
def _mean(x, out):
    """out[0] = mean(x) (0 when x is empty); launched as ONE block.

    As a loop: s = 0; for i in n: s += x[i]; out[0] = s / n.
    Optimisations: THREADS_PER_BLOCK threads stride over x (coalesced), then one tree reduction
    in shared memory; a fixed order, so the loss is bitwise reproducible.
    """
    buf = cuda.shared.array(THREADS_PER_BLOCK, float32)
    tid = cuda.threadIdx.x
    n = x.shape[0]
    s = float32(0.0)
    for i in range(tid, n, THREADS_PER_BLOCK):
        s += x[i]
    buf[tid] = s
    cuda.syncthreads()
    _block_sum(buf, tid, THREADS_PER_BLOCK)
    if tid == 0:
        out[0] = buf[0] / float32(n) if n > 0 else float32(0.0)


@cuda.jit
def _relu_forward(z, a):
    """a[i] = max(z[i], 0) for i in range(n). Grid-stride loop, coalesced."""
    for i in range(cuda.grid(1), z.shape[0], cuda.gridsize(1)):
        # Two stores, not `z[i] if z[i] > 0 else 0`: that expression unifies float32 with an
        # int and computes in float64 (visible in the PTX as .f64 instructions).
        if z[i] > 0:
            a[i] = z[i]
        else:
            a[i] = 0


@cuda.jit
def _relu_backward(z, da, dz):
    """dz[i] = da[i] if z[i] > 0 else 0 for i in range(n). Grid-stride loop, coalesced."""
    for i in range(cuda.grid(1), z.shape[0], cuda.gridsize(1)):
        if z[i] > 0:  # two stores: no float64 detour (see _relu_forward)
            dz[i] = da[i]
        else:
            dz[i] = 0


@cuda.jit
def _add_into(dst, src):
    """dst[i] += src[i] for i in range(n). Grid-stride loop, coalesced."""
    for i in range(cuda.grid(1), dst.shape[0], cuda.gridsize(1)):
        dst[i] += src[i]


@cuda.jit
def _scale(x, alpha):
    """x[i] *= alpha for i in range(n). Grid-stride loop, coalesced."""
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        x[i] *= alpha


@cuda.jit
def _sgd_step(params, grads, lr):
    """params[i] -= lr * grads[i] for i in range(n). Grid-stride loop, coalesced."""
    for i in range(cuda.grid(1), params.shape[0], cuda.gridsize(1)):
        params[i] -= lr * grads[i]


@cuda.jit
def _fill(x, value):
    """x[i] = value for i in range(n) (used by `zeros`). Grid-stride loop, coalesced."""
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        x[i] = value


# --- convolution as im2col + matmul, and max-pooling -------------------------------------------
#
# One thread per OUTPUT element in all four, so every store is a plain store by its only writer:
# the gradients are gathers (each dX pixel sums the window positions that read it) instead of
# scatters with atomicAdd. No atomics: deterministic, and the sums are added in the reference's
# order. Flat thread index e -> (b, y, x, c) with c fastest, so a warp's stores are consecutive
# addresses (coalesced), and so are most of its loads (neighbouring c, then neighbouring x).
# Ho = (H + 2 pad - kh) // stride + 1 is numpy_ops.conv_out itself, compiled as a device
# function (`_conv_out`); a flat index walks the 4-D arrays as `_unflatten` splits it.
# The pixel (y, x) is read by window row i at kernel row u exactly when
# i*stride + u - pad == y: u runs over (y + pad) % stride, that + stride, ... < kh, with
# i = (y + pad - u) // stride (exact), which must lie in [0, Ho); columns likewise.


_conv_out = cuda.jit(device=True)(conv_out)


@cuda.jit(device=True)
def _unflatten(e, n1, n2, n3):
    """(a, b, c, d) of the flat row-major index e into an array of shape (_, n1, n2, n3)."""
    r = e // n3
    d = e - r * n3
    r2 = r // n2
    c = r - r2 * n2
    a = r2 // n1
    return a, r2 - a * n1, c, d


@cuda.jit
def _im2col(X, kh, kw, stride, pad, cols):
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
def _col2im(cols, kh, kw, stride, pad, dX):
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
def _maxpool_forward(X, k, stride, Y, argmax):
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
def _maxpool_backward(dY, argmax, k, stride, dX):
    """dX[b, y, x, c] = the sum of dY over the windows whose argmax is (y, x), as
    numpy_ops.maxpool_backward.

    Optimisations: a gather as in _col2im (pad 0), one thread per pixel of dX, no atomics
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
_V = "float32[::1]"
_T = "float32[:, :, :, ::1]"  # an NHWC feature map
_I = "int32[:, :, :, ::1]"  # max-pooling's argmax
# Every kernel with one example signature: tests/test_cuda_compile.py compiles each to PTX.
KERNELS = [
    (_matmul_tiled, f"({_M}, {_M}, {_V}, {_M}, boolean, boolean)"),
    (_matmul_register_tiled, f"({_M}, {_M}, {_V}, {_M}, boolean, boolean)"),
    (_column_sum, f"({_M}, {_V})"),
    (_softmax_xent_rows, f"({_M}, int64[::1], {_M}, {_V})"),
    (_mean, f"({_V}, {_V})"),
    (_relu_forward, f"({_V}, {_V})"),
    (_relu_backward, f"({_V}, {_V}, {_V})"),
    (_add_into, f"({_V}, {_V})"),
    (_scale, f"({_V}, float32)"),
    (_sgd_step, f"({_V}, {_V}, float32)"),
    (_fill, f"({_V}, float32)"),
    (_im2col, f"({_T}, int64, int64, int64, int64, {_M})"),
    (_col2im, f"({_M}, int64, int64, int64, int64, {_T})"),
    (_maxpool_forward, f"({_T}, int64, int64, {_T}, {_I})"),
    (_maxpool_backward, f"({_T}, {_I}, int64, int64, {_T})"),
]


# ---------------------------------------------------------------------------------------------
# Launching, checking, scratch


_checked = False


def _launch(kernel, geometry, *args) -> None:
    """kernel[grid, block](*args): the one place every op launches a kernel.

    `geometry` is (grid, block) from cuda_support.launch_1d / launch_2d. The first launch checks
    that kernels can run here at all and says what to do if not (instead of a driver error).
    """
    global _checked
    if not _checked:
        problem = gpu_problem()
        if problem is not None:
            raise RuntimeError(f"cuda backend: {problem}")
        _checked = True
    grid, block = geometry
    kernel[grid, block](*args)


def _contiguous(x):
    """x itself, refused unless a C-contiguous device array: the kernels' index math (and the
    coalescing it is designed for) assumes row-major order."""
    if not x.is_c_contiguous():
        raise ValueError(
            f"cuda backend: expected a C-contiguous device array, got shape {x.shape} with "
            f"strides {x.strides}; pass a view of the flat parameter buffer or a fresh array"
        )
    return x


def _flat(x):
    """A 1-D view of a contiguous device array (the elementwise kernels index one axis)."""
    return _contiguous(x).reshape(x.size)


def _require_float32(op: str, *arrays, why: str = "stages tiles in float32 shared memory") -> None:
    for a in arrays:
        if a is not None and a.dtype != np.float32:
            raise TypeError(
                f"cuda backend: {op} {why} and takes float32 arrays only, got {a.dtype}; train "
                "in float32, or use the numpy backend for float64 gradient checks"
            )


_MAPS = "sums and compares feature maps in float32 (the training dtype)"


_scratch = threading.local()  # per thread: two threads' losses never share a buffer


def _scratch_f32(name: str, n: int):
    """A cached float32 device buffer of at least n elements, sliced to n.

    Why: the training loop must not allocate on the hot path; the buffer grows only when a
    larger batch arrives. Launches from one thread go to one stream, in order, so a buffer is
    never reused before the kernel reading it has run.
    """
    buf = getattr(_scratch, name, None)
    if buf is None or buf.shape[0] < n:
        buf = cuda.device_array(max(n, 1), dtype=np.float32)
        setattr(_scratch, name, buf)
    return buf[:n]


# ---------------------------------------------------------------------------------------------
# Allocation: the model keeps its activations and parameters on the device through these


def empty(shape, dtype=np.float32):
    """An uninitialised device array (cuda.device_array)."""
    return cuda.device_array(shape, dtype=np.dtype(dtype))


def zeros(shape, dtype=np.float32):
    """A device array of zeros, filled on the device (no host buffer, no transfer)."""
    x = empty(shape, dtype)
    if x.size:
        flat = x.reshape(x.size)
        _launch(_fill, launch_1d(x.size), flat, flat.dtype.type(0))
    return x


def to_device(host_array):
    """A device copy of a host array (made C-contiguous first: kernels index row-major)."""
    return cuda.to_device(np.ascontiguousarray(host_array))


def to_host(dev_array, out: np.ndarray | None = None) -> np.ndarray:
    """The device array copied to the host: into `out` when given (same shape and dtype)."""
    if out is None:
        return dev_array.copy_to_host()
    return dev_array.copy_to_host(out)


# ---------------------------------------------------------------------------------------------
# The ops (signatures as in numpy_ops)


def dense_forward(X, W, b, Y) -> None:
    """Y = X @ W + b: one tiled matmul with the bias fused in its epilogue."""
    _require_float32("dense_forward", X, W, b, Y)
    _matmul(X, W, b, Y, False, False)


def dense_backward(X, W, dY, dW, db, dX) -> None:
    """dW = X^T dY, db = column sums of dY, dX = dY W^T (skipped when dX is None).

    The two products reuse the forward kernel with a transpose flag: the tile loop, the
    barriers and the edge guards are written (and reviewed) once.
    """
    _require_float32("dense_backward", X, W, dY, dW, db, dX)
    no_bias = _scratch_f32("no_bias", 0)  # length 0: "no bias" to the kernel
    _matmul(X, dY, no_bias, dW, True, False)
    # launch_2d(1, n_out): one row of blocks, TILE columns each; the threads' y axis walks B.
    _launch(_column_sum, launch_2d(1, db.shape[0]), dY, db)
    if dX is not None:
        _matmul(dY, W, no_bias, dX, False, True)


def relu_forward(Z, A) -> None:
    _launch(_relu_forward, launch_1d(Z.size), _flat(Z), _flat(A))


def relu_backward(Z, dA, dZ) -> None:
    _launch(_relu_backward, launch_1d(Z.size), _flat(Z), _flat(dA), _flat(dZ))


def softmax_xent_grad(logits, y, dlogits) -> float:
    """Mean softmax cross-entropy (returned: the only device -> host copy, one float) and
    dlogits written on the device. Labels: a device or host int array (int64 or int32)."""
    _require_float32("softmax_xent_grad", logits, dlogits)
    B = logits.shape[0]
    if B == 0:
        return 0.0
    if not hasattr(y, "copy_to_host"):  # a host array: B labels, a small copy
        y = cuda.to_device(np.ascontiguousarray(y))
    row_loss = _scratch_f32("row_loss", B)
    loss = _scratch_f32("loss", 1)
    _launch(_softmax_xent_rows, (min(B, MAX_BLOCKS), ROW_THREADS), logits, y, dlogits, row_loss)
    _launch(_mean, (1, THREADS_PER_BLOCK), row_loss, loss)
    return float(loss.copy_to_host()[0])


def add_into(dst, src) -> None:
    _launch(_add_into, launch_1d(dst.size), _flat(dst), _flat(src))


def scale(x, alpha: float) -> None:
    # The scalar is cast to x's dtype here so the kernel multiplies float32 by float32.
    _launch(_scale, launch_1d(x.size), _flat(x), x.dtype.type(alpha))


def sgd_step(params, grads, lr: float) -> None:
    _launch(_sgd_step, launch_1d(params.size), _flat(params), _flat(grads), params.dtype.type(lr))


def im2col(X, kh: int, kw: int, stride: int, pad: int, cols) -> None:
    """Every kh x kw window of X as one row of cols: one thread per element of cols."""
    check_im2col("cuda", "im2col", X.shape, kh, kw, stride, pad, cols.shape)
    _require_float32("im2col", X, cols, why=_MAPS)
    X, cols = _contiguous(X), _contiguous(cols)
    if cols.size:  # an empty batch: nothing to write
        _launch(_im2col, launch_1d(cols.size), X, int(kh), int(kw), int(stride), int(pad), cols)


def col2im(cols, kh: int, kw: int, stride: int, pad: int, dX) -> None:
    """The adjoint of im2col, as a gather: one thread per pixel of dX, no atomics."""
    check_im2col("cuda", "col2im", dX.shape, kh, kw, stride, pad, cols.shape)
    _require_float32("col2im", cols, dX, why=_MAPS)
    cols, dX = _contiguous(cols), _contiguous(dX)
    if dX.size:
        _launch(_col2im, launch_1d(dX.size), cols, int(kh), int(kw), int(stride), int(pad), dX)


def maxpool_forward(X, k: int, stride: int, Y, argmax) -> None:
    """Max over each k x k window and its argmax: one thread per output element."""
    check_pool("cuda", "maxpool_forward", X.shape, k, stride, Y.shape, argmax)
    _require_float32("maxpool_forward", X, Y, why=_MAPS)
    X, Y, argmax = _contiguous(X), _contiguous(Y), _contiguous(argmax)
    if Y.size:
        _launch(_maxpool_forward, launch_1d(Y.size), X, int(k), int(stride), Y, argmax)


def maxpool_backward(dY, argmax, k: int, stride: int, dX) -> None:
    """Each dY back to where its max was, as a gather: one thread per pixel of dX, no atomics
    (windows overlap when stride < k)."""
    check_pool("cuda", "maxpool_backward", dX.shape, k, stride, dY.shape, argmax)
    _require_float32("maxpool_backward", dY, dX, why=_MAPS)
    dY, argmax, dX = _contiguous(dY), _contiguous(argmax), _contiguous(dX)
    if dX.size:
        _launch(_maxpool_backward, launch_1d(dX.size), dY, argmax, int(k), int(stride), dX)
