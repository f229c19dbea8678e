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
