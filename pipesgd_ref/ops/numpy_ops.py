"""The NumPy reference ops: the *definition* of every named op.

Each function states its meaning as a plain loop in its docstring and implements it with
vectorised NumPy. The faster rungs (`numba_ops`, and later the CUDA kernels) must agree with
these on every input; the tests in tests/test_ops.py check exactly that.

Conventions shared by every backend:
- Outputs are written into preallocated arrays passed as `out` arguments (the training loop
  allocates once and reuses: no per-step allocation on the hot path).
- A dense layer stores W as (n_in, n_out) so that the forward pass is Y = X @ W + b with
  X (batch, n_in): rows are samples, which keeps each sample's features contiguous.
- The dtype is the caller's: float32 in training, float64 in gradient checks.
"""

from __future__ import annotations

import numpy as np


def dense_forward(X: np.ndarray, W: np.ndarray, b: np.ndarray, Y: np.ndarray) -> None:
    """Y = X @ W + b.

    As a loop: for i in batch, j in n_out: Y[i, j] = b[j] + sum_k X[i, k] * W[k, j].
    Shapes: X (B, n_in), W (n_in, n_out), b (n_out,), Y (B, n_out).
    """
    np.matmul(X, W, out=Y)
    Y += b


def dense_backward(
    X: np.ndarray,
    W: np.ndarray,
    dY: np.ndarray,
    dW: np.ndarray,
    db: np.ndarray,
    dX: np.ndarray | None,
) -> None:
    """Gradients of Y = X @ W + b given dL/dY.

    As loops:
        dW[k, j] = sum_i X[i, k] * dY[i, j]      (X^T dY)
        db[j]    = sum_i dY[i, j]
        dX[i, k] = sum_j dY[i, j] * W[k, j]      (dY W^T), skipped when dX is None
    Shapes: X (B, n_in), W (n_in, n_out), dY (B, n_out), dW like W, db like b, dX like X.
    """
    np.matmul(X.T, dY, out=dW)
    np.sum(dY, axis=0, out=db)
    if dX is not None:
        np.matmul(dY, W.T, out=dX)


def dense_input_grad(W: np.ndarray, dY: np.ndarray, dX: np.ndarray) -> None:
    """dX = dY W^T alone: dense_backward's third product, the same bits. A backward that hands
    each layer's weight gradient on as soon as it is written (ddp) computes dW and db first
    (dense_backward with dX None) and this after."""
    np.matmul(dY, W.T, out=dX)


def relu_forward(Z: np.ndarray, A: np.ndarray) -> None:
    """A = max(Z, 0), elementwise. Shapes: Z, A (B, n)."""
    np.maximum(Z, 0, out=A)


def relu_backward(Z: np.ndarray, dA: np.ndarray, dZ: np.ndarray) -> None:
    """dZ = dA where Z > 0 else 0 (the subgradient 0 at Z == 0). Shapes: all (B, n)."""
    np.multiply(dA, Z > 0, out=dZ)


def softmax_xent_grad(logits: np.ndarray, y: np.ndarray, dlogits: np.ndarray) -> float:
    """Mean softmax cross-entropy over the batch, and its gradient with respect to the logits.

    As a loop, for each row i (B rows, C classes), with m = max_j logits[i, j] for stability:
        p[i, j]       = exp(logits[i, j] - m) / sum_j' exp(logits[i, j'] - m)
        loss_i        = log(sum_j exp(logits[i, j] - m)) + m - logits[i, y[i]]
        dlogits[i, j] = (p[i, j] - [j == y[i]]) / B
    Returns mean_i loss_i as a Python float; writes dlogits (B, C). B == 0 gives loss 0.
    """
    B = logits.shape[0]
    if B == 0:
        return 0.0
    shifted = logits - logits.max(axis=1, keepdims=True)  # (B, C); max subtracted: no overflow
    exp = np.exp(shifted)
    sum_exp = exp.sum(axis=1, keepdims=True)  # (B, 1)
    rows = np.arange(B)
    loss = float(np.mean(np.log(sum_exp[:, 0]) - shifted[rows, y]))
    np.divide(exp, sum_exp * B, out=dlogits)
    dlogits[rows, y] -= 1.0 / B
    return loss


