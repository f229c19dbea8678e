"""CUDA versions of the named ops (Numba `cuda.jit`): same signatures and meaning as `numpy_ops`.

The third rung of the ladder numpy_ops -> numba_ops -> cuda_ops. Every argument is a Numba
CUDA device array (`to_device`, `empty`, `zeros` below make them); outputs are written into
preallocated device arrays, as in every backend. Only `softmax_xent_grad` returns to the host,
with one scalar (the loss). The labels `y` may be a device or a host int array (int64 from
the data sets, or int32); a host array is copied over (B integers).

This module is the host side: checks, scratch buffers, one launch per op. The kernels, each
with its loop, its optimisations and why, live by idea beside it:

    cuda_matmul.py       dense_forward / dense_backward: shared-memory tiles, register tiles
                         from 64 x 64 outputs, coalesced transposed reads, the bias fused
    cuda_softmax.py      softmax_xent_grad: one block per row, fused, tree reductions
    cuda_elementwise.py  relu, add_into, scale, sgd_step: grid-stride loops
    cuda_windows.py      im2col, col2im, max-pooling: one thread per output, gathers instead of
                         atomics (deterministic, bitwise NumPy's)
    cuda_norm.py         batch norm, its running averages, global average pooling: per-channel
                         sums in two deterministic stages (row chunks, then their partials)

Every reduction runs in a fixed order (no atomics), so repeated runs give identical bits.

dtype: the matrix kernels (dense_forward, dense_backward) stage tiles in float32 shared memory
and accept float32 only, the training dtype; gradient checks in float64 use the numpy backend.
The window ops take float32 maps (and an int32 argmax) only, likewise, and so do batch norm and
the pooling. The elementwise kernels take any float dtype.
"""

from __future__ import annotations

import threading

import numpy as np
from numba import cuda

from pipesgd_ref.ops.cuda_elementwise import (
    add_into_kernel,
    fill_kernel,
    relu_backward_kernel,
    relu_forward_kernel,
    scale_kernel,
    sgd_step_kernel,
)
from pipesgd_ref.ops.cuda_matmul import column_sum_kernel, matmul
from pipesgd_ref.ops.cuda_norm import (
    ROW_LANES,
    batchnorm_apply_kernel,
    batchnorm_input_grad_kernel,
    channel_tile,
    chunks,
    finish_sums_kernel,
    global_avgpool_backward_kernel,
    global_avgpool_forward_kernel,
    partial_sums_kernel,
    running_average_kernel,
)
from pipesgd_ref.ops.cuda_softmax import ROW_THREADS, mean_kernel, softmax_xent_rows_kernel
from pipesgd_ref.ops.cuda_support import (
    MAX_BLOCKS,
    THREADS_PER_BLOCK,
    ceil_div,
    launch,
    launch_1d,
    launch_2d,
)
from pipesgd_ref.ops.cuda_windows import (
    col2im_kernel,
    im2col_kernel,
    maxpool_backward_kernel,
    maxpool_forward_kernel,
)
from pipesgd_ref.ops.norms import check_avgpool, check_rows
from pipesgd_ref.ops.windows import check_im2col, check_pool

# ---------------------------------------------------------------------------------------------
# Checking, scratch


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
        launch(fill_kernel, launch_1d(x.size), flat, flat.dtype.type(0))
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
    matmul(X, W, b, Y, False, False)


def dense_backward(X, W, dY, dW, db, dX) -> None:
    """dW = X^T dY, db = column sums of dY, dX = dY W^T (skipped when dX is None).

    The two products reuse the forward kernel with a transpose flag: the tile loop, the
    barriers and the edge guards are written (and reviewed) once.
    """
    _require_float32("dense_backward", X, W, dY, dW, db, dX)
    no_bias = _scratch_f32("no_bias", 0)  # length 0: "no bias" to the kernel
    matmul(X, dY, no_bias, dW, True, False)
    # launch_2d(1, n_out): one row of blocks, TILE columns each; the threads' y axis walks B.
    launch(column_sum_kernel, launch_2d(1, db.shape[0]), dY, db)
    if dX is not None:
        matmul(dY, W, no_bias, dX, False, True)


def dense_input_grad(W, dY, dX) -> None:
    """dX = dY W^T: dense_backward's third product alone (the same kernel and flags)."""
    _require_float32("dense_input_grad", W, dY, dX)
    matmul(dY, W, _scratch_f32("no_bias", 0), dX, False, True)


def relu_forward(Z, A) -> None:
    launch(relu_forward_kernel, launch_1d(Z.size), _flat(Z), _flat(A))


