"""The ResNet's batch-norm running statistics through distributed training: DDP's rule (the
job's statistics are worker 0's, as every replica of torch DDP uses rank 0's buffers) in every
method, bitwise the one-process oracle's (`reference.model_grad_fn` with buffers), every ring
replica ending with rank 0's, checkpoints and resumes carrying them, and the evaluation of
summary.json using them.

A tiny net (depth 8, widths 4, 8, 8: 2646 weights, 120 statistics) on digits, p = 2, with
momentum, weight decay and a cosine schedule (the acceptance runs' optimiser). p = 2: two
gradients add in the same order in the ring and in the oracle, so every comparison is bitwise.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest

from pipesgd_ref.comm.ps_wire import push_buffers
from pipesgd_ref.commands.cli import main
from pipesgd_ref.commands.train import run_training
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.errors import ConfigError
from pipesgd_ref.methods.optimizer import SGD, schedule
from pipesgd_ref.methods.reference import async_ps_sgd, delayed_sgd, model_grad_fn, sync_sgd
from pipesgd_ref.methods.table import METHODS
from pipesgd_ref.runtime import checkpoint
from pipesgd_ref.runtime.job import share_rank0_buffers
from pipesgd_ref.runtime.summary import Recorder
from pipesgd_ref.runtime.worker import Worker, WorkerResult

OPTIMISER = dict(momentum=0.9, weight_decay=5e-4, lr_schedule="cosine", lr_warmup=2)
CFG = TrainConfig.preset("tiny").replace(model="resnet", depth=8, channels=(4, 8, 8),
                                         world_size=2, steps=8, eval_every=4,
                                         **OPTIMISER)  # fmt: skip
ARGS = ["train", "--preset=tiny", "--model=resnet", "--depth=8", "--channels=4,8,8",
        "--world-size=2", "--no-progress", "--momentum=0.9", "--weight-decay=5e-4",
        "--lr-schedule=cosine", "--lr-warmup=2"]  # fmt: skip


def quiet(cfg: TrainConfig):
    return run_training(cfg, progress=False, log=lambda _: None)


def oracle(cfg: TrainConfig, arrival_order=None) -> tuple[np.ndarray, np.ndarray]:
    """(weights, running statistics) of cfg's one-process oracle: worker 0's forward passes
    update the statistics (model_grad_fn's buffers), in the order the oracle computes them.
    `arrival_order`: ps-async's, as its server recorded it."""
    w = Worker.build(cfg, 0, cfg.world_size)
    stats = w.model.init_buffers()
    grad_fn = model_grad_fn(w.model, w.data, w.sampler, stats)
    p, steps, rule, row = cfg.world_size, w.steps, SGD.of(cfg), METHODS[cfg.algo]
    if arrival_order is not None:
        lr = schedule(cfg, p * steps)  # one update a push
        want = async_ps_sgd(grad_fn, w.params, p, arrival_order, lr, optimizer=rule)
    elif row.pipelined:
        want = delayed_sgd(grad_fn, w.params, p, steps, w.lr_at, staleness=cfg.staleness,
                           warmup_steps=cfg.warmup_steps, compensation=cfg.compensation,
                           optimizer=rule)  # fmt: skip
    else:
        want = sync_sgd(grad_fn, w.params, p, steps, w.lr_at, optimizer=rule)
    assert not np.array_equal(stats, w.model.init_buffers()), "the statistics never moved"
    return want.params, stats


def slow(*values, id: str):
    return pytest.param(*values, marks=pytest.mark.slow, id=id)


# --- every method against its oracle ------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "algo, width, compensation",
    [
        pytest.param("pipe", 2, "none", id="pipe"),
        slow("sync", 1, "none", id="sync"),
        slow("ddp", 1, "none", id="ddp"),
        slow("pipe", 2, "predict", id="pipe-predict"),
    ],
)
def test_ring_methods_end_with_the_oracles_weights_and_statistics_on_every_replica(
    algo, width, compensation
):
    """Rank 0's statistics are worker 0's of the oracle, and after the loop every replica
    holds them (without the hand-over rank 1 would keep its initial ones: it computes none)."""
    cfg = CFG.replace(algo=algo, width=width, compensation=compensation)
    summary, results = quiet(cfg)
    params, stats = oracle(cfg)
    for r in results:
        np.testing.assert_array_equal(r.params, params, err_msg=f"{algo}: rank {r.rank}")
        np.testing.assert_array_equal(r.buffers, stats, err_msg=f"{algo}: rank {r.rank}")
    assert summary["params_identical_on_all_ranks"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "algo, codec",
    [
        pytest.param("ps-sync", "none", id="ps-sync"),
        slow("ps-async", "none", id="ps-async"),
        slow("ps-sync", "q8", id="ps-sync-q8"),
    ],
)
def test_parameter_servers_keep_worker_0s_statistics(algo, codec):
    """The server (rank 0) copies worker 0's statistics from its pushes: its final ones are
    worker 0's (rank 1's) and, without a codec, the oracle's; q8's codes leave the loss and
    statistics after them unaligned (4 + n bytes), which must not matter."""
    cfg = CFG.replace(algo=algo, width=1, codec=codec)
    _, results = quiet(cfg)
    server, worker0 = results[0], results[1]
    np.testing.assert_array_equal(server.buffers, worker0.buffers, err_msg=f"{algo} {codec}")
    assert not np.array_equal(server.buffers, Worker.build(cfg, 0, 2).model.init_buffers())
    if codec == "none":
        params, stats = oracle(cfg, server.extra.get("arrival_order"))
        np.testing.assert_array_equal(server.params, params, err_msg=algo)
        np.testing.assert_array_equal(server.buffers, stats, err_msg=algo)


