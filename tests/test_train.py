"""Distributed training in real worker processes, against the one-process oracles."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracles import assert_matches_oracle, oracle

from pipesgd_ref.commands.cli import main
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.methods.pipe import pipe_worker
from pipesgd_ref.methods.sync import sync_worker
from pipesgd_ref.runtime.launch import launch_local
from pipesgd_ref.runtime.worker import Worker


@pytest.mark.slow
@pytest.mark.timeout(120)
@settings(max_examples=12)
@given(
    p=st.integers(1, 4),
    width=st.integers(1, 3),
    warmup=st.sampled_from([0, 0, 2]),
    model=st.sampled_from(["softmax", "mlp"]),
    seed=st.integers(0, 1000),
)
def test_pipe_equals_delayed_sgd(p, width, warmup, model, seed):
    cfg = TrainConfig.preset("tiny").replace(
        world_size=p, width=width, warmup_steps=warmup, model=model, hidden=(8,), steps=25,
        seed=seed,
    )  # fmt: skip
    results = launch_local(p, pipe_worker, (cfg,), start_method="fork", timeout=20)
    assert_matches_oracle(results, oracle(cfg, width - 1, warmup), p)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("p", [1, 2, pytest.param(3, marks=pytest.mark.slow), 4])
@pytest.mark.parametrize("model", ["softmax", "mlp"])
def test_sync_equals_sync_sgd(p, model):
    cfg = TrainConfig.preset("tiny").replace(world_size=p, model=model, hidden=(8,), steps=25)
    results = launch_local(p, sync_worker, (cfg,), start_method="fork", timeout=20)
    assert_matches_oracle(results, oracle(cfg, 0), p)


@pytest.mark.timeout(180)
def test_train_writes_summary_and_trace(tmp_path):
    out = tmp_path / "run"
    rc = main(["train", "--preset=tiny", "--algo=pipe", "--steps=40", f"--out={out}",
               "--no-progress"])  # fmt: skip
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    for key in ("algo", "world_size", "width", "codec", "steps", "wall_time_s", "iter_time_s",
                "t_comp_s", "t_comm_s", "comm_hidden_fraction", "final_train_loss",
                "test_accuracy", "bytes_sent_per_rank", "config", "loss_curve"):  # fmt: skip
        assert key in summary, key
    assert summary["steps"] == 40 and len(summary["loss_curve"]) == 40
    assert summary["params_identical_on_all_ranks"]
    assert 0 <= summary["comm_hidden_fraction"] <= 1
    trace = json.loads((out / "trace.json").read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["name"] for e in spans} >= {"compute", "allreduce", "update"}
    assert {e["pid"] for e in spans} == {0, 1}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_digits_every_algorithm_reaches_95_percent_and_pipe_tracks_sync(tmp_path):
    """Default configuration (laptop preset, 400 steps): every method reaches 95% test
    accuracy on digits; pipe ends within 1 point of sync after the same number of steps."""
    acc = {}
    for algo in ("sync", "pipe", "ps-sync", "ps-async"):
        out = tmp_path / algo
        rc = main(["train", "--preset=laptop", f"--algo={algo}", "--steps=400", "--no-progress",
                   f"--out={out}"])  # fmt: skip
        assert rc == 0
        summary = json.loads((out / "summary.json").read_text())
        acc[algo] = summary["test_accuracy"]
        if algo == "ps-async":
            hist = summary["staleness_histogram"]
            assert sum(hist.values()) == 4 * 400, "one applied gradient per push"
        else:
            assert summary["params_identical_on_all_ranks"], algo
    assert all(a >= 0.95 for a in acc.values()), acc
    assert abs(acc["pipe"] - acc["sync"]) <= 0.01, acc


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--world-size=5000", "--allow-many-workers"], "larger than the training set"),
        (["--width=0"], "width must be >= 1"),
        (["--lr=0"], "lr must be a positive"),
        (["--dataset=cifar"], "unknown dataset"),
        (["--model=vgg"], "model must be one of softmax, mlp, cnn, resnet"),
        (["--algo=gossip"], "algo must be one of"),
        (["--bandwidth=10Mb"], "ambiguous bandwidth"),
        (["--codec=zip"], "codec must be none, trunc16, bf16 or q8"),
        (["--codec-pull=zip"], "codec_pull must be none, trunc16, bf16 or q8"),
        (["--checkpoint-every=-1"], "checkpoint_every must be >= 0"),
        (["--resume=/nonexistent"], "--resume /nonexistent: no such folder"),
        (["--master-port=70000"], "master_port must be 0..65535"),
        (["--device=tpu"], "device must be cpu or cuda"),
        (["--device=cuda", "--algo=ps-sync"], "--device cuda trains with the ring methods"),
        (["--skip-nonfinite=maybe"], "skip_nonfinite"),
    ],
)
def test_train_bad_input_exits_2(argv, message, capsys):
    assert main(["train", "--no-progress", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.timeout(120)
def test_diverging_training_names_rank_and_step(capsys):
    rc = main(["train", "--algo=sync", "--steps=100", "--lr=50", "--no-progress"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "diverged" in err and "at step" in err and "Traceback" not in err


@pytest.mark.timeout(120)
def test_a_huge_dc_lambda_is_named_when_the_run_diverges(capsys):
    """Delay compensation weighed at 1e300 blows up at once: the advice is --dc-lambda, not
    --lr (issue 29, 19)."""
    argv = ["--preset=tiny", "--compensation=dc", "--dc-lambda=1e300", "--no-progress"]
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err
    assert "diverged. Lower --dc-lambda (now 1e+300, the default 0.04)" in err
    assert "diverged. Lower --lr" not in err and "Traceback" not in err


def _run_until_checkpoint_then_kill(out, argv, min_step):
    """Start `pipesgd train` in its own process group; SIGKILL the whole job as soon as a
    checkpoint at or past `min_step` exists (a crash in mid-run), and return its step."""
    import os
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-m", "pipesgd_ref", "train", *argv],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 120
    step = None
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            path = out / "checkpoint.npz"
            if path.exists():
                try:
                    with np.load(path) as z:
                        step = int(z["next_step"])
                except (OSError, ValueError, KeyError):
                    step = None  # only if the file were torn: the rename makes it whole
                if step is not None and step >= min_step:
                    break
            time.sleep(0.01)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    return step


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("algo, width", [("sync", 1), ("ddp", 1), ("pipe", 2), ("pipe", 3)])
def test_resume_after_a_crash_equals_an_uninterrupted_run(algo, width, tmp_path):
    common = ["--preset=tiny", f"--algo={algo}", f"--width={width}", "--world-size=3",
              "--model=mlp", "--hidden=8", "--steps=1200", "--no-progress"]  # fmt: skip
    assert main(["train", *common, f"--out={tmp_path / 'full'}"]) == 0
    with np.load(tmp_path / "full" / "checkpoint.npz") as z:
        want = z["params"].copy()
    crashed = tmp_path / "crashed"
    step = _run_until_checkpoint_then_kill(
        crashed, [*common, f"--out={crashed}", "--checkpoint-every=50"], min_step=100
    )
    assert step is not None and 100 <= step < 1200, f"no mid-run checkpoint (got {step})"
    resumed = tmp_path / "resumed"
    assert main(["train", *common, f"--out={resumed}", f"--resume={crashed}"]) == 0
    with np.load(resumed / "checkpoint.npz") as z:
        got = z["params"]
    np.testing.assert_array_equal(got, want, err_msg=f"resumed from step {step}")


def test_resume_refuses_a_different_run(tmp_path):
    assert main(["train", "--preset=tiny", "--algo=sync", "--steps=5", "--no-progress",
                 f"--out={tmp_path}"]) == 0  # fmt: skip
    rc = main(["train", "--preset=tiny", "--algo=sync", "--steps=5", "--no-progress",
               "--lr=0.5", f"--resume={tmp_path}"])  # fmt: skip
    assert rc == 2
    with pytest.raises(Exception, match="different run"):
        from pipesgd_ref.runtime.checkpoint import load

        load(tmp_path, TrainConfig.preset("tiny").replace(algo="sync", steps=5, lr=0.5))


@pytest.mark.timeout(120)
def test_divergence_keeps_the_last_good_checkpoint(tmp_path, capsys):
    rc = main(["train", "--algo=pipe", "--steps=100", "--lr=50", "--no-progress",
               "--checkpoint-every=5", f"--out={tmp_path}"])  # fmt: skip
    assert rc == 2
    err = capsys.readouterr().err
    assert "diverged" in err and "at step" in err
    with np.load(tmp_path / "checkpoint.npz") as z:  # whole, loadable, and finite
        assert z["next_step"] > 0 and np.all(np.isfinite(z["params"]))


@pytest.mark.timeout(120)
def test_resume_from_a_finished_run(tmp_path, capsys):
    """A final checkpoint comes after the drain: resuming it at the same --steps has nothing
    to do (exit 2, one line); with more steps the pipeline refills and training goes on."""
    common = ["train", "--preset=tiny", "--algo=pipe", "--no-progress"]
    assert main([*common, "--steps=30", f"--out={tmp_path / 'a'}"]) == 0
    assert main([*common, "--steps=30", f"--resume={tmp_path / 'a'}"]) == 2
    assert "already at step 30 of 30" in capsys.readouterr().err
    assert main([*common, "--steps=50", f"--resume={tmp_path / 'a'}",
                 f"--out={tmp_path / 'b'}"]) == 0  # fmt: skip
    summary = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert summary["steps"] == 20 and summary["loss_curve"][0]["step"] == 30


# --- the evaluation curve and the time to target -----------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("algo", ["sync", "ps-async"])
def test_summary_has_eval_curve_and_time_to_target(algo, tmp_path):
    """A copy of the weights every eval_every steps (ps-async: every eval_every * p updates of
    the server), evaluated after training: eval_curve. The first point at or above the target
    gives steps_to_target and time_to_target_s; the last point is the final weights."""
    from pipesgd_ref.commands.train import run_training

    cfg = TrainConfig.preset("tiny").replace(algo=algo, steps=20, eval_every=5,
                                             target_accuracy=0.5, out=str(tmp_path))  # fmt: skip
    summary, _ = run_training(cfg, progress=False, log=lambda *_: None)
    assert summary == json.loads((tmp_path / "summary.json").read_text())
    curve = summary["eval_curve"]
    assert [e["step"] for e in curve] == [5, 10, 15, 20], curve
    times = [e["wall_time_s"] for e in curve]
    assert 0 < times[0] and times == sorted(times) and times[-1] <= summary["wall_time_s"], times
    assert all(0 <= e["test_accuracy"] <= 1 for e in curve)
    assert curve[-1]["test_accuracy"] == summary["test_accuracy"], "the last copy is the answer"
    first = next(e for e in curve if e["test_accuracy"] >= 0.5)  # 20 tiny steps reach 50%
    assert summary["target_accuracy"] == 0.5
    assert summary["steps_to_target"] == first["step"], (summary["steps_to_target"], curve)
    assert summary["time_to_target_s"] == first["wall_time_s"]


@pytest.mark.timeout(120)
def test_an_unreachable_target_has_no_time_to_target():
    from pipesgd_ref.commands.train import run_training

    cfg = TrainConfig.preset("tiny").replace(algo="sync", steps=10, eval_every=5,
                                             target_accuracy=1.0)  # fmt: skip
    summary, _ = run_training(cfg, progress=False, log=lambda *_: None)
    assert [e["step"] for e in summary["eval_curve"]] == [5, 10]
    assert summary["steps_to_target"] is None and summary["time_to_target_s"] is None
    assert summary["target_accuracy"] == 1.0


class _FirstWeight:
    """A stand-in model whose 'accuracy' is the first weight: it says which copy was kept."""

    def accuracy(self, params, X, y):
        return float(params[0])


@pytest.mark.parametrize("per_step", [1, 3])  # 3: ps-async's server, p updates per step
def test_recorder_thins_snapshots_to_the_memory_budget(monkeypatch, caplog, per_step):
    """12 steps, a copy every step, 10 parameters (40 bytes a copy), a budget of 3 copies
    (120 bytes): every 4th step is kept instead, 3 copies, and a warning says so."""
    from types import SimpleNamespace

    from pipesgd_ref.runtime import summary

    monkeypatch.setattr(summary, "SNAPSHOT_BUDGET", 3 * 40)
    cfg = TrainConfig.preset("tiny").replace(eval_every=1, steps=12)
    total = 12 * per_step
    with caplog.at_level("WARNING", logger="pipesgd.train"):
        rec = summary.Recorder(cfg, total, total, per_step, False, n_params=10)
    assert rec.store.shape == (3, 10), "preallocated for the copies kept, no more"
    assert "every 4 steps instead of every 1" in caplog.text, caplog.text
    for update in range(total):
        rec(update, np.full(10, update, np.float32), loss=1.0)
    rec.close()
    curve = rec.eval_curve(_FirstWeight(), SimpleNamespace(X_test=None, y_test=None))
    assert [e["step"] for e in curve] == [4, 8, 12]
    # the weights after update u are kept when u + 1 is a multiple of 4 * per_step
    assert [e["test_accuracy"] for e in curve] == [4 * per_step * k - 1 for k in (1, 2, 3)]
    assert [e["time"] for e in curve] == sorted(e["time"] for e in curve)


def test_recorder_within_budget_keeps_every_copy(monkeypatch):
    from pipesgd_ref.runtime import summary

    monkeypatch.setattr(summary, "SNAPSHOT_BUDGET", 12 * 40)
    rec = summary.Recorder(TrainConfig.preset("tiny").replace(eval_every=1), 12, 12, 1, False,
                           n_params=10)  # fmt: skip
    assert rec.store.shape == (12, 10) and rec.every == 1
    rec.close()
    rec = summary.Recorder(TrainConfig.preset("tiny").replace(eval_every=0), 12, 12, 1, False,
                           n_params=10)  # fmt: skip
    assert rec.store.size == 0 and rec.every == 0, "eval_every 0: no copies at all"
    rec.close()


@pytest.mark.timeout(120)
def test_a_run_over_the_snapshot_budget_evaluates_fewer_steps(monkeypatch):
    """The budget reaches the forked rank 0: a softmax of 650 parameters (2600 bytes a copy),
    12 steps, a copy every step, room for 3: eval_curve at steps 4, 8, 12."""
    import pipesgd_ref.commands.train as train
    from pipesgd_ref.models import build_model

    assert build_model("softmax", 64, 10, ()).n_params == 650
    monkeypatch.setattr("pipesgd_ref.runtime.summary.SNAPSHOT_BUDGET", 3 * 2600)  # read by rank 0
    cfg = TrainConfig.preset("tiny").replace(algo="sync", steps=12, eval_every=1)
    summary, _ = train.run_training(cfg, progress=False, log=lambda *_: None)
    assert [e["step"] for e in summary["eval_curve"]] == [4, 8, 12]


# --- the start of a run -------------------------------------------------------------------------


@pytest.mark.slow  # 2-9 s: kept out of the fast subset (under 3 minutes)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("algo", ["sync", "pipe", "ps-sync", "ps-async"])
def test_workers_start_step_zero_together(algo, monkeypatch):
    """A worker that is slow to get ready (here worker 1, 1 s late) holds back the first step
    of every worker: the run's clock (time to target, the loss curve) starts with training,
    not while one worker is still setting up. Without the barrier before step 0 (ring) or the
    server's start (ps) the others would start computing up to 1 s early (less by the 0-0.5 s
    their codecs' first load differs)."""
    import time

    from pipesgd_ref.commands.train import run_training

    codec = Worker.codec

    def late_codec(self):  # the last thing a worker does before its loop
        made = codec(self)
        if self.index == 1:
            time.sleep(1.0)
        return made

    monkeypatch.setattr(Worker, "codec", late_codec)  # the forked ranks inherit it
    cfg = TrainConfig.preset("tiny").replace(algo=algo, world_size=3, steps=6, eval_every=3)
    summary, results = run_training(cfg, progress=False, log=lambda *_: None)
    workers = results[1:] if algo.startswith("ps") else results  # rank 0 serves
    firsts = [min(e["ts"] for e in r.events) / 1e6 for r in workers]
    assert max(firsts) - min(firsts) < 0.25, f"first spans start at {firsts} (s): not together"
    assert summary["loss_curve"][0]["wall_time_s"] < 0.5, summary["loss_curve"][0]


