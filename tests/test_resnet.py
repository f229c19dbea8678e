"""The residual network (models/resnet.py, resnet_plan.py) and its ops (batch norm, running
averages, global average pooling): gradients against float64 central differences, the running
statistics against torch's formulas, evaluation with them, the parameter count, the backends
against the NumPy reference, and a short training run.

Tolerances. The gradient checks run the NumPy reference in float64 (rtol 1e-5, as the CNN's).
Numba against NumPy in float32 is NOT bitwise, unlike the window ops: Numba's matmul sums in
another order than BLAS, and batch norm and the pooling sum each channel in float64 in row
order where NumPy sums float32 pairwise; so float32 rounding (rtol 1e-4, atol 1e-5, as
test_cnn.py's whole-network check), and 1e-10 in float64. CUDA (Numba's simulator) likewise:
its sums are float32 in two stages (row chunks, then their partials).
"""

from __future__ import annotations

import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipesgd_ref.config import TrainConfig
from pipesgd_ref.data import load_dataset
from pipesgd_ref.errors import ConfigError
from pipesgd_ref.models import CNN, MLP, ResNet, SoftmaxRegression, build_model, model_for
from pipesgd_ref.models.layout import buckets
from pipesgd_ref.models.resnet_plan import make_plan
from pipesgd_ref.ops import numba_ops as fast
from pipesgd_ref.ops import numpy_ops as ref
from strategies import central_differences, seeds

# --- shapes (kept small: a float64 depth-14 net runs in a few ms) -----------------------------

widths = st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4))
images = st.tuples(st.integers(1, 3), st.integers(1, 7), st.integers(1, 7))  # (C, H, W)
F32 = dict(rtol=1e-4, atol=1e-5)  # float32 rounding, sums in another order
F64 = dict(rtol=1e-10, atol=1e-12)


def perturbed(model: ResNet, seed: int) -> np.ndarray:
    """float64 weights off the initial point (gamma not all 1, beta not all 0): every term of
    the gradient is exercised."""
    rng = np.random.default_rng(seed)
    return model.init_params(seed, np.float64) + 0.1 * rng.standard_normal(model.n_params)


def every_tensor(model: ResNet, rng, per_tensor: int = 2) -> np.ndarray:
    """A few random coordinates of every named tensor of the layout."""
    idx = [s.offset + rng.choice(s.size, min(per_tensor, s.size), replace=False)
           for s in model.layout.slots]  # fmt: skip
    return np.concatenate(idx)


def check_gradient(model: ResNet, B: int, seed: int, per_tensor: int = 2) -> None:
    rng = np.random.default_rng(seed)
    w = perturbed(model, seed)
    X = rng.standard_normal((B, model.n_features))
    y = rng.integers(0, model.n_classes, B)
    grads, scratch = np.empty_like(w), np.empty_like(w)
    model.loss_and_grad(w, X, y, grads)
    idx = every_tensor(model, rng, per_tensor)
    want = central_differences(lambda v: model.loss_and_grad(v, X, y, scratch), w, idx)
    names = [next(s.name for s in model.layout.slots if s.offset <= i < s.offset + s.size)
             for i in idx]  # fmt: skip
    worst = int(np.argmax(np.abs(grads[idx] - want)))
    np.testing.assert_allclose(
        grads[idx], want, rtol=1e-5, atol=1e-7,
        err_msg=f"{model!r}: worst at {names[worst]} (flat index {idx[worst]})",
    )  # fmt: skip


# --- the gradient ------------------------------------------------------------------------------


def test_depth_8_gradient_with_both_shortcuts_matches_central_differences():
    """Stage 0 keeps its width (identity shortcut); stages 1 and 2 halve the map and widen it
    (1 x 1 projections with stride 2): every tensor's gradient, odd and even sizes (5 x 6)."""
    model = ResNet((2, 5, 6), 3, depth=8, channels=(3, 4, 5))
    kinds = [blk.shortcut is None for blk in model.plan.blocks]
    assert kinds == [True, False, False], "stage 0 identity, stages 1 and 2 projections"
    check_gradient(model, B=3, seed=0, per_tensor=4)


@settings(max_examples=6, deadline=None)
@given(image=images, channels=widths, depth=st.sampled_from([8, 14]), B=st.integers(2, 3),
       seed=seeds)  # fmt: skip