# --- checkpoints, resume, evaluation ----------------------------------------------------------


def test_a_checkpoint_carries_the_statistics_and_refuses_bad_ones(tmp_path):
    cfg = CFG.replace(out=str(tmp_path))
    w = Worker.build(cfg, 0, 2)
    assert w.buffers is not None and w.buffers.shape == (w.model.n_buffers,)
    np.testing.assert_array_equal(w.buffers, w.model.init_buffers())
    w.buffers[:] = np.linspace(0.5, 2.0, w.buffers.size, dtype=np.float32)
    w.save_checkpoint(3)
    restored = checkpoint.load(tmp_path, cfg, w.model.n_params, w.model.n_buffers)
    np.testing.assert_array_equal(restored.buffers, w.buffers)
    for index in (0, 1):  # every rank resumes from them: the replicas start identical
        resumed = Worker.build(cfg.replace(resume=str(tmp_path)), index, 2)
        np.testing.assert_array_equal(resumed.buffers, w.buffers, err_msg=f"worker {index}")
    params = w.params
    checkpoint.save(tmp_path, cfg, params, 3, {}, None, np.ones(7, np.float32))
    with pytest.raises(ConfigError, match=r"running statistics of shape \(7,\); .* has 120"):
        Worker.build(cfg.replace(resume=str(tmp_path)), 0, 2)
    checkpoint.save(tmp_path, cfg, params, 3, {}, None, np.full(120, np.nan, np.float32))
    with pytest.raises(ConfigError, match="non-finite batch-norm running statistics"):
        checkpoint.load(tmp_path, cfg)
    checkpoint.save(tmp_path, cfg, params, 3, {})  # as an older file: no statistics
    old = Worker.build(cfg.replace(resume=str(tmp_path)), 0, 2)
    np.testing.assert_array_equal(old.buffers, old.model.init_buffers())  # start afresh
    mlp = TrainConfig.preset("tiny").replace(out=str(tmp_path / "mlp"))
    plain = Worker.build(mlp, 0, 2)
    plain.save_checkpoint(1)  # a model without batch norm writes none, and holds none
    assert plain.buffers is None and checkpoint.load(tmp_path / "mlp", mlp).buffers is None


def test_snapshots_keep_the_statistics_of_their_moment():
    """The Recorder keeps each copy's statistics beside it and evaluates with them."""
    cfg = CFG.replace(eval_every=2)
    rec = Recorder(cfg, 6, 6, 1, False, n_params=3, n_buffers=2)
    for step in range(6):
        rec(step, np.full(3, step, np.float32), 1.0, np.full(2, 10 * step, np.float32))
    rec.close()
    model = SimpleNamespace(accuracy=lambda w, X, y, buffers: float(w[0] + buffers[1]))
    curve = rec.eval_curve(model, SimpleNamespace(X_test=None, y_test=None))
    assert [e["test_accuracy"] for e in curve] == [11 * s for s in (1, 3, 5)]


