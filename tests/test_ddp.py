"""ddp: the AllReduce in buckets during the backward (methods/ddp.py), against its oracles.

- the buckets cover the gradient, each one slice, in the backward's order;
- the backward hands each layer's gradient on when it is final (the bits it ends with);
- a ddp run equals sync_sgd bitwise with each bucket's mean in the ring's order, and a sync run
  within float32 rounding; every rank ends bitwise the same; with the codecs too;
- the options it does not take are refused, saying why.
"""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracles import assert_matches_oracle, ddp_oracle, oracle

from pipesgd_ref.codecs import get_codec
from pipesgd_ref.commands.cli import main
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.data import load_dataset
from pipesgd_ref.errors import ConfigError
from pipesgd_ref.methods.ddp import ddp_worker
from pipesgd_ref.methods.sync import sync_worker
from pipesgd_ref.models import build_model
from pipesgd_ref.models.layout import buckets
from pipesgd_ref.runtime.launch import launch_local
from pipesgd_ref.runtime.preflight import check_config, check_idle_options

# --- the buckets ----------------------------------------------------------------------------


@given(
    sizes=st.lists(st.integers(1, 50), min_size=1, max_size=8),
    cap=st.integers(0, 400),
)
def test_buckets_are_slices_that_cover_the_gradient_in_backward_order(sizes, cap):
    """Units as a backward writes them (the last range first): the buckets cover [0, n) once,
    each one contiguous range, in the same order; each holds at least the cap, but the last;
    and none could have closed a unit earlier."""
    n = sum(sizes)
    units, hi = [], n
    for size in sizes:
        units.append((hi - size, hi))
        hi -= size
    plan = buckets(units, cap, itemsize=4)
    assert plan[0][1] == n and plan[-1][0] == 0
    for (lo, _), (_, hi2) in zip(plan[:-1], plan[1:], strict=True):
        assert hi2 == lo, plan
    edges = {u[0] for u in units}
    for lo, hi in plan:
        assert lo in edges and lo < hi
    for lo, hi in plan[:-1]:
        assert (hi - lo) * 4 >= cap
        # the unit before the bucket's last one had not reached the cap yet
        inner = [u for u in units if lo < u[0] < hi]
        assert all((hi - u[0]) * 4 < cap for u in inner), (plan, units)


def test_buckets_of_the_compare_mlp():
    """MLP 64-1024-1024-10: three layers of 41 KB, 4.2 MB and 266 KB, last first."""
    model = build_model("mlp", 64, 10, hidden=(1024, 1024))
    units = model.grad_units()
    sizes = [(hi - lo) * 4 for lo, hi in units]
    assert sizes == [41000, 4198400, 266240]
    assert len(buckets(units, 32_000)) == 3
    assert len(buckets(units, 1_000_000)) == 2  # DDP's first-bucket cap: both upper layers
    assert buckets(units, 25_000_000) == [(0, model.n_params)]  # DDP's 25 MB: one bucket


def test_buckets_refuse_units_out_of_order():
    with pytest.raises(ValueError, match="does not end where"):
        buckets([(5, 10), (0, 4)], 0)


@pytest.mark.parametrize("name", ["softmax", "mlp", "cnn"])
def test_the_backward_hands_on_each_layer_when_it_is_final(name):
    """ready(lo, hi, loss) comes once per unit of grad_units(), in that order; what grads[lo:hi]
    holds then is what it holds at the end; the loss is the one returned; the gradient is
    bitwise the one computed without the callback."""
    data = load_dataset("digits")
    kw = dict(hidden=(16, 8)) if name == "mlp" else {}
    if name == "cnn":
        kw = dict(image_shape=data.image_shape, channels=(2, 3), kernels=(3, 3), hidden=(8,))
    model = build_model(name, data.n_features, data.n_classes, **kw)
    w = model.init_params(0)
    X, y = data.X_train[:16], data.y_train[:16]
    plain = np.empty_like(w)
    want_loss = model.loss_and_grad(w, X, y, plain)
    grads = np.full_like(w, np.nan)
    seen = []

    def ready(lo, hi, loss):
        seen.append(((lo, hi), grads[lo:hi].copy(), loss))

    loss = model.loss_and_grad(w, X, y, grads, ready)
    assert [s[0] for s in seen] == model.grad_units()
    assert loss == want_loss and all(s[2] == loss for s in seen)
    np.testing.assert_array_equal(grads, plain)
    for (lo, hi), then, _ in seen:
        np.testing.assert_array_equal(then, grads[lo:hi], err_msg=f"{name} {(lo, hi)}")