def test_rank_zero_trains_with_the_worker_it_built_for_the_recorder(monkeypatch):
    """Rank 0 builds its Worker once (the recorder's sizes, then the worker's training),
    and evaluates with the host model even where the worker replaced it (--device cuda)."""
    from pipesgd_ref.methods.table import Method
    from pipesgd_ref.runtime import job
    from pipesgd_ref.runtime.worker import WorkerResult

    built, got = [], []
    build = Worker.build.__func__

    def counting_build(cls, cfg, worker, n_workers, inputs=None):
        built.append(worker)
        return build(cls, cfg, worker, n_workers, inputs)

    def fake_worker(comm, cfg, hooks):
        worker, progress = hooks.worker, hooks.progress
        got.append(worker)
        host_model = worker.model
        worker.model = None  # as to_device does: the recorder must keep the host model
        progress(0, worker.params, 1.0)
        return WorkerResult(0, worker.params, [1.0], [0.0], [], 0, {"host": host_model})

    monkeypatch.setattr(Worker, "build", classmethod(counting_build))
    monkeypatch.setattr(Method, "loop", property(lambda row: fake_worker))
    cfg = TrainConfig.preset("tiny").replace(steps=1, eval_every=1)
    comm = type("Comm", (), {"rank": 0, "world_size": cfg.world_size})()
    result = job.train_job(comm, cfg, False)
    assert built == [0], f"rank 0 built {len(built)} Workers"
    assert got[0] is not None and got[0].cfg == cfg
    assert [e["step"] for e in result.extra["eval_curve"]] == [1]  # after step 0
    host = result.extra["host"]
    want = host.accuracy(result.params, got[0].data.X_test, got[0].data.y_test)
    assert result.extra["test_accuracy"] == want, "rank 0 evaluates the final weights"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("algo", ["sync", "pipe", "ps-sync"])
