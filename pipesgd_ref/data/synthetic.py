"""`synthetic`: Gaussian inputs labelled by a seeded random teacher network, of any size.

Inputs X ~ N(0, I); labels are the argmax of a "teacher" network (one tanh hidden layer), so
the task is learnable and fully determined by (samples, features, classes, seed). The samples
are i.i.d., so the last rows are the test set. A request beyond this machine's memory is
refused before anything is allocated (`synthetic_bytes`).
"""

from __future__ import annotations

import os

import numpy as np

from pipesgd_ref.data.dataset import Dataset, held_out, standardise
from pipesgd_ref.errors import DataError

SYNTHETIC_DEFAULTS = {"samples": 4096, "features": 32, "classes": 10, "seed": 0}
_CALIBRATION_SAMPLES = 2048  # teacher logit scales are measured on this many extra inputs


def make_synthetic(
    samples: int = 4096,
    features: int = 32,
    classes: int = 10,
    seed: int = 0,
    test_fraction: float = 0.2,
) -> Dataset:
    """Gaussian inputs labelled by a random teacher network: any size, determined by the seed.

    teacher(x) = argmax_k (tanh(x W1) W2)_k / s_k, W1 (features, 2*features) and W2
    (2*features, classes) drawn N(0, 1/fan_in); s_k is the RMS of logit k over 2048 extra
    calibration inputs, so no class wins most inputs just by a longer W2 column. Balance is
    good, not perfect: the rarest of 10 classes gets about 0.25x its uniform share at
    features=4, 0.5x at features=32; with 1 or 2 features and many classes, some classes may
    never occur (n_classes is still `classes`). Draw order teacher, calibration, X: the
    teacher depends only on (features, classes, seed), not on the number of samples.
    """
    limits = {"samples": (samples, 2), "features": (features, 1), "classes": (classes, 2)}
    for key, (value, least) in {**limits, "seed": (seed, 0)}.items():
        if not isinstance(value, (int, np.integer)) or value < least:
            raise DataError(f"synthetic: {key} must be an integer >= {least}, got {value!r}")
    spec = f"samples={samples},features={features},classes={classes}"
    need, have = synthetic_bytes(samples, features, classes), physical_memory()
    if have is not None and need > have:
        per_sample = synthetic_bytes(1, features, classes) - synthetic_bytes(0, features, classes)
        most = (have - synthetic_bytes(0, features, classes)) // per_sample
        fits = f" (at most about {most} samples fit)" if most >= 2 else ""
        raise DataError(
            f"synthetic:{spec} needs about {_gb(need)} of memory to generate, more than this "
            f"machine's {_gb(have)} (physical memory); use fewer samples{fits}, features or "
            f"classes"
        )
    try:
        return _make_synthetic(samples, features, classes, seed, test_fraction)
    except MemoryError:  # the estimate fitted, but the memory free now did not
        raise DataError(
            f"synthetic:{spec}: out of memory while generating it (about {_gb(need)}; the "
            f"machine has {_gb(have) if have else 'an unknown amount'}, less is free now); use "
            f"fewer samples, features or classes"
        ) from None


def synthetic_bytes(samples: int, features: int, classes: int) -> int:
    """Peak bytes `make_synthetic` allocates, from its arrays (float64 unless said):

        teacher        W1 (D, 2D), W2 (2D, K), calibration 2048 x (D + 2 x 2D + 2 x K)
        labelling      X (N, D), X W1 and its tanh (N, 2D) each, logits and / scale (N, K)
                       each, the labels (N,) int64
    The float32 train/test copies (3 x 4 N D: cast, centred, scaled) come after the labelling
    temporaries are freed, and are smaller. Python ints: no overflow for any request."""
    n, d, k = int(samples), int(features), int(classes)
    teacher = 8 * (2 * d * d + 2 * d * k + _CALIBRATION_SAMPLES * (5 * d + 2 * k))
    return teacher + 8 * n * (d + 4 * d + 2 * k + 1)


def physical_memory() -> int | None:
    """Bytes of RAM of this machine (os.sysconf SC_PHYS_PAGES x SC_PAGE_SIZE); None where the
    OS does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _gb(nbytes: int) -> str:
    """812e9 -> "812 GB", 2.9e12 -> "2.9 TB"; SI units as disks and RAM sizes are quoted."""
    value, unit = nbytes / 1e9, "GB"
    for bigger in ("TB", "PB", "EB"):
        if value < 1000:
            break
        value, unit = value / 1000, bigger
    return f"{value:.3g} {unit}"


def _make_synthetic(
    samples: int, features: int, classes: int, seed: int, test_fraction: float
) -> Dataset:
    rng = np.random.default_rng(seed)
    width = 2 * features
    W1 = rng.standard_normal((features, width)) / np.sqrt(features)  # (D, H)
    W2 = rng.standard_normal((width, classes)) / np.sqrt(width)  # (H, K)
    calibration = rng.standard_normal((_CALIBRATION_SAMPLES, features))
    # tanh is odd and the inputs symmetric, so every logit has mean 0: only its scale differs.
    scale = np.sqrt(np.mean((np.tanh(calibration @ W1) @ W2) ** 2, axis=0))  # (K,)
    X = rng.standard_normal((samples, features))  # (N, D)
    y = np.argmax(np.tanh(X @ W1) @ W2 / scale, axis=1)  # (N,)
    n_train = samples - held_out(samples, test_fraction)
    X_train, X_test = standardise(X[:n_train].astype(np.float32), X[n_train:].astype(np.float32))
    name = f"synthetic:samples={samples},features={features},classes={classes},seed={seed}"
    return Dataset(name, X_train, y[:n_train], X_test, y[n_train:], n_classes=classes)


def parse_synthetic(options: str) -> dict[str, int]:
    """'samples=64,classes=3' -> {'samples': 64, 'classes': 3}; unknown keys are an error."""
    parsed: dict[str, int] = {}
    valid = ", ".join(f"{k} (default {v})" for k, v in SYNTHETIC_DEFAULTS.items())
    for item in filter(None, (part.strip() for part in options.split(","))):
        key, eq, value = (s.strip() for s in item.partition("="))
        if not eq or key not in SYNTHETIC_DEFAULTS:
            raise DataError(f"synthetic: unknown option {item!r}; valid keys are {valid}")
        if key in parsed:
            raise DataError(f"synthetic: option {key!r} is given twice")
        try:
            parsed[key] = int(value)
        except ValueError:
            raise DataError(
                f"synthetic: {key}={value!r} is not an integer; valid keys are {valid}"
            ) from None
    return parsed
