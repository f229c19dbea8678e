"""Hypothesis strategies shared by the tests: sizes, shapes, seeds, spectra.

Lengths include the edge cases every array op must handle: 0, 1, odd, and large. Random values
come from a seed drawn by hypothesis and fed to NumPy's generator: the arrays are generic (no
exact ties, no values sitting on a ReLU kink) and shrinking still works on the seed.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

seeds = st.integers(min_value=0, max_value=2**32 - 1)
world_sizes = st.integers(min_value=1, max_value=8)
float_dtypes = st.sampled_from([np.float32, np.float64])

# 0, 1, small odd/even, primes, and a large length (vectorised loops with remainders).
lengths = st.one_of(
    st.sampled_from([0, 1, 2, 3, 7, 31, 64, 127, 1000, 4099]),
    st.integers(min_value=0, max_value=300),
)

# --- the ring (tests/test_ring.py, tests/test_compressed_ring.py) -----------------------------

# Primes: never divisible by any p > 1, so the chunks differ in size.
RING_PRIMES = (2, 3, 5, 7, 11, 13, 97)


def ring_lengths(p: int, max_n: int = 300):
    """Lengths of a flat array for a ring of p ranks: 0 (every rank still takes every step),
    1, p-1 (fewer elements than ranks: some chunks are empty), p, p+1 (not divisible by p),
    primes, and any length up to max_n."""
    edges = sorted({0, 1, max(p - 1, 0), p, p + 1, *RING_PRIMES})
    return st.one_of(st.sampled_from(edges), st.integers(0, max_n))


@st.composite
def ring_sizes(draw, max_p: int = 8, max_n: int = 300):
    """(p, n): a world size 1..max_p (at most 8, world_sizes) and a length for it
    (ring_lengths). Tests that start p processes per example pass a smaller max_p."""
    p = draw(st.integers(1, max_p))
    return p, draw(ring_lengths(p, max_n))


def integer_valued(seed, n: int, dtype=np.float64, bound: int = 1000) -> np.ndarray:
    """n integers in [-bound, bound) as dtype: sums of a few of them are exact in any order
    (float32 while |sum| < 2^24), so a ring's result can be compared with np.sum bit for bit.
    `seed` as for np.random.default_rng (an int or a list such as [seed, rank])."""
    return np.random.default_rng(seed).integers(-bound, bound, n).astype(dtype)


# A dense layer's (batch, n_in, n_out), edge sizes included.
dense_shapes = st.tuples(
    st.sampled_from([0, 1, 2, 3, 5, 17, 64]),
    st.sampled_from([1, 2, 3, 7, 16, 33]),
    st.sampled_from([1, 2, 3, 10, 31]),
)

# Small MLP shapes for finite-difference checks: (n_features, hidden, n_classes, batch).
mlp_shapes = st.tuples(
    st.integers(1, 6),
    st.lists(st.integers(1, 5), min_size=0, max_size=2).map(tuple),
    st.integers(2, 5),
    st.integers(1, 6),
)


# --- sliding windows (im2col / col2im, max-pooling): tests/test_ops.py, tests/test_cuda_ops.py --


@st.composite
def conv_shapes(draw, max_batch: int = 2, max_size: int = 9, max_channels: int = 3):
    """(B, H, W, C, kh, kw, stride, pad): batch 0..max_batch, kernel 1..3 on each axis (kh != kw
    too), stride 1..2 (so kernel < stride, == stride and > stride all occur), pad 0..2, and H, W
    from the smallest map the window fits in (an exact fit; shrinking goes there) up to
    max_size, odd and even, with and without a remainder the windows never reach."""
    kh, kw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    stride, pad = draw(st.integers(1, 2)), draw(st.integers(0, 2))
    H = draw(st.integers(max(1, kh - 2 * pad), max_size))
    W = draw(st.integers(max(1, kw - 2 * pad), max_size))
    B, C = draw(st.integers(0, max_batch)), draw(st.integers(1, max_channels))
    return B, H, W, C, kh, kw, stride, pad


@st.composite
def pool_shapes(draw, max_batch: int = 2, max_size: int = 9, max_channels: int = 3):
    """(B, H, W, C, k, stride): a k x k pool (k 1..3, no padding) with stride 1..2, so windows
    overlap (stride < k), tile (stride == k) or skip pixels (stride > k); H, W from k (one
    window) up to max_size."""
    k, stride = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    H, W = draw(st.integers(k, max_size)), draw(st.integers(k, max_size))
    B, C = draw(st.integers(0, max_batch)), draw(st.integers(1, max_channels))
    return B, H, W, C, k, stride


def pool_input(seed: int, shape, dtype, ties: bool) -> np.ndarray:
    """A feature map for max-pooling: with `ties`, integers in [-2, 2], so most windows hold
    their maximum more than once and the first-maximum rule is exercised; else normal values."""
    if ties:
        return np.random.default_rng(seed).integers(-2, 3, size=shape).astype(dtype)
    return random_array(seed, shape, dtype)


def central_differences(f, w: np.ndarray, idx, eps: float = 1e-6) -> np.ndarray:
    """(f(w + eps e_i) - f(w - eps e_i)) / 2 eps for each coordinate i of idx: the gradient
    checks' reference (use float64 w)."""
    out = []
    for i in idx:
        e = np.zeros_like(w)
        e[i] = eps
        out.append((f(w + e) - f(w - e)) / (2 * eps))
    return np.array(out)


