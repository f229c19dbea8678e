"""The optimiser (methods/optimizer.py): torch.optim.SGD's rule and the lr schedules against a
plain loop of their formulas, every method with momentum bitwise its one-process oracle, resume
with momentum, the config's refusals, and delayed heavy ball's stability bounds on both sides."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracles import oracle, oracle_inputs

from pipesgd_ref.commands.cli import main
from pipesgd_ref.commands.parser import split_overrides
from pipesgd_ref.config import TrainConfig, apply_overrides
from pipesgd_ref.errors import ConfigError
from pipesgd_ref.methods.ddp import ddp_worker
from pipesgd_ref.methods.optimizer import (
    SGD,
    heavy_ball_bound,
    heavy_ball_stable,
    learning_rate,
    schedule,
)
from pipesgd_ref.methods.pipe import pipe_worker
from pipesgd_ref.methods.ps import ps_async_worker, ps_sync_worker
from pipesgd_ref.methods.reference import async_ps_sgd, delayed_sgd, sync_sgd
from pipesgd_ref.methods.sync import sync_worker
from pipesgd_ref.ops import get_backend
from pipesgd_ref.runtime import checkpoint
from pipesgd_ref.runtime.launch import launch_local
from pipesgd_ref.runtime.worker import Worker
from strategies import seeds

# What practitioners pass: every part of the rule and of the schedule at once.
OPTIMISER = dict(momentum=0.9, nesterov=True, weight_decay=5e-4, lr_schedule="cosine",
                 lr_warmup=3)  # fmt: skip
OPTIMISER_ARGS = ["--momentum=0.9", "--nesterov", "--weight-decay=5e-4", "--lr-schedule=cosine",
                  "--lr-warmup=3"]  # fmt: skip
TINY = TrainConfig.preset("tiny").replace(model="mlp", hidden=(8,), steps=20, world_size=2)


# --- the rule, against torch.optim.SGD's formulas written out ----------------------------------


def torch_sgd(w, grads, lrs, momentum, nesterov, wd):
    """torch.optim.SGD.step as its documentation writes it, one float32 expression a line
    (the velocity a copy of d at the first step, as torch's is)."""
    w, v = w.copy(), None
    M, wd = np.float32(momentum), np.float32(wd)
    for g, lr in zip(grads, lrs, strict=True):
        d = g + wd * w if wd else g.copy()
        if M:
            v = d.copy() if v is None else M * v + d
            d = d + M * v if nesterov else v
        w = w - np.float32(lr) * d
    return w


@settings(max_examples=30)
@given(seed=seeds, momentum=st.sampled_from([0.0, 0.5, 0.9]), nesterov=st.booleans(),
       wd=st.sampled_from([0.0, 5e-4, 0.1]), n=st.sampled_from([1, 7, 100]),
       steps=st.integers(1, 6))  # fmt: skip
def test_the_rule_is_torchs_sgd_bitwise_on_numpy_and_numba(seed, momentum, nesterov, wd, n,
                                                           steps):  # fmt: skip
    nesterov = nesterov and momentum > 0
    rng = np.random.default_rng(seed)
    w0 = rng.normal(size=n).astype(np.float32)
    grads = [rng.normal(size=n).astype(np.float32) for _ in range(steps)]
    lrs = [0.1 / (1 + t) for t in range(steps)]
    want = torch_sgd(w0, grads, lrs, momentum, nesterov, wd)
    rule = SGD(momentum, nesterov, wd)
    for backend in ("numpy", "numba"):
        ops, w = get_backend(backend), w0.copy()
        v = np.zeros_like(w) if momentum else None
        for g, lr in zip(grads, lrs, strict=True):
            rule.step(ops, w, g.copy(), lr, v)
        np.testing.assert_array_equal(w, want, err_msg=f"{backend}: {rule}")


def test_plain_sgd_is_the_plain_step_and_the_oracles_unchanged():
    """Momentum 0 and no decay: the very sgd_step call (grads untouched), and each oracle's
    default is the update it always wrote, w -= lr_t g, bitwise."""
    rng = np.random.default_rng(0)
    w, g = rng.normal(size=9).astype(np.float32), rng.normal(size=9).astype(np.float32)
    got, g_before = w.copy(), g.copy()
    SGD().step(get_backend("numpy"), got, g, 0.3)
    np.testing.assert_array_equal(got, w - np.float32(0.3) * g)
    np.testing.assert_array_equal(g, g_before)
    grad_fn, w0 = oracle_inputs(TINY, 2)
    by_hand = w0.copy()
    for t in range(5):
        g0, g1 = grad_fn(by_hand, 0, t)[1], grad_fn(by_hand, 1, t)[1]
        mean = np.zeros_like(by_hand)
        mean += g0
        mean += g1
        mean /= 2
        by_hand -= by_hand.dtype.type(0.2 / (1 + 0.1 * t)) * mean
    lr = TINY.replace(lr=0.2, lr_schedule="inverse", lr_decay=0.1).lr_at
    np.testing.assert_array_equal(sync_sgd(grad_fn, w0, 2, 5, lr).params, by_hand)


# --- the schedules --------------------------------------------------------------------------------


def test_each_schedule_is_its_formula():
    cfg = TrainConfig(lr=0.4, steps=100)
    assert [cfg.lr_at(t) for t in (0, 50, 500)] == [0.4, 0.4, 0.4]
    inverse = cfg.replace(lr_schedule="inverse", lr_decay=0.01)
    assert [inverse.lr_at(t) for t in (0, 7)] == [0.4, 0.4 / (1.0 + 0.01 * 7)]
    step = cfg.replace(lr_schedule="step", lr_milestones=(10, 30), lr_gamma=0.5)
    assert [step.lr_at(t) for t in (0, 9, 10, 29, 30, 99)] == [0.4, 0.4, 0.2, 0.2, 0.1, 0.1]
    cosine = cfg.replace(lr_schedule="cosine", lr_warmup=20)
    for t in range(0, 130, 7):
        done = min(max(t - 20, 0), 80) / 80
        want = 0.4 * 0.5 * (1 + math.cos(math.pi * done)) * (min(t + 1, 20) / 20)
        assert cosine.lr_at(t) == pytest.approx(want, rel=1e-12, abs=1e-15), t
    assert cosine.lr_at(20) == 0.4 and cosine.lr_at(100) == 0.0 == cosine.lr_at(101)
    assert cosine.lr_at(60) == pytest.approx(0.2)
    warm = cfg.replace(lr_warmup=4)  # linear warm-up of a constant lr, then lr
    assert [warm.lr_at(t) for t in range(6)] == [0.1, 0.2, 0.30000000000000004, 0.4, 0.4, 0.4]
    warm_step = step.replace(lr_warmup=15)  # the warm-up multiplies the schedule's lr_t
    assert warm_step.lr_at(12) == 0.2 * 13 / 15
    long = cosine.replace(lr_warmup=150)  # a warm-up longer than the run: no room for the cosine
    assert long.lr_at(99) == 0.4 * 100 / 150 and long.lr_at(100) == 0.0


def test_cosines_horizon_is_the_runs_steps():
    """Epochs give the steps only with the data: cfg.lr_at then wants them, the Worker knows
    them, and ps-async's server counts p updates per step."""
    cfg = TINY.replace(lr_schedule="cosine", epochs=1.0)
    with pytest.raises(ValueError, match="cosine's horizon"):
        cfg.lr_at(3)
    w = Worker.build(cfg, 0, 2)
    assert w.lr_at(w.steps) == 0.0 < w.lr_at(w.steps - 1)
    assert w.lr_at(5) == learning_rate(cfg, 5, w.steps) == schedule(cfg, w.steps)(5)
    p = 3
    async_cfg = TINY.replace(algo="ps-async", world_size=p, width=1, lr_schedule="cosine")
    from pipesgd_ref.methods.table import METHODS

    server = Worker.for_rank(async_cfg, 0, METHODS["ps-async"], n_workers=p)
    assert server.lr_at(p * 20 - 1) > 0.0 == server.lr_at(p * 20)


# --- every method with momentum, against its oracle -----------------------------------------------


def _launch(fn, cfg, ranks, **kw):
    return launch_local(ranks, fn, (cfg,), start_method="fork", timeout=20, **kw)


def _plain(cfg):
    return cfg.replace(momentum=0.0, nesterov=False, weight_decay=0.0, lr_schedule="constant",
                       lr_warmup=0)  # fmt: skip


@pytest.mark.timeout(120)
@pytest.mark.parametrize("width,compensation", [(1, "none"), (2, "none"), (2, "dc"),
                                                (2, "predict"), (3, "none"), (3, "predict"),
                                                (3, "dc")])  # fmt: skip
def test_sync_and_pipe_with_momentum_equal_their_oracles(width, compensation):
    cfg = TINY.replace(width=width, compensation=compensation, **OPTIMISER)
    fn = sync_worker if width == 1 else pipe_worker
    results = _launch(fn, cfg, 2)
    want = oracle(cfg, width - 1)
    for r in results:
        np.testing.assert_array_equal(r.params, want.params, err_msg=f"rank {r.rank}")
    plain = oracle(_plain(cfg), width - 1)
    assert not np.array_equal(plain.params, want.params), "the optimiser changed nothing"


@pytest.mark.timeout(120)
def test_ddp_with_momentum_equals_its_oracle():
    from oracles import ddp_oracle

    cfg = TINY.replace(algo="ddp", width=1, bucket_size="1KB", **OPTIMISER)
    results = _launch(ddp_worker, cfg, 2)
    want = ddp_oracle(cfg)
    for r in results:
        np.testing.assert_array_equal(r.params, want.params, err_msg=f"rank {r.rank}")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("compensation", ["none", "dc"])
def test_parameter_servers_with_momentum_equal_their_oracles(compensation):
    """ps-sync: sync_sgd's weights; ps-async: the recorded order replayed, its schedule over
    the server's p * steps updates. The velocity is the server's."""
    p = 2
    cfg = TINY.replace(width=1, world_size=p, **OPTIMISER)
    grad_fn, w0 = oracle_inputs(cfg, p)
    rule = SGD.of(cfg)
    if compensation == "none":
        server = _launch(ps_sync_worker, cfg.replace(algo="ps-sync"), p + 1, star=True)[0]
        want = sync_sgd(grad_fn, w0, p, cfg.steps, schedule(cfg, cfg.steps), optimizer=rule)
        np.testing.assert_array_equal(server.params, want.params, err_msg="ps-sync")
    cfg = cfg.replace(algo="ps-async", compensation=compensation)
    server = _launch(ps_async_worker, cfg, p + 1, star=True)[0]
    order = server.extra["arrival_order"]
    want = async_ps_sgd(grad_fn, w0, p, order, schedule(cfg, p * cfg.steps),
                        compensation=compensation, optimizer=rule)  # fmt: skip
    np.testing.assert_array_equal(server.params, want.params, err_msg=f"ps-async {compensation}")


# --- checkpoints carry the velocity ---------------------------------------------------------------


def test_a_checkpoint_carries_the_velocity(tmp_path):
    cfg = TINY.replace(**OPTIMISER)
    w = Worker.build(cfg.replace(out=str(tmp_path)), 0, 2)
    grads = np.random.default_rng(0).normal(size=w.params.size).astype(np.float32)
    assert w.velocity is None  # made at the first update that needs it
    w.sgd_step(grads.copy(), 0)
    w.sgd_step(grads.copy(), 1)
    assert w.velocity is not None and np.any(w.velocity)
    w.save_checkpoint(2)
    restored = checkpoint.load(tmp_path, cfg)
    np.testing.assert_array_equal(restored.velocity, w.velocity)
    resumed = Worker.build(cfg.replace(resume=str(tmp_path)), 0, 2)
    np.testing.assert_array_equal(resumed.velocity, w.velocity)
    np.testing.assert_array_equal(resumed.params, w.params)
    plain = Worker.build(TINY.replace(out=str(tmp_path / "plain")), 0, 2)
    plain.sgd_step(grads, 0)
    plain.save_checkpoint(1)  # plain SGD keeps no velocity, and writes none
    assert plain.velocity is None and checkpoint.load(tmp_path / "plain", TINY).velocity is None


def test_a_checkpoint_from_another_optimiser_or_with_a_bad_velocity_is_refused(tmp_path):
    cfg = TINY.replace(**OPTIMISER)
    w = Worker.build(cfg, 0, 2).params
    checkpoint.save(tmp_path, cfg, w, 3, {}, np.ones_like(w))
    for change in (dict(momentum=0.5), dict(nesterov=False), dict(weight_decay=0.0),
                   dict(lr_schedule="constant"), dict(lr_warmup=0)):  # fmt: skip
        with pytest.raises(ConfigError, match=f"different run .*{next(iter(change))}"):
            checkpoint.load(tmp_path, cfg.replace(**change))
    checkpoint.save(tmp_path, cfg, w, 3, {}, np.ones(5, np.float32))
    with pytest.raises(ConfigError, match="velocity of shape"):
        checkpoint.load(tmp_path, cfg)
    checkpoint.save(tmp_path, cfg, w, 3, {}, np.full_like(w, np.nan))
    with pytest.raises(ConfigError, match="non-finite momentum velocity"):
        checkpoint.load(tmp_path, cfg)


def test_an_older_checkpoint_without_a_velocity_resumes_plain_sgd(tmp_path):
    """No velocity key, no optimiser keys in its config: the defaults (plain SGD), v = None."""
    w = Worker.build(TINY, 0, 2).params
    checkpoint.save(tmp_path, TINY, w, 3, {})
    path = tmp_path / checkpoint.FILE
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files if k != "velocity"}
    import json

    config = json.loads(str(arrays["config"]))
    for key in ("momentum", "nesterov", "weight_decay", "lr_schedule", "lr_warmup"):
        config.pop(key)
    arrays["config"] = np.array(json.dumps(config))
    np.savez(path, **arrays)
    assert checkpoint.load(tmp_path, TINY).velocity is None
    with pytest.raises(ConfigError, match="momentum: 0.0 in the checkpoint, 0.9 now"):
        checkpoint.load(tmp_path, TINY.replace(momentum=0.9))


