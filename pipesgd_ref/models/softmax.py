"""Softmax regression: one dense layer and a softmax cross-entropy loss.

    logits (B, n_classes) = X (B, n_features) @ W0 (n_features, n_classes) + b0 (n_classes)

It is the MLP with no hidden layer (same flat layout, same forward and backward code), kept as
its own name because it is the convex model: the one to use when a result should not depend on
the landscape of a deep net.
"""

from __future__ import annotations

from pipesgd_ref.models.mlp import MLP
from pipesgd_ref.ops import Backend


class SoftmaxRegression(MLP):
    def __init__(self, n_features: int, n_classes: int, backend: Backend | str = "numpy"):
        super().__init__(n_features, n_classes, hidden=(), backend=backend)