def add_into(dst: np.ndarray, src: np.ndarray) -> None:
    """dst += src, elementwise (the reduction step of every collective)."""
    np.add(dst, src, out=dst)


def scale(x: np.ndarray, alpha: float) -> None:
    """x *= alpha, elementwise (sum -> mean after an AllReduce)."""
    np.multiply(x, x.dtype.type(alpha), out=x)


def sgd_step(params: np.ndarray, grads: np.ndarray, lr: float) -> None:
    """params -= lr * grads, elementwise: plain SGD on the flat parameter vector."""
    # The product is formed in the params' dtype so float32 training never widens to float64.
    params -= params.dtype.type(lr) * grads


# --- convolution as im2col + matmul, and max-pooling (models/cnn.py) ------------------------
#
# Feature maps are NHWC: (B, H, W, C), so that a window's C channels are contiguous and the
# rows of im2col feed `dense_forward` directly (its output (B*Ho*Wo, K) is again NHWC).
# Output sizes: Ho = (H + 2 pad - kh) // stride + 1, Wo likewise (`conv_out`).


def conv_out(size: int, k: int, stride: int, pad: int) -> int:
    """Output length of a window of k, moved by stride, over size + 2 pad (no partial windows)."""
    return (size + 2 * pad - k) // stride + 1


def _taps(offset: int, count: int, stride: int) -> slice:
    """Where offset `offset` of a window falls in each of `count` windows moved by `stride`:
    offset, offset + stride, ..., offset + stride * (count - 1)."""
    return slice(offset, offset + stride * (count - 1) + 1, stride)


def im2col(X: np.ndarray, kh: int, kw: int, stride: int, pad: int, cols: np.ndarray) -> None:
    """Unroll every kh x kw window of X into one row of cols (zeros where it hangs over the
    padding).

    As a loop, for b, i < Ho, j < Wo, u < kh, v < kw, c < C:
        cols[(b*Ho + i)*Wo + j, (u*kw + v)*C + c] = X[b, i*stride + u - pad, j*stride + v - pad, c]
                                                   (0 when that row or column is outside X)
    Shapes: X (B, H, W, C), cols (B*Ho*Wo, kh*kw*C).
    """
    B, H, W, C = X.shape
    Ho, Wo = conv_out(H, kh, stride, pad), conv_out(W, kw, stride, pad)
    padded = np.zeros((B, H + 2 * pad, W + 2 * pad, C), X.dtype)
    padded[:, pad : pad + H, pad : pad + W, :] = X
    out = cols.reshape(B, Ho, Wo, kh, kw, C)
    for u in range(kh):
        for v in range(kw):
            out[:, :, :, u, v, :] = padded[:, _taps(u, Ho, stride), _taps(v, Wo, stride), :]


def col2im(cols: np.ndarray, kh: int, kw: int, stride: int, pad: int, dX: np.ndarray) -> None:
    """The adjoint of im2col: every entry of cols added back where im2col read it from.

    As a loop: dX = 0; for every (row, column) of cols whose source position
    (b, y, x, c) = (b, i*stride + u - pad, j*stride + v - pad, c) lies inside X:
        dX[b, y, x, c] += cols[(b*Ho + i)*Wo + j, (u*kw + v)*C + c]
    Windows that overlap (stride < kernel) add into the same pixel: the input gradient.
    Shapes: cols (B*Ho*Wo, kh*kw*C), dX (B, H, W, C).
    """
    B, H, W, C = dX.shape
    Ho, Wo = conv_out(H, kh, stride, pad), conv_out(W, kw, stride, pad)
    padded = np.zeros((B, H + 2 * pad, W + 2 * pad, C), dX.dtype)
    src = cols.reshape(B, Ho, Wo, kh, kw, C)
    for u in range(kh):
        for v in range(kw):
            padded[:, _taps(u, Ho, stride), _taps(v, Wo, stride), :] += src[:, :, :, u, v, :]
    dX[...] = padded[:, pad : pad + H, pad : pad + W, :]


