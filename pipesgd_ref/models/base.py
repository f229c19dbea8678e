"""What every model over one flat parameter vector shares (the MLP, and the CNN's dense head).

- the backend: its ops, chosen once; on a device backend (`--device cuda`) the buffers come
  from the backend's own allocator, and evaluation on host copies of the weights uses the NumPy
  reference ops (`_use_backend`, `_empty`, `_ops_for`, `_to_device`);
- the dense layers, forward and backward, each line beside the chain rule it computes
  (`_dense_forward`, `_dense_loss_and_backward`), over the parameters W{l}, b{l} of the layout;
- evaluation: `predict` and `accuracy` from a model's `logits`;
- buffers: state beside the parameters that the loss updates but SGD does not (the ResNet's
  batch-norm running statistics), in a second flat float32 vector of `buffer_layout`. A model
  without any (every one but the ResNet) has n_buffers == 0 and accepts and ignores a
  `buffers` argument, so that callers pass it to every model alike.
"""

from __future__ import annotations

import importlib

import numpy as np

from pipesgd_ref.models.layout import ParamLayout, on_device
from pipesgd_ref.ops import BACKENDS, Backend, get_backend


def backend_module(backend: Backend):
    """The module behind a backend (its allocation helpers are not ops), or None."""
    return importlib.import_module(BACKENDS[backend.name]) if backend.name in BACKENDS else None