def test_a_push_carries_the_statistics_after_the_loss():
    """[gradient][loss][statistics] in one float vector; with a codec [codes][loss][stats],
    the last two float32 and unaligned after q8's 4 + n code bytes."""
    from pipesgd_ref.codecs import get_codec

    wire, grads, loss, codes, stats = push_buffers(5, np.dtype(np.float32), None, 3)
    grads[:], loss[0], stats[:] = 1.0, 2.0, [3.0, 4.0, 5.0]
    assert codes is None and wire.tolist() == [1.0] * 5 + [2.0, 3.0, 4.0, 5.0]
    q8 = get_codec("q8", "numpy")
    wire, grads, loss, codes, stats = push_buffers(5, np.dtype(np.float32), q8, 3)
    assert wire.size == q8.wire_bytes(5) + 4 + 12 and codes.size == q8.wire_bytes(5)
    loss[0], stats[:] = 2.0, [3.0, 4.0, 5.0]
    tail = np.frombuffer(wire[codes.size :].tobytes(), np.float32)
    assert tail.tolist() == [2.0, 3.0, 4.0, 5.0]
    assert push_buffers(5, np.dtype(np.float32), None)[4].size == 0  # no batch norm: none


def test_the_hand_over_leaves_a_stopped_job_and_other_models_alone():
    """No AllReduce (this stand-in communicator has no links) after a signal stopped the job
    (its ranks may have left the loop at different steps) or without statistics."""
    comm = SimpleNamespace(world_size=2, rank=1)
    mine = np.ones(4, np.float32)
    stopped = WorkerResult(1, mine, [], [], [], 0, {"stopped_at": 3}, buffers=mine)
    share_rank0_buffers(comm, stopped)
    assert stopped.buffers is mine
    share_rank0_buffers(comm, WorkerResult(1, mine, [], [], [], 0, {}))


def summary_matches_checkpoint(out) -> np.ndarray:
    """summary.json's test accuracy is the final checkpoint's, evaluated with its statistics;
    returns those statistics."""
    summary = json.loads((out / "summary.json").read_text())
    w = Worker.build(CFG, 0, 2)  # the runs' model and data
    with np.load(out / checkpoint.FILE) as z:
        params, stats = z["params"].copy(), z["buffers"].copy()
    want = w.model.accuracy(params, w.data.X_test, w.data.y_test, stats)
    assert summary["test_accuracy"] == want, f"{out.name}: {summary['test_accuracy']} != {want}"
    return stats


@pytest.mark.timeout(120)
def test_pipesgd_reference_evaluates_with_worker_0s_statistics(tmp_path):
    """`pipesgd reference` on the ResNet (width 2: pipe's oracle): its accuracies are the
    oracle's weights evaluated with the oracle's statistics (it once evaluated without any and
    failed)."""
    assert main(["reference", *ARGS[1:], "--steps=8", "--eval-every=4", "--width=2",
                 f"--out={tmp_path}"]) == 0  # fmt: skip
    summary = json.loads((tmp_path / "summary.json").read_text())
    params, stats = oracle(CFG.replace(algo="pipe", width=2))
    w = Worker.build(CFG, 0, 2)
    want = w.model.accuracy(params, w.data.X_test, w.data.y_test, stats)
    assert summary["test_accuracy"] == want
    assert [e["step"] for e in summary["eval_curve"]] == [4, 8]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("algo", ["pipe", "ps-sync"])
