"""NumPy models over one flat float32 parameter vector (see layout.py)."""

from __future__ import annotations

from collections.abc import Sequence

from pipesgd_ref.models.layout import ParamLayout
from pipesgd_ref.models.mlp import MLP
from pipesgd_ref.models.softmax import SoftmaxRegression
from pipesgd_ref.ops import Backend

MODELS = ("softmax", "mlp")


def build_model(
    name: str,
    n_features: int,
    n_classes: int,
    hidden: Sequence[int] = (64,),
    backend: Backend | str = "numpy",
) -> MLP:
    """The model called `name` ("softmax" or "mlp") for the given data shape."""
    if name == "softmax":
        return SoftmaxRegression(n_features, n_classes, backend=backend)
    if name == "mlp":
        return MLP(n_features, n_classes, hidden=hidden, backend=backend)
    raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")


__all__ = ["MLP", "MODELS", "ParamLayout", "SoftmaxRegression", "build_model"]
