"""Every Numba op against its NumPy reference, on random inputs of edge and odd sizes."""

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from pipesgd_ref.ops import OP_NAMES, get_backend
from pipesgd_ref.ops.numpy_ops import conv_out
from strategies import (
    conv_shapes,
    dense_shapes,
    float_dtypes,
    lengths,
    pool_input,
    pool_shapes,
    random_array,
    seeds,
)

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


# --- convolution as im2col + matmul, and max-pooling ------------------------------------------
#
# Bitwise: im2col and maxpool_forward only copy and compare, and the numba gradients add the same
# terms in the reference's (u, v) order, so any difference at all is a bug, not rounding.


def cols_shape(shape):
    B, H, W, C, kh, kw, stride, pad = shape
    return B * conv_out(H, kh, stride, pad) * conv_out(W, kw, stride, pad), kh * kw * C


def pooled_shape(shape):
    B, H, W, C, k, stride = shape
    return B, conv_out(H, k, stride, 0), conv_out(W, k, stride, 0), C


def assert_bitwise(got, want, what):
    np.testing.assert_array_equal(got, want, err_msg=f"numba {what} differs from the reference")


@given(conv_shapes(), float_dtypes, seeds)
@example((0, 3, 3, 2, 3, 3, 1, 1), np.float32, 0)  # an empty batch
@example((2, 3, 3, 2, 3, 3, 1, 0), np.float32, 1)  # the window is the whole map: Ho = Wo = 1
@example((1, 5, 7, 3, 3, 3, 2, 1), np.float64, 2)  # stride 2 lands on the padded edge exactly
@example((1, 4, 5, 1, 1, 1, 2, 0), np.float32, 3)  # kernel < stride: pixels no window reads
@example((1, 1, 1, 1, 3, 3, 1, 1), np.float64, 4)  # one pixel, the rest of the window padding
def test_im2col_col2im(shape, dtype, seed):
    B, H, W, C, kh, kw, stride, pad = shape
    X = random_array(seed, (B, H, W, C), dtype)
    want, got = np.full(cols_shape(shape), np.nan, dtype), np.full(cols_shape(shape), np.nan, dtype)
    ref.im2col(X, kh, kw, stride, pad, want)
    fast.im2col(X, kh, kw, stride, pad, got)
    assert_bitwise(got, want, f"im2col {shape}")

    cols = random_array(seed + 1, want.shape, dtype)
    want, got = np.full_like(X, np.nan), np.full_like(X, np.nan)
    ref.col2im(cols, kh, kw, stride, pad, want)
    fast.col2im(cols, kh, kw, stride, pad, got)
    assert_bitwise(got, want, f"col2im {shape}")


@given(conv_shapes(), seeds)
@example((1, 4, 4, 2, 3, 3, 1, 2), 0)  # pad 2 with a 3x3 kernel: windows mostly padding
def test_col2im_is_the_adjoint_of_im2col(shape, seed):
    """<im2col(X), R> == <X, col2im(R)> for every X, R: col2im is the transpose of im2col's
    linear map, which is what makes it the input gradient of a convolution."""
    B, H, W, C, kh, kw, stride, pad = shape
    X = random_array(seed, (B, H, W, C))
    R = random_array(seed + 1, cols_shape(shape))
    for be in (ref, fast):
        cols, dX = np.empty(R.shape), np.empty(X.shape)
        be.im2col(X, kh, kw, stride, pad, cols)
        be.col2im(R, kh, kw, stride, pad, dX)
        lhs, rhs = float(np.vdot(cols, R)), float(np.vdot(X, dX))
        assert np.isclose(lhs, rhs, rtol=1e-12, atol=1e-12), (
            f"{be.name} {shape}: <im2col(X), R> = {lhs!r} but <X, col2im(R)> = {rhs!r}"
        )


@given(pool_shapes(), float_dtypes, seeds, st.booleans())
@example((0, 2, 2, 1, 2, 2), np.float32, 0, False)  # an empty batch
@example((1, 3, 3, 2, 3, 1), np.float32, 1, True)  # one window, the whole map, with ties
@example((2, 5, 5, 1, 3, 2), np.float64, 2, True)  # k > stride: windows overlap
@example((1, 5, 4, 3, 1, 2), np.float32, 3, False)  # k < stride: pixels no window covers
def test_maxpool(shape, dtype, seed, ties):
    B, H, W, C, k, stride = shape
    X = pool_input(seed, (B, H, W, C), dtype, ties)
    outs = {}
    for name, be in (("ref", ref), ("fast", fast)):
        Y = np.full(pooled_shape(shape), np.nan, dtype)
        argmax = np.full(Y.shape, -1, np.int32)
        be.maxpool_forward(X, k, stride, Y, argmax)
        outs[name] = Y, argmax
    assert_bitwise(outs["fast"][0], outs["ref"][0], f"maxpool_forward Y {shape}")
    assert_bitwise(outs["fast"][1], outs["ref"][1], f"maxpool_forward argmax {shape} ties={ties}")

    dY, argmax = random_array(seed + 1, Y.shape, dtype), outs["ref"][1]
    want, got = np.full_like(X, np.nan), np.full_like(X, np.nan)
    ref.maxpool_backward(dY, argmax, k, stride, want)
    fast.maxpool_backward(dY, argmax, k, stride, got)
    assert_bitwise(got, want, f"maxpool_backward {shape}")