def test_a_restarted_run_ends_bitwise_uninterrupted_statistics_included(
    algo, tmp_path, monkeypatch, capsys
):
    """Worker 0 killed at step 18 of 24: --max-restarts resumes every rank from the checkpoint
    of step 16 (its statistics, velocity and, for pipe, gradients in flight); the end is the
    uninterrupted run's, and each summary's accuracy is its checkpoint's, with its statistics."""
    common = [*ARGS, f"--algo={algo}", "--steps=24", "--checkpoint-every=8"]
    assert main([*common, f"--out={tmp_path / 'full'}"]) == 0
    with np.load(tmp_path / "full" / checkpoint.FILE) as z:
        want = {k: z[k].copy() for k in ("params", "velocity", "buffers")}
    monkeypatch.setenv("PIPESGD_FAULT", "kill@1:18")  # rank 1: worker 0 in both methods
    assert main([*common, f"--out={tmp_path / 'restarted'}", "--max-restarts=1"]) == 0
    assert "resuming from step 16" in capsys.readouterr().err
    with np.load(tmp_path / "restarted" / checkpoint.FILE) as z:
        for key, value in want.items():
            np.testing.assert_array_equal(z[key], value, err_msg=f"{algo}: {key}")
    stats = summary_matches_checkpoint(tmp_path / "full")
    np.testing.assert_array_equal(summary_matches_checkpoint(tmp_path / "restarted"), stats)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_pipe_stopped_by_a_signal_ends_cleanly_and_resumes_bitwise(tmp_path):
    """SIGTERM mid-run: the job ends with 143 in one line (no hand-over of statistics between
    ranks that stopped), its checkpoint holds rank 0's, and resuming it ends as the
    uninterrupted run, statistics included."""
    steps = 1500
    common = [*ARGS, "--algo=pipe", f"--steps={steps}"]
    assert main([*common, f"--out={tmp_path / 'full'}"]) == 0
    stopped = tmp_path / "stopped"
    argv = [sys.executable, "-m", "pipesgd_ref", *common, "--log-level=WARNING",
            f"--out={stopped}", "--checkpoint-every=50"]  # fmt: skip
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (stopped / checkpoint.FILE).is_file():
            assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert len(err.strip().splitlines()) == 1 and "stopped by SIGTERM" in err, err
    with np.load(stopped / checkpoint.FILE) as z:
        at = int(z["next_step"])
        assert z["buffers"].shape == (120,) and np.all(np.isfinite(z["buffers"]))
    assert 0 < at < steps
    resumed = tmp_path / "resumed"
    assert main([*common, f"--resume={stopped}", f"--out={resumed}"]) == 0
    with np.load(tmp_path / "full" / checkpoint.FILE) as a, np.load(resumed / checkpoint.FILE) as b:
        for key in ("params", "buffers"):
            np.testing.assert_array_equal(b[key], a[key], err_msg=f"{key}: stopped at {at}")


# --- --device cuda ------------------------------------------------------------------------------


@pytest.mark.slow  # one ResNet step in Numba's simulator: tens of seconds
@pytest.mark.timeout(600)
def test_the_statistics_live_on_the_device_beside_the_weights(tmp_path):
    """--device cuda (Numba's simulator here, or a GPU): to_device moves the statistics where
    the weights are, worker 0's forward updates them there as the CPU's, a checkpoint brings
    them home, and the other workers' stay as they were."""
    from pipesgd_ref.data import Dataset, MinibatchSampler
    from pipesgd_ref.models import model_for
    from pipesgd_ref.models.layout import on_device
    from pipesgd_ref.ops.cuda_support import gpu_problem
    from pipesgd_ref.runtime.inputs import JobInputs

    if (problem := gpu_problem()) is not None:
        pytest.skip(f"CUDA kernels cannot run: {problem}")
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((8, 4)), rng.integers(0, 2, 8)
    data = Dataset("2x2 images", X, y, X, y, n_classes=2, image_shape=(1, 2, 2))
    cfg = CFG.replace(channels=(1, 1, 1), batch_size=2, device="cuda", out=str(tmp_path))

    def worker(index: int) -> Worker:
        inputs = JobInputs(data, MinibatchSampler(8, 2, 2, cfg.seed), 4, model_for(cfg, data))
        return Worker.build(cfg, index, 2, inputs)

    cpu, dev, other = worker(0), worker(0), worker(1)
    dev.to_device(0)
    other.to_device(1)
    assert on_device(dev.buffers) and on_device(other.buffers)
    cpu.loss_and_grad(0, np.empty_like(cpu.params))
    for w in (dev, other):
        w.loss_and_grad(0, w.new_buffer())
    np.testing.assert_allclose(dev.host(dev.buffers), cpu.buffers, rtol=1e-5, atol=1e-6)
    assert not np.array_equal(cpu.buffers, cpu.model.init_buffers())
    np.testing.assert_array_equal(other.host(other.buffers), other.model.init_buffers())
    dev.save_checkpoint(1)
    saved = checkpoint.load(tmp_path, cfg, dev.model.n_params, dev.model.n_buffers).buffers
    np.testing.assert_array_equal(saved, dev.host(dev.buffers))