@pytest.mark.slow
def test_each_process_builds_one_worker_and_the_launcher_none(algo, tmp_path, monkeypatch):
    """A Worker loads the data and the checkpoint and builds w_0: every rank of a job builds
    exactly one, the launcher (which checks the inputs, then summarises) builds none, and a
    resumed run is no different (its launcher reads the checkpoint once, to check it)."""
    import os

    from pipesgd_ref.commands.train import run_training

    log = tmp_path / "builds.txt"
    build = Worker.build.__func__

    def logging_build(cls, cfg, worker, n_workers, inputs=None):
        with open(log, "a") as f:  # the forked ranks inherit this patch; a file sees them all
            f.write(f"{os.getpid()} {worker}\n")
        return build(cls, cfg, worker, n_workers, inputs)

    monkeypatch.setattr(Worker, "build", classmethod(logging_build))
    out = tmp_path / "run"
    cfg = TrainConfig.preset("tiny").replace(algo=algo, world_size=2, steps=4, out=str(out))
    ranks = 3 if algo.startswith("ps") else 2
    for run in (cfg, cfg.replace(steps=6, resume=str(out))):
        log.write_text("")
        summary, results = run_training(run, progress=False, log=lambda *_: None)
        builds = [line.split() for line in log.read_text().splitlines()]
        pids = [pid for pid, _ in builds]
        assert len(builds) == ranks and len(set(pids)) == ranks, (
            f"{algo}: {ranks} ranks should build one Worker each, got (pid, worker) {builds}"
        )
        assert str(os.getpid()) not in pids, f"{algo}: the launcher built a Worker: {builds}"
        # worker indices: one per rank; a parameter server keeps its weights as worker 0's
        want = [0, 0, 1] if algo.startswith("ps") else [0, 1]
        assert sorted(int(w) for _, w in builds) == want, builds
        assert 0.0 <= summary["test_accuracy"] <= 1.0 and len(results) == ranks


