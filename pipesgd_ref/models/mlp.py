"""A multilayer perceptron with ReLU hidden layers and a softmax cross-entropy loss.

    X (B, n_features) -> [dense -> ReLU] x len(hidden) -> dense -> logits (B, n_classes)
    loss = mean_i cross_entropy(softmax(logits_i), y_i)

All parameters live in one flat vector (see layout.py); `loss_and_grad` writes the gradient into
a flat buffer of the same layout, which is exactly what the collective sends. Forward and
backward are written out layer by layer, with the shapes, so the backward pass can be checked
line by line against the chain rule (tests/test_models.py checks it against finite differences);
the dense layers' loops are models/base.py's, shared with the CNN's dense head.
The arithmetic goes through the ops backend chosen once at construction (numpy or numba).

On the GPU (backend "cuda", --device cuda) the same code runs on Numba device arrays: params,
grads, X, y and every activation live on the device, allocated once through the backend's own
`empty`. Evaluation (`logits`, `predict`, `accuracy`) is off the hot path: it copies the
weights to the host and runs the NumPy ops there.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipesgd_ref.models.base import FlatModel
from pipesgd_ref.models.layout import ParamLayout, on_device
from pipesgd_ref.ops import Backend


class MLP(FlatModel):
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
        self._use_backend(backend)
        self.widths = (n_features, *self.hidden, n_classes)  # layer l maps widths[l] -> widths[l+1]
        self.n_layers = len(self.widths) - 1
        shapes: list[tuple[str, tuple[int, ...]]] = []
        for l in range(self.n_layers):
            shapes.append((f"W{l}", (self.widths[l], self.widths[l + 1])))
            shapes.append((f"b{l}", (self.widths[l + 1],)))
        self.layout = ParamLayout(shapes)
        self._buffers: dict[tuple, tuple[list, list]] = {}
        self._grad_buffers: dict[tuple, tuple[list, list]] = {}

    def init_params(self, seed: int, dtype=np.float32) -> np.ndarray:
        """A fresh flat parameter vector: He-normal weights (variance 2/fan_in), zero biases."""
        rng = np.random.default_rng(seed)
        params = np.zeros(self.n_params, dtype=dtype)
        views = self.layout.views(params)
        for l in range(self.n_layers):
            fan_in = self.widths[l]
            views[f"W{l}"][...] = rng.normal(0.0, np.sqrt(2.0 / fan_in), views[f"W{l}"].shape)
        return params

    def _activations(self, batch: int, dtype, device: bool = False) -> tuple[list, list]:
        """Preallocated pre-activations Z[l] and activations A[l] for a batch size and dtype
        (on the device for device params).

        Reused across steps: the hot loop allocates nothing. A[0] is the input itself.
        """
        return self._layer_buffers(self._buffers, batch, dtype, device)

    def _gradients(self, batch: int, dtype, device: bool) -> tuple[list, list]:
        """Preallocated dL/dZ[l] (like Z[l]) and dL/dA[l] (like A[l], l >= 1; the input needs
        no gradient): the backward pass writes each exactly once per step, so reusing them
        across steps changes no number, and the hot loop allocates nothing."""
        return self._layer_buffers(self._grad_buffers, batch, dtype, device)

    def _layer_buffers(self, cache: dict, batch: int, dtype, device: bool) -> tuple[list, list]:
        """One (batch, width) array per layer output, and one per hidden layer output with
        None for the input; made once per (batch, dtype, device) and kept in `cache`."""
        key = (batch, np.dtype(dtype), device)
        if key not in cache:
            outs = [self._empty((batch, w), dtype, device) for w in self.widths[1:]]
            hidden = [None] + [self._empty((batch, w), dtype, device) for w in self.widths[1:-1]]
            cache[key] = (outs, hidden)
        return cache[key]

    def forward(self, params, X) -> tuple[list, list]:
        """Run the layers; returns (Z, A): Z[l] (B, widths[l+1]) pre-activations, A[l] inputs.
        Device params: X may be a device array or a host one (then copied over)."""
        ops, v, device = self._ops_for(params), self.layout.views(params), on_device(params)
        if device:
            X = self._to_device(X, params.dtype)
        else:
            X = np.ascontiguousarray(X, dtype=params.dtype)
        Z, A = self._activations(X.shape[0], params.dtype, device)
        A = [X] + A[1:]
        self._dense_forward(ops, v, A, Z)  # Z[l] = A[l] W_l + b_l, A[l+1] = relu(Z[l])
        return Z, A

    def loss_and_grad(self, params, X, y, grads, ready=None, buffers=None) -> float:
        """Mean cross-entropy on (X, y); writes d loss / d params into the flat `grads`.
        On the device: params and grads device arrays; X and y device arrays, or host ones
        (copied over: the worker stages them through pinned buffers instead). `ready(lo, hi,
        loss)`, if given, is called as soon as grads[lo:hi] is final, for each range of
        `grad_units()` in turn (last layer first), with this minibatch's loss: ddp all-reduces
        the gradient in buckets while the rest of the backward runs. `buffers`: ignored (the
        MLP has none; the keyword lets callers pass the ResNet's to every model alike)."""
        ops, v = self._ops_for(params), self.layout.views(params)
        g = self.layout.views(grads)
        Z, A = self.forward(params, X)
        dZs, dAs = self._gradients(Z[0].shape[0], params.dtype, on_device(params))
        # dAs[0] is None: the input needs no gradient
        return self._dense_loss_and_backward(ops, v, g, A, Z, y, dZs, dAs, ready)

    def logits(self, params, X: np.ndarray, buffers=None) -> np.ndarray:
        """(B, n_classes) logits, on the host (device weights are copied over first: evaluation
        is off the hot path). `buffers` ignored (the MLP has none)."""
        if on_device(params):
            params = params.copy_to_host()
        Z, _ = self.forward(params, X)
        return Z[-1].copy()

    def __repr__(self) -> str:
        shape = " -> ".join(map(str, self.widths))
        return f"{type(self).__name__}({shape}, {self.n_params} params)"
