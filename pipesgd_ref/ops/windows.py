"""Shape checks (and the argmax dtype) for the sliding-window ops (im2col, col2im, max-pooling),
shared by the fast backends.

The Numba loops do not check bounds and the CUDA kernels cannot, so a cols buffer one row too
short would be written past its end. Every fast backend's wrapper therefore checks the shapes
here first, once, with one message for all of them; the NumPy reference needs no check (its
reshape and slicing fail loudly on their own).
"""

from __future__ import annotations

import numpy as np

from pipesgd_ref.ops.numpy_ops import conv_out


def _window_params(backend: str, op: str, size: tuple[int, int], k: tuple[int, int], stride, pad):
    H, W = size
    kh, kw = k
    if min(kh, kw, stride) < 1 or pad < 0:
        raise ValueError(
            f"{backend} backend: {op} needs kernel >= 1, stride >= 1 and pad >= 0, got kernel "
            f"{kh}x{kw}, stride {stride}, pad {pad}"
        )
    if H + 2 * pad < kh or W + 2 * pad < kw:
        raise ValueError(
            f"{backend} backend: {op}: a {kh}x{kw} window does not fit in a {H}x{W} map with "
            f"pad {pad}; use a smaller kernel or more padding"
        )
    return conv_out(H, kh, stride, pad), conv_out(W, kw, stride, pad)


def _expect(backend: str, op: str, name: str, got, want) -> None:
    if tuple(got) != tuple(want):
        raise ValueError(
            f"{backend} backend: {op}: {name} has shape {tuple(got)}, expected {tuple(want)}; "
            "allocate it with the output sizes conv_out(size, k, stride, pad)"
        )


def check_im2col(backend: str, op: str, X_shape, kh, kw, stride, pad, cols_shape) -> None:
    """X (B, H, W, C) and cols (B*Ho*Wo, kh*kw*C) agree: for im2col and col2im alike."""
    if len(X_shape) != 4:
        raise ValueError(f"{backend} backend: {op}: expected an NHWC map, got shape {X_shape}")
    B, H, W, C = X_shape
    Ho, Wo = _window_params(backend, op, (H, W), (kh, kw), stride, pad)
    _expect(backend, op, "cols", cols_shape, (B * Ho * Wo, kh * kw * C))


def check_pool(backend: str, op: str, X_shape, k, stride, Y_shape, argmax) -> None:
    """X (B, H, W, C), Y and argmax (B, Ho, Wo, C), argmax int32 (a window index u*k + v, as
    numpy_ops writes it): for maxpool_forward and maxpool_backward."""
    if argmax.dtype != np.int32:
        raise TypeError(
            f"{backend} backend: {op}: argmax must be int32 (as numpy_ops writes it), got "
            f"{argmax.dtype}; allocate it with dtype np.int32"
        )
    if len(X_shape) != 4:
        raise ValueError(f"{backend} backend: {op}: expected an NHWC map, got shape {X_shape}")
    B, H, W, C = X_shape
    Ho, Wo = _window_params(backend, op, (H, W), (k, k), stride, 0)
    _expect(backend, op, "the pooled map", Y_shape, (B, Ho, Wo, C))
    _expect(backend, op, "argmax", argmax.shape, (B, Ho, Wo, C))
