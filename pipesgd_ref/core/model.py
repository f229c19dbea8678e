"""The arithmetic every method shares: the model, its gradient, the minibatches, the step.

An MLP with ReLU hidden layers and a softmax cross-entropy loss. All its parameters live in ONE
flat float32 vector, its gradient in a second one of the same layout, so the AllReduce sees one
array whatever the layers are (production systems call this a fused tensor):

    params: [ W0 (n_in x h0) | b0 (h0) | W1 (h0 x h1) | b1 (h1) | ... ]    views, no copies

Every line below is written with the same NumPy calls, in the same order, as the product's
reference ops (pipesgd_ref/ops/numpy_ops.py), so the two compute the same bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import numpy as np


class MLP:
    """X (B, n_in) -> [dense -> ReLU] x len(hidden) -> dense -> logits (B, n_classes)."""

    def __init__(self, n_features: int, n_classes: int, hidden: tuple[int, ...] = (64,)):
        self.widths = (n_features, *hidden, n_classes)  # layer l maps widths[l] -> widths[l+1]
        self.n_params = sum(a * b + b for a, b in pairwise(self.widths))

    def layers(self, flat: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """(W_l, b_l) of each layer: views into `flat` (writing one writes `flat`)."""
        out, at = [], 0
        for n_in, n_out in pairwise(self.widths):
            W = flat[at : at + n_in * n_out].reshape(n_in, n_out)
            b = flat[at + n_in * n_out : at + n_in * n_out + n_out]
            out.append((W, b))
            at += n_in * n_out + n_out
        return out

    def init_params(self, seed: int) -> np.ndarray:
        """w_0 from the seed alone, so every rank builds the same one and nothing is
        broadcast: He-normal weights (variance 2 / fan_in), zero biases."""
        rng = np.random.default_rng(seed)
        params = np.zeros(self.n_params, np.float32)
        for (W, _), fan_in in zip(self.layers(params), self.widths[:-1], strict=True):
            W[...] = rng.normal(0.0, np.sqrt(2.0 / fan_in), W.shape)
        return params

    def forward(self, params: np.ndarray, X: np.ndarray) -> tuple[list, list]:
        """Z[l] = A[l] W_l + b_l (pre-activations) and A[l] (inputs: A[0] = X,
        A[l+1] = relu(Z[l]))."""
        layers = self.layers(params)
        A, Z = [np.ascontiguousarray(X, np.float32)], []
        for l, (W, b) in enumerate(layers):
            z = np.matmul(A[l], W)
            z += b
            Z.append(z)
            if l < len(layers) - 1:
                A.append(np.maximum(z, 0))
        return Z, A

    def loss_and_grad(self, params: np.ndarray, X, y, grads: np.ndarray) -> float:
        """Mean cross-entropy of softmax(logits) against y; d loss / d params into `grads`."""
        Z, A = self.forward(params, X)
        B = len(y)
        # softmax and cross-entropy fused: dL/dlogits = (softmax - onehot(y)) / B
        shifted = Z[-1] - Z[-1].max(axis=1, keepdims=True)  # the max subtracted: no overflow
        exp = np.exp(shifted)
        sum_exp = exp.sum(axis=1, keepdims=True)
        rows = np.arange(B)
        loss = float(np.mean(np.log(sum_exp[:, 0]) - shifted[rows, y]))
        dZ = np.divide(exp, sum_exp * B)
        dZ[rows, y] -= 1.0 / B
        layers, glayers = self.layers(params), self.layers(grads)
        for l in reversed(range(len(layers))):
            # Z[l] = A[l] W_l + b_l  =>  dW_l = A[l]^T dZ,  db_l = sum over rows of dZ
            np.matmul(A[l].T, dZ, out=glayers[l][0])
            np.sum(dZ, axis=0, out=glayers[l][1])
            if l > 0:  # dA[l] = dZ W_l^T, then through the ReLU: dZ[l-1] = dA[l] * [Z[l-1] > 0]
                dZ = np.multiply(np.matmul(dZ, layers[l][0].T), Z[l - 1] > 0)
        return loss

    def accuracy(self, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> float:
        Z, _ = self.forward(params, X)
        return float(np.mean(np.argmax(Z[-1], axis=1) == y))


@dataclass
class Problem:
    """One training run: the data and every number the methods need."""

    X: np.ndarray  # (n_train, n_features) float32
    y: np.ndarray  # (n_train,) int64 class labels
    n_classes: int
    hidden: tuple[int, ...] = (64,)
    world_size: int = 4  # p: workers computing gradients (ps-sync adds a server rank)
    width: int = 2  # K: Pipe-SGD's pipeline width; the staleness is K - 1
    warmup: int = 0  # synchronous steps before the pipeline starts
    batch_size: int = 32  # per worker
    lr: float = 0.1
    lr_decay: float = 0.0  # lr_t = lr / (1 + lr_decay * t)
    steps: int = 100
    seed: int = 0  # seeds w_0 and every worker's minibatch order
    keep_every: int = 0  # rank 0 keeps a copy of its weights every N steps (0: none)

    def model(self) -> MLP:
        return MLP(self.X.shape[1], self.n_classes, self.hidden)

    def lr_at(self, t: int) -> float:
        return self.lr / (1.0 + self.lr_decay * t)

    def minibatch(self, worker: int, step: int) -> np.ndarray:
        """Rows of worker `worker`'s minibatch `step`, a pure function of (seed, worker, step).
        The worker owns rows worker, worker + p, worker + 2p, ... (its shard); each epoch is
        a fresh permutation of the shard from (seed, worker, epoch), cut into batches."""
        p, B = self.world_size, self.batch_size
        shard = np.arange(worker, len(self.X), p, dtype=np.int64)
        per_epoch = (len(self.X) // p) // B  # the same on every worker: the smallest shard's
        epoch, i = divmod(step, per_epoch)
        perm = np.random.default_rng((self.seed, worker, epoch)).permutation(len(shard))
        return shard[perm[i * B : (i + 1) * B]]

    def gradient(self, model: MLP, params, worker: int, step: int, grads) -> float:
        """g = grad f(params; minibatch (worker, step)) into `grads`; returns the loss."""
        rows = self.minibatch(worker, step)
        return model.loss_and_grad(params, self.X[rows], self.y[rows], grads)

    def sgd_step(self, params: np.ndarray, avg: np.ndarray, t: int) -> None:
        """w_{t+1} = w_t - lr_t * avg, the product formed in float32."""
        params -= params.dtype.type(self.lr_at(t)) * avg


def blobs(n: int = 2000, features: int = 32, classes: int = 10, seed: int = 0):
    """A data set from NumPy alone, for the core run by itself: `classes` Gaussian clouds of
    unit variance whose centres lie about 4 standard deviations apart. Returns (X, y)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 4.0 / np.sqrt(2 * features), (classes, features))
    y = rng.integers(0, classes, n)
    X = (centres[y] + rng.normal(0.0, 1.0, (n, features))).astype(np.float32)
    return X, y.astype(np.int64)
