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