def maxpool_forward(X: np.ndarray, k: int, stride: int, Y: np.ndarray, argmax: np.ndarray) -> None:
    """Max over each k x k window (no padding), and where it was.

    As a loop, for b, i < Ho, j < Wo, c < C (Ho = (H - k) // stride + 1):
        Y[b, i, j, c]      = max over u, v < k of X[b, i*stride + u, j*stride + v, c]
        argmax[b, i, j, c] = u*k + v of the first maximum in row-major (u, v) order
    Shapes: X (B, H, W, C), Y and argmax (B, Ho, Wo, C); argmax int32.
    """
    B, H, W, C = X.shape
    Ho, Wo = conv_out(H, k, stride, 0), conv_out(W, k, stride, 0)
    windows = np.empty((k * k, B, Ho, Wo, C), X.dtype)
    for u in range(k):
        for v in range(k):
            windows[u * k + v] = X[:, _taps(u, Ho, stride), _taps(v, Wo, stride), :]
    argmax[...] = np.argmax(windows, axis=0)  # the first maximum, as the loop says
    np.max(windows, axis=0, out=Y)


def maxpool_backward(
    dY: np.ndarray, argmax: np.ndarray, k: int, stride: int, dX: np.ndarray
) -> None:
    """The gradient of maxpool_forward: each dY goes to the position its max came from.

    As a loop: dX = 0; for b, i, j, c: (u, v) = divmod(argmax[b, i, j, c], k);
        dX[b, i*stride + u, j*stride + v, c] += dY[b, i, j, c]
    (+=: with stride < k one pixel can be the max of several windows.)
    Shapes: dY and argmax (B, Ho, Wo, C), dX (B, H, W, C).
    """
    B, Ho, Wo, C = dY.shape
    dX[...] = 0
    for u in range(k):
        for v in range(k):
            hit = argmax == u * k + v
            # one (u, v): distinct pixels for distinct windows, so += adds each once
            dX[:, _taps(u, Ho, stride), _taps(v, Wo, stride), :] += np.where(hit, dY, 0)


# --- batch normalisation and global average pooling (models/resnet.py) ----------------------
#
# Batch norm normalises each channel of an NHWC map over the batch AND the pixels: the map
# (B, H, W, C) is seen as rows X (N, C), N = B*H*W (a reshape, no copy), and every statistic is
# per column. Training mode uses the batch's own mean and biased variance; evaluation the
# running averages the model keeps beside its parameters (`running_average`).


def batchnorm_forward(
    X: np.ndarray,
    gamma: np.ndarray,
    beta: np.ndarray,
    eps: float,
    Y: np.ndarray,
    xhat: np.ndarray,
    mean: np.ndarray,
    var: np.ndarray,
) -> None:
    """Batch norm in training mode: each channel standardised with the batch's statistics,
    then scaled and shifted.

    As loops, for every channel c (N rows):
        mean[c]    = sum_n X[n, c] / N
        var[c]     = sum_n (X[n, c] - mean[c])^2 / N            (biased: divided by N)
        xhat[n, c] = (X[n, c] - mean[c]) / sqrt(var[c] + eps)
        Y[n, c]    = gamma[c] * xhat[n, c] + beta[c]
    xhat is kept for the backward. Shapes: X, Y, xhat (N, C); gamma, beta, mean, var (C,).
    """
    np.mean(X, axis=0, out=mean)
    np.subtract(X, mean, out=xhat)  # centred first: the variance of centred values is exact-er
    np.mean(np.square(xhat), axis=0, out=var)
    xhat *= 1.0 / np.sqrt(var + xhat.dtype.type(eps))
    np.multiply(xhat, gamma, out=Y)
    Y += beta