def test_load_before_fork_leaves_the_workers_nothing_to_import():
    """What a forked worker would load on its own (Numba, the codec, the algorithm's module)
    is loaded by the parent, in a fresh interpreter that had none of it."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from pipesgd_ref.config import TrainConfig\n"
        "from pipesgd_ref.runtime.job import load_before_fork\n"
        "mods = ('numba', 'pipesgd_ref.codecs', 'pipesgd_ref.methods.pipe')\n"
        "before = [m in sys.modules for m in mods]\n"
        "load_before_fork(TrainConfig.preset('tiny').replace(algo='pipe', codec='q8'))\n"
        "print(before, [m in sys.modules for m in mods])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout  # fmt: skip
    assert out.split() == ["[False,", "False,", "False]", "[True,", "True,", "True]"], out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("algo", ["sync", "ps-sync"])
def test_a_worker_failing_before_the_start_ends_the_job_naming_it(algo, monkeypatch):
    """A worker that fails while setting up, before it is ready for step 0, ends the job with
    its error, well within the timeout: the others' wait at the start (the ring barrier; the
    parameter server's start message) never becomes a hang."""
    import time

    from pipesgd_ref.commands.train import run_training
    from pipesgd_ref.errors import WorkerFailed

    codec = Worker.codec

    def failing_codec(self):
        if self.index == 1:
            raise RuntimeError("no codec for worker 1 (a test)")
        return codec(self)

    monkeypatch.setattr(Worker, "codec", failing_codec)  # the forked ranks inherit it
    cfg = TrainConfig.preset("tiny").replace(algo=algo, world_size=3, steps=6, timeout=30.0)
    start = time.monotonic()
    with pytest.raises(WorkerFailed, match="no codec for worker 1") as info:
        run_training(cfg, progress=False, log=lambda *_: None)
    rank = 2 if algo.startswith("ps") else 1  # worker 1: rank 2 beside a server
    assert info.value.cause == rank, str(info.value)
    assert f"the errors point to rank {rank}:" in str(info.value), str(info.value)
    assert time.monotonic() - start < cfg.timeout, "the others waited out their timeout"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", [["--steps=1"], ["--epochs=0.0001"]])
def test_a_one_step_run_writes_its_summary(how, tmp_path, capsys):
    """One step has no step-to-step interval: its iteration time is the step itself."""
    assert main(["train", "--preset=tiny", "--no-progress", *how, f"--out={tmp_path}"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["iter_time_s"] > 0
    assert (tmp_path / "trace.json").is_file()
    assert "1 steps in" in capsys.readouterr().out