def relu_backward(Z, dA, dZ) -> None:
    launch(relu_backward_kernel, launch_1d(Z.size), _flat(Z), _flat(dA), _flat(dZ))


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
    rows = (min(B, MAX_BLOCKS), ROW_THREADS)  # one block per row, grid-strided past MAX_BLOCKS
    launch(softmax_xent_rows_kernel, rows, logits, y, dlogits, row_loss)
    launch(mean_kernel, (1, THREADS_PER_BLOCK), row_loss, loss)
    return float(loss.copy_to_host()[0])


def add_into(dst, src) -> None:
    launch(add_into_kernel, launch_1d(dst.size), _flat(dst), _flat(src))


def scale(x, alpha: float) -> None:
    # The scalar is cast to x's dtype here so the kernel multiplies float32 by float32.
    launch(scale_kernel, launch_1d(x.size), _flat(x), x.dtype.type(alpha))


def sgd_step(params, grads, lr: float) -> None:
    lr = params.dtype.type(lr)  # as in scale: float32 times float32
    launch(sgd_step_kernel, launch_1d(params.size), _flat(params), _flat(grads), lr)


def im2col(X, kh: int, kw: int, stride: int, pad: int, cols) -> None:
    """Every kh x kw window of X as one row of cols: one thread per element of cols."""
    check_im2col("cuda", "im2col", X.shape, kh, kw, stride, pad, cols.shape)
    _require_float32("im2col", X, cols, why=_MAPS)
    X, cols = _contiguous(X), _contiguous(cols)
    if cols.size:  # an empty batch: nothing to write
        window = (int(kh), int(kw), int(stride), int(pad))
        launch(im2col_kernel, launch_1d(cols.size), X, *window, cols)


def col2im(cols, kh: int, kw: int, stride: int, pad: int, dX) -> None:
    """The adjoint of im2col, as a gather: one thread per pixel of dX, no atomics."""
    check_im2col("cuda", "col2im", dX.shape, kh, kw, stride, pad, cols.shape)
    _require_float32("col2im", cols, dX, why=_MAPS)
    cols, dX = _contiguous(cols), _contiguous(dX)
    if dX.size:
        window = (int(kh), int(kw), int(stride), int(pad))
        launch(col2im_kernel, launch_1d(dX.size), cols, *window, dX)


def maxpool_forward(X, k: int, stride: int, Y, argmax) -> None:
    """Max over each k x k window and its argmax: one thread per output element."""
    check_pool("cuda", "maxpool_forward", X.shape, k, stride, Y.shape, argmax)
    _require_float32("maxpool_forward", X, Y, why=_MAPS)
    X, Y, argmax = _contiguous(X), _contiguous(Y), _contiguous(argmax)
    if Y.size:
        launch(maxpool_forward_kernel, launch_1d(Y.size), X, int(k), int(stride), Y, argmax)


def maxpool_backward(dY, argmax, k: int, stride: int, dX) -> None:
    """Each dY back to where its max was, as a gather: one thread per pixel of dX, no atomics
    (windows overlap when stride < k)."""
    check_pool("cuda", "maxpool_backward", dX.shape, k, stride, dY.shape, argmax)
    _require_float32("maxpool_backward", dY, dX, why=_MAPS)
    dY, argmax, dX = _contiguous(dY), _contiguous(argmax), _contiguous(dX)
    if dX.size:
        launch(maxpool_backward_kernel, launch_1d(dX.size), dY, argmax, int(k), int(stride), dX)


# ---------------------------------------------------------------------------------------------
# Batch norm and global average pooling (kernels in cuda_norm.py)


def _channel_sums(A, B, center, mode: int, scale, out, scratch: str) -> None:
    """out[c] = scale * the sum over the rows of A of partial_sums_kernel's `mode` term, in
    two launches: the row chunks' partial sums into a cached scratch, then their sum."""
    N, C = A.shape
    R = chunks(N)
    partial = _scratch_f32(scratch, R * C).reshape(R, C)
    T = channel_tile(C)
    grid = ((ceil_div(C, T), R), (T, ROW_LANES))
    launch(partial_sums_kernel, grid, A, B, center, mode, partial)
    launch(finish_sums_kernel, _launch_small(C), partial, np.float32(scale), out)


def _launch_small(n: int) -> tuple[int, int]:
    """launch_1d, but below THREADS_PER_BLOCK elements (a per-channel vector, a tiny map) one
    block of as few whole warps as cover n, instead of 256 threads of which most would idle
    (and each costs the simulator); from 256 elements on, launch_1d's geometry itself."""
    return launch_1d(n, min(THREADS_PER_BLOCK, 32 * ceil_div(max(n, 1), 32)))


