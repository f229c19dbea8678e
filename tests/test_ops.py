"""Every Numba op against its NumPy reference, on random inputs of edge and odd sizes."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipesgd_ref.ops import OP_NAMES, get_backend
from strategies import dense_shapes, float_dtypes, lengths, random_array, seeds

ref = get_backend("numpy")
fast = get_backend("numba")


def tol(dtype):
    return dict(rtol=1e-4, atol=1e-5) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-12)


def assert_close(got, want, dtype, what):
    np.testing.assert_allclose(
        got, want, **tol(dtype), err_msg=f"numba {what} differs from the numpy reference"
    )


def test_backends_provide_every_op():
    for name in OP_NAMES:
        assert callable(getattr(fast, name)) and callable(getattr(ref, name))
    with pytest.raises(ValueError, match="choose one of: numpy, numba"):
        get_backend("cupy")


@given(dense_shapes, float_dtypes, seeds)
def test_dense_forward(shape, dtype, seed):
    B, n_in, n_out = shape
    X = random_array(seed, (B, n_in), dtype)
    W = random_array(seed + 1, (n_in, n_out), dtype)
    b = random_array(seed + 2, (n_out,), dtype)
    want, got = np.empty((B, n_out), dtype), np.full((B, n_out), np.nan, dtype)
    ref.dense_forward(X, W, b, want)
    fast.dense_forward(X, W, b, got)
    assert_close(got, want, dtype, f"dense_forward {shape}")
    assert_close(want, X.astype(np.float64) @ W + b, dtype, "reference dense_forward")


@given(dense_shapes, float_dtypes, seeds, st.booleans())
def test_dense_backward(shape, dtype, seed, with_dX):
    B, n_in, n_out = shape
    X = random_array(seed, (B, n_in), dtype)
    W = random_array(seed + 1, (n_in, n_out), dtype)
    dY = random_array(seed + 2, (B, n_out), dtype)
    outs = {}
    for name, be in (("ref", ref), ("fast", fast)):
        # Fill with NaN: an op that forgets to write (or to zero) its output fails the test.
        dW, db = np.full((n_in, n_out), np.nan, dtype), np.full(n_out, np.nan, dtype)
        dX = np.full((B, n_in), np.nan, dtype) if with_dX else None
        be.dense_backward(X, W, dY, dW, db, dX)
        outs[name] = (dW, db, dX)
    for i, what in enumerate(("dW", "db", "dX")):
        if outs["ref"][i] is not None:
            assert_close(outs["fast"][i], outs["ref"][i], dtype, f"dense_backward {what} {shape}")
    assert_close(outs["ref"][0], X.T.astype(np.float64) @ dY, dtype, "reference dW")


@given(lengths, float_dtypes, seeds)
def test_relu(n, dtype, seed):
    Z = random_array(seed, (n, 3), dtype)
    dA = random_array(seed + 1, (n, 3), dtype)
    outs = []
    for be in (ref, fast):
        A, dZ = np.full_like(Z, np.nan), np.full_like(Z, np.nan)
        be.relu_forward(Z, A)
        be.relu_backward(Z, dA, dZ)
        outs.append((A, dZ))
    np.testing.assert_array_equal(outs[1][0], outs[0][0], err_msg="relu_forward")
    np.testing.assert_array_equal(outs[1][1], outs[0][1], err_msg="relu_backward")
    np.testing.assert_array_equal(outs[0][0], np.where(Z > 0, Z, 0))


@given(
    st.sampled_from([0, 1, 2, 7, 64]), st.integers(2, 12), float_dtypes, seeds, st.floats(0.1, 30)
)
def test_softmax_xent_grad(B, C, dtype, seed, spread):
    logits = random_array(seed, (B, C), dtype, scale=spread)  # large spread: tests the max shift
    y = np.random.default_rng(seed).integers(0, C, size=B)
    want, got = np.full_like(logits, np.nan), np.full_like(logits, np.nan)
    loss_ref = ref.softmax_xent_grad(logits, y, want)
    loss_fast = fast.softmax_xent_grad(logits, y, got)
    assert_close(got, want, dtype, "softmax_xent_grad gradient")
    assert np.isclose(loss_fast, loss_ref, **tol(dtype)), (loss_fast, loss_ref)
    if B:
        # Definition check in float64: loss = mean(logsumexp - logit of the label).
        l64 = logits.astype(np.float64)
        m = l64.max(axis=1)
        lse = m + np.log(np.exp(l64 - m[:, None]).sum(axis=1))
        # float32 rounds logsumexp (of size ~spread) before the subtraction: absolute slack.
        atol = 4e-7 * (1 + spread) if dtype == np.float32 else 1e-12 * (1 + spread)
        assert np.isclose(loss_ref, np.mean(lse - l64[np.arange(B), y]), rtol=1e-5, atol=atol)
        # Each gradient row sums to zero (softmax minus one-hot).
        np.testing.assert_allclose(want.sum(axis=1), 0, atol=1e-6)


@given(lengths, float_dtypes, seeds, st.floats(-3, 3))
def test_elementwise_ops(n, dtype, seed, alpha):
    a = random_array(seed, n, dtype)
    b = random_array(seed + 1, n, dtype)
    for op, args in (("add_into", (b,)), ("scale", (alpha,)), ("sgd_step", (b, alpha))):
        want, got = a.copy(), a.copy()
        getattr(ref, op)(want, *args)
        getattr(fast, op)(got, *args)
        assert_close(got, want, dtype, f"{op} at length {n}")
        assert got.dtype == dtype, f"{op} changed the dtype to {got.dtype}"
    want = a.copy()
    ref.sgd_step(want, b, alpha)
    assert_close(want, a - dtype(alpha) * b, dtype, "reference sgd_step")


def test_numba_refuses_non_contiguous_views():
    x = np.zeros((4, 4), np.float32)[:, ::2]  # a strided view: a flat copy would lose the writes
    with pytest.raises(ValueError, match="C-contiguous"):
        fast.scale(x, 2.0)
