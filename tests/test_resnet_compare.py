"""`pipesgd compare --model resnet`: the compare-resnet preset, and the timing models on the
residual net (its measured backward profile, ddp's buckets over its units, the optimiser's
passes in t_u).

- `compare --model resnet` starts from the compare-resnet preset, which passes every check and
  the preflight of every run of the comparison;
- the measured backward profile has one entry per unit of grad_units(), in the backward's
  order, the unit's bytes, the fractions strictly increasing;
- the prediction's buckets (timing/buckets.py) are ddp's (methods/ddp.py) over the resnet's
  units, and ddp hands each bucket to the ring the moment the backward has written its lowest
  unit, before the backward goes on (a spy in the worker processes);
- t_u is timed on the run's own optimiser rule: 1 pass (plain), 3 (momentum), 5 (weight decay
  and nesterov);
- a tiny comparison of the resnet shows every run's prediction beside its measurement.
"""

import json
import math
import os
from types import SimpleNamespace

import numpy as np
import pytest

from pipesgd_ref.commands.compare import preflight_runs, run_compare
from pipesgd_ref.commands.parser import build_parser, resolve_named
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.methods import ddp
from pipesgd_ref.methods.ddp import ddp_worker
from pipesgd_ref.methods.optimizer import SGD
from pipesgd_ref.methods.pipe import CommThread
from pipesgd_ref.models import build_model
from pipesgd_ref.models.layout import buckets
from pipesgd_ref.ops import get_backend
from pipesgd_ref.presets import PRESETS
from pipesgd_ref.runtime import preflight
from pipesgd_ref.runtime.launch import launch_local
from pipesgd_ref.runtime.worker import Worker
from pipesgd_ref.timing import Calibration, measure
from pipesgd_ref.timing.buckets import bucket_ready

PRESET = TrainConfig.preset("compare-resnet")


def resolved(*argv: str) -> tuple[TrainConfig, frozenset]:
    args, rest = build_parser().parse_known_args(list(argv))
    return resolve_named(args, rest)


def resnet_of(cfg: TrainConfig):
    return build_model("resnet", 64, 10, image_shape=(1, 8, 8), channels=cfg.channels,
                       depth=cfg.depth)  # fmt: skip


# --- the preset ---------------------------------------------------------------------------------


def test_compare_model_resnet_starts_from_the_compare_resnet_preset():
    """`compare --model resnet` (and --quick) is the preset, its bandwidth left for compare to
    choose; --preset compare-resnet is the same; other commands and models are untouched."""
    for argv in (["compare", "--model=resnet"], ["compare", "--quick", "--model", "resnet"],
                 ["compare", "--preset=compare-resnet"]):  # fmt: skip
        cfg, named = resolved(*argv)
        assert cfg == PRESET, argv
        assert "bandwidth" not in named and cfg.bandwidth == "inf", argv
    cfg, _ = resolved("compare", "--model=resnet", "--steps=7", "--channels=8,16,32")
    assert (cfg.steps, cfg.channels, cfg.lr) == (7, (8, 16, 32), PRESET.lr), "flags still win"
    assert resolved("train", "--model=resnet")[0].steps == TrainConfig.preset("laptop").steps
    assert resolved("compare", "--model=cnn")[0] == TrainConfig.preset("compare-cnn")
    assert resolved("compare", "--model=mlp")[0] == TrainConfig.preset("compare")


def test_the_compare_resnet_preset_is_a_valid_comparison():
    """Depth 8 on digits, 4 workers, a target below what it ends at, the link left to compare;
    every run of the comparison passes the preflight (options, memory, the link's timeout)."""
    assert (PRESET.model, PRESET.depth, PRESET.dataset, PRESET.world_size) == (
        "resnet", 8, "digits", 4)  # fmt: skip
    assert "bandwidth" not in PRESETS["compare-resnet"], "compare chooses the link"
    assert 0.5 < PRESET.target_accuracy < 1 and PRESET.steps % PRESET.eval_every == 0
    preflight.check_config(PRESET)
    preflight_runs(PRESET)
    assert resnet_of(PRESET).n_params == 77_754