class FlatModel:
    """The shared part of a model; a subclass sets `layout`, `n_classes` and its dense
    `widths`, calls `_use_backend` in its constructor, and defines `logits`."""

    layout: ParamLayout
    n_classes: int
    widths: tuple[int, ...]  # the dense layers' sizes, input first
    buffer_layout: ParamLayout = ParamLayout([])  # none: a model with buffers sets its own
    image_shape: tuple[int, ...]  # (C, H, W): an image model's (CNN, ResNet) alone

    def _use_backend(self, backend: Backend | str) -> None:
        self.backend = get_backend(backend) if isinstance(backend, str) else backend
        module = backend_module(self.backend)
        # A device backend (its module moves arrays: `to_device`) allocates with its own
        # `empty`; evaluation, on host copies of the weights, uses the NumPy reference ops.
        self.on_gpu = hasattr(module, "to_device")
        self._device_empty = getattr(module, "empty", None) if self.on_gpu else None
        self.host_backend = get_backend("numpy") if self.on_gpu else self.backend

    @property
    def n_params(self) -> int:
        return self.layout.size

    @property
    def n_buffers(self) -> int:
        """Length of the buffers vector (running statistics; 0 for a model without any)."""
        return self.buffer_layout.size

    def init_buffers(self) -> np.ndarray:
        """A fresh float32 buffers vector (empty for a model without buffers)."""
        return np.zeros(self.n_buffers, np.float32)

    def _empty(self, shape: tuple[int, ...], dtype, device: bool):
        """One buffer: on the device through the backend's allocator, else np.empty."""
        if device:
            assert self._device_empty is not None  # a device backend has `empty`
            return self._device_empty(shape, dtype)
        return np.empty(shape, dtype=dtype)

    def _ops_for(self, params) -> Backend:
        """The ops that work where `params` live: the model's backend; for host weights on a
        device model (evaluation), the host ops."""
        device = on_device(params)
        if device and not self.on_gpu:
            raise TypeError(
                f"{self!r} runs the {self.backend.name} backend on host arrays, but was given "
                f"device weights; build the model with backend='cuda' (--device cuda)"
            )
        return self.backend if device or not self.on_gpu else self.host_backend

    def _to_device(self, array, dtype):
        """A host input (X or y) copied to the device; a device one as it is."""
        if on_device(array):
            return array
        return backend_module(self.backend).to_device(np.ascontiguousarray(array, dtype=dtype))

    def _images_nhwc(self, X, nhwc, dtype, device: bool):
        """The images of X (B, C*H*W, rows of (C, H, W): self.image_shape) as an NHWC map;
        `nhwc` (B, H, W, C) receives them when C > 1 (a transpose), else X is reshaped."""
        C, H, W = self.image_shape
        if device:
            X = self._to_device(X, dtype)
        else:
            X = np.ascontiguousarray(X, dtype=dtype)
        B = X.shape[0]
        if C == 1:
            return X.reshape(B, H, W, 1)  # (C, H, W) and (H, W, C) are the same bytes
        if device:  # the rare case off the hot path of this project's data: via the host
            host = X.copy_to_host().reshape(B, C, H, W).transpose(0, 2, 3, 1)
            nhwc.copy_to_device(np.ascontiguousarray(host))
            return nhwc
        np.copyto(nhwc, X.reshape(B, C, H, W).transpose(0, 2, 3, 1))
        return nhwc

    def _dense_forward(self, ops: Backend, v: dict, A: list, Z: list) -> None:
        """The dense layers l = 0 .. len(Z) - 1 with ReLU between them: Z[l] (B, n_out) the
        pre-activations, A[l] (B, n_in) each layer's input (A[0] given, the rest written)."""
        last = len(Z) - 1
        for l in range(last + 1):
            ops.dense_forward(A[l], v[f"W{l}"], v[f"b{l}"], Z[l])  # Z[l] = A[l] W_l + b_l
            if l < last:
                ops.relu_forward(Z[l], A[l + 1])  # A[l+1] = relu(Z[l])

    def _dense_loss_and_backward(
        self, ops: Backend, v: dict, g: dict, A: list, Z: list, y, dZs: list, dAs: list, ready
    ) -> float:
        """Mean cross-entropy of softmax(Z[-1]) against y, and the dense layers' gradients into
        g (W{l}, b{l}); dAs[0], when not None, receives d loss / d A[0] (the CNN's pooled map).
        dZs[l] like Z[l] and dAs[l] like A[l] are scratch, each written once. `ready(lo, hi,
        loss)`, if given, hears of each layer's gradient as soon as it is written (see
        `grad_units`)."""
        last = len(Z) - 1
        # dZ starts as dL/dlogits (B, n_classes); the softmax and the loss are fused.
        dZ = dZs[last]
        loss = ops.softmax_xent_grad(Z[last], y, dZ)
        for l in range(last, -1, -1):
            # Z[l] = A[l] W_l + b_l  =>  dW_l = A[l]^T dZ, db_l = sum_rows dZ, dA[l] = dZ W_l^T
            dA = dAs[l]
            ops.dense_backward(A[l], v[f"W{l}"], dZ, g[f"W{l}"], g[f"b{l}"], None)
            if ready is not None:  # layer l's gradient is final: it may leave now (ddp)
                ready(*self.layout.span(f"W{l}", f"b{l}"), loss)
            if dA is not None:  # then the layer's input gradient, the same bits as fused
                ops.dense_input_grad(v[f"W{l}"], dZ, dA)
            if l > 0:
                # A[l] = relu(Z[l-1])  =>  dZ[l-1] = dA[l] * [Z[l-1] > 0]
                dZ = dZs[l - 1]
                ops.relu_backward(Z[l - 1], dA, dZ)
        return loss

    def grad_units(self) -> list[tuple[int, int]]:
        """The (lo, hi) ranges of the flat gradient in the order `loss_and_grad` finishes
        them, which is the order its `ready` callback hears of them: the dense layers last
        first (W{l} and b{l} together); a model with more layers (the CNN) adds its own after.
        Each range ends where the one before begins, so any run of them is one slice."""
        n_dense = len(self.widths) - 1
        return [self.layout.span(f"W{l}", f"b{l}") for l in range(n_dense - 1, -1, -1)]

    def flops_per_sample(self) -> int:
        """Multiply-adds of one sample's forward pass through the dense layers `widths`
        (backward: about twice as many); a model with more layers adds theirs."""
        widths = self.widths
        return sum(a * b for a, b in zip(widths[:-1], widths[1:], strict=True))

    def logits(self, params, X: np.ndarray, buffers=None) -> np.ndarray:
        raise NotImplementedError

    def predict(self, params, X: np.ndarray, buffers=None) -> np.ndarray:
        """The most likely class of each row of X: (B,) int64. `buffers`: the model's running
        statistics (the ResNet needs them; other models ignore them)."""
        return np.argmax(self.logits(params, X, buffers), axis=1)

    def accuracy(self, params, X: np.ndarray, y: np.ndarray, buffers=None) -> float:
        """Fraction of rows of X whose predicted class equals y (`buffers` as in predict)."""
        if len(y) == 0:
            return float("nan")
        return float(np.mean(self.predict(params, X, buffers) == y))
