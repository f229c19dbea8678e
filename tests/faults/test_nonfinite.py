"""Numerical faults: a NaN or Inf in one rank's gradient never silently poisons the weights.

Without --skip-nonfinite the job stops, the error naming the rank and the step; with it, that
gradient is left out of the step's average (the others' mean is applied) and counted. The
left-out steps are checked against the one-process oracles with the bad gradients removed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from pipesgd_ref.config import TrainConfig
from pipesgd_ref.methods.pipe import pipe_worker
from pipesgd_ref.methods.ps import ps_async_worker, ps_sync_worker
from pipesgd_ref.methods.reference import delayed_sgd, model_grad_fn, sync_sgd
from pipesgd_ref.methods.sync import sync_worker
from pipesgd_ref.runtime import faults
from pipesgd_ref.runtime.launch import launch_local
from pipesgd_ref.runtime.worker import Worker

ALGOS = ("sync", "pipe", "ps-sync", "ps-async")
WORKER_FN = {"sync": sync_worker, "pipe": pipe_worker, "ps-sync": ps_sync_worker,
             "ps-async": ps_async_worker}  # fmt: skip
BAD = {5: [2], 7: [1, 3]}  # step -> the ranks (ring methods) whose gradient is NaN/Inf there


def fault_spec(bad: dict[int, list[int]], rank_offset: int = 0) -> str:
    """PIPESGD_FAULT for `bad`, alternating NaN and Inf."""
    items = [f"{('nan', 'inf')[i % 2]}@{r + rank_offset}:{t}"
             for t, ranks in bad.items() for i, r in enumerate(ranks)]  # fmt: skip
    return ",".join(items)


def cfg_for(algo: str, **more) -> TrainConfig:
    settings = {"algo": algo, "world_size": 4, "steps": 14, **more}
    return TrainConfig.preset("tiny").replace(**settings)


def run(algo: str, cfg: TrainConfig, spec: str, monkeypatch):
    monkeypatch.setenv(faults.ENV, spec)
    ps = algo.startswith("ps")
    ranks = cfg.world_size + 1 if ps else cfg.world_size
    return launch_local(ranks, WORKER_FN[algo], (cfg,), start_method="fork", timeout=20,
                        star=ps)  # fmt: skip


def oracle_without(cfg: TrainConfig, bad: dict[int, list[int]], staleness: int):
    """The oracle with rank r's gradient of step t left out for every (t, r) in `bad`: the
    mean over the other ranks (all left out: zero)."""
    worker = Worker.build(cfg, 0, cfg.world_size)
    grad_fn = model_grad_fn(worker.model, worker.data, worker.sampler)
    p = cfg.world_size

    def left_out(params, rank, step):
        loss, g = grad_fn(params, rank, step)
        if step in bad:  # the oracle averages over p: rescale the good ones to their own mean
            good = p - len(bad[step])
            g = np.zeros_like(g) if rank in bad[step] else g * g.dtype.type(p / good)
        return loss, g

    params0 = worker.model.init_params(cfg.seed)
    if staleness == 0:
        return sync_sgd(left_out, params0, p, worker.steps, cfg.lr_at).params
    return delayed_sgd(left_out, params0, p, worker.steps, cfg.lr_at, staleness=staleness).params


def test_parse_reads_every_action_and_refuses_bad_specs():
    assert faults.parse("kill@2:10, nan@0:3") == [faults.Fault("kill", 2, 10),
                                                   faults.Fault("nan", 0, 3)]  # fmt: skip
    assert faults.parse("") == []
    for bad, words in [("kill", "ACTION@RANK:STEP"), ("explode@1:2", "unknown action"),
                       ("kill@1", "ACTION@RANK:STEP"), ("kill@-1:2", ">= 0")]:  # fmt: skip
        with pytest.raises(ValueError, match=words):
            faults.parse(bad)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "algo, action", [("sync", "nan"), ("pipe", "inf"), ("ps-sync", "inf"), ("ps-async", "nan")]
)
def test_a_nonfinite_gradient_stops_the_job_naming_rank_and_step(algo, action, tmp_path):
    rank, step = 2, 5
    env = {**os.environ, faults.ENV: f"{action}@{rank}:{step}"}
    out = subprocess.run(
        [sys.executable, "-m", "pipesgd_ref", "train", "--preset=tiny", "--world-size=4",
         f"--algo={algo}", "--steps=12", "--timeout=10", "--no-progress", f"--out={tmp_path}"],
        env=env, capture_output=True, text=True, timeout=100,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr[-2000:]
    assert f"rank {rank}" in out.stderr and f"step {step} has 1 NaN/Inf" in out.stderr
    assert "--skip-nonfinite" in out.stderr  # what to do
    # Nothing bad was written: the final checkpoint (if any) was never reached.
    assert not (tmp_path / "summary.json").exists()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("algo, staleness", [("sync", 0), ("pipe", 1)])
@pytest.mark.slow  # 2-5 s: kept out of the fast subset
def test_ring_methods_leave_out_bad_gradients_as_the_oracle_does(algo, staleness, monkeypatch):
    cfg = cfg_for(algo, skip_nonfinite=True)
    results = run(algo, cfg, fault_spec(BAD), monkeypatch)
    want = oracle_without(cfg, BAD, staleness)
    for r in results:
        np.testing.assert_array_equal(r.params, results[0].params)  # replicas stay identical
        assert r.extra["nonfinite_skipped"] == sorted(BAD.items())  # every rank knows
    assert np.all(np.isfinite(results[0].params))
    np.testing.assert_allclose(results[0].params, want, rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(120)
def test_ps_sync_leaves_out_bad_pushes_as_the_oracle_does(monkeypatch):
    cfg = cfg_for("ps-sync", skip_nonfinite=True)
    results = run("ps-sync", cfg, fault_spec(BAD, rank_offset=1), monkeypatch)
    server = results[0]
    # the server names ranks (worker i is rank i + 1)
    assert server.extra["nonfinite_skipped"] == [(t, [r + 1 for r in rs]) for t, rs in
                                                 sorted(BAD.items())]  # fmt: skip
    np.testing.assert_allclose(server.params, oracle_without(cfg, BAD, 0), rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(120)
def test_ps_async_drops_bad_pushes_and_finishes(monkeypatch):
    cfg = cfg_for("ps-async", skip_nonfinite=True)
    results = run("ps-async", cfg, fault_spec(BAD, rank_offset=1), monkeypatch)
    server = results[0]
    skipped = server.extra["nonfinite_skipped"]
    assert sorted(r for _, ranks in skipped for r in ranks) == sorted(
        r + 1 for rs in BAD.values() for r in rs
    )
    # every push not left out was applied: p * steps updates less the skipped ones
    n_bad = sum(len(rs) for rs in BAD.values())
    assert len(server.extra["arrival_order"]) == cfg.world_size * cfg.steps - n_bad
    assert np.all(np.isfinite(server.params))


@pytest.mark.timeout(120)
def test_all_ranks_bad_makes_no_update(monkeypatch):
    cfg = cfg_for("sync", skip_nonfinite=True, steps=6)
    bad = {5: [0, 1, 2, 3]}  # the last step: its update must change nothing
    results = run("sync", cfg, fault_spec(bad), monkeypatch)
    clean = cfg.replace(steps=5)
    monkeypatch.delenv(faults.ENV)
    before = launch_local(4, sync_worker, (clean,), start_method="fork", timeout=20)
    np.testing.assert_array_equal(results[0].params, before[0].params)


@pytest.mark.timeout(200)
@pytest.mark.slow  # 2-5 s: kept out of the fast subset
def test_summary_counts_the_left_out_gradients(tmp_path):
    env = {**os.environ, faults.ENV: fault_spec(BAD)}
    out = subprocess.run(
        [sys.executable, "-m", "pipesgd_ref", "train", "--preset=tiny", "--world-size=4",
         "--algo=pipe", "--steps=14", "--timeout=10", "--no-progress", f"--out={tmp_path}",
         "--skip-nonfinite=true"],
        env=env, capture_output=True, text=True, timeout=150,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["nonfinite_skipped"] == [{"step": t, "ranks": rs} for t, rs in
                                            sorted(BAD.items())]  # fmt: skip
    assert np.isfinite(summary["final_train_loss"])
    assert "left out of this step's average" in out.stderr  # the bad rank says so in the log
