"""A data set: train and test features and labels, standardised with the train statistics.

`Dataset` is what every source returns (sources.py, synthetic.py, mnist.py) and what the
workers read their minibatches from (sharding.py). Standardising uses the TRAIN mean and std
per feature (a constant feature keeps std 1), and the test set reuses those statistics: the test
set must not leak into training.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pipesgd_ref.errors import DataError

SPLIT_SEED = 0  # the bundled sets' train/test permutation; a constant so the split never moves


@dataclass(frozen=True, eq=False, repr=False)  # eq/repr off: arrays compare and print badly
class Dataset:
    """A train/test pair of standardised features and integer labels (built by the loaders).

    The constructor accepts array-likes and stores X as C-contiguous float32 and y as int64,
    so those types hold whoever builds one (a test, a tutorial).
    """

    name: str  # a spec `load_dataset` accepts, e.g. "digits" or "synthetic:samples=64,..."
    X_train: np.ndarray  # (n_train, n_features) float32, standardised with the train mean/std
    y_train: np.ndarray  # (n_train,) int64 in [0, n_classes)
    X_test: np.ndarray  # (n_test, n_features) float32, standardised with the TRAIN statistics
    y_test: np.ndarray  # (n_test,) int64 in [0, n_classes)
    n_classes: int  # K: the models' output width, even if some class never occurs
    # (C, H, W) of an image data set, whose rows are its pixels in that order (C-order
    # flattening); None for data that are not images. `--model cnn` reads it.
    image_shape: tuple[int, int, int] | None = None

    def __post_init__(self) -> None:
        # object.__setattr__: the one sanctioned way to normalise fields of a frozen dataclass.
        for field in ("X_train", "X_test"):
            object.__setattr__(self, field, np.ascontiguousarray(getattr(self, field), np.float32))
        for field in ("y_train", "y_test"):
            object.__setattr__(self, field, np.ascontiguousarray(getattr(self, field), np.int64))

    @property
    def n_features(self) -> int:
        return self.X_train.shape[1]

    @property
    def n_train(self) -> int:
        return self.X_train.shape[0]

    @property
    def n_test(self) -> int:
        return self.X_test.shape[0]

    def __repr__(self) -> str:
        return (
            f"Dataset({self.name!r}, n_train={self.n_train}, n_test={self.n_test}, "
            f"n_features={self.n_features}, n_classes={self.n_classes})"
        )


def standardise(X_train: np.ndarray, X_test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(x - mean) / std per feature, the statistics from X_train alone; returns float32 copies."""
    mean = X_train.mean(axis=0, dtype=np.float64)  # (n_features,)
    std = X_train.std(axis=0, dtype=np.float64)  # (n_features,)
    # A constant column (a border pixel of digits) has std 0, or a rounding residue of ~1e-16
    # relative to its mean: treat both as constant so nothing is divided by (almost) zero.
    std[std <= 1e-6 * np.maximum(1.0, np.abs(mean))] = 1.0
    mean32, std32 = mean.astype(np.float32), std.astype(np.float32)
    return (X_train - mean32) / std32, (X_test - mean32) / std32


def held_out(n: int, test_fraction: float) -> int:
    """ceil(n * test_fraction), as scikit-learn's train_test_split; at least 1 row each side."""
    if not 0.0 < test_fraction < 1.0:
        raise DataError(f"test_fraction must lie strictly between 0 and 1, got {test_fraction}")
    # The small epsilon keeps 10 * 0.3 = 3.0000000000000004 from rounding up to 4.
    return min(max(math.ceil(n * test_fraction - 1e-9), 1), n - 1)


def fixed_split(name: str, X, y, test_fraction: float, image_shape) -> Dataset:
    """A bundled set's split: a permutation from SPLIT_SEED, its first held_out rows for test
    and the rest for train, both standardised with the train statistics; 10 classes."""
    perm = np.random.default_rng(SPLIT_SEED).permutation(len(X))
    test, train = np.split(perm, [held_out(len(X), test_fraction)])
    X_train, X_test = standardise(X[train], X[test])
    y_train, y_test = y[train], y[test]
    return Dataset(name, X_train, y_train, X_test, y_test, n_classes=10, image_shape=image_shape)