def random_array(seed: int, shape, dtype=np.float64, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).normal(size=shape) * scale).astype(dtype)


@st.composite
def spd_matrices(draw, max_dim: int = 6, max_condition: float = 10.0):
    """(A, b, lam_max): A symmetric positive definite with eigenvalues in
    [lam_max / condition, lam_max], a random rotation, and a random b."""
    dim = draw(st.integers(1, max_dim))
    seed = draw(seeds)
    lam_max = draw(st.floats(0.1, 10.0))
    condition = draw(st.floats(1.0, max_condition))
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.normal(size=(dim, dim)))
    lams = rng.uniform(lam_max / condition, lam_max, size=dim)
    lams[0] = lam_max  # the top of the spectrum is exactly lam_max
    A = (Q * lams) @ Q.T
    A = (A + A.T) / 2
    b = rng.normal(size=dim)
    return A, b, lam_max


# --- timing models (tests/test_timing.py, tests/test_predict.py) ---------------------------------


def log_uniform(lo: float, hi: float):
    """Floats spread evenly over the decades between lo > 0 and hi (1e-6..1 reaches every scale
    a timing model meets, which a uniform draw would not)."""
    import math

    return st.floats(math.log10(lo), math.log10(hi)).map(lambda x: 10.0**x)


timing_world_sizes = st.integers(min_value=1, max_value=64)


@st.composite
def calibrations(draw, cores: int | None = None, copy: bool = True):
    """A timing.Calibration from a laptop-sized model to a cluster-sized one: n 1..1e8 params,
    t_comp 10 us..1 s, alpha 0..10 ms, B 1 Mbit/s..1 Tbit/s or unlimited, gamma and copy
    0..1 ns/B, trunc16 (r = 2) and q8 (r = 4) with e, d 0..5 ns/B. cores: fixed (e.g. 10**6
    for the textbook formulas, every worker on a core of its own), else drawn 1..64. copy=False:
    no socket copy cost (the pure alpha-beta link)."""
    from pipesgd_ref.timing import Calibration

    def zero_or(s):  # zero is a case of its own: a free term must not break a formula
        return st.one_of(st.just(0.0), s)

    codec_cost = zero_or(log_uniform(1e-12, 5e-9))
    return Calibration(
        n_params=draw(st.integers(0, 8).map(lambda k: 10**k) | st.integers(1, 10**8)),
        t_comp=draw(log_uniform(1e-5, 1.0)),
        t_update=draw(zero_or(log_uniform(1e-7, 1e-2))),
        alpha=draw(zero_or(log_uniform(1e-7, 1e-2))),
        bandwidth=draw(st.one_of(log_uniform(1.25e5, 1.25e11), st.just(float("inf")))),
        gamma=draw(zero_or(log_uniform(1e-13, 1e-9))),
        copy=draw(zero_or(log_uniform(1e-13, 1e-9))) if copy else 0.0,
        cores=cores if cores is not None else draw(st.integers(1, 64)),
        t_comp_cpu=tuple(sorted(draw(st.lists(log_uniform(1e-5, 1.0), max_size=4)))),
        codecs={
            "trunc16": (2.0, draw(codec_cost), draw(codec_cost)),
            "q8": (4.0, draw(codec_cost), draw(codec_cost)),
        },
    )
