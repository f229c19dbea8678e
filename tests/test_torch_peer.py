"""The torch peers (pipesgd_ref/torch_peer): the twins are our models, and the Pipe-SGD hook is
the oracle's delayed SGD. Skipped where torch is not installed (CI: it is an optional extra);
tests/test_compare_peers.py covers what runs without it.

Tolerance: the twins compute in float32 with torch's kernels (oneDNN or MKL matmul and
convolution), ours with NumPy's BLAS over im2col, so each sum runs in another order; gloo sums
the ranks' g / p where the oracle sums g in rank order and divides (with 2 ranks both are
exact up to that rounding). Losses agree to 1e-6 relative, gradients and weights after a few
steps to 1e-5 of their largest entry; the gap to the wrong oracle is four orders larger.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pipesgd_ref.config import TrainConfig  # noqa: E402
from pipesgd_ref.data import load_dataset  # noqa: E402
from pipesgd_ref.methods import reference  # noqa: E402
from pipesgd_ref.methods.optimizer import SGD, schedule  # noqa: E402
from pipesgd_ref.models import build_model  # noqa: E402
from pipesgd_ref.models.resnet import ResNet  # noqa: E402
from pipesgd_ref.runtime.inputs import JobInputs  # noqa: E402
from pipesgd_ref.torch_peer import torch_problem  # noqa: E402
from pipesgd_ref.torch_peer.ranks import run_peer, update_step  # noqa: E402
from pipesgd_ref.torch_peer.twins import (  # noqa: E402
    conv_from_torch,
    conv_to_torch,
    flat_of,
    head_from_torch,
    head_to_torch,
    load_flat,
    twin,
)

RGB = (3, 8, 6)  # a colour image that is not square: C > 1 and H != W catch a wrong axis order


def models():
    """(name, model, X, y): each architecture at a tiny size, on images where it takes them."""
    digits = load_dataset("digits")
    X, y = digits.X_train[:24], digits.y_train[:24]
    rng = np.random.default_rng(5)
    Xc = rng.normal(size=(16, int(np.prod(RGB)))).astype(np.float32)
    yc = rng.integers(0, 4, 16)
    cnn = build_model("cnn", 64, 10, (16,), image_shape=(1, 8, 8), channels=(3, 4), kernels=(3, 3))
    rgb = dict(image_shape=RGB, channels=(4, 5), kernels=(3, 1))
    return [
        ("softmax", build_model("softmax", 64, 10), X, y),
        ("mlp", build_model("mlp", 64, 10, (12, 8)), X, y),
        ("cnn", cnn, X, y),
        ("cnn-rgb", build_model("cnn", int(np.prod(RGB)), 4, (6,), **rgb), Xc, yc),
        ("resnet", ResNet(RGB, 4, depth=8, channels=(4, 6, 8)), Xc, yc),
    ]


MODELS = models()


@pytest.mark.parametrize("name,model,X,y", MODELS, ids=[m[0] for m in MODELS])
def test_the_twin_is_our_model(name, model, X, y):
    """The same parameter count; our w_0 in and out bitwise; the same loss at step 0 and the
    same gradient (mapped back into our layout); the ResNet's running statistics updated
    alike."""
    params = model.init_params(11)
    buffers = model.init_buffers()
    net = twin(model)
    assert sum(p.numel() for p in net.parameters()) == model.n_params, name
    load_flat(net, model, params, buffers)
    back, back_buffers = flat_of(net, model)
    assert np.array_equal(back, params) and np.array_equal(back_buffers, buffers), name

    grads = np.empty_like(params)
    loss = model.loss_and_grad(params, X, y, grads, buffers=buffers)
    torch_loss = F.cross_entropy(net(torch.from_numpy(X)), torch.from_numpy(y))
    torch_loss.backward()
    assert torch_loss.item() == pytest.approx(loss, rel=1e-6), name
    with torch.no_grad():  # the gradients through the same map as the weights
        for p in net.parameters():
            p.copy_(p.grad)
    torch_grads, torch_buffers = flat_of(net, model)
    scale = np.abs(grads).max()
    assert np.abs(torch_grads - grads).max() <= 1e-5 * scale, f"{name}: gradients differ"
    assert np.allclose(torch_buffers, buffers, rtol=1e-5, atol=1e-6), f"{name}: running stats"
    if name == "resnet":
        assert not np.array_equal(buffers, model.init_buffers()), "the stats moved in training"


@given(
    k=st.sampled_from([1, 3, 5]),
    c_in=st.integers(1, 4),
    c_out=st.integers(1, 4),
    hwc=st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 3)),
)
def test_the_maps_between_layouts_are_inverse(k, c_in, c_out, hwc):
    rng = np.random.default_rng(0)
    C = rng.normal(size=(k * k * c_in, c_out))
    assert conv_to_torch(C, k).shape == (c_out, c_in, k, k)
    assert np.array_equal(conv_from_torch(conv_to_torch(C, k)), C)
    h, w, c = hwc
    W = rng.normal(size=(h * w * c, c_out))
    assert head_to_torch(W, h, w, c).shape == (c_out, c * h * w)
    assert np.array_equal(head_from_torch(head_to_torch(W, h, w, c), h, w, c), W)


def test_the_conv_map_reads_im2col_rows_as_u_v_c():
    """Row (u*k + v)*Cin + c of our filters is torch's weight[:, c, u, v] (models/cnn.py)."""
    k, c_in, c_out = 3, 2, 4
    C = np.arange(k * k * c_in * c_out, dtype=np.float32).reshape(k * k * c_in, c_out)
    w = conv_to_torch(C, k)
    for u, v, c in np.ndindex(k, k, c_in):
        assert np.array_equal(w[:, c, u, v], C[(u * k + v) * c_in + c]), (u, v, c)


