"""Every CUDA op against its NumPy reference.

Tiny sizes run in Numba's CUDA simulator (conftest.py sets NUMBA_ENABLE_CUDASIM=1): it checks
indexing, edge guards and barriers, not speed, at about a millisecond per simulated thread, so
shapes stay at one or two tiles and examples are few. The shapes are chosen to break kernels:
1 x 1, sizes that are not multiples of TILE (16) or of the block size, an empty batch.
With PIPESGD_GPU_TESTS=1 on a machine with a GPU the same tests run on it, and so do the tests
marked `gpu`, at sizes where every block and tile is full and many are ragged.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pipesgd_ref.ops import OP_NAMES, cuda_matmul, get_backend
from pipesgd_ref.ops import cuda_ops as dev  # importing needs no GPU; launching does
from pipesgd_ref.ops import numpy_ops as ref
from pipesgd_ref.ops.cuda_elementwise import add_into_kernel
from pipesgd_ref.ops.cuda_softmax import ROW_THREADS, softmax_xent_rows_kernel
from pipesgd_ref.ops.cuda_support import gpu_problem, launch, simulated
from pipesgd_ref.ops.cuda_windows import (
    col2im_kernel,
    im2col_kernel,
    maxpool_backward_kernel,
    maxpool_forward_kernel,
)
from pipesgd_ref.ops.numpy_ops import conv_out
from strategies import conv_shapes, pool_input, pool_shapes, random_array, seeds

_problem = gpu_problem()
pytestmark = pytest.mark.skipif(_problem is not None, reason=f"CUDA kernels cannot run: {_problem}")

FEW = settings(max_examples=4)  # each example launches kernels of hundreds of simulated threads

# (batch, n_in, n_out): at most two tiles along any axis, ragged edges included.
tiny_dense_shapes = st.tuples(
    st.sampled_from([0, 1, 3, 17]), st.sampled_from([1, 3, 17]), st.sampled_from([1, 5, 17])
)
tiny_lengths = st.sampled_from([0, 1, 3, 257])  # 257: one more than a block of 256 threads
RTOL, ATOL = 1e-5, 1e-5  # float32; the tiled sums run in another order than NumPy's BLAS


def assert_close(got, want, what, rtol=RTOL, atol=ATOL):
    diff = float(np.max(np.abs(got - want))) if got.size else 0.0
    np.testing.assert_allclose(
        got,
        want,
        rtol=rtol,
        atol=atol,
        err_msg=f"cuda {what} differs from the numpy reference (max |diff| {diff:.3g})",
    )


def nan_device(shape):
    """A device array of NaN: an op that forgets to write part of its output fails the test."""
    return dev.to_device(np.full(shape, np.nan, np.float32))


def check_dense_forward(shape, seed, rtol=RTOL, atol=ATOL):
    B, n_in, n_out = shape
    X = random_array(seed, (B, n_in), np.float32)
    W = random_array(seed + 1, (n_in, n_out), np.float32)
    b = random_array(seed + 2, (n_out,), np.float32)
    want = np.empty((B, n_out), np.float32)
    ref.dense_forward(X, W, b, want)
    Y = nan_device((B, n_out))
    dev.dense_forward(dev.to_device(X), dev.to_device(W), dev.to_device(b), Y)
    assert_close(dev.to_host(Y), want, f"dense_forward {shape}", rtol, atol)


def check_dense_backward(shape, seed, with_dX, rtol=RTOL, atol=ATOL):
    B, n_in, n_out = shape
    X = random_array(seed, (B, n_in), np.float32)
    W = random_array(seed + 1, (n_in, n_out), np.float32)
    dY = random_array(seed + 2, (B, n_out), np.float32)
    want = (np.empty_like(W), np.empty(n_out, np.float32), np.empty_like(X) if with_dX else None)
    ref.dense_backward(X, W, dY, *want)
    got = (nan_device(W.shape), nan_device(n_out), nan_device(X.shape) if with_dX else None)
    dev.dense_backward(dev.to_device(X), dev.to_device(W), dev.to_device(dY), *got)
    for name, g, w in zip(("dW", "db", "dX"), got, want, strict=True):
        if w is not None:
            assert_close(dev.to_host(g), w, f"dense_backward {name} {shape}", rtol, atol)


def check_softmax(B, C, seed, label_dtype, labels_on_device, rtol=RTOL, atol=ATOL):
    logits = random_array(seed, (B, C), np.float32, scale=3.0)
    y = np.random.default_rng(seed).integers(0, C, size=B).astype(label_dtype)
    want = np.empty_like(logits)
    want_loss = ref.softmax_xent_grad(logits, y, want)
    dlogits = nan_device((B, C))
    y_arg = dev.to_device(y) if labels_on_device else y
    loss = dev.softmax_xent_grad(dev.to_device(logits), y_arg, dlogits)
    assert isinstance(loss, float), f"softmax_xent_grad returned {type(loss)}, not a float"
    np.testing.assert_allclose(
        loss, want_loss, rtol=rtol, err_msg=f"cuda softmax_xent_grad loss, B={B} C={C}"
    )
    assert_close(dev.to_host(dlogits), want, f"softmax_xent_grad dlogits B={B} C={C}", rtol, atol)


def test_backend_is_registered():
    backend = get_backend("cuda")
    for name in OP_NAMES:
        assert callable(getattr(backend, name)), f"cuda backend lacks {name}"


@pytest.mark.slow
@FEW
@given(tiny_dense_shapes, seeds)
@example((3, 17, 5), 0)  # X (3, 17) @ W (17, 5): ragged in every dimension
@example((1, 1, 1), 1)
@example((0, 3, 5), 2)  # an empty batch: nothing to write, nothing may crash
def test_dense_forward(shape, seed):
    check_dense_forward(shape, seed)


@pytest.mark.slow
@FEW
@given(tiny_dense_shapes, seeds, st.booleans())
@example((3, 17, 5), 0, True)
@example((0, 3, 5), 1, True)  # an empty batch: dW and db are zeros
@example((1, 1, 1), 2, False)
def test_dense_backward(shape, seed, with_dX):
    check_dense_backward(shape, seed, with_dX)


@FEW
@given(tiny_lengths, seeds)
@example(0, 0)
def test_relu(n, seed):
    Z = random_array(seed, (n, 3), np.float32)
    dA = random_array(seed + 1, (n, 3), np.float32)
    want_A, want_dZ = np.empty_like(Z), np.empty_like(Z)
    ref.relu_forward(Z, want_A)
    ref.relu_backward(Z, dA, want_dZ)
    A, dZ, Zd = nan_device(Z.shape), nan_device(Z.shape), dev.to_device(Z)
    dev.relu_forward(Zd, A)
    dev.relu_backward(Zd, dev.to_device(dA), dZ)
    np.testing.assert_array_equal(dev.to_host(A), want_A, err_msg=f"cuda relu_forward n={n}")
    np.testing.assert_array_equal(dev.to_host(dZ), want_dZ, err_msg=f"cuda relu_backward n={n}")


@FEW
@given(tiny_lengths, seeds, st.floats(-3, 3, width=32))
@example(1, 0, 0.5)
def test_add_into_scale_sgd_step(n, seed, alpha):
    params = random_array(seed, n, np.float32)
    grads = random_array(seed + 1, n, np.float32)
    want = params.copy()
    ref.add_into(want, grads)
    ref.scale(want, alpha)
    ref.sgd_step(want, grads, alpha)
    p = dev.to_device(params)
    g = dev.to_device(grads)
    dev.add_into(p, g)
    dev.scale(p, alpha)
    dev.sgd_step(p, g, alpha)
    # The same float32 operations per element; a GPU may fuse p - lr * g into one FMA (one
    # rounding instead of two), so allow a few ulps.
    assert_close(dev.to_host(p), want, f"add_into/scale/sgd_step n={n} alpha={alpha}", 1e-6, 1e-6)


@pytest.mark.slow
@FEW
@given(
    st.sampled_from([0, 1, 3, 5]),
    st.sampled_from([2, 10, 33]),  # 33: more classes than the ROW_THREADS threads of a row
    seeds,
    st.sampled_from([np.int64, np.int32]),
    st.booleans(),
)
@example(3, 10, 0, np.int64, True)  # what the MLP passes: int64 labels from pipesgd_ref.data
@example(0, 10, 0, np.int64, True)  # an empty batch: loss 0
def test_softmax_xent_grad(B, C, seed, label_dtype, labels_on_device):
    check_softmax(B, C, seed, label_dtype, labels_on_device)


@pytest.mark.slow
def test_grid_stride_loops_cover_more_elements_than_threads():
    """A grid smaller than the data (as launch_1d's MAX_BLOCKS cap makes it for huge arrays):
    every element must still be visited exactly once."""
    dst, src = np.arange(100, dtype=np.float32), np.ones(100, np.float32)
    d = dev.to_device(dst)
    add_into_kernel[2, 16](d, dev.to_device(src))  # 32 threads, 100 elements
    np.testing.assert_array_equal(dev.to_host(d), dst + 1, err_msg="grid-stride add_into")

    B, C = 5, 4  # 2 blocks for 5 rows: blocks take rows 0, 2, 4 and 1, 3
    logits = random_array(7, (B, C), np.float32)
    y = np.arange(B) % C
    want = np.empty_like(logits)
    ref.softmax_xent_grad(logits, y, want)
    dlogits, row_loss = nan_device((B, C)), nan_device(B)
    softmax_xent_rows_kernel[2, ROW_THREADS](
        dev.to_device(logits), dev.to_device(y), dlogits, row_loss
    )
    assert_close(dev.to_host(dlogits), want, "grid-stride softmax rows")


def test_allocation_helpers():
    z = dev.zeros((3, 5), np.float32)
    assert z.shape == (3, 5) and z.dtype == np.float32
    np.testing.assert_array_equal(dev.to_host(z), np.zeros((3, 5), np.float32))
    assert dev.zeros((0, 4)).shape == (0, 4)
    e = dev.empty((2, 7), np.int64)
    assert e.shape == (2, 7) and e.dtype == np.int64
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    d = dev.to_device(host.T)  # non-contiguous in: copied to a C-contiguous device array
    np.testing.assert_array_equal(dev.to_host(d), host.T)
    out = np.empty((4, 3), np.float32)
    assert dev.to_host(d, out=out) is out
    np.testing.assert_array_equal(out, host.T)


def test_float64_matmul_is_refused_with_a_way_out():
    X = dev.to_device(np.ones((2, 3)))
    W = dev.to_device(np.ones((3, 4)))
    b, Y = dev.to_device(np.ones(4)), dev.empty((2, 4), np.float64)
    with pytest.raises(TypeError, match="numpy backend"):
        dev.dense_forward(X, W, b, Y)


# ---------------------------------------------------------------------------------------------
# Convolution as im2col + matmul, and max-pooling. BITWISE against NumPy: im2col and
# maxpool_forward copy and compare; col2im and maxpool_backward are gathers that add the same
# float32 terms in the reference's (u, v) order (adds only: nothing a GPU could fuse into an FMA).

tiny_conv_shapes = conv_shapes(max_batch=2, max_size=5, max_channels=2)
tiny_pool_shapes = pool_shapes(max_batch=2, max_size=5, max_channels=2)


def check_im2col_col2im(shape, seed):
    B, H, W, C, kh, kw, stride, pad = shape
    Ho, Wo = conv_out(H, kh, stride, pad), conv_out(W, kw, stride, pad)
    X = random_array(seed, (B, H, W, C), np.float32)
    want = np.empty((B * Ho * Wo, kh * kw * C), np.float32)
    ref.im2col(X, kh, kw, stride, pad, want)
    cols = nan_device(want.shape)
    dev.im2col(dev.to_device(X), kh, kw, stride, pad, cols)
    np.testing.assert_array_equal(dev.to_host(cols), want, err_msg=f"cuda im2col {shape}")

    R = random_array(seed + 1, want.shape, np.float32)
    want = np.empty_like(X)
    ref.col2im(R, kh, kw, stride, pad, want)
    dX = nan_device(X.shape)
    dev.col2im(dev.to_device(R), kh, kw, stride, pad, dX)
    np.testing.assert_array_equal(dev.to_host(dX), want, err_msg=f"cuda col2im {shape}")


def check_maxpool(shape, seed, ties):
    B, H, W, C, k, stride = shape
    X = pool_input(seed, (B, H, W, C), np.float32, ties)
    pooled = (B, conv_out(H, k, stride, 0), conv_out(W, k, stride, 0), C)
    want_Y, want_argmax = np.empty(pooled, np.float32), np.empty(pooled, np.int32)
    ref.maxpool_forward(X, k, stride, want_Y, want_argmax)
    Y, argmax = nan_device(pooled), dev.to_device(np.full(pooled, -1, np.int32))
    dev.maxpool_forward(dev.to_device(X), k, stride, Y, argmax)
    np.testing.assert_array_equal(dev.to_host(Y), want_Y, err_msg=f"cuda maxpool Y {shape}")
    np.testing.assert_array_equal(
        dev.to_host(argmax), want_argmax, err_msg=f"cuda maxpool argmax {shape} ties={ties}"
    )

    dY = random_array(seed + 1, pooled, np.float32)
    want = np.empty_like(X)
    ref.maxpool_backward(dY, want_argmax, k, stride, want)
    dX = nan_device(X.shape)
    dev.maxpool_backward(dev.to_device(dY), argmax, k, stride, dX)
    np.testing.assert_array_equal(dev.to_host(dX), want, err_msg=f"cuda maxpool_backward {shape}")


@FEW
@given(tiny_conv_shapes, seeds)
@example((0, 3, 3, 2, 3, 3, 1, 1), 0)  # an empty batch: no launch, nothing may crash
@example((2, 3, 3, 2, 3, 3, 1, 0), 1)  # the window is the whole map: Ho = Wo = 1
@example((1, 5, 4, 1, 3, 3, 1, 1), 2)  # overlapping windows: up to 9 terms per pixel, in order
@example((1, 5, 5, 2, 1, 2, 2, 0), 3)  # kernel < stride: pixels no window reads stay 0
def test_im2col_col2im(shape, seed):
    check_im2col_col2im(shape, seed)


@FEW
@given(tiny_pool_shapes, seeds, st.booleans())
@example((0, 2, 2, 1, 2, 2), 0, False)  # an empty batch
@example((2, 5, 5, 2, 3, 1), 1, True)  # overlapping windows with ties: the first max, summed
@example((1, 5, 4, 1, 1, 2), 2, False)  # k < stride: pixels no window covers stay 0
def test_maxpool(shape, seed, ties):
    check_maxpool(shape, seed, ties)


def test_window_kernels_grid_stride():
    """Each window kernel launched with 32 threads for more than 32 outputs: every element of
    the output must still be written once (the NaN fill shows any that is not)."""
    B, H, W, C, k, stride, pad = 1, 4, 5, 2, 3, 1, 1
    X = pool_input(5, (B, H, W, C), np.float32, ties=True)
    Ho, Wo = conv_out(H, k, stride, pad), conv_out(W, k, stride, pad)
    want_cols, want_dX = np.empty((B * Ho * Wo, k * k * C), np.float32), np.empty_like(X)
    ref.im2col(X, k, k, stride, pad, want_cols)
    ref.col2im(want_cols, k, k, stride, pad, want_dX)
    cols, dX = nan_device(want_cols.shape), nan_device(X.shape)
    im2col_kernel[1, 32](dev.to_device(X), k, k, stride, pad, cols)  # 360 elements
    col2im_kernel[1, 32](cols, k, k, stride, pad, dX)  # 40 pixels
    np.testing.assert_array_equal(dev.to_host(cols), want_cols, err_msg="grid-stride im2col")
    np.testing.assert_array_equal(dev.to_host(dX), want_dX, err_msg="grid-stride col2im")

    pooled = (B, conv_out(H, 2, 1, 0), conv_out(W, 2, 1, 0), C)  # 24 outputs, 16 threads
    want_Y, want_argmax = np.empty(pooled, np.float32), np.empty(pooled, np.int32)
    ref.maxpool_forward(X, 2, 1, want_Y, want_argmax)
    ref.maxpool_backward(want_Y, want_argmax, 2, 1, want_dX)
    Y, argmax, dX = nan_device(pooled), dev.empty(pooled, np.int32), nan_device(X.shape)
    maxpool_forward_kernel[1, 16](dev.to_device(X), 2, 1, Y, argmax)
    maxpool_backward_kernel[1, 16](Y, argmax, 2, 1, dX)
    np.testing.assert_array_equal(dev.to_host(Y), want_Y, err_msg="grid-stride maxpool Y")
    np.testing.assert_array_equal(dev.to_host(dX), want_dX, err_msg="grid-stride maxpool dX")


def test_window_ops_refuse_float64_and_int64_argmax():
    X, Y = dev.to_device(np.ones((1, 4, 4, 1))), dev.empty((1, 2, 2, 1), np.float64)
    with pytest.raises(TypeError, match="float32"):
        dev.maxpool_forward(X, 2, 2, Y, dev.empty((1, 2, 2, 1), np.int32))
    X32, Y32 = dev.to_device(np.ones((1, 4, 4, 1), np.float32)), dev.empty((1, 2, 2, 1))
    with pytest.raises(TypeError, match="int32"):
        dev.maxpool_forward(X32, 2, 2, Y32, dev.empty((1, 2, 2, 1), np.int64))
    with pytest.raises(ValueError, match="cols has shape"):
        dev.im2col(X32, 3, 3, 1, 0, dev.empty((4, 8)))  # 9 columns: 3 x 3 x C


# ---------------------------------------------------------------------------------------------
# Large sizes: a real GPU only


def require_gpu():
    if os.environ.get("PIPESGD_GPU_TESTS") != "1":
        pytest.skip("large CUDA checks need a real GPU: run with PIPESGD_GPU_TESTS=1 on one")
    if simulated():
        pytest.skip("NUMBA_ENABLE_CUDASIM=1: the simulator is far too slow for large sizes")
    problem = gpu_problem()
    if problem is not None:
        pytest.skip(problem)


LARGE_RTOL, LARGE_ATOL = 1e-4, 1e-3  # sums of 1000+ float32 products, in another order


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1024, 1024, 1024), (1000, 1023, 1025), (4096, 64, 10)])
def test_dense_large(shape):
    require_gpu()
    check_dense_forward(shape, 0, LARGE_RTOL, LARGE_ATOL)
    check_dense_backward(shape, 1, True, LARGE_RTOL, LARGE_ATOL)


@pytest.mark.gpu
@pytest.mark.parametrize("B, C", [(4096, 10), (1000, 1000), (70000, 3)])  # 70000 > MAX_BLOCKS
def test_softmax_large(B, C):
    require_gpu()
    check_softmax(B, C, 0, np.int64, True, LARGE_RTOL, LARGE_ATOL)


@pytest.mark.gpu
def test_elementwise_large():
    require_gpu()
    n = 20_000_000  # more than MAX_BLOCKS * THREADS_PER_BLOCK: the grid-stride loop is used
    params, grads = random_array(0, n, np.float32), random_array(1, n, np.float32)
    want = params.copy()
    ref.add_into(want, grads)
    ref.scale(want, 0.5)
    ref.sgd_step(want, grads, 0.1)
    p, g = dev.to_device(params), dev.to_device(grads)
    dev.add_into(p, g)
    dev.scale(p, 0.5)
    dev.sgd_step(p, g, 0.1)
    assert_close(dev.to_host(p), want, "add_into/scale/sgd_step n=2e7", 1e-6, 1e-6)
    A, dZ = dev.empty(n), dev.empty(n)
    dev.relu_forward(p, A)
    dev.relu_backward(p, g, dZ)
    host_p = dev.to_host(p)
    np.testing.assert_array_equal(dev.to_host(A), np.maximum(host_p, 0), err_msg="relu_forward")
    np.testing.assert_array_equal(dev.to_host(dZ), grads * (host_p > 0), err_msg="relu_backward")


@pytest.mark.gpu
@pytest.mark.parametrize(
    "conv, pool",
    [
        ((64, 32, 32, 16, 3, 3, 1, 1), (64, 32, 32, 16, 2, 2)),  # a CNN's first block
        ((7, 33, 31, 3, 5, 3, 2, 2), (7, 33, 31, 3, 3, 2)),  # ragged, overlapping pool windows
    ],
)
def test_conv_pool_large(conv, pool):
    require_gpu()
    check_im2col_col2im(conv, 0)
    check_maxpool(pool, 1, ties=False)
    check_maxpool(pool, 2, ties=True)


@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, False), (False, True)])
def test_register_tiled_matmul(trans_a, trans_b):
    """The register-tiled kernel (a 4 x 4 micro-tile per thread) against NumPy: ragged edges
    in every direction (one block, most of its tile outside C), each transpose the dense ops
    use, the bias fused; within float32 rounding (it sums in its own order)."""
    M, N, K = 5, 7, 19  # K > RT_BK: two depth steps, the second ragged
    A = random_array(11, (K, M) if trans_a else (M, K), np.float32)
    B = random_array(12, (N, K) if trans_b else (K, N), np.float32)
    bias = random_array(13, (N,), np.float32)
    C = nan_device((M, N))
    threads = (cuda_matmul.RT_THREADS, cuda_matmul.RT_THREADS)
    operands = (dev.to_device(A), dev.to_device(B), dev.to_device(bias), C)
    launch(cuda_matmul.matmul_register_tiled_kernel, ((1, 1), threads), *operands, trans_a, trans_b)
    want = (A.T if trans_a else A) @ (B.T if trans_b else B) + bias
    assert_close(C.copy_to_host(), want, f"register-tiled matmul {trans_a=} {trans_b=}")


def test_dense_ops_take_the_register_tiled_kernel_from_its_size(monkeypatch):
    """With the size threshold lowered, dense_forward and dense_backward run on the register-
    tiled kernel and still match NumPy."""
    monkeypatch.setattr(cuda_matmul, "REGISTER_TILED_FROM", 1)
    launched = []
    monkeypatch.setattr(cuda_matmul, "launch", lambda k, *a: (launched.append(k), launch(k, *a)))
    check_dense_forward((3, 5, 4), 21)
    check_dense_backward((3, 5, 4), 22, with_dX=True)
    kernels = cuda_matmul.matmul_register_tiled_kernel, cuda_matmul.matmul_tiled_kernel
    assert kernels[0] in launched and kernels[1] not in launched
