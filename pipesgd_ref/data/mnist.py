"""`mnist:PATH`: MNIST from a folder of the four standard IDX files, and the IDX format itself.

The files' own 60000 / 10000 train / test split, each raw or gzip-compressed (.gz suffix).
`read_idx` and `write_idx` implement the IDX format: 2 zero bytes, a type code, the number of
dimensions, the sizes as big-endian uint32, then the items big-endian. Every way a download can
be wrong (truncated, corrupt, a raw and a .gz copy that differ, labels that are no digit) is a
DataError that says which file and what to do.
"""

from __future__ import annotations

import gzip
import math
import os
import struct
import zlib
from pathlib import Path

import numpy as np

from pipesgd_ref.data.dataset import Dataset, standardise
from pipesgd_ref.errors import DataError

MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
# IDX type code -> big-endian dtype of the data on disk.
IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def open_by_suffix(path: Path, mode: str):
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
        with open_by_suffix(path, "rb") as f:
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
    with open_by_suffix(Path(path), "wb") as f:
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
    X_train, X_test = standardise(X_train, X_test)
    y_train, y_test = arrays["train_labels"], arrays["test_labels"]
    image_shape = (1, *train.shape[1:])
    return Dataset(
        f"mnist:{path}", X_train, y_train, X_test, y_test, n_classes=10, image_shape=image_shape
    )
