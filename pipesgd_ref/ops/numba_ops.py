"""Numba CPU versions of the named ops: same signatures and meaning as `numpy_ops`.

Optimisations, and why:
- `njit(nogil=True)`: the compiled loop releases the GIL, so Pipe-SGD's compute thread runs
  while the communication thread is in a socket call in the same process.
- `cache=True`: compiled code is stored beside the module, so spawned worker processes load it
  instead of recompiling (about a second per process otherwise).
- Loop order i-k-j in the matrix multiplies: the innermost loop walks a row of W (or of dY)
  contiguously, which the compiler vectorises.
- Fusion: softmax-cross-entropy computes max, exp, sum, loss and gradient in two passes over a
  row without temporaries; `sgd_step`, `add_into` and `scale` are single passes.

Accumulations run in a fixed order (the dX dot products in float64), so results are deterministic;
they differ from NumPy's (BLAS) summation order only by float rounding.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

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
    for i in range(B):
        for k in range(n_in):
            acc = 0.0  # float64 accumulator; rounded once on the store below
            for j in range(n_out):  # row k of W and row i of dY: both contiguous
                acc += dY[i, j] * W[k, j]
            dX[i, k] = acc


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


def _flat(x: np.ndarray) -> np.ndarray:
    """A 1-D view of a contiguous array; refuse a copy, which would silently drop the writes."""
    if not x.flags.c_contiguous:
        raise ValueError(
            f"numba backend: expected a C-contiguous array, got shape {x.shape} with strides "
            f"{x.strides}; pass np.ascontiguousarray(x) or a view of the flat parameter buffer"
        )
    return x.reshape(-1)


def dense_forward(X, W, b, Y) -> None:
    _dense_forward(X, W, b, Y)


def dense_backward(X, W, dY, dW, db, dX) -> None:
    _dense_backward_weights(X, dY, dW, db)
    if dX is not None:
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


# TEMPORARY (branch wt-cnn only, replaced before merge): the NumPy definitions stand in
from pipesgd_ref.ops.numpy_ops import col2im, im2col, maxpool_backward, maxpool_forward  # noqa: E402,F401
