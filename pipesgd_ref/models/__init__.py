"""NumPy models over one flat float32 parameter vector (see layout.py)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipesgd_ref.errors import ConfigError
from pipesgd_ref.models.cnn import CNN
from pipesgd_ref.models.layout import ParamLayout
from pipesgd_ref.models.mlp import MLP
from pipesgd_ref.models.softmax import SoftmaxRegression
from pipesgd_ref.ops import Backend

MODELS = ("softmax", "mlp", "cnn")


def build_model(
    name: str,
    n_features: int,
    n_classes: int,
    hidden: Sequence[int] = (64,),
    backend: Backend | str = "numpy",
    *,
    image_shape: Sequence[int] | None = None,
    channels: Sequence[int] = (6, 16),
    kernels: Sequence[int] = (5, 5),
) -> MLP | CNN:
    """The model called `name` ("softmax", "mlp" or "cnn") for the given data shape; the CNN
    needs the images' (C, H, W) `image_shape` (data.Dataset.image_shape)."""
    if name == "softmax":
        return SoftmaxRegression(n_features, n_classes, backend=backend)
    if name == "mlp":
        return MLP(n_features, n_classes, hidden=hidden, backend=backend)
    if name == "cnn":
        if image_shape is None or int(np.prod(image_shape)) != n_features:
            raise ValueError(
                f"--model cnn needs images: this data set has {n_features} features and no "
                f"(channels, height, width) shape; use --dataset digits, mnist5k or mnist:PATH"
            )
        return CNN(image_shape, n_classes, channels, kernels, hidden, backend=backend)
    raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")


def model_for(cfg, data, backend: Backend | str = "numpy") -> MLP | CNN:
    """cfg's model (a config.TrainConfig: softmax, mlp or cnn) for `data` (a data.Dataset) on
    `backend`; a shape the model cannot take (a CNN on data that are not images, too many
    pools) is a ConfigError naming the model and the data set."""
    try:
        return build_model(
            cfg.model,
            data.n_features,
            data.n_classes,
            cfg.hidden,
            backend,
            image_shape=data.image_shape,
            channels=cfg.channels,
            kernels=cfg.kernels,
        )
    except ValueError as e:
        raise ConfigError(f"--model {cfg.model} on {data.name}: {e}") from None


__all__ = ["CNN", "MLP", "MODELS", "ParamLayout", "SoftmaxRegression", "build_model", "model_for"]
