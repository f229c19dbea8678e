"""The backend table: one set of named ops, several implementations.

    numpy  -> the reference (ops/numpy_ops.py): the definition every other backend must match
    numba  -> Numba CPU, `njit(nogil=True)` (ops/numba_ops.py)
    cuda   -> Numba CUDA kernels on device arrays (ops/cuda_ops.py, the kernels beside it in
              cuda_matmul, cuda_softmax, cuda_elementwise, cuda_windows, cuda_norm): a GPU, or
              Numba's simulator with NUMBA_ENABLE_CUDASIM=1; float32 matmuls; also provides
              empty/zeros/to_device/to_host for the device buffers

A backend is chosen once, by name (`--backend numpy|numba`), and handed to the model and the
algorithms; code never branches on the backend after that. Every backend module provides the
functions listed in `OP_NAMES` with the same signatures and meaning.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipesgd_ref.ops import numpy_ops as _reference

OP_NAMES = (
    "dense_forward",  # Y = X @ W + b
    "dense_backward",  # dW = X^T dY, db = sum_rows dY, dX = dY W^T
    "dense_input_grad",  # dX = dY W^T alone (ddp: the weights' gradient goes out first)
    "relu_forward",  # A = max(Z, 0)
    "relu_backward",  # dZ = dA * [Z > 0]
    "softmax_xent_grad",  # mean cross-entropy of softmax(logits), and d/dlogits
    "add_into",  # dst += src
    "scale",  # x *= alpha
    "sgd_step",  # params -= lr * grads
    "im2col",  # every kh x kw window of an NHWC map as one row (convolution = im2col + matmul)
    "col2im",  # its adjoint: the rows added back into the map (the input gradient)
    "maxpool_forward",  # max over each k x k window, and the argmax
    "maxpool_backward",  # each dY back to where its max was
    "batchnorm_forward",  # per channel of rows (N, C): standardise with the batch's statistics
    "batchnorm_backward",  # its gradients: dX, dgamma, dbeta
    "batchnorm_eval",  # standardise with given (running) statistics
    "running_average",  # running = (1 - m) running + m * correction * batch (BN's buffers)
    "global_avgpool_forward",  # (B, H, W, C) -> (B, C): each channel's mean over the map
    "global_avgpool_backward",  # each pixel gets dY / (H * W)
)

BACKENDS = {
    "numpy": "pipesgd_ref.ops.numpy_ops",
    "numba": "pipesgd_ref.ops.numba_ops",
    "cuda": "pipesgd_ref.ops.cuda_ops",
}


class Backend:
    """A named set of ops; attribute access gives the op, e.g. `backend.sgd_step(p, g, lr)`."""

    if TYPE_CHECKING:  # every backend's ops have the reference's signatures (OP_NAMES)
        dense_forward = staticmethod(_reference.dense_forward)
        dense_backward = staticmethod(_reference.dense_backward)
        dense_input_grad = staticmethod(_reference.dense_input_grad)
        relu_forward = staticmethod(_reference.relu_forward)
        relu_backward = staticmethod(_reference.relu_backward)
        softmax_xent_grad = staticmethod(_reference.softmax_xent_grad)
        add_into = staticmethod(_reference.add_into)
        scale = staticmethod(_reference.scale)
        sgd_step = staticmethod(_reference.sgd_step)
        im2col = staticmethod(_reference.im2col)
        col2im = staticmethod(_reference.col2im)
        maxpool_forward = staticmethod(_reference.maxpool_forward)
        maxpool_backward = staticmethod(_reference.maxpool_backward)
        batchnorm_forward = staticmethod(_reference.batchnorm_forward)
        batchnorm_backward = staticmethod(_reference.batchnorm_backward)
        batchnorm_eval = staticmethod(_reference.batchnorm_eval)
        running_average = staticmethod(_reference.running_average)
        global_avgpool_forward = staticmethod(_reference.global_avgpool_forward)
        global_avgpool_backward = staticmethod(_reference.global_avgpool_backward)

    def __init__(self, name: str, module: ModuleType):
        self.name = name
        missing = [op for op in OP_NAMES if not hasattr(module, op)]
        if missing:
            raise ImportError(f"backend {name!r} ({module.__name__}) lacks ops: {missing}")
        for op in OP_NAMES:
            setattr(self, op, getattr(module, op))

    def __repr__(self) -> str:
        return f"Backend({self.name!r})"


_loaded: dict[str, Backend] = {}


def get_backend(name: str = "numpy") -> Backend:
    """The backend called `name`; imported on first use (Numba compiles lazily, per dtype)."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of: {', '.join(BACKENDS)}")
    if name not in _loaded:
        _loaded[name] = Backend(name, importlib.import_module(BACKENDS[name]))
    return _loaded[name]
