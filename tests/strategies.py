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
