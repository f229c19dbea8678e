"""Shape checks for the batch-norm and average-pooling ops, shared by the fast backends.

As windows.py for the window ops: the Numba loops do not check bounds and the CUDA kernels
cannot, so each fast backend's wrapper checks the shapes here first, once, with one message for
all of them; the NumPy reference needs no check (its broadcasting fails loudly on its own).
"""

from __future__ import annotations


def _expect(backend: str, op: str, name: str, got, want) -> None:
    if tuple(got) != tuple(want):
        raise ValueError(
            f"{backend} backend: {op}: {name} has shape {tuple(got)}, expected {tuple(want)}; "
            "batch norm takes rows (N, C) of an NHWC map and per-channel vectors (C,)"
        )


def check_rows(backend: str, op: str, rows: dict, vectors: dict) -> None:
    """Every array of `rows` (name -> shape) is (N, C) like the first, every one of `vectors`
    is (C,): for batchnorm_forward, batchnorm_backward and batchnorm_eval."""
    first, shape = next(iter(rows.items()))
    if len(shape) != 2:
        raise ValueError(
            f"{backend} backend: {op}: {first} has shape {tuple(shape)}; expected rows (N, C) "
            "(an NHWC map reshaped to (B*H*W, C))"
        )
    for name, got in rows.items():
        _expect(backend, op, name, got, shape)
    for name, got in vectors.items():
        _expect(backend, op, name, got, (shape[1],))


def check_avgpool(backend: str, op: str, map_shape, pooled_shape) -> None:
    """The map (B, H, W, C) and its pooled (B, C): for global_avgpool_forward and _backward."""
    if len(map_shape) != 4:
        raise ValueError(f"{backend} backend: {op}: expected an NHWC map, got shape {map_shape}")
    B, _, _, C = map_shape
    _expect(backend, op, "the pooled map", pooled_shape, (B, C))