def _resume_case(algo, width):
    return pytest.param(algo, width, marks=[pytest.mark.slow], id=f"{algo}-{width}")


RESUME_CASES = [
    _resume_case("pipe", 2),
    _resume_case("sync", 1),
    _resume_case("ddp", 1),
    _resume_case("pipe", 3),
    _resume_case("ps-sync", 1),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("algo, width", RESUME_CASES)
def test_a_run_with_momentum_restarted_from_its_checkpoint_ends_bitwise_uninterrupted(
    algo, width, tmp_path, monkeypatch, capsys
):
    """A worker killed at step 45 of 60: --max-restarts resumes every rank from the checkpoint
    of step 40, whose velocity (and pipe's gradients in flight) continue the very run."""
    common = ["train", "--preset=tiny", f"--algo={algo}", f"--width={width}", "--world-size=2",
              "--model=mlp", "--hidden=8", "--steps=60", "--no-progress",
              "--checkpoint-every=20", *OPTIMISER_ARGS]  # fmt: skip
    assert main([*common, f"--out={tmp_path / 'full'}"]) == 0
    with np.load(tmp_path / "full" / checkpoint.FILE) as z:
        want, velocity = z["params"].copy(), z["velocity"].copy()
    assert velocity.shape == want.shape and np.any(velocity)
    monkeypatch.setenv("PIPESGD_FAULT", "kill@1:45")
    assert main([*common, f"--out={tmp_path / 'restarted'}", "--max-restarts=1"]) == 0
    assert "resuming from step 40" in capsys.readouterr().err
    with np.load(tmp_path / "restarted" / checkpoint.FILE) as z:
        np.testing.assert_array_equal(z["params"], want, err_msg=f"{algo} width {width}")
        np.testing.assert_array_equal(z["velocity"], velocity)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ps_async_checkpoints_the_servers_velocity_and_resumes_with_it(tmp_path):
    """With p workers ps-async's result depends on the order pushes arrive in; with one worker
    the order is fixed, so 20 steps resumed to 30 are bitwise 30 steps (a constant lr: cosine's
    horizon would be the run's steps) when the server's velocity is carried, and not without."""
    common = ["train", "--preset=tiny", "--algo=ps-async", "--world-size=1", "--no-progress",
              "--momentum=0.9", "--nesterov", "--weight-decay=5e-4"]  # fmt: skip
    assert main([*common, "--steps=30", f"--out={tmp_path / 'full'}"]) == 0
    assert main([*common, "--steps=20", f"--out={tmp_path / 'a'}"]) == 0
    rule = dict(momentum=0.9, nesterov=True, weight_decay=5e-4)
    cfg = TrainConfig.preset("tiny").replace(algo="ps-async", world_size=1, steps=20, **rule)
    saved = checkpoint.load(tmp_path / "a", cfg)
    assert saved.next_step == 20 and saved.velocity is not None and np.any(saved.velocity)
    assert main([*common, "--steps=30", f"--resume={tmp_path / 'a'}",
                 f"--out={tmp_path / 'b'}"]) == 0  # fmt: skip
    with np.load(tmp_path / "full" / checkpoint.FILE) as z:
        want = z["params"].copy()
    with np.load(tmp_path / "b" / checkpoint.FILE) as z:
        np.testing.assert_array_equal(z["params"], want)
    path = tmp_path / "a" / checkpoint.FILE  # the same checkpoint without its velocity
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files if k != "velocity"}
    np.savez(path, **arrays)
    assert main([*common, "--steps=30", f"--resume={tmp_path / 'a'}",
                 f"--out={tmp_path / 'c'}"]) == 0  # fmt: skip
    with np.load(tmp_path / "c" / checkpoint.FILE) as z:
        assert not np.array_equal(z["params"], want), "the velocity made no difference"


