"""A multilayer perceptron with ReLU hidden layers and a softmax cross-entropy loss.

    X (B, n_features) -> [dense -> ReLU] x len(hidden) -> dense -> logits (B, n_classes)
    loss = mean_i cross_entropy(softmax(logits_i), y_i)

All parameters live in one flat vector (see layout.py); `loss_and_grad` writes the gradient into
a flat buffer of the same layout, which is exactly what the collective sends. Forward and
backward are written out layer by layer, with the shapes, so the backward pass can be checked
line by line against the chain rule (tests/test_models.py checks it against finite differences).
The arithmetic goes through the ops backend chosen once at construction (numpy or numba).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipesgd_ref.models.layout import ParamLayout
from pipesgd_ref.ops import Backend, get_backend


class MLP:
    """ReLU MLP over one flat parameter vector. `hidden=()` gives softmax regression."""

    def __init__(
        self,
        n_features: int,
        n_classes: int,
        hidden: Sequence[int] = (64,),
        backend: Backend | str = "numpy",
    ):
        if n_features < 1 or n_classes < 2 or any(h < 1 for h in hidden):
            raise ValueError(
                f"bad model shape: n_features={n_features} (>= 1), n_classes={n_classes} (>= 2), "
                f"hidden={tuple(hidden)} (each >= 1)"
            )
        self.n_features = n_features
        self.n_classes = n_classes
        self.hidden = tuple(int(h) for h in hidden)
        self.backend = get_backend(backend) if isinstance(backend, str) else backend
        self.widths = (n_features, *self.hidden, n_classes)  # layer l maps widths[l] -> widths[l+1]
        self.n_layers = len(self.widths) - 1
        shapes = []
        for l in range(self.n_layers):
            shapes.append((f"W{l}", (self.widths[l], self.widths[l + 1])))
            shapes.append((f"b{l}", (self.widths[l + 1],)))
        self.layout = ParamLayout(shapes)
        self._buffers: dict[tuple[int, np.dtype], tuple[list, list]] = {}

    @property
    def n_params(self) -> int:
        return self.layout.size

    def init_params(self, seed: int, dtype=np.float32) -> np.ndarray:
        """A fresh flat parameter vector: He-normal weights (variance 2/fan_in), zero biases."""
        rng = np.random.default_rng(seed)
        params = np.zeros(self.n_params, dtype=dtype)
        views = self.layout.views(params)
        for l in range(self.n_layers):
            fan_in = self.widths[l]
            views[f"W{l}"][...] = rng.normal(0.0, np.sqrt(2.0 / fan_in), views[f"W{l}"].shape)
        return params

    def _activations(self, batch: int, dtype) -> tuple[list, list]:
        """Preallocated pre-activations Z[l] and activations A[l] for a batch size and dtype.

        Reused across steps: the hot loop allocates nothing. A[0] is the input itself.
        """
        key = (batch, np.dtype(dtype))
        if key not in self._buffers:
            Z = [np.empty((batch, w), dtype=dtype) for w in self.widths[1:]]
            A = [None] + [np.empty((batch, w), dtype=dtype) for w in self.widths[1:-1]]
            self._buffers[key] = (Z, A)
        return self._buffers[key]

    def forward(self, params: np.ndarray, X: np.ndarray) -> tuple[list, list]:
        """Run the layers; returns (Z, A): Z[l] (B, widths[l+1]) pre-activations, A[l] inputs."""
        ops, v = self.backend, self.layout.views(params)
        X = np.ascontiguousarray(X, dtype=params.dtype)
        Z, A = self._activations(X.shape[0], params.dtype)
        A = [X] + A[1:]
        for l in range(self.n_layers):
            ops.dense_forward(A[l], v[f"W{l}"], v[f"b{l}"], Z[l])  # Z[l] = A[l] W_l + b_l
            if l < self.n_layers - 1:
                ops.relu_forward(Z[l], A[l + 1])  # A[l+1] = relu(Z[l])
        return Z, A

    def loss_and_grad(
        self, params: np.ndarray, X: np.ndarray, y: np.ndarray, grads: np.ndarray
    ) -> float:
        """Mean cross-entropy on (X, y); writes d loss / d params into the flat `grads`."""
        ops, v = self.backend, self.layout.views(params)
        g = self.layout.views(grads)
        Z, A = self.forward(params, X)
        last = self.n_layers - 1
        # dZ starts as dL/dlogits (B, n_classes); the softmax and the loss are fused.
        dZ = np.empty_like(Z[last])
        loss = ops.softmax_xent_grad(Z[last], y, dZ)
        for l in range(last, -1, -1):
            # Z[l] = A[l] W_l + b_l  =>  dW_l = A[l]^T dZ, db_l = sum_rows dZ, dA[l] = dZ W_l^T
            dA = np.empty_like(A[l]) if l > 0 else None  # the input needs no gradient
            ops.dense_backward(A[l], v[f"W{l}"], dZ, g[f"W{l}"], g[f"b{l}"], dA)
            if l > 0:
                # A[l] = relu(Z[l-1])  =>  dZ[l-1] = dA[l] * [Z[l-1] > 0]
                dZ = np.empty_like(Z[l - 1])
                ops.relu_backward(Z[l - 1], dA, dZ)
        return loss

    def logits(self, params: np.ndarray, X: np.ndarray) -> np.ndarray:
        Z, _ = self.forward(params, X)
        return Z[-1].copy()

    def predict(self, params: np.ndarray, X: np.ndarray) -> np.ndarray:
        """The most likely class of each row of X: (B,) int64."""
        return np.argmax(self.logits(params, X), axis=1)

    def accuracy(self, params: np.ndarray, X: np.ndarray, y: np.ndarray) -> float:
        """Fraction of rows of X whose predicted class equals y."""
        if len(y) == 0:
            return float("nan")
        return float(np.mean(self.predict(params, X) == y))

    def __repr__(self) -> str:
        shape = " -> ".join(map(str, self.widths))
        return f"{type(self).__name__}({shape}, {self.n_params} params)"
