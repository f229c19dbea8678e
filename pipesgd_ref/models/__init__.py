"""NumPy models over one flat float32 parameter vector (see layout.py)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipesgd_ref.errors import ConfigError
from pipesgd_ref.models.cnn import CNN
from pipesgd_ref.models.layout import ParamLayout
from pipesgd_ref.models.mlp import MLP
from pipesgd_ref.models.resnet import ResNet
from pipesgd_ref.models.softmax import SoftmaxRegression
from pipesgd_ref.ops import Backend

MODELS = ("softmax", "mlp", "cnn", "resnet")
# The config fields (config.TrainConfig) a model is built from: with the data set's shape they
# define the parameter layout, so model_for reads these and nothing else, and a checkpoint must
# agree on every one of them (runtime/checkpoint.py MUST_MATCH). A new model option is a new
# keyword of build_model and a new name here.
MODEL_FIELDS = ("model", "hidden", "channels", "kernels", "depth")


def build_model(
    name: str,
    n_features: int,
    n_classes: int,
    hidden: Sequence[int] = (64,),
    backend: Backend | str = "numpy",
    *,
    image_shape: Sequence[int] | None = None,
    channels: Sequence[int] | None = None,
    kernels: Sequence[int] = (5, 5),
    depth: int = 8,
) -> MLP | CNN | ResNet:
    """The model called `name` ("softmax", "mlp", "cnn" or "resnet") for the given data shape;
    the CNN and the ResNet need the images' (C, H, W) `image_shape` (data.Dataset.image_shape).
    `channels` None or (): the model's default (the CNN's (6, 16), the ResNet's (16, 32, 64));
    the ResNet reads `depth` and `channels` and ignores `hidden` and `kernels`."""
    if name == "softmax":
        return SoftmaxRegression(n_features, n_classes, backend=backend)
    if name == "mlp":
        return MLP(n_features, n_classes, hidden=hidden, backend=backend)
    if name in ("cnn", "resnet"):
        if image_shape is None or int(np.prod(image_shape)) != n_features:
            raise ValueError(
                f"--model {name} needs images: this data set has {n_features} features and no "
                f"(channels, height, width) shape; use --dataset digits, mnist5k or mnist:PATH"
            )
        if name == "cnn":
            channels = channels or (6, 16)
            return CNN(image_shape, n_classes, channels, kernels, hidden, backend=backend)
        channels = channels or (16, 32, 64)
        return ResNet(image_shape, n_classes, depth, channels, backend=backend)
    raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")


def model_for(cfg, data, backend: Backend | str = "numpy") -> MLP | CNN | ResNet:
    """cfg's model (a config.TrainConfig: softmax, mlp, cnn or resnet) for `data` (a
    data.Dataset) on `backend`; a shape the model cannot take (a CNN or a ResNet on data that
    are not images, too many pools, a depth not 6n + 2) is a ConfigError naming the model and
    the data set."""
    options = {k: getattr(cfg, k) for k in MODEL_FIELDS}  # what defines the layout, only that
    name = options.pop("model")
    try:
        return build_model(
            name,
            data.n_features,
            data.n_classes,
            backend=backend,
            image_shape=data.image_shape,
            **options,
        )
    except ValueError as e:
        raise ConfigError(f"--model {cfg.model} on {data.name}: {e}") from None


__all__ = [
    "CNN",
    "MLP",
    "MODELS",
    "MODEL_FIELDS",
    "ParamLayout",
    "ResNet",
    "SoftmaxRegression",
    "build_model",
    "model_for",
]