def test_the_lr_of_an_update_is_that_of_the_step_that_applies_it():
    assert [update_step(k, 0, 0) for k in range(3)] == [0, 1, 2]  # torch-ddp
    assert [update_step(k, 0, 1) for k in range(3)] == [1, 2, 3]  # pipe: the fill comes first
    assert [update_step(k, 2, 1) for k in range(4)] == [0, 1, 3, 4]  # warm-up, fill, steady


def test_torch_is_usable_here():
    assert torch_problem() is None


# --- the peers' trajectories against the oracles --------------------------------------------

# every option the peers take: momentum, nesterov, weight decay, a cosine schedule with an lr
# warm-up, and pipe's synchronous warm-up
OPTIONS = dict(momentum=0.9, nesterov=True, weight_decay=1e-3, lr_schedule="cosine",
               lr_warmup=2, warmup_steps=1)  # fmt: skip


def oracle_runs(cfg: TrainConfig, inputs: JobInputs) -> dict:
    """sync_sgd and delayed_sgd of cfg's staleness on the same data, weights and optimiser."""
    grad_fn = reference.model_grad_fn(inputs.model, inputs.data, inputs.sampler)
    w0, p, T = inputs.initial_params(cfg.seed), cfg.world_size, inputs.steps
    lr, opt = schedule(cfg, T), SGD.of(cfg)
    return {
        "torch-ddp": reference.sync_sgd(grad_fn, w0, p, T, lr, optimizer=opt),
        "torch-pipe": reference.delayed_sgd(
            grad_fn, w0, p, T, lr, staleness=cfg.staleness, warmup_steps=cfg.warmup_steps,
            optimizer=opt,
        ),
    }  # fmt: skip


def check_trajectory(cfg: TrainConfig, peer: str) -> None:
    inputs = JobInputs.load(cfg)
    summary, per_rank = run_peer(cfg, peer, inputs)
    oracles = oracle_runs(cfg, inputs)
    want = oracles[peer]
    other = oracles["torch-pipe" if peer == "torch-ddp" else "torch-ddp"]
    got = per_rank[0]["params"]
    scale = np.abs(want.params).max()
    gap = np.abs(got - want.params).max()
    assert gap <= 1e-5 * scale, f"{peer}: {gap:.2e} from its oracle (scale {scale:.2f})"
    assert np.abs(got - other.params).max() > 1e3 * max(gap, 1e-7), f"{peer}: the wrong oracle"
    assert summary["params_identical_on_all_ranks"], f"{peer}: the ranks' weights differ"
    mean_loss = np.mean([r["losses"] for r in per_rank], axis=0)
    assert np.allclose(mean_loss, want.losses, rtol=1e-5), f"{peer}: the losses at each step"
    assert summary["steps"] == cfg.steps and len(summary["eval_curve"]) == cfg.steps // 2


@pytest.mark.parametrize("peer", ["torch-ddp", "torch-pipe"])
@pytest.mark.slow
def test_a_peer_follows_its_oracle(peer):
    """2 ranks, 6 steps of an MLP: torch-ddp is sync_sgd, torch-pipe (the hook) delayed_sgd
    with staleness one, a synchronous warm-up step, and the drain."""
    cfg = TrainConfig.preset("tiny").replace(model="mlp", hidden=(16,), steps=6, eval_every=2,
                                             **OPTIONS)  # fmt: skip
    check_trajectory(cfg, peer)


@pytest.mark.slow
@pytest.mark.parametrize(
    "changes",
    [dict(model="resnet", depth=8, channels=(4, 4, 8), batch_size=8), dict(width=3)],
    ids=["resnet", "staleness-2"],
)
def test_the_hook_follows_delayed_sgd_on_a_resnet_and_at_staleness_two(changes):
    """The hook on a net with batch norm (DDP regroups no BN statistics: each rank keeps its
    own), and with two steps in flight (width 3)."""
    cfg = TrainConfig.preset("tiny").replace(model="mlp", hidden=(16,), steps=6, eval_every=2)
    check_trajectory(cfg.replace(**{**OPTIONS, **changes}), "torch-pipe")
