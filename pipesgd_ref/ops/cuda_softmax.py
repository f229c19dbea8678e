"""The loss as CUDA kernels: softmax cross-entropy and its gradient per row, then the mean.

`softmax_xent_rows_kernel` is fused: one block per row finds the row's max, the sum of exp and
writes the gradient in one kernel (the row's logits read three times, from cache after the
first; no probabilities stored). The max, the sums and the mean are tree reductions in shared
memory in a fixed order (no atomics), so repeated runs give identical bits.
"""

from __future__ import annotations

import math
from typing import no_type_check

from numba import cuda, float32

from pipesgd_ref.ops.cuda_support import THREADS_PER_BLOCK

ROW_THREADS = 32  # softmax: one warp per row; a row has C classes (10 here), rarely more than 32


@cuda.jit(device=True)
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
def _block_sum(buf, tid, n_threads):
    """Tree sum of buf[0:n_threads] (n_threads a power of two) into buf[0], in shared memory."""
    half = n_threads // 2
    while half > 0:
        if tid < half:
            buf[tid] += buf[tid + half]
        cuda.syncthreads()
        half //= 2


@cuda.jit(device=True)
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
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
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
def softmax_xent_rows_kernel(logits, y, dlogits, row_loss):
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
@no_type_check  # a Numba kernel: its body is typed by Numba, not by mypy
def mean_kernel(x, out):
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


_M = "float32[:, ::1]"
_V = "float32[::1]"
# Every kernel with one example signature: tests/test_cuda_compile.py compiles each to PTX.
KERNELS = [
    (softmax_xent_rows_kernel, f"({_M}, int64[::1], {_M}, {_V})"),
    (mean_kernel, f"({_V}, {_V})"),
]