def batchnorm_backward(
    dY: np.ndarray,
    xhat: np.ndarray,
    gamma: np.ndarray,
    var: np.ndarray,
    eps: float,
    dX: np.ndarray,
    dgamma: np.ndarray,
    dbeta: np.ndarray,
) -> None:
    """The gradients of batchnorm_forward (training mode) given dL/dY.

    As loops, for every channel c, with inv = 1 / sqrt(var[c] + eps):
        dbeta[c]  = sum_n dY[n, c]
        dgamma[c] = sum_n dY[n, c] * xhat[n, c]
        dX[n, c]  = gamma[c] * inv * (dY[n, c] - dbeta[c] / N - xhat[n, c] * dgamma[c] / N)
    The last line is the chain rule through xhat = (x - mean) / sqrt(var + eps) with the mean
    and the variance functions of every x of the channel (models/resnet.py derives it).
    Shapes: dY, xhat, dX (N, C); gamma, var, dgamma, dbeta (C,).
    """
    N = dY.shape[0]
    np.sum(dY, axis=0, out=dbeta)
    np.sum(dY * xhat, axis=0, out=dgamma)
    if N == 0:
        return
    inv = 1.0 / np.sqrt(var + var.dtype.type(eps))
    # dX = gamma inv (dY - mean(dY) - xhat mean(dY xhat))
    np.multiply(xhat, dgamma / N, out=dX)
    np.subtract(dY, dX, out=dX)
    dX -= dbeta / N
    dX *= gamma * inv


def batchnorm_eval(
    X: np.ndarray,
    gamma: np.ndarray,
    beta: np.ndarray,
    mean: np.ndarray,
    var: np.ndarray,
    eps: float,
    Y: np.ndarray,
) -> None:
    """Batch norm in evaluation mode: the given (running) statistics instead of the batch's.

    As a loop: Y[n, c] = gamma[c] * (X[n, c] - mean[c]) / sqrt(var[c] + eps) + beta[c].
    Shapes: X, Y (N, C); gamma, beta, mean, var (C,) (mean and var may be float32 running
    statistics beside float64 weights: they are cast to X's dtype).
    """
    mean, var = mean.astype(X.dtype, copy=False), var.astype(X.dtype, copy=False)
    np.subtract(X, mean, out=Y)
    Y *= gamma / np.sqrt(var + X.dtype.type(eps))
    Y += beta


def running_average(running: np.ndarray, batch: np.ndarray, momentum: float, correction: float):
    """running = (1 - momentum) * running + momentum * correction * batch, elementwise.

    Batch norm's running statistics, as torch.nn.BatchNorm updates them: momentum 0.1, and
    correction N / (N - 1) for the variance (the unbiased estimate from the biased `var` of
    batchnorm_forward), 1 for the mean. Shapes: running, batch (C,); running is float32 (the
    model's buffers), batch any float dtype.
    """
    keep = running.dtype.type(1.0 - momentum)
    np.multiply(running, keep, out=running)
    running += (momentum * correction * batch).astype(running.dtype, copy=False)


def global_avgpool_forward(X: np.ndarray, Y: np.ndarray) -> None:
    """The mean of every channel over the whole map: (B, H, W, C) -> (B, C).

    As a loop: Y[b, c] = sum_{y, x} X[b, y, x, c] / (H * W).
    """
    np.mean(X, axis=(1, 2), out=Y)


def global_avgpool_backward(dY: np.ndarray, dX: np.ndarray) -> None:
    """The gradient of global_avgpool_forward: each pixel gets its channel's dY / (H * W).

    As a loop: dX[b, y, x, c] = dY[b, c] / (H * W). Shapes: dY (B, C), dX (B, H, W, C).
    """
    B, H, W, C = dX.shape
    dX[...] = (dY / dX.dtype.type(H * W))[:, None, None, :]
