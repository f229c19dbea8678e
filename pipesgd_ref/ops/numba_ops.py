"""Numba CPU versions of the named ops: same signatures and meaning as `numpy_ops`.

Optimisations, and why:
- `njit(nogil=True)`: the compiled loop releases the GIL, so Pipe-SGD's compute thread runs
  while the communication thread is in a socket call in the same process.
- `cache=True`: compiled code is stored beside the module, so spawned worker processes load it
  instead of recompiling (about a second per process otherwise).
- Loop order i-k-j in the matrix multiplies: the innermost loop walks a row of W (or of dY)
  contiguously, which the compiler vectorises; dX = dY W^T walks a copy of W^T the same way,
  with a row of float64 accumulators.
- Fusion: softmax-cross-entropy computes max, exp, sum, loss and gradient in two passes over a
  row without temporaries; `sgd_step`, `add_into` and `scale` are single passes.
- Window ops (im2col, col2im, max-pooling) on NHWC maps: the innermost loop walks the C
  contiguous channels of a pixel; padding is a bounds test, never a padded copy of the map;
  the gradients are gathers (each pixel of dX sums what reads it, written once).

Accumulations run in a fixed order (the dX dot products in float64), so results are deterministic;
they differ from NumPy's (BLAS) summation order only by float rounding. The window ops are
bitwise equal to NumPy: copies and compares, and sums in the reference's (u, v) order.
Batch norm and average pooling sum each channel in float64 in row order (NumPy sums float32
pairwise, in float32): equal to NumPy within float32 rounding, not bitwise.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from pipesgd_ref.ops.norms import check_avgpool, check_rows
from pipesgd_ref.ops.numpy_ops import conv_out
from pipesgd_ref.ops.windows import check_im2col, check_pool

_jit = njit(nogil=True, cache=True)


@_jit
def _dense_forward(X, W, b, Y):
    B, n_in = X.shape
    n_out = W.shape[1]
    for i in range(B):
        for j in range(n_out):
            Y[i, j] = b[j]
        for k in range(n_in):
            x = X[i, k]
            for j in range(n_out):  # contiguous in W and Y: vectorised
                Y[i, j] += x * W[k, j]


@_jit
def _dense_backward_weights(X, dY, dW, db):
    B, n_in = X.shape
    n_out = dY.shape[1]
    dW[:, :] = 0
    db[:] = 0
    for i in range(B):
        for j in range(n_out):
            db[j] += dY[i, j]
        for k in range(n_in):
            x = X[i, k]
            for j in range(n_out):
                dW[k, j] += x * dY[i, j]


@_jit
def _dense_backward_input(W, dY, dX):
    B, n_out = dY.shape
    n_in = W.shape[0]
    # dX[i, k] = sum_j dY[i, j] W[k, j], accumulated in float64 in j order. Loop order i-j-k
    # over a contiguous copy of W^T (n_out x n_in: a small copy beside B n_in n_out products):
    # the innermost loop updates n_in independent accumulators from one contiguous row
    # (vectorised), where a k-then-j dot product waits on each add in turn. The same products
    # (rounded in the inputs' dtype) added in the same order: the same bits.
    WT = np.ascontiguousarray(W.T)
    acc = np.empty(n_in)  # float64 accumulators of row i; rounded once on the store below
    for i in range(B):
        acc[:] = 0.0
        for j in range(n_out):
            d = dY[i, j]  # the inputs' dtype: the product is rounded as before, then widened
            for k in range(n_in):  # row j of W^T and acc: both contiguous
                acc[k] += d * WT[j, k]
        for k in range(n_in):
            dX[i, k] = acc[k]


@_jit
def _relu_forward(z, a):
    for i in range(z.size):
        a[i] = z[i] if z[i] > 0 else 0


@_jit
def _relu_backward(z, da, dz):
    for i in range(z.size):
        dz[i] = da[i] if z[i] > 0 else 0


@_jit
def _softmax_xent_grad(logits, y, dlogits):
    B, C = logits.shape
    if B == 0:
        return 0.0
    total = 0.0  # float64 accumulator for the loss: B terms, reported not differentiated
    inv_B = 1.0 / B
    for i in range(B):
        m = logits[i, 0]
        for j in range(1, C):
            m = max(m, logits[i, j])
        s = 0.0
        for j in range(C):  # pass 1: exponentials into dlogits, their sum
            e = math.exp(logits[i, j] - m)
            dlogits[i, j] = e
            s += e
        total += math.log(s) + m - logits[i, y[i]]
        scale_row = inv_B / s
        for j in range(C):  # pass 2: normalise in place, subtract the one-hot
            dlogits[i, j] *= scale_row
        dlogits[i, y[i]] -= inv_B
    return total * inv_B


@_jit
def _add_into(dst, src):
    for i in range(dst.size):
        dst[i] += src[i]


@_jit
def _scale(x, alpha):
    for i in range(x.size):
        x[i] *= alpha


@_jit
def _sgd_step(params, grads, lr):
    for i in range(params.size):
        params[i] -= lr * grads[i]


# --- convolution as im2col + matmul, and max-pooling ------------------------------------------
#
# NHWC maps, so the C channels of one pixel are contiguous in the map and in a row of cols: the
# innermost loop of every kernel below walks them (a vectorised copy, compare or add).
# Ho = (H + 2 pad - kh) // stride + 1 is numpy_ops.conv_out itself, compiled (`_conv_out`).
#
# The gradients (col2im, maxpool_backward) are gathers: each pixel of dX sums the window
# positions that read it, in the (u, v) row-major order in which the reference adds them into
# its zeroed buffer, so the float sums are rounded in the same order: bitwise equal. The pixel
# (y, x) is read by window row i at kernel row u exactly when i*stride + u - pad == y, so u runs
# over (y + pad) % stride, that + stride, ... < kh, with i = (y + pad - u) // stride, which must
# lie in [0, Ho); columns likewise.


_conv_out = _jit(conv_out)


@_jit
def _im2col(X, kh, kw, stride, pad, cols):
    B, H, W, C = X.shape
    Ho, Wo = _conv_out(H, kh, stride, pad), _conv_out(W, kw, stride, pad)
    for b in range(B):
        for i in range(Ho):
            for j in range(Wo):
                row = (b * Ho + i) * Wo + j  # rows written in order: cols is streamed once
                for u in range(kh):
                    y = i * stride + u - pad
                    for v in range(kw):
                        x = j * stride + v - pad
                        col0 = (u * kw + v) * C
                        if 0 <= y < H and 0 <= x < W:
                            for c in range(C):  # C contiguous values in both arrays
                                cols[row, col0 + c] = X[b, y, x, c]
                        else:  # the window hangs over the padding: no padded copy of X needed
                            for c in range(C):
                                cols[row, col0 + c] = 0


@_jit
def _col2im(cols, kh, kw, stride, pad, dX):
    B, H, W, C = dX.shape
    Ho, Wo = _conv_out(H, kh, stride, pad), _conv_out(W, kw, stride, pad)
    for b in range(B):
        for y in range(H):
            for x in range(W):
                for c in range(C):
                    dX[b, y, x, c] = 0
                for u in range((y + pad) % stride, kh, stride):  # the rows that read y
                    i = (y + pad - u) // stride  # exact: u = y + pad (mod stride)
                    if i < 0 or i >= Ho:
                        continue
                    for v in range((x + pad) % stride, kw, stride):
                        j = (x + pad - v) // stride
                        if j < 0 or j >= Wo:
                            continue
                        row = (b * Ho + i) * Wo + j
                        col0 = (u * kw + v) * C
                        for c in range(C):  # added in dX's dtype, (u, v) in reference order
                            dX[b, y, x, c] += cols[row, col0 + c]


@_jit
def _maxpool_forward(X, k, stride, Y, argmax):
    B, Ho, Wo, C = Y.shape
    for b in range(B):
        for i in range(Ho):
            for j in range(Wo):
                y0, x0 = i * stride, j * stride
                for c in range(C):
                    Y[b, i, j, c] = X[b, y0, x0, c]
                    argmax[b, i, j, c] = 0
                for u in range(k):
                    for v in range(k):
                        for c in range(C):
                            val = X[b, y0 + u, x0 + v, c]
                            m = Y[b, i, j, c]
                            # Strict >: a tie keeps the first maximum. A NaN wins once and then
                            # stays, as in np.max / np.argmax: a diverged input is not hidden.
                            if val > m or (val != val and m == m):
                                Y[b, i, j, c] = val
                                argmax[b, i, j, c] = u * k + v


@_jit
def _maxpool_backward(dY, argmax, k, stride, dX):
    B, H, W, C = dX.shape
    Ho, Wo = dY.shape[1], dY.shape[2]
    for b in range(B):
        for y in range(H):
            for x in range(W):
                for c in range(C):
                    dX[b, y, x, c] = 0  # also the pixels no window covers (H - k % stride)
                for u in range(y % stride, k, stride):  # pad 0: the gather of _col2im
                    i = (y - u) // stride
                    if i < 0 or i >= Ho:
                        continue
                    for v in range(x % stride, k, stride):
                        j = (x - v) // stride
                        if j < 0 or j >= Wo:
                            continue
                        hit = u * k + v
                        for c in range(C):
                            if argmax[b, i, j, c] == hit:  # this window's max was here
                                dX[b, y, x, c] += dY[b, i, j, c]


# --- batch norm and global average pooling ---------------------------------------------------
#
# Rows X (N, C) of an NHWC map: the inner loop walks the C channels of one pixel (contiguous),
# with one float64 accumulator per channel, so every statistic is a single pass over the rows.


@_jit
def _batchnorm_forward(X, gamma, beta, eps, Y, xhat, mean, var):
    N, C = X.shape
    acc = np.zeros(C)  # float64 per channel: N float32 terms summed without drift
    for n in range(N):
        for c in range(C):
            acc[c] += X[n, c]
    for c in range(C):
        mean[c] = acc[c] / N if N > 0 else np.nan
        acc[c] = 0.0
    for n in range(N):  # pass 2: the variance of the centred values (no cancellation)
        for c in range(C):
            d = X[n, c] - mean[c]
            acc[c] += d * d
    inv = np.empty(C)
    for c in range(C):
        var[c] = acc[c] / N if N > 0 else np.nan
        inv[c] = 1.0 / math.sqrt(var[c] + eps)
    for n in range(N):  # pass 3: normalise, scale, shift (fused)
        for c in range(C):
            h = (X[n, c] - mean[c]) * inv[c]
            xhat[n, c] = h
            Y[n, c] = gamma[c] * h + beta[c]


@_jit
def _batchnorm_backward(dY, xhat, gamma, var, eps, dX, dgamma, dbeta):
    N, C = dY.shape
    sum_dy, sum_dyx = np.zeros(C), np.zeros(C)  # float64 per channel
    for n in range(N):  # one pass for both sums
        for c in range(C):
            sum_dy[c] += dY[n, c]
            sum_dyx[c] += dY[n, c] * xhat[n, c]
    k = np.empty(C)
    for c in range(C):
        dbeta[c] = sum_dy[c]
        dgamma[c] = sum_dyx[c]
        k[c] = gamma[c] / math.sqrt(var[c] + eps)
        if N > 0:
            sum_dy[c] /= N  # now mean(dY)
            sum_dyx[c] /= N  # now mean(dY * xhat)
    for n in range(N):  # dX = gamma inv (dY - mean(dY) - xhat mean(dY xhat)), fused
        for c in range(C):
            dX[n, c] = k[c] * (dY[n, c] - sum_dy[c] - xhat[n, c] * sum_dyx[c])


@_jit
def _batchnorm_eval(X, gamma, beta, mean, var, eps, Y):
    N, C = X.shape
    scale, shift = np.empty(C), np.empty(C)
    for c in range(C):  # the affine map of each channel, once
        scale[c] = gamma[c] / math.sqrt(var[c] + eps)
        shift[c] = beta[c] - mean[c] * scale[c]
    for n in range(N):
        for c in range(C):
            Y[n, c] = X[n, c] * scale[c] + shift[c]


@_jit
def _running_average(running, batch, momentum, correction):
    for c in range(running.size):
        running[c] = (1.0 - momentum) * running[c] + momentum * correction * batch[c]


@_jit
def _global_avgpool_forward(X, Y):
    B, H, W, C = X.shape
    acc = np.zeros(C)
    for b in range(B):
        acc[:] = 0.0
        for y in range(H):
            for x in range(W):
                for c in range(C):  # the channels of one pixel: contiguous
                    acc[c] += X[b, y, x, c]
        for c in range(C):
            Y[b, c] = acc[c] / (H * W)


@_jit
def _global_avgpool_backward(dY, dX):
    B, H, W, C = dX.shape
    for b in range(B):
        for y in range(H):
            for x in range(W):
                for c in range(C):
                    dX[b, y, x, c] = dY[b, c] / (H * W)


def _contiguous(x: np.ndarray) -> np.ndarray:
    """x itself, refused unless C-contiguous: a flat copy would silently drop the writes, and
    the window loops walk C order (a strided view would compile a second, slower loop)."""
    if not x.flags.c_contiguous:
        raise ValueError(
            f"numba backend: expected a C-contiguous array, got shape {x.shape} with strides "
            f"{x.strides}; pass np.ascontiguousarray(x) or a view of the flat parameter buffer"
        )
    return x


def _flat(x: np.ndarray) -> np.ndarray:
    """A 1-D view of a contiguous array (never a copy: see _contiguous)."""
    return _contiguous(x).reshape(-1)


def dense_forward(X, W, b, Y) -> None:
    _dense_forward(X, W, b, Y)


def dense_backward(X, W, dY, dW, db, dX) -> None:
    _dense_backward_weights(X, dY, dW, db)
    if dX is not None:
        _dense_backward_input(W, dY, dX)


def dense_input_grad(W, dY, dX) -> None:
    _dense_backward_input(W, dY, dX)


def relu_forward(Z, A) -> None:
    _relu_forward(_flat(Z), _flat(A))


def relu_backward(Z, dA, dZ) -> None:
    _relu_backward(_flat(Z), _flat(dA), _flat(dZ))


def softmax_xent_grad(logits, y, dlogits) -> float:
    return float(_softmax_xent_grad(logits, np.ascontiguousarray(y, dtype=np.int64), dlogits))


def add_into(dst, src) -> None:
    _add_into(_flat(dst), _flat(src))


def scale(x, alpha: float) -> None:
    # The scalar is cast to x's dtype here so the kernel multiplies float32 by float32.
    _scale(_flat(x), x.dtype.type(alpha))


def sgd_step(params, grads, lr: float) -> None:
    _sgd_step(_flat(params), _flat(grads), params.dtype.type(lr))


def im2col(X, kh: int, kw: int, stride: int, pad: int, cols) -> None:
    check_im2col("numba", "im2col", X.shape, kh, kw, stride, pad, cols.shape)
    _im2col(_contiguous(X), int(kh), int(kw), int(stride), int(pad), _contiguous(cols))


def col2im(cols, kh: int, kw: int, stride: int, pad: int, dX) -> None:
    check_im2col("numba", "col2im", dX.shape, kh, kw, stride, pad, cols.shape)
    _col2im(_contiguous(cols), int(kh), int(kw), int(stride), int(pad), _contiguous(dX))


def maxpool_forward(X, k: int, stride: int, Y, argmax) -> None:
    check_pool("numba", "maxpool_forward", X.shape, k, stride, Y.shape, argmax)
    _maxpool_forward(_contiguous(X), int(k), int(stride), _contiguous(Y), _contiguous(argmax))


def maxpool_backward(dY, argmax, k: int, stride: int, dX) -> None:
    check_pool("numba", "maxpool_backward", dX.shape, k, stride, dY.shape, argmax)
    _maxpool_backward(_contiguous(dY), _contiguous(argmax), int(k), int(stride), _contiguous(dX))


def batchnorm_forward(X, gamma, beta, eps: float, Y, xhat, mean, var) -> None:
    rows, vectors = {"X": X.shape, "Y": Y.shape, "xhat": xhat.shape}, {"gamma": gamma.shape,
               "beta": beta.shape, "mean": mean.shape, "var": var.shape}  # fmt: skip
    check_rows("numba", "batchnorm_forward", rows, vectors)
    args = (_contiguous(X), _contiguous(gamma), _contiguous(beta), float(eps), _contiguous(Y))
    _batchnorm_forward(*args, _contiguous(xhat), _contiguous(mean), _contiguous(var))


def batchnorm_backward(dY, xhat, gamma, var, eps: float, dX, dgamma, dbeta) -> None:
    rows = {"dY": dY.shape, "xhat": xhat.shape, "dX": dX.shape}
    vectors = {"gamma": gamma.shape, "var": var.shape, "dgamma": dgamma.shape,
               "dbeta": dbeta.shape}  # fmt: skip
    check_rows("numba", "batchnorm_backward", rows, vectors)
    args = (_contiguous(dY), _contiguous(xhat), _contiguous(gamma), _contiguous(var), float(eps))
    _batchnorm_backward(*args, _contiguous(dX), _contiguous(dgamma), _contiguous(dbeta))


def batchnorm_eval(X, gamma, beta, mean, var, eps: float, Y) -> None:
    vectors = {"gamma": gamma.shape, "beta": beta.shape, "mean": mean.shape, "var": var.shape}
    check_rows("numba", "batchnorm_eval", {"X": X.shape, "Y": Y.shape}, vectors)
    args = (_contiguous(X), _contiguous(gamma), _contiguous(beta), _contiguous(mean))
    _batchnorm_eval(*args, _contiguous(var), float(eps), _contiguous(Y))


def running_average(running, batch, momentum: float, correction: float) -> None:
    if running.shape != batch.shape:
        raise ValueError(
            f"numba backend: running_average: running {running.shape} and batch {batch.shape} "
            "must be the same per-channel vector"
        )
    _running_average(_flat(running), _flat(batch), float(momentum), float(correction))


def global_avgpool_forward(X, Y) -> None:
    check_avgpool("numba", "global_avgpool_forward", X.shape, Y.shape)
    _global_avgpool_forward(_contiguous(X), _contiguous(Y))


def global_avgpool_backward(dY, dX) -> None:
    check_avgpool("numba", "global_avgpool_backward", dX.shape, dY.shape)
    _global_avgpool_backward(_contiguous(dY), _contiguous(dX))