# --- training against the oracles -------------------------------------------------------------


def tiny(**kw) -> TrainConfig:
    base = dict(model="mlp", hidden=(16, 8), steps=20, bucket_size="0", algo="ddp")
    return TrainConfig.preset("tiny").replace(**{**base, **kw})


@pytest.mark.timeout(120)
@pytest.mark.parametrize("p", [1, 2, pytest.param(3, marks=pytest.mark.slow), 4])
@pytest.mark.parametrize("bucket_size", ["0", "600", "1MB"])
def test_ddp_equals_sync_sgd_bitwise_in_bucket_order(p, bucket_size):
    """Every rank bitwise the same, and bitwise sync_sgd with each bucket's mean in the ring's
    order; within float32 rounding of sync_sgd in rank order (assert_matches_oracle)."""
    cfg = tiny(world_size=p, bucket_size=bucket_size)
    results = launch_local(p, ddp_worker, (cfg,), start_method="fork", timeout=20)
    want = ddp_oracle(cfg)
    for r in results:
        np.testing.assert_array_equal(r.params, want.params, err_msg=f"rank {r.rank}")
    assert_matches_oracle(results, oracle(cfg, 0), p)


@pytest.mark.timeout(120)
def test_ddp_ends_within_rounding_of_a_sync_run():
    """The same seed and steps, 4 workers: ddp's weights and sync's (one AllReduce of the whole
    gradient) differ only by the order of the mean's additions."""
    cfg = tiny(world_size=4, steps=30, bucket_size="32KB")
    ddp = launch_local(4, ddp_worker, (cfg,), start_method="fork", timeout=20)
    sync = launch_local(4, sync_worker, (cfg.replace(algo="sync"),), start_method="fork",
                        timeout=20)  # fmt: skip
    worst = np.max(np.abs(ddp[0].params - sync[0].params)) / np.max(np.abs(sync[0].params))
    assert 0 < worst <= 1e-6 or np.array_equal(ddp[0].params, sync[0].params), worst
    np.testing.assert_allclose(ddp[0].losses, sync[0].losses, rtol=1e-5)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("codec", ["trunc16", "q8"])
def test_ddp_with_a_codec_equals_its_bucket_oracle(codec):
    """The compressed ring on each bucket: bitwise its simulation, bucket by bucket."""
    cfg = tiny(world_size=3, codec=codec, bucket_size="600")
    results = launch_local(3, ddp_worker, (cfg,), start_method="fork", timeout=20)
    want = ddp_oracle(cfg, get_codec(codec, cfg.codec_backend))
    for r in results:
        np.testing.assert_array_equal(r.params, want.params, err_msg=f"{codec} rank {r.rank}")


@pytest.mark.timeout(120)
def test_ddp_with_error_feedback_keeps_the_replicas_identical_and_learns():
    cfg = tiny(world_size=3, codec="q8", error_feedback=True, bucket_size="600", steps=60)
    results = launch_local(3, ddp_worker, (cfg,), start_method="fork", timeout=20)
    for r in results:
        np.testing.assert_array_equal(r.params, results[0].params, err_msg=f"rank {r.rank}")
    plain = ddp_oracle(cfg.replace(codec="none", error_feedback=False))
    worst = np.max(np.abs(results[0].params - plain.params)) / np.max(np.abs(plain.params))
    assert worst < 0.05, f"q8 with error feedback strays {worst:.3f} from full precision"
    assert np.mean(results[0].losses[-10:]) < np.mean(results[0].losses[:10])


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("transport", ["unix", "shm"])
def test_ddp_over_each_transport_equals_its_oracle(transport):
    cfg = tiny(world_size=3, bucket_size="600")
    results = launch_local(3, ddp_worker, (cfg,), start_method="fork", timeout=20,
                           transport=transport)  # fmt: skip
    want = ddp_oracle(cfg)
    for r in results:
        np.testing.assert_array_equal(r.params, want.params, err_msg=f"{transport} {r.rank}")