# --- the backward's profile and ddp's buckets ----------------------------------------------------


def test_the_resnets_measured_backward_profile_follows_its_units(monkeypatch):
    """time_compute_profile: per unit of grad_units() (the head, then each conv + BN from the
    top block down to the stem), its bytes and a fraction of the call, strictly increasing;
    the units are contiguous ranges covering the vector top down. t_u is the cfg's rule's."""
    rules = []

    def spy(rule, ops, params, grads, reps=10):
        rules.append(rule)
        return measure.median_time(lambda: rule.step(ops, params.copy(), grads.copy(), 0.0,
                                                     np.zeros_like(params)), 1, 0)  # fmt: skip

    monkeypatch.setattr(measure, "time_update", spy)
    cfg = PRESET.replace(momentum=0.9, lr=0.01)
    n, t_comp, t_update, units = measure.time_compute_profile(cfg, reps=3)
    ranges = resnet_of(cfg).grad_units()
    assert n == ranges[0][1] and ranges[-1][0] == 0
    assert all(hi == lo for (lo, _), (_, hi) in zip(ranges, ranges[1:], strict=False))
    assert [b for b, _ in units] == [(hi - lo) * 4 for lo, hi in ranges]
    fractions = [f for _, f in units]
    assert all(0 < a < b <= 1 for a, b in zip(fractions, fractions[1:], strict=False)), units
    assert t_comp > 0 and t_update > 0
    assert rules == [SGD(momentum=0.9)], "t_u times the run's own rule"


@pytest.mark.parametrize("cap", [0, 8_000, 32_000, 100_000, 10**9])
def test_the_predictions_buckets_are_ddps_over_the_resnets_units(cap):
    """bucket_ready groups the profile's units as methods/ddp.py groups grad_units(): the same
    buckets in the same order, each ready when its lowest (last written) unit is."""
    ranges = resnet_of(PRESET).grad_units()
    units = [((hi - lo) * 4, (i + 1) / len(ranges)) for i, (lo, hi) in enumerate(ranges)]
    plan = buckets(ranges, cap, 4)
    ready_at = {lo: f for (lo, _), (_, f) in zip(ranges, units, strict=True)}
    assert bucket_ready(units, cap) == [((hi - lo) * 4, ready_at[lo]) for lo, hi in plan]
    if cap == 32_000:  # the default --bucket-size: 10 units in 5 buckets
        assert len(plan) == 5


@pytest.mark.timeout(120)
def test_ddp_hands_each_resnet_bucket_to_the_ring_as_soon_as_it_is_written(tmp_path, monkeypatch):
    """In each rank, each step: the backward's ready(lo, hi) for every unit in order, and right
    after the unit that completes a bucket (the bucket's lowest), that bucket's AllReduce
    starts, before the backward writes the next unit; the buckets in the ring's order."""
    cfg = PRESET.replace(world_size=2, steps=2, algo="ddp", bandwidth="inf", latency="0",
                         bucket_size="32KB", eval_every=0)  # fmt: skip
    seen: list = []  # this process's events (each rank is a forked process)
    grads_of: dict = {}
    real = Worker.loss_and_grad

    def loss_and_grad(self, step, grads, params=None, ready=None):
        grads_of["now"] = grads

        def heard(lo, hi, loss):
            seen.append(["ready", step, lo, hi])
            ready(lo, hi, loss)

        loss = real(self, step, grads, params, heard if ready else None)
        (tmp_path / f"{os.getpid()}.json").write_text(json.dumps(seen))
        return loss

    class Spy(CommThread):
        def start_allreduce(self, step, buf, ok=True):
            lo = (buf.ctypes.data - grads_of["now"].ctypes.data) // buf.itemsize
            seen.append(["send", step, lo, lo + buf.size])
            super().start_allreduce(step, buf, ok)

    monkeypatch.setattr(Worker, "loss_and_grad", loss_and_grad)
    monkeypatch.setattr(ddp, "CommThread", Spy)
    launch_local(2, ddp_worker, (cfg,), start_method="fork", timeout=60)
    ranges = resnet_of(cfg).grad_units()
    plan = {lo: hi for lo, hi in buckets(ranges, 32_000, 4)}
    want = []
    for t in range(cfg.steps):
        for lo, hi in ranges:
            want.append(["ready", t, lo, hi])
            if lo in plan:
                want.append(["send", t, lo, plan[lo]])
    logs = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
    assert len(logs) == 2, "one log per rank"
    for log in logs:
        assert log == want


