"""Tutorial 11's checkable exercises (convolutional nets)."""

from __future__ import annotations

import numpy as np

from pipesgd_ref.exercises import close, equal, exercise, same_function


def _im2col_stride2(X: np.ndarray) -> np.ndarray:
    """The reference: ops.im2col with a 3 x 3 window, stride 2, padding 1."""
    from pipesgd_ref.ops import numpy_ops as ops

    B, H, W, C = X.shape
    Ho, Wo = ops.conv_out(H, 3, 2, 1), ops.conv_out(W, 3, 2, 1)
    cols = np.empty((B * Ho * Wo, 9 * C), X.dtype)
    ops.im2col(X, 3, 3, 2, 1, cols)
    return cols


def _im2col_cases() -> list[tuple]:
    image = np.arange(16, dtype=np.float64).reshape(1, 4, 4, 1)  # section 1's image
    other = np.random.default_rng(1).standard_normal((2, 5, 6, 3))  # odd sizes, 3 channels
    return [(image,), (other,)]


def _im2col_stride1(X: np.ndarray) -> np.ndarray:
    """A plausible wrong answer: the stride-1 im2col of section 1."""
    from pipesgd_ref.ops import numpy_ops as ops

    B, H, W, C = X.shape
    cols = np.empty((B * H * W, 9 * C), X.dtype)
    ops.im2col(X, 3, 3, 1, 1, cols)
    return cols


@exercise(
    "11.1",
    "a function X (B, H, W, C) -> cols of every 3 x 3 window, stride 2, padding 1",
    "Ho = (H + 2 - 3) // 2 + 1; output pixel (i, j) reads the window at (2i - 1, 2j - 1) of X, "
    "zeros outside it, its entries in (u, v, c) order",
    judge=same_function(_im2col_cases, close(rel=0.0, abs_=1e-12)),
    wrong=lambda: _im2col_stride1,
)
def im2col_stride2():
    return _im2col_stride2


@exercise(
    "11.2",
    "the position u*2 + v of [[3, 7], [7, 1]] that max-pooling's backward sends the gradient to",
    "maxpool_forward keeps the FIRST maximum in row-major (u, v) order",
    judge=equal,
    wrong=lambda: 2,  # the other 7
)
def maxpool_tie_position() -> int:
    from pipesgd_ref.ops import numpy_ops as ops

    window = np.array([[3.0, 7.0], [7.0, 1.0]]).reshape(1, 2, 2, 1)
    Y, argmax = np.empty((1, 1, 1, 1)), np.empty((1, 1, 1, 1), np.int32)
    ops.maxpool_forward(window, 2, 2, Y, argmax)
    return int(argmax[0, 0, 0, 0])


@exercise(
    "11.3",
    "the bytes of cols (float32) for LeNet-5's first conv layer at batch 32 on MNIST",
    "B * Ho * Wo rows of k * k * Cin float32: 32 * 28 * 28 * (5 * 5 * 1) * 4 bytes",
    judge=close(rel=1e-6),
)
def lenet_first_cols_bytes() -> int:
    from pipesgd_ref.models import CNN

    lenet = CNN((1, 28, 28), 10)
    h, w, c_in = lenet.maps[0]  # "same" padding, stride 1: Ho, Wo = H, W
    k = lenet.kernels[0]
    return 32 * h * w * k * k * c_in * 4


@exercise(
    "11.5",
    "multiply-adds per parameter, per image, of LeNet-5 with channels (32, 64)",
    "CNN((1, 28, 28), 10, channels=(32, 64)).flops_per_sample() divided by its n_params",
    judge=close(rel=0.01),
)
def wide_lenet_work_per_parameter() -> float:
    from pipesgd_ref.models import CNN

    wide = CNN((1, 28, 28), 10, channels=(32, 64))
    return wide.flops_per_sample() / wide.n_params