def test_resnet_gradient_matches_central_differences(image, channels, depth, B, seed):
    """Any image (1 x 1 to 7 x 7, 1 to 3 channels), stage widths 1 to 4 (equal widths: more
    identity shortcuts), depth 8 or 14 (two blocks a stage: stride-1 identity blocks after the
    projections), batch 2 or 3."""
    check_gradient(ResNet(image, 3, depth, channels), B, seed % 10_000)


@settings(max_examples=10, deadline=None)
@given(N=st.integers(2, 40), C=st.integers(1, 4), seed=seeds)
def test_batchnorm_backward_matches_central_differences(N, C, seed):
    """ops.batchnorm_backward's dX, dgamma, dbeta against central differences of <Y, R> through
    batchnorm_forward (float64): the mean and the variance depend on every input."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, C)) * 2 + 1
    gamma, beta, R = rng.standard_normal(C), rng.standard_normal(C), rng.standard_normal((N, C))
    eps = 1e-5

    def f(x, g, b):
        Y, xhat, mean, var = np.empty_like(x), np.empty_like(x), np.empty(C), np.empty(C)
        ref.batchnorm_forward(x, g, b, eps, Y, xhat, mean, var)
        return float((Y * R).sum()), xhat, var

    _, xhat, var = f(X, gamma, beta)
    dX, dgamma, dbeta = np.empty_like(X), np.empty(C), np.empty(C)
    ref.batchnorm_backward(R, xhat, gamma, var, eps, dX, dgamma, dbeta)
    want = central_differences(lambda v: f(v.reshape(X.shape), gamma, beta)[0], X.ravel(),
                               range(X.size))  # fmt: skip
    np.testing.assert_allclose(dX.ravel(), want, rtol=1e-5, atol=1e-7, err_msg="dX")
    want = central_differences(lambda v: f(X, v, beta)[0], gamma, range(C))
    np.testing.assert_allclose(dgamma, want, rtol=1e-6, atol=1e-8, err_msg="dgamma")
    want = central_differences(lambda v: f(X, gamma, v)[0], beta, range(C))
    np.testing.assert_allclose(dbeta, want, rtol=1e-6, atol=1e-8, err_msg="dbeta")
    # the compact formula's projection: a constant shift of a channel's inputs changes nothing
    np.testing.assert_allclose(dX.sum(axis=0), 0, atol=1e-9)


def test_ready_hears_each_range_once_written_in_order():
    """ready(lo, hi, loss): the ranges of grad_units(), in order, contiguous and covering the
    vector, each already final when heard (ddp may send it at once), nothing below it yet
    written; buckets() accepts them."""
    model = ResNet((1, 6, 6), 4, depth=14, channels=(2, 3, 4))
    w = model.init_params(0)
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((3, 36)).astype(np.float32), np.array([0, 1, 3])
    final = np.empty_like(w)
    model.loss_and_grad(w, X, y, final)
    grads = np.full_like(w, np.nan)
    heard = []

    def ready(lo, hi, loss):
        np.testing.assert_array_equal(grads[lo:hi], final[lo:hi], err_msg=f"[{lo}, {hi})")
        assert np.isnan(grads[:lo]).all(), f"below {lo} written before its turn"
        heard.append((lo, hi))

    model.loss_and_grad(w, X, y, grads, ready=ready)
    units = model.grad_units()
    assert heard == units
    assert units[0][1] == model.n_params and units[-1][0] == 0
    assert len(units) == 2 + 6 * 2 + 2  # head, stem, 2 convs per block, 2 projections
    assert buckets(units, 0) == units and buckets(units, 1 << 30) == [(0, model.n_params)]


# --- the running statistics and evaluation -------------------------------------------------


def direct_conv3x3(X: np.ndarray, Wc: np.ndarray) -> np.ndarray:
    """A 3 x 3, pad 1, stride 1 convolution by its definition (no im2col): X (B, H, W, C),
    Wc (9*C, K) with rows (u, v, c) -> (B, H, W, K)."""
    B, H, W, C = X.shape
    P = np.zeros((B, H + 2, W + 2, C))
    P[:, 1:-1, 1:-1] = X
    K = Wc.reshape(3, 3, C, -1)
    return sum(np.einsum("bhwc,ck->bhwk", P[:, u : u + H, v : v + W], K[u, v])
               for u in range(3) for v in range(3))  # fmt: skip


def test_buffers_follow_torchs_momentum_update():
    """After a training step, the stem's running mean is 0.9 * 0 + 0.1 * the batch mean and
    its running variance 0.9 * 1 + 0.1 * the UNBIASED batch variance (ddof 1, N = B*H*W), as
    torch.nn.BatchNorm2d(momentum=0.1) updates them; a second step on the same batch gives
    0.19 * mean and 0.81 + 0.19 * var. The loss and gradient do not depend on the buffers
    (training uses the batch's statistics), and without buffers nothing is updated."""
    model = ResNet((1, 5, 5), 3, depth=8, channels=(3, 4, 4))
    w = model.init_params(1, np.float64)
    rng = np.random.default_rng(1)
    X, y = rng.standard_normal((4, 25)), np.array([0, 1, 2, 0])
    Z = direct_conv3x3(X.reshape(4, 5, 5, 1), model.layout.views(w)["stem.conv"])
    mean, var = Z.mean(axis=(0, 1, 2)), Z.var(axis=(0, 1, 2), ddof=1)
    buffers = model.init_buffers()
    assert buffers.dtype == np.float32 and buffers.size == model.n_buffers
    g1, g2 = np.empty_like(w), np.empty_like(w)
    loss = model.loss_and_grad(w, X, y, g1, buffers=buffers)
    stats = model.buffer_layout.views(buffers)
    np.testing.assert_allclose(stats["stem.bn.mean"], 0.1 * mean, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(stats["stem.bn.var"], 0.9 + 0.1 * var, rtol=1e-6)
    assert model.loss_and_grad(w, X, y, g2, buffers=buffers) == loss
    np.testing.assert_array_equal(g1, g2)
    np.testing.assert_allclose(stats["stem.bn.mean"], 0.19 * mean, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(stats["stem.bn.var"], 0.81 + 0.19 * var, rtol=1e-6)
    before = buffers.copy()
    model.loss_and_grad(w, X, y, g2)
    np.testing.assert_array_equal(buffers, before)
    np.testing.assert_array_equal(g1, g2)
    fresh = model.buffer_layout.views(model.init_buffers())
    assert all((v == (1 if k.endswith(".var") else 0)).all() for k, v in fresh.items())
    assert [s.name for s in model.buffer_layout.slots][:4] == [
        "stem.bn.mean", "stem.bn.var", "s0.b0.bn1.mean", "s0.b0.bn1.var"]  # fmt: skip


def test_evaluation_uses_the_running_statistics():
    """Running statistics equal to a batch's own (biased) ones make evaluation on that batch
    reproduce the training forward's logits; evaluation is per sample (a batch of one gives
    the same rows); predict and accuracy take the buffers; no buffers is a clear error."""
    model = ResNet((1, 6, 6), 3, depth=8, channels=(2, 3, 4))
    w = perturbed(model, 2)
    rng = np.random.default_rng(2)
    X, y = rng.standard_normal((5, 36)), np.array([0, 1, 2, 2, 1])
    scratch = model.forward(w, X)  # training mode: the batch's statistics
    train_logits = scratch["logits"].copy()
    buffers = model.init_buffers()
    stats = model.buffer_layout.views(buffers)
    for u in model.units:
        stats[f"{u.bn}.mean"][...] = scratch[u.conv]["mean"]
        stats[f"{u.bn}.var"][...] = scratch[u.conv]["var"]
    eval_logits = model.logits(w, X, buffers)
    np.testing.assert_allclose(eval_logits, train_logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(model.logits(w, X[2:3], buffers), eval_logits[2:3], rtol=1e-12)
    np.testing.assert_array_equal(model.predict(w, X, buffers), np.argmax(eval_logits, axis=1))
    want = float(np.mean(np.argmax(eval_logits, axis=1) == y))
    assert model.accuracy(w, X, y, buffers) == want
    with pytest.raises(ValueError, match="pass buffers"):
        model.accuracy(w, X, y)


def test_the_other_models_accept_and_ignore_buffers():
    rng = np.random.default_rng(3)
    X, y = rng.standard_normal((4, 16)).astype(np.float32), np.array([0, 1, 1, 0])
    for model in (SoftmaxRegression(16, 2), MLP(16, 2, (5,)), CNN((1, 4, 4), 2, (2,), (3,), (3,))):
        assert model.n_buffers == 0 and model.init_buffers().shape == (0,)
        w, ignored = model.init_params(0), np.zeros(0, np.float32)
        g1, g2 = np.empty_like(w), np.empty_like(w)
        assert model.loss_and_grad(w, X, y, g1) == model.loss_and_grad(w, X, y, g2, None, ignored)
        np.testing.assert_array_equal(g1, g2)
        assert model.accuracy(w, X, y, ignored) == model.accuracy(w, X, y)
        np.testing.assert_array_equal(model.predict(w, X, ignored), model.predict(w, X))


# --- shapes, counts, configuration -----------------------------------------------------------


def expected_params(C: int, K: int, n: int, c: tuple[int, int, int]) -> int:
    """The closed form: 3x3 filters 9 c_in c_out and a BN (2 c_out) per conv, a 1 x 1
    projection c_in c_out + 2 c_out where a stage widens, the head c2 K + K."""
    unit = lambda cin, cout, k=3: k * k * cin * cout + 2 * cout  # noqa: E731
    total = unit(C, c[0]) + n * 2 * unit(c[0], c[0])  # stem, stage 0 (identity shortcuts)
    for a, b in ((c[0], c[1]), (c[1], c[2])):  # stages 1, 2: a projecting block, n - 1 more
        total += unit(a, b) + unit(b, b) + unit(a, b, 1) + (n - 1) * 2 * unit(b, b)
    return total + c[2] * K + K


@settings(max_examples=20, deadline=None)
@given(image=images, n=st.integers(1, 4), channels=widths, K=st.integers(2, 12))
def test_parameter_and_buffer_counts(image, n, channels, K):
    model = ResNet(image, K, 6 * n + 2, channels)
    assert model.n_params == expected_params(image[0], K, n, channels)
    n_bn = 1 + 6 * n + 2  # stem, two per block, two projections
    assert len(model.buffer_layout.slots) == 2 * n_bn
    assert model.n_buffers == 2 * sum(u.c_out for u in model.units)
    h, w = image[1:]
    for _ in range(2):  # stride 2 twice, rounding up (pad 1 for the 3x3, 0 for the 1x1)
        h, w = (h + 1) // 2, (w + 1) // 2
    assert model.plan.size_last == (h, w)
    for blk in model.plan.blocks:
        if blk.shortcut is not None:
            assert blk.shortcut.size_out == blk.conv1.size_out, "the two branches must agree"


def test_digits_default_layout_and_flops():
    """depth 8, channels 16, 32, 64 on 8 x 8 digits: 77,754 parameters in the spec's order."""
    model = build_model("resnet", 64, 10, image_shape=(1, 8, 8))
    assert (model.depth, model.channels) == (8, (16, 32, 64))
    assert model.n_params == expected_params(1, 10, 1, (16, 32, 64)) == 77_754
    names = [s.name for s in model.layout.slots]
    assert names[:6] == ["stem.conv", "stem.bn.g", "stem.bn.b", "s0.b0.conv1", "s0.b0.bn1.g",
                         "s0.b0.bn1.b"]  # fmt: skip
    assert names[-5:] == ["s2.b0.sc.conv", "s2.b0.sc.bn.g", "s2.b0.sc.bn.b", "fc.W", "fc.b"]
    shapes = {s.name: s.shape for s in model.layout.slots}
    assert shapes["s1.b0.conv1"] == (9 * 16, 32) and shapes["s1.b0.sc.conv"] == (16, 32)
    macs = 64 * 9 * 16 + 2 * 64 * 9 * 16 * 16  # stem, stage 0 (8 x 8)
    macs += 16 * (9 * 16 * 32 + 9 * 32 * 32 + 16 * 32)  # stage 1 (4 x 4)
    macs += 4 * (9 * 32 * 64 + 9 * 64 * 64 + 32 * 64) + 64 * 10  # stage 2 (2 x 2), head
    assert model.flops_per_sample() == macs
    w = model.init_params(0)
    v = model.layout.views(w)
    assert (v["stem.bn.g"] == 1).all() and (v["stem.bn.b"] == 0).all() and (v["fc.b"] == 0).all()
    assert abs(float(v["s2.b0.conv2"].std()) - np.sqrt(2 / (9 * 64))) < 0.005, "He-normal"
    np.testing.assert_array_equal(w, model.init_params(0))


def test_bad_shapes_are_one_clear_line():
    with pytest.raises(ValueError, match=r"6n \+ 2 .*use --depth 8"):
        ResNet((1, 8, 8), 10, depth=10)
    with pytest.raises(ValueError, match="3 widths"):
        ResNet((1, 8, 8), 10, channels=(6, 16))
    with pytest.raises(ValueError, match="--model resnet needs images"):
        build_model("resnet", 32, 10)
    cfg = types.SimpleNamespace(model="resnet", hidden=(8,), channels=(4, 4, 4), kernels=(3,),
                                depth=9)  # fmt: skip
    with pytest.raises(ConfigError, match=r"--model resnet on digits: depth 9"):
        model_for(cfg, load_dataset("digits"))


def test_model_for_builds_the_resnet_from_a_train_config():
    digits = load_dataset("digits")
    model = model_for(TrainConfig(model="resnet", depth=14), digits, backend="numba")
    assert isinstance(model, ResNet) and model.backend.name == "numba"
    assert (model.depth, model.channels, len(model.plan.blocks)) == (14, (16, 32, 64), 6)
    model = model_for(TrainConfig(model="resnet", channels=(4, 8, 8)), digits)
    assert model.channels == (4, 8, 8) and model.plan.blocks[2].shortcut is not None
    with pytest.raises(ConfigError, match="needs images"):
        model_for(TrainConfig(model="resnet"), load_dataset("synthetic:samples=64"))


def test_plan_is_what_the_spec_says():
    plan = make_plan((3, 7, 7), 14, (2, 4, 8))
    assert [b.name for b in plan.blocks] == [f"s{s}.b{j}" for s in range(3) for j in range(2)]
    assert [b.conv1.stride for b in plan.blocks] == [1, 1, 2, 1, 2, 1]
    assert [b.shortcut is not None for b in plan.blocks] == [False, False, True, False, True,
                                                             False]  # fmt: skip
    assert [b.conv2.size_out for b in plan.blocks] == [(7, 7)] * 2 + [(4, 4)] * 2 + [(2, 2)] * 2
    assert plan.stem.c_in == 3 and plan.blocks[2].shortcut.k == 1


# --- backends ------------------------------------------------------------------------------


def bn_case(seed: int, N: int, C: int, dtype):
    rng = np.random.default_rng(seed)
    X = (rng.standard_normal((N, C)) * 3 + 2).astype(dtype)
    gamma, beta = rng.standard_normal(C).astype(dtype), rng.standard_normal(C).astype(dtype)
    dY = rng.standard_normal((N, C)).astype(dtype)
    return X, gamma, beta, dY


def run_norm_ops(ops, X, gamma, beta, dY, maps, host=np.asarray, dev=np.asarray, empty=None):
    """Every new op of `ops` on the given inputs; the outputs as host arrays by name."""
    empty = empty or (lambda shape: np.empty(shape, X.dtype))
    N, C = X.shape
    Xd, gd, bd, dYd = (dev(a) for a in (X, gamma, beta, dY))
    Y, xhat, mean, var = empty((N, C)), empty((N, C)), empty(C), empty(C)
    ops.batchnorm_forward(Xd, gd, bd, 1e-5, Y, xhat, mean, var)
    dX, dgamma, dbeta, Ye = empty((N, C)), empty(C), empty(C), empty((N, C))
    ops.batchnorm_backward(dYd, xhat, gd, var, 1e-5, dX, dgamma, dbeta)
    ops.batchnorm_eval(Xd, gd, bd, dev(np.abs(beta)), dev(gamma * gamma), 1e-5, Ye)
    running = dev(np.linspace(0.5, 1.5, C).astype(np.float32))
    ops.running_average(running, var, 0.1, N / (N - 1))
    M, dM = maps
    P, dP = empty((M.shape[0], M.shape[3])), empty(M.shape)
    ops.global_avgpool_forward(dev(M), P)
    ops.global_avgpool_backward(dev(dM), dP)
    out = dict(Y=Y, xhat=xhat, mean=mean, var=var, dX=dX, dgamma=dgamma, dbeta=dbeta, Ye=Ye,
               running=running, P=P, dP=dP)  # fmt: skip
    return {k: host(v) for k, v in out.items()}


def compare(got: dict, want: dict, what: str, tol: dict) -> None:
    for k in want:
        diff = float(np.max(np.abs(got[k] - want[k]))) if want[k].size else 0.0
        k_tol = F32 if want[k].dtype == np.float32 else tol  # the running buffer is float32
        np.testing.assert_allclose(got[k], want[k], **k_tol,
                                   err_msg=f"{what}: {k} (max |diff| {diff:.3g})")  # fmt: skip


@settings(max_examples=10, deadline=None)
@given(N=st.integers(2, 70), C=st.integers(1, 5), dtype=st.sampled_from([np.float32, np.float64]),
       seed=seeds)  # fmt: skip
def test_numba_norm_ops_match_numpy(N, C, dtype, seed):
    X, gamma, beta, dY = bn_case(seed, N, C, dtype)
    rng = np.random.default_rng(seed)
    maps = (
        rng.standard_normal((2, 3, 2, C)).astype(dtype),
        rng.standard_normal((2, C)).astype(dtype),
    )
    want = run_norm_ops(ref, X, gamma, beta, dY, maps)
    got = run_norm_ops(fast, X, gamma, beta, dY, maps)
    compare(got, want, f"numba {np.dtype(dtype).name} N={N} C={C}",
            F32 if dtype == np.float32 else F64)  # fmt: skip


def test_numba_norm_ops_refuse_bad_shapes():
    X = np.ones((4, 3), np.float32)
    v = np.ones(3, np.float32)
    with pytest.raises(ValueError, match=r"mean has shape \(2,\), expected \(3,\)"):
        fast.batchnorm_forward(X, v, v, 1e-5, X.copy(), X.copy(), np.ones(2, np.float32), v)
    with pytest.raises(ValueError, match="pooled map has shape"):
        fast.global_avgpool_forward(np.ones((2, 2, 2, 3), np.float32), np.ones((2, 4), np.float32))


def test_numba_resnet_matches_numpy():
    """The whole network on the Numba ops (float32): loss, gradient, running statistics and
    evaluation within float32 rounding of NumPy's (not bitwise: see the module docstring)."""
    rng = np.random.default_rng(4)
    a, b = (ResNet((2, 5, 5), 10, 8, (3, 4, 6), backend=name) for name in ("numpy", "numba"))
    w = a.init_params(0)
    X, y = rng.standard_normal((4, 50)).astype(np.float32), rng.integers(0, 10, 4)
    ga, gb, ba, bb = np.empty_like(w), np.empty_like(w), a.init_buffers(), b.init_buffers()
    la, lb = a.loss_and_grad(w, X, y, ga, buffers=ba), b.loss_and_grad(w, X, y, gb, buffers=bb)
    assert la == pytest.approx(lb, rel=1e-5)
    np.testing.assert_allclose(gb, ga, **F32, err_msg="gradient")
    np.testing.assert_allclose(bb, ba, **F32, err_msg="running statistics")
    np.testing.assert_allclose(b.logits(w, X, bb), a.logits(w, X, ba), **F32, err_msg="eval")


# --- CUDA, in Numba's simulator (conftest.py sets NUMBA_ENABLE_CUDASIM=1) ---------------------


def cuda_or_skip():
    from pipesgd_ref.ops.cuda_support import gpu_problem

    problem = gpu_problem()
    if problem is not None:
        pytest.skip(f"CUDA kernels cannot run: {problem}")
    from pipesgd_ref.ops import cuda_ops

    return cuda_ops


def test_cuda_norm_ops_match_numpy():
    dev = cuda_or_skip()
    N, C = 5, 3
    X, gamma, beta, dY = bn_case(N, N, C, np.float32)
    rng = np.random.default_rng(N)
    maps = (rng.standard_normal((2, 3, 2, C)).astype(np.float32),
            rng.standard_normal((2, C)).astype(np.float32))  # fmt: skip
    want = run_norm_ops(ref, X, gamma, beta, dY, maps)
    got = run_norm_ops(dev, X, gamma, beta, dY, maps, host=dev.to_host, dev=dev.to_device,
                       empty=lambda shape: dev.empty(shape, np.float32))  # fmt: skip
    compare(got, want, f"cuda N={N} C={C}", dict(rtol=1e-4, atol=2e-5))


def test_cuda_channel_sums_over_several_tiles_and_chunks():
    """The two-stage sums on a grid smaller than the data: 2 tiles of 2 channels (the last half
    empty) by 2 row chunks over 37 rows, each lane striding past the grid; then the chunks'
    partials summed. The same sums as NumPy's, within float32 rounding."""
    dev = cuda_or_skip()
    from pipesgd_ref.ops.cuda_norm import ROW_LANES, finish_sums_kernel, partial_sums_kernel

    rng = np.random.default_rng(6)
    A, B = (rng.standard_normal((37, 3)).astype(np.float32) for _ in range(2))
    center = rng.standard_normal(3).astype(np.float32)
    Ad, Bd, cd = dev.to_device(A), dev.to_device(B), dev.to_device(center)
    want = [A.sum(axis=0), ((A - center) ** 2).sum(axis=0), (A * B).sum(axis=0)]
    for mode in range(3):
        partial, out = dev.empty((2, 3)), dev.to_device(np.full(3, np.nan, np.float32))
        partial_sums_kernel[(2, 2), (2, ROW_LANES)](Ad, Bd, cd, mode, partial)
        finish_sums_kernel[1, 32](partial, np.float32(0.5), out)
        np.testing.assert_allclose(dev.to_host(out), 0.5 * want[mode], rtol=1e-5, atol=1e-5,
                                   err_msg=f"mode {mode}")  # fmt: skip


def test_cuda_refuses_host_buffers_beside_device_weights():
    dev = cuda_or_skip()
    model = ResNet((1, 2, 2), 2, 8, (1, 1, 1), backend="cuda")
    w = dev.to_device(model.init_params(0))
    with pytest.raises(TypeError, match="keep the running statistics where the weights are"):
        model.loss_and_grad(w, np.zeros((2, 4)), np.array([0, 1]), dev.empty(w.shape),
                            buffers=model.init_buffers())  # fmt: skip


@pytest.mark.slow  # about 25 s in the simulator (every kernel of a step); run on a GPU too
def test_cuda_resnet_matches_numpy():
    dev = cuda_or_skip()
    rng = np.random.default_rng(5)
    a, b = (ResNet((1, 3, 3), 3, 8, (2, 2, 3), backend=name) for name in ("numpy", "cuda"))
    w = a.init_params(0)
    X, y = rng.standard_normal((2, 9)).astype(np.float32), np.array([0, 2])
    ga, ba = np.empty_like(w), a.init_buffers()
    la = a.loss_and_grad(w, X, y, ga, buffers=ba)
    wd, gd, bd = dev.to_device(w), dev.empty(w.shape), dev.to_device(b.init_buffers())
    lb = b.loss_and_grad(wd, X, y, gd, buffers=bd)
    assert lb == pytest.approx(la, rel=1e-5)
    np.testing.assert_allclose(dev.to_host(gd), ga, rtol=1e-4, atol=2e-5, err_msg="gradient")
    np.testing.assert_allclose(dev.to_host(bd), ba, rtol=1e-5, atol=1e-6, err_msg="buffers")
    np.testing.assert_allclose(b.logits(wd, X, bd), a.logits(w, X, ba), rtol=1e-5, atol=1e-6)


# --- training ------------------------------------------------------------------------------


@pytest.mark.slow  # about 3-6 s
def test_plain_sgd_trains_the_resnet_on_digits():
    """200 steps of plain SGD (lr 0.1, batch 32) on digits reach high test accuracy with the
    running statistics (about 97% when written)."""
    digits = load_dataset("digits")
    model = model_for(TrainConfig(model="resnet"), digits)
    w, g, buffers = model.init_params(0), np.empty(model.n_params, np.float32), model.init_buffers()
    rng = np.random.default_rng(0)
    for _ in range(200):
        idx = rng.choice(digits.n_train, 32, replace=False)
        model.loss_and_grad(w, digits.X_train[idx], digits.y_train[idx], g, buffers=buffers)
        model.backend.sgd_step(w, g, 0.1)
    accuracy = model.accuracy(w, digits.X_test, digits.y_test, buffers)
    assert accuracy > 0.93, f"test accuracy {accuracy:.3f} after 200 steps"


def test_resnet_step_benchmark_prints_its_table(capsys):
    """benchmarks/resnet_step.py, in this process at one repeat: a row per backend with a
    positive time, and with --profile the step split by op (batch norm among them)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "resnet_step.py"
    spec = importlib.util.spec_from_file_location("resnet_step", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    args = ["--repeats", "1", "--backends", "numpy", "--channels", "2,2,4", "--profile"]
    assert script.main(args) == 0
    out = capsys.readouterr().out
    row = next(line.split() for line in out.splitlines() if line.startswith("numpy "))
    assert float(row[1]) > 0 and float(row[3]) > 0, out
    assert "batchnorm_forward" in out and "(the rest)" in out, out