# --- the optimiser's passes in t_u ----------------------------------------------------------------


@pytest.mark.parametrize(
    "rule, ops",
    [
        (SGD(), {"sgd_step": 1}),
        (SGD(momentum=0.9), {"scale": 1, "add_into": 1, "sgd_step": 1}),
        (SGD(momentum=0.9, nesterov=True, weight_decay=5e-4),
         {"scale": 1, "add_into": 1, "sgd_step": 3}),
    ],
)  # fmt: skip
def test_t_update_times_every_pass_of_the_optimisers_rule(rule, ops):
    """time_update runs the whole rule: plain SGD one pass over the weights, momentum three,
    with weight decay and nesterov five; the caller's weights and gradient are left alone."""
    numpy_ops = get_backend("numpy")
    calls: dict[str, int] = {}

    def counted(name):
        def op(*args):
            calls[name] = calls.get(name, 0) + 1
            return getattr(numpy_ops, name)(*args)

        return op

    counting = SimpleNamespace(**{name: counted(name) for name in ("sgd_step", "scale",
                                                                    "add_into")})  # fmt: skip
    params, grads = np.ones(1000, np.float32), np.full(1000, 0.5, np.float32)
    t = measure.time_update(rule, counting, params, grads, reps=4)
    assert t > 0
    assert calls == {name: k * (4 + 2) for name, k in ops.items()}, "4 timed + 2 warm-up"
    assert (params == 1).all() and (grads == 0.5).all()


# --- a tiny comparison ----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_tiny_resnet_comparison_shows_predicted_beside_measured(tmp_path):
    """compare --model resnet, shrunk: 2 workers, narrow stages, 4 steps, sync, ddp and pipe,
    a made-up calibration: every row has its measured and predicted iteration and the error,
    and the logged table shows them."""
    cfg, _ = resolved("compare", "--model=resnet", "--channels=4,8,8", "--world-size=2",
                      "--steps=4", "--eval-every=2", "--bandwidth=inf", "--latency=0",
                      "--target-accuracy=0.01")  # fmt: skip
    n = resnet_of(cfg).n_params
    cal = Calibration(n_params=n, t_comp=2e-3, t_update=1e-5, alpha=1e-4, bandwidth=math.inf,
                      gamma=1e-10, cores=2)  # fmt: skip
    lines: list[str] = []
    runs = (("sync", "none"), ("ddp", "none"), ("pipe", "none"))
    report = run_compare(cfg, out=tmp_path, progress=False, log=lines.append, runs=runs,
                         calibration=cal, repeats=1)  # fmt: skip
    assert report["config"]["model"] == "resnet"
    assert [r["run"] for r in report["table"]] == ["sync", "ddp", "pipe"]
    for row in report["table"]:
        assert row["iter_ms"] > 0 and row["predicted_ms"] > 0, row
        assert row["error"] == pytest.approx(
            (row["predicted_ms"] - row["iter_ms"]) / row["iter_ms"]
        )
    table = "\n".join(lines)
    assert "predicted" in table and "timing model: median |error|" in table
    for row in report["table"]:
        line = next(x for x in table.splitlines() if x.startswith(f"{row['run']} "))
        assert f"{row['predicted_ms']:.1f}" in line and f"{row['iter_ms']:.1f}" in line