# --- the options on the command line, and their refusals ------------------------------------------


def test_the_options_parse_from_the_command_line():
    args = ["--momentum", "0.9", "--nesterov", "--weight-decay", "5e-4", "--lr-schedule", "step",
            "--lr-milestones", "10,20", "--lr-gamma=0.5", "--lr-warmup", "5"]  # fmt: skip
    cfg = apply_overrides(TrainConfig(), split_overrides(args))
    assert (cfg.momentum, cfg.nesterov, cfg.weight_decay) == (0.9, True, 5e-4)
    assert (cfg.lr_schedule, cfg.lr_milestones, cfg.lr_gamma, cfg.lr_warmup) == (
        "step", (10, 20), 0.5, 5)  # fmt: skip
    assert SGD.of(cfg) == SGD(0.9, True, 5e-4)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(momentum=1.0), "momentum must be in [0, 1)"),
        (dict(momentum=-0.1), "momentum must be in [0, 1)"),
        (dict(momentum=float("nan")), "momentum must be in [0, 1)"),
        (dict(nesterov=True), "nesterov needs a momentum > 0"),
        (dict(weight_decay=-1.0), "weight_decay must be a finite number >= 0"),
        (dict(weight_decay=float("inf")), "weight_decay must be a finite number >= 0"),
        (dict(lr_schedule="linear"), "lr_schedule must be one of constant, inverse, step, cosine"),
        (dict(lr_decay=0.01), "pass --lr-schedule inverse"),
        (dict(lr_schedule="cosine", lr_decay=0.01), "pass --lr-schedule inverse (now cosine)"),
        (dict(lr_schedule="step"), "lr_schedule step needs --lr-milestones"),
        (dict(lr_milestones=(5,)), "lr_milestones are the step schedule's"),
        (dict(lr_schedule="step", lr_milestones=(5, 5)), "strictly increasing steps > 0"),
        (dict(lr_schedule="step", lr_milestones=(0, 5)), "strictly increasing steps > 0"),
        (dict(lr_schedule="step", lr_milestones=(3,), lr_gamma=0.0), "lr_gamma must be in (0, 1]"),
        (dict(lr_schedule="step", lr_milestones=(3,), lr_gamma=2.0), "lr_gamma must be in (0, 1]"),
        (dict(lr_gamma=0.5), "lr_gamma 0.5 is the step schedule's"),
        (dict(lr_warmup=-1), "lr_warmup must be >= 0"),
    ],
)
def test_bad_optimiser_options_are_one_phrase_each(changes, message):
    with pytest.raises(ConfigError, match="invalid configuration: ") as e:
        TrainConfig(**changes)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_bad_option_on_the_command_line_is_one_line(capsys):
    assert main(["train", "--preset=tiny", "--no-progress", "--lr-decay=0.1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--lr-schedule inverse" in err[0], err


def test_the_lesson_core_refuses_the_optimiser_it_lacks(capsys):
    """The core (pipesgd_ref/core) trains plain SGD with lr / (1 + lr_decay t): the other
    options are refused in one line, never silently dropped."""
    assert main(["train", "--lesson", "--no-progress", "--momentum=0.9",
                 "--lr-schedule=cosine"]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--momentum 0.9, --lr-schedule cosine" in err[0], err


# --- stability: delayed heavy ball on a quadratic -------------------------------------------------


def recurrence(x: float, momentum: float, staleness: int, steps: int) -> float:
    """|w| after `steps` of v = M v + lambda w_{t-s}, w -= lr v (lr = 1, lambda = x), w_0 = 1
    (w_{t-s} = w_0 before the start: the pipeline applies nothing older)."""
    history, v = [1.0], 0.0
    for t in range(steps):
        v = momentum * v + x * history[max(t - staleness, 0)]
        history.append(history[-1] - v)
        if not abs(history[-1]) < 1e12:
            return math.inf
    return abs(history[-1])


def test_the_bounds_are_the_derived_ones():
    for m in (0.0, 0.5, 0.9):
        assert heavy_ball_bound(m, 0) == 2 * (1 + m) and heavy_ball_bound(m, 1) == 1 - m
        for s in (0, 1):  # the closed forms and the roots agree on both sides
            b = heavy_ball_bound(m, s)
            assert heavy_ball_stable(0.99 * b, m, s) and not heavy_ball_stable(1.01 * b, m, s)
    assert heavy_ball_bound(0.0, 2) == pytest.approx(2 * math.sin(math.pi / 10), rel=1e-9)
    assert heavy_ball_bound(0.9, 1) < heavy_ball_bound(0.0, 1) / 9  # momentum shrinks it
    with pytest.raises(ValueError, match="momentum"):
        heavy_ball_bound(1.0, 1)


@settings(max_examples=40)
@given(momentum=st.floats(0.0, 0.9), staleness=st.integers(0, 3),
       inside=st.floats(0.05, 0.85), outside=st.floats(1.15, 1.6))  # fmt: skip
def test_delayed_heavy_ball_is_bounded_inside_its_bound_and_diverges_outside(
    momentum, staleness, inside, outside
):
    bound = heavy_ball_bound(momentum, staleness)
    assert recurrence(inside * bound, momentum, staleness, 4000) < 1e-3
    assert recurrence(outside * bound, momentum, staleness, 4000) > 1e6


def _quadratic(lam):
    """Every worker the same gradient of f(w) = lam w^2 / 2: identical workers."""
    return lambda w, rank, step: (0.5 * lam * float(w @ w), lam * w)


@settings(max_examples=12)
@given(momentum=st.floats(0.0, 0.9), inside=st.floats(0.1, 0.8), outside=st.floats(1.3, 1.6))
def test_the_oracles_follow_the_bounds_and_predict_recovers_the_synchronous_one(
    momentum, inside, outside
):
    """delayed_sgd itself with momentum, staleness one: stable below 1 - M, divergent above;
    with predict (identical workers) stable up to the synchronous 2 (1 + M), where plain
    staleness one diverges, and divergent past it."""
    rule, w0 = SGD(momentum), np.ones(1)

    def final(x, compensation="none", staleness=1, steps=600):
        with np.errstate(over="ignore", invalid="ignore"):
            traj = delayed_sgd(_quadratic(1.0), w0, 2, steps, x, staleness=staleness,
                               drain=False, compensation=compensation, optimizer=rule)  # fmt: skip
        return abs(float(traj.params[0]))

    fresh, stale = heavy_ball_bound(momentum, 0), heavy_ball_bound(momentum, 1)
    assert final(inside * stale) < 1e-2
    # just past 1 - M the roots leave the circle slowly (|z| = sqrt(M + x) >= 1.015 here)
    assert not final(outside * stale, steps=1200) < 1e3
    between = stale + inside * (fresh - stale)  # past the delayed bound, inside the fresh one
    assert not final(between) < 1e3, "plain staleness one must diverge here"
    assert final(between, "predict") < 1e-2
    assert not final(outside * fresh, "predict") < 1e3
    assert final(inside * fresh, staleness=0) < 1e-2  # sync, for reference


# --- device: momentum's velocity beside the weights on the GPU ------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_momentum_on_the_device_follows_the_cpu_and_checkpoints_to_the_host(tmp_path):
    """Numba's CUDA simulator (or a GPU): the velocity is made on the device, the update
    matches the CPU's, a checkpoint brings it back, and a resume puts it on the device."""
    assert os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or os.environ.get("PIPESGD_GPU_TESTS")
    from pipesgd_ref.models.layout import on_device
    from pipesgd_ref.ops import cuda_ops

    cfg = TrainConfig(dataset="synthetic:samples=64,features=8,classes=3,seed=0",
                      model="softmax", hidden=(), world_size=2, batch_size=8, steps=5,
                      device="cuda", out=str(tmp_path), **OPTIMISER)  # fmt: skip
    cpu, dev = Worker.build(cfg, 0, 2), Worker.build(cfg, 0, 2)
    dev.to_device(0)
    rng = np.random.default_rng(1)
    for t in range(3):
        g = rng.normal(size=cpu.params.size).astype(np.float32)
        cpu.sgd_step(g.copy(), t)
        dev.sgd_step(cuda_ops.to_device(g), t)
    assert on_device(dev.velocity)
    np.testing.assert_allclose(dev.params_host(), cpu.params, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(dev.host(dev.velocity), cpu.velocity, rtol=1e-6, atol=1e-7)
    dev.save_checkpoint(3)
    np.testing.assert_array_equal(checkpoint.load(tmp_path, cfg).velocity, dev.host(dev.velocity))
    resumed = Worker.build(cfg.replace(resume=str(tmp_path)), 0, 2)
    resumed.to_device(0)
    assert on_device(resumed.velocity)
    np.testing.assert_array_equal(resumed.host(resumed.velocity), dev.host(dev.velocity))


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("algo, width", [("sync", 1), ("pipe", 2)])
def test_a_tiny_run_with_momentum_on_the_device_ends_where_the_cpu_run_does(algo, width):
    from pipesgd_ref.commands.train import run_training

    cfg = TrainConfig(dataset="synthetic:samples=64,features=8,classes=3,seed=0",
                      model="softmax", hidden=(), world_size=2, batch_size=8, steps=4,
                      algo=algo, width=width, eval_every=0, timeout=120.0,
                      **OPTIMISER)  # fmt: skip
    _, cpu = run_training(cfg, progress=False, log=lambda _: None)
    summary, gpu = run_training(cfg.replace(device="cuda"), progress=False, log=lambda _: None)
    assert summary["params_identical_on_all_ranks"]
    np.testing.assert_allclose(gpu[0].params, cpu[0].params, rtol=1e-5, atol=1e-6)
    _, plain = run_training(_plain(cfg), progress=False, log=lambda _: None)
    assert not np.allclose(plain[0].params, cpu[0].params, rtol=1e-5, atol=1e-6)