def _inv(n: int):
    return np.float32(1.0 / n) if n else np.float32(np.nan)  # an empty batch: NaN, as NumPy's


def batchnorm_forward(X, gamma, beta, eps: float, Y, xhat, mean, var) -> None:
    """Training-mode batch norm: the mean, then the variance around it (two-stage channel
    sums each), then one elementwise pass writing xhat and Y."""
    rows, vectors = {"X": X.shape, "Y": Y.shape, "xhat": xhat.shape}, {"gamma": gamma.shape,
               "beta": beta.shape, "mean": mean.shape, "var": var.shape}  # fmt: skip
    check_rows("cuda", "batchnorm_forward", rows, vectors)
    _require_float32("batchnorm_forward", X, gamma, beta, Y, xhat, mean, var, why=_MAPS)
    N, C = X.shape
    if C == 0:
        return
    inv_n = _inv(N)
    _channel_sums(X, X, mean, 0, inv_n, mean, "bn_partial")  # mean = sum X / N
    _channel_sums(X, X, mean, 1, inv_n, var, "bn_partial")  # var = sum (X - mean)^2 / N
    if N:
        args = (X, gamma, beta, mean, var, np.float32(eps), xhat, Y, 1)
        launch(batchnorm_apply_kernel, _launch_small(N * C), *args)


def batchnorm_backward(dY, xhat, gamma, var, eps: float, dX, dgamma, dbeta) -> None:
    """dbeta and dgamma as two-stage channel sums, then dX elementwise from them."""
    rows = {"dY": dY.shape, "xhat": xhat.shape, "dX": dX.shape}
    vectors = {"gamma": gamma.shape, "var": var.shape, "dgamma": dgamma.shape,
               "dbeta": dbeta.shape}  # fmt: skip
    check_rows("cuda", "batchnorm_backward", rows, vectors)
    _require_float32("batchnorm_backward", dY, xhat, gamma, var, dX, dgamma, dbeta, why=_MAPS)
    N, C = dY.shape
    if C == 0:
        return
    _channel_sums(dY, dY, var, 0, 1.0, dbeta, "bn_partial")  # dbeta = sum dY
    _channel_sums(dY, xhat, var, 2, 1.0, dgamma, "bn_partial2")  # dgamma = sum dY xhat
    if N:
        args = (dY, xhat, gamma, var, np.float32(eps), dbeta, dgamma, _inv(N), dX)
        launch(batchnorm_input_grad_kernel, _launch_small(N * C), *args)


def batchnorm_eval(X, gamma, beta, mean, var, eps: float, Y) -> None:
    """Evaluation-mode batch norm with the given (running) statistics: one elementwise pass."""
    vectors = {"gamma": gamma.shape, "beta": beta.shape, "mean": mean.shape, "var": var.shape}
    check_rows("cuda", "batchnorm_eval", {"X": X.shape, "Y": Y.shape}, vectors)
    _require_float32("batchnorm_eval", X, gamma, beta, mean, var, Y, why=_MAPS)
    if X.size:  # Y stands in for xhat, which evaluation does not keep (keep_xhat 0)
        args = (X, gamma, beta, mean, var, np.float32(eps), Y, Y, 0)
        launch(batchnorm_apply_kernel, _launch_small(X.size), *args)


def running_average(running, batch, momentum: float, correction: float) -> None:
    """running = (1 - momentum) running + momentum correction batch, one thread per channel."""
    if running.shape != batch.shape:
        raise ValueError(
            f"cuda backend: running_average: running {running.shape} and batch {batch.shape} "
            "must be the same per-channel vector"
        )
    _require_float32("running_average", running, batch, why=_MAPS)
    if running.size:
        args = (_flat(running), _flat(batch), np.float32(momentum), np.float32(correction))
        launch(running_average_kernel, _launch_small(running.size), *args)


def global_avgpool_forward(X, Y) -> None:
    """The mean of each channel over the map: one thread per (b, c)."""
    check_avgpool("cuda", "global_avgpool_forward", X.shape, Y.shape)
    _require_float32("global_avgpool_forward", X, Y, why=_MAPS)
    if Y.size:
        launch(global_avgpool_forward_kernel, _launch_small(Y.size), _contiguous(X), _contiguous(Y))


def global_avgpool_backward(dY, dX) -> None:
    """dY / (H W) to every pixel of its channel: one thread per element of dX."""
    check_avgpool("cuda", "global_avgpool_backward", dX.shape, dY.shape)
    _require_float32("global_avgpool_backward", dY, dX, why=_MAPS)
    if dX.size:
        args = (_contiguous(dY), _contiguous(dX))
        launch(global_avgpool_backward_kernel, _launch_small(dX.size), *args)