def test_maxpool_keeps_a_nan_like_numpy():
    """A NaN in a window is its max, at the first NaN (np.max / np.argmax): a diverged
    activation propagates instead of being hidden by the pool."""
    X = np.array([[1, np.nan, 5, np.nan], [3, 2, -np.inf, np.inf], [0, 7, 0, 1]], np.float32)
    X = X.reshape(1, 3, 4, 1)
    outs = []
    for be in (ref, fast):
        Y, argmax = np.empty((1, 2, 3, 1), np.float32), np.empty((1, 2, 3, 1), np.int32)
        be.maxpool_forward(X, 2, 1, Y, argmax)
        outs.append((Y, argmax))
    assert_bitwise(outs[1][0], outs[0][0], "maxpool_forward Y with NaN")
    assert_bitwise(outs[1][1], outs[0][1], "maxpool_forward argmax with NaN")
    assert np.isnan(outs[0][0][0, 0, :2, 0]).all() and outs[0][1][0, 0, 0, 0] == 1


@given(pool_shapes(max_size=6), seeds)
@example((1, 5, 5, 1, 3, 1), 0)  # overlapping windows: one pixel can be the max of several
def test_maxpool_backward_matches_finite_differences(shape, seed):
    """dL/dX for L = <G, maxpool(X)>, by central differences on every pixel of a tie-free map
    (distinct integers: a step of 0.25 never changes which pixel is a window's max, so L is
    linear there and the difference quotient is exact up to rounding)."""
    B, H, W, C, k, stride = shape
    rng = np.random.default_rng(seed)
    X = rng.permutation(B * H * W * C).reshape(B, H, W, C).astype(np.float64)
    G = rng.normal(size=pooled_shape(shape))

    def loss(X):
        Y, argmax = np.empty(G.shape), np.empty(G.shape, np.int32)
        ref.maxpool_forward(X, k, stride, Y, argmax)
        return float(np.vdot(G, Y)), argmax

    _, argmax = loss(X)
    step = 0.25
    numeric = np.empty_like(X)
    for idx in np.ndindex(X.shape):
        Xp, Xm = X.copy(), X.copy()
        Xp[idx] += step
        Xm[idx] -= step
        numeric[idx] = (loss(Xp)[0] - loss(Xm)[0]) / (2 * step)
    for be in (ref, fast):
        dX = np.full_like(X, np.nan)
        be.maxpool_backward(G, argmax, k, stride, dX)
        np.testing.assert_allclose(
            dX, numeric, rtol=1e-10, atol=1e-10, err_msg=f"{be.name} maxpool_backward {shape}"
        )


def test_numba_window_ops_refuse_bad_arguments():
    X = np.zeros((2, 5, 5, 3), np.float32)
    cols = np.zeros((2 * 3 * 3, 27), np.float32)
    fast.im2col(X, 3, 3, 1, 0, cols)  # the right shapes: accepted
    with pytest.raises(ValueError, match=r"cols has shape \(18, 27\), expected \(50, 27\)"):
        fast.im2col(X, 3, 3, 1, 1, cols)  # pad 1 makes 5 x 5 windows per image, not 3 x 3
    with pytest.raises(ValueError, match="does not fit"):
        fast.col2im(cols, 7, 7, 1, 0, X)
    with pytest.raises(ValueError, match="C-contiguous"):
        fast.im2col(np.zeros((2, 5, 10, 3), np.float32)[:, :, ::2], 3, 3, 1, 0, cols)
    Y = np.zeros((2, 2, 2, 3), np.float32)
    with pytest.raises(TypeError, match="int32"):
        fast.maxpool_forward(X, 2, 2, Y, np.zeros(Y.shape, np.int64))
    with pytest.raises(ValueError, match="argmax has shape"):
        fast.maxpool_backward(Y, np.zeros((2, 2, 2, 1), np.int32), 2, 2, X)