@pytest.mark.timeout(120)
def test_the_cnn_trains_with_ddp_bitwise_its_oracle():
    cfg = tiny(world_size=2, model="cnn", channels=(2, 3), kernels=(3, 3), hidden=(8,),
               steps=4, bucket_size="200")  # fmt: skip
    results = launch_local(2, ddp_worker, (cfg,), start_method="fork", timeout=30)
    want = ddp_oracle(cfg)
    for r in results:
        np.testing.assert_array_equal(r.params, want.params, err_msg=f"rank {r.rank}")


# --- the command line ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_digits_ddp_reaches_95_percent_and_ends_at_syncs_weights(tmp_path):
    """`pipesgd train --algo ddp`, 4 workers on digits (the laptop preset): at least 95% test
    accuracy, and sync's weights after the same steps within float32 rounding. A bucket per
    layer (--bucket-size 0): the laptop MLP's 19 KB gradient is one bucket at the default
    32KB, which is sync's AllReduce exactly."""
    params = {}
    for algo in ("ddp", "sync"):
        out = tmp_path / algo
        argv = ["train", "--preset=laptop", f"--algo={algo}", "--no-progress", f"--out={out}"]
        argv += ["--bucket-size=0"] if algo == "ddp" else []
        assert main(argv) == 0
        summary = json.loads((out / "summary.json").read_text())
        assert summary["params_identical_on_all_ranks"], algo
        if algo == "ddp":
            assert summary["test_accuracy"] >= 0.95, summary["test_accuracy"]
        with np.load(out / "checkpoint.npz") as z:
            params[algo] = z["params"].copy()
    worst = np.max(np.abs(params["ddp"] - params["sync"])) / np.max(np.abs(params["sync"]))
    assert 0 < worst <= 1e-5, f"ddp strays {worst:.2e} from sync after 600 steps (0: not bucketed)"


def test_ddp_refuses_skip_nonfinite_saying_why():
    with pytest.raises(ConfigError, match="before the whole gradient is known.*--algo sync"):
        check_config(tiny(skip_nonfinite=True))


def test_bucket_size_without_ddp_is_refused():
    with pytest.raises(ConfigError, match="--bucket-size 1MB .* --algo ddp"):
        check_idle_options(tiny(algo="sync", bucket_size="1MB"))
    check_idle_options(tiny(bucket_size="1MB"))  # ddp takes it


def test_a_bad_bucket_size_is_one_line(capsys):
    assert main(["train", "--preset=tiny", "--algo=ddp", "--bucket-size=lots"]) == 2
    assert "bucket_size: cannot read 'lots'" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_a_nan_gradient_stops_ddp_before_it_leaves(capsys, monkeypatch):
    """PIPESGD_FAULT nan@1:3: rank 1's first bucket of step 3 holds a NaN; the run stops
    naming rank 1 and step 3 (no bucket of that step reached the others' weights)."""
    monkeypatch.setenv("PIPESGD_FAULT", "nan@1:3")
    rc = main(["train", "--preset=tiny", "--algo=ddp", "--model=mlp", "--hidden=8",
               "--world-size=2", "--steps=10", "--no-progress"])  # fmt: skip
    assert rc != 0
    err = capsys.readouterr().err
    assert "rank 1" in err and "step 3" in err and "NaN" in err, err[-2000:]


@settings(max_examples=5, deadline=None)
@given(p=st.integers(2, 3), seed=st.integers(0, 100))
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ddp_softmax_any_seed_equals_its_oracle(p, seed):
    cfg = tiny(world_size=p, model="softmax", hidden=(), seed=seed, bucket_size="0", steps=15)
    results = launch_local(p, ddp_worker, (cfg,), start_method="fork", timeout=20)
    want = ddp_oracle(cfg)
    for r in results:
        np.testing.assert_array_equal(r.params, want.params)
