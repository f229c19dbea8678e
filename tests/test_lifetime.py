"""A job's lifetime: signals stop every rank at one step, no worker outlives its launcher, and
--max-restarts picks a failed job up from its last checkpoint (pipesgd_ref/runtime/lifetime.py)."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from procs import processes

from pipesgd_ref.commands.cli import main
from pipesgd_ref.runtime.lifetime import StopPlan

# --- the stop plan: every rank stops before the same step ------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_every_rank_stops_before_the_same_step_whatever_their_skew(seed):
    """Ranks in threads step at random speeds, bound together as the ring binds them (a step
    ends only when every rank has done it: a barrier); a stop asked at a random moment must
    end every rank before the same step, or the barrier would wait for a rank that stopped."""
    rng = random.Random(seed)
    p = rng.randint(2, 6)
    plan = StopPlan(mp.get_context("fork"), p)
    step_done = threading.Barrier(p, timeout=10)
    start = rng.randint(0, 5)  # a resumed run starts later
    stopped = {}
    delays = [[rng.random() * 2e-3 for _ in range(500)] for _ in range(p)]

    def rank(r):
        t = start
        while plan.entering(r, t):
            time.sleep(delays[r][t % 500])
            step_done.wait()  # the AllReduce: nobody finishes step t before everybody does it
            t += 1
        stopped[r] = t

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(p)]
    for th in threads:
        th.start()
    time.sleep(rng.random() * 0.05)
    stop_at = plan.request(signal.SIGTERM)
    for th in threads:
        th.join(timeout=20)
    assert not step_done.broken, "a rank waited for a step another rank never ran"
    assert set(stopped.values()) == {stop_at}, f"p={p}: ranks stopped at {stopped}"
    assert plan.stop_at == stop_at and plan.signum == signal.SIGTERM
    assert plan.request(signal.SIGINT) == stop_at  # a second request changes nothing


def test_a_stop_before_any_step_stops_every_rank_at_its_start():
    plan = StopPlan(mp.get_context("fork"), 3)
    assert plan.request() == 0
    assert not any(plan.entering(r, 7) for r in range(3))  # resumed at step 7: runs nothing


def test_the_plan_keeps_the_rank_whose_signal_stopped_the_job():
    """The job's last line names the worker that received the signal (None: the launcher);
    a later request, by any rank, changes neither the step nor the rank."""
    plan = StopPlan(mp.get_context("fork"), 3)
    assert plan.by_rank is None
    assert plan.entering(0, 4) and plan.entering(2, 5)
    assert plan.request(signal.SIGTERM, rank=2) == 6
    assert plan.request(signal.SIGINT) == 6 and plan.request(signal.SIGHUP, rank=1) == 6
    assert (plan.signum, plan.by_rank) == (signal.SIGTERM, 2)
    launcher = StopPlan(mp.get_context("fork"), 3)
    launcher.request(signal.SIGINT)
    assert (launcher.signum, launcher.by_rank) == (signal.SIGINT, None)


# --- signals to a real job ---------------------------------------------------------------------


def _job_pids(marker: str) -> list[int]:
    """Processes whose command line holds `marker` (the run's unique --out)."""
    me = os.getpid()
    return [p.pid for p in processes() if p.pid != me and marker in (p.cmdline() or "")]


def _start(out: Path, *extra: str, steps: int = 200_000) -> subprocess.Popen:
    argv = [sys.executable, "-m", "pipesgd_ref", "train", "--preset=tiny", "--model=mlp",
            "--hidden=8", f"--steps={steps}", "--no-progress", "--log-level=WARNING",
            f"--out={out}", "--checkpoint-every=50", *extra]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip


def _wait_for_checkpoint(out: Path, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not (out / "checkpoint.npz").is_file():
        assert proc.poll() is None, f"the run ended early: {proc.communicate()}"
        assert time.monotonic() < deadline, "no checkpoint within 60 s"
        time.sleep(0.05)


def _gone_within(marker: str, seconds: float) -> float | None:
    """Seconds until no process of the job is left (None: some still are after `seconds`)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        if not _job_pids(marker):
            return time.monotonic() - t0
        time.sleep(0.05)
    return None


def _kill_job(marker: str) -> None:
    for pid in _job_pids(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "algo, how",
    [
        ("pipe", "SIGTERM"),  # kill, scancel, a container stop, a CI timeout
        ("sync", "SIGINT"),  # SIGINT to the launcher's pid alone
        ("ps-sync", "SIGTERM"),
        ("ps-async", "SIGINT"),
        ("pipe", "Ctrl-C"),  # SIGINT to the whole process group, as a terminal sends it
        ("sync", "SIGHUP"),
    ],
)
def test_a_signal_stops_every_worker_with_a_checkpoint_and_one_line(algo, how, tmp_path):
    out = tmp_path / f"run-{algo}-{how}"
    proc = _start(out, f"--algo={algo}", "--world-size=3")
    try:
        _wait_for_checkpoint(out, proc)
        time.sleep(0.3)
        sig = signal.SIGINT if how == "Ctrl-C" else getattr(signal, how)
        sent = time.monotonic()
        if how == "Ctrl-C":
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
        left = _gone_within(str(out), 5.0)
        assert left is not None, f"processes of the job still alive 5 s after {how}"
    finally:
        _kill_job(str(out))
    assert proc.returncode == 128 + sig, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"want one line, got:\n{err}"
    assert f"stopped by {sig.name}" in lines[0] and "--resume" in lines[0], lines[0]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert took < 10, f"{how}: the job took {took:.1f} s to stop"
    summary = json.loads((out / "summary.json").read_text())
    stop_at = summary["stopped"]["at_step"]
    assert summary["stopped"]["signal"] == sig.name and stop_at > 0
    assert summary["stopped"]["rank"] is None and "sent to rank" not in lines[0], lines[0]
    with np.load(out / "checkpoint.npz") as z:  # the stop's own checkpoint, not a periodic one
        assert int(z["next_step"]) == stop_at and np.all(np.isfinite(z["params"]))


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "algo, rank, how, role",
    [
        ("sync", 1, "SIGTERM", ""),  # `kill PID` of one worker found with ps
        ("pipe", 2, "SIGINT", ""),
        ("ps-async", 2, "SIGTERM", " (worker 1)"),
        ("ps-sync", 0, "SIGHUP", " (the parameter server)"),
    ],
)
def test_a_signal_to_one_worker_stops_the_job_as_one_to_the_launcher(
    algo, rank, how, role, tmp_path
):
    """A stop of any rank is a stop of the job: the worker that received the signal asks the
    job to stop, every rank stops before the same step, and the launcher ends with the
    signal's code, one line naming the rank, the stop's checkpoint and `stopped` in
    summary.json, not with a success over fewer steps."""
    out = tmp_path / f"one-{algo}-{how}"
    proc = _start(out, f"--algo={algo}", "--world-size=3")
    try:
        _wait_for_checkpoint(out, proc)
        # The launcher starts its workers in rank order: their pids ascend with the rank.
        workers = sorted(pid for pid in _job_pids(str(out)) if pid != proc.pid)
        ranks = 4 if algo.startswith("ps") else 3  # a parameter server's job has p + 1
        assert len(workers) == ranks, workers
        sig = getattr(signal, how)
        os.kill(workers[rank], sig)
        _, err = proc.communicate(timeout=60)
        left = _gone_within(str(out), 5.0)
        assert left is not None, f"processes of the job still alive 5 s after {how}"
    finally:
        _kill_job(str(out))
    assert proc.returncode == 128 + sig, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"want one line, got:\n{err}"
    assert f"{algo}: stopped by {how} sent to rank {rank}{role} before step " in lines[0], lines[0]
    assert "--resume" in lines[0] and "Traceback" not in err, lines[0]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped"]["signal"] == how and summary["stopped"]["rank"] == rank, summary
    stop_at = summary["stopped"]["at_step"]
    assert f"before step {stop_at} " in lines[0], lines[0]
    with np.load(out / "checkpoint.npz") as z:  # the stop's own checkpoint, not a periodic one
        assert int(z["next_step"]) == stop_at and np.all(np.isfinite(z["params"]))


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_workers_stop_on_their_own_when_the_launcher_is_sigkilled(tmp_path):
    out = tmp_path / "orphans"
    proc = _start(out, "--algo=pipe", "--world-size=3")
    try:
        _wait_for_checkpoint(out, proc)
        workers = [pid for pid in _job_pids(str(out)) if pid != proc.pid]
        assert len(workers) == 3, workers
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        left = _gone_within(str(out), 5.0)
        assert left is not None, "the workers outlived their SIGKILLed launcher by 5 s"
    finally:
        _kill_job(str(out))
    with np.load(out / "checkpoint.npz") as z:  # written by rank 0 as it stopped, or periodic
        assert int(z["next_step"]) > 0 and np.all(np.isfinite(z["params"]))


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("algo", ["sync", "ddp", "pipe", "ps-sync"])
def test_stopped_then_resumed_ends_bitwise_as_an_uninterrupted_run(algo, tmp_path):
    """The stop's checkpoint continues the very run: for pipe it keeps the gradients in
    flight instead of draining them."""
    steps = 3000
    common = ["train", "--preset=tiny", f"--algo={algo}", "--world-size=3", "--model=mlp",
              "--hidden=8", f"--steps={steps}", "--no-progress"]  # fmt: skip
    assert main([*common, f"--out={tmp_path / 'full'}"]) == 0
    with np.load(tmp_path / "full" / "checkpoint.npz") as z:
        want = z["params"].copy()
    stopped = tmp_path / "stopped"
    proc = _start(stopped, f"--algo={algo}", "--world-size=3", steps=steps)
    try:
        _wait_for_checkpoint(stopped, proc)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        _kill_job(str(stopped))
    if proc.returncode == 0:
        pytest.fail("the run finished before the signal: make it longer")
    assert proc.returncode == 143
    with np.load(stopped / "checkpoint.npz") as z:
        at = int(z["next_step"])
    assert 0 < at < steps
    resumed = tmp_path / "resumed"
    assert main([*common, f"--resume={stopped}", f"--out={resumed}"]) == 0
    with np.load(resumed / "checkpoint.npz") as z:
        np.testing.assert_array_equal(z["params"], want, err_msg=f"stopped before step {at}")


# --- restarts ----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("algo", ["sync", "ddp", "pipe", "ps-sync"])
def test_max_restarts_resumes_from_the_checkpoint_and_ends_as_if_nothing_failed(
    algo, tmp_path, monkeypatch, capsys
):
    common = ["train", "--preset=tiny", f"--algo={algo}", "--world-size=3", "--model=mlp",
              "--hidden=8", "--steps=400", "--no-progress", "--checkpoint-every=100"]  # fmt: skip
    assert main([*common, f"--out={tmp_path / 'full'}"]) == 0
    with np.load(tmp_path / "full" / "checkpoint.npz") as z:
        want = z["params"].copy()
    monkeypatch.setenv("PIPESGD_FAULT", "kill@1:250")  # fires in the first run only
    assert main([*common, f"--out={tmp_path / 'failed'}"]) == 2  # no restarts: the job fails
    assert "rank 1" in capsys.readouterr().err
    restarted = tmp_path / "restarted"
    assert main([*common, f"--out={restarted}", "--max-restarts=2"]) == 0
    err = capsys.readouterr().err
    assert "restart 1 of 2" in err and "resuming from step 200" in err, err
    with np.load(restarted / "checkpoint.npz") as z:
        np.testing.assert_array_equal(z["params"], want, err_msg="after one restart")
    summary = json.loads((restarted / "summary.json").read_text())
    [restart] = summary["restarts"]
    assert restart["cause_rank"] == 1 and restart["resumed_from_step"] == 200, restart
    assert summary["config"]["resume"] == "" and summary["loss_curve"][0]["step"] == 200
    assert os.environ["PIPESGD_FAULT"] == "kill@1:250"  # the caller's environment, restored


@pytest.mark.timeout(120)
def test_a_restart_without_a_checkpoint_starts_over(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PIPESGD_FAULT", "kill@0:5")
    rc = main(["train", "--preset=tiny", "--algo=sync", "--world-size=2", "--steps=30",
               "--no-progress", "--max-restarts=1"])  # fmt: skip
    assert rc == 0
    err = capsys.readouterr().err
    assert "restart 1 of 1" in err and "starting over" in err, err


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_a_restart_of_a_resumed_run_without_its_own_checkpoint_resumes_where_resume_said(
    tmp_path, monkeypatch, capsys
):
    """--resume DIR, no --out: the restart resumes from DIR's checkpoint again (it read the
    step from --out's checkpoint, which there is none of, and failed)."""
    first = tmp_path / "first"
    common = ["train", "--preset=tiny", "--algo=sync", "--world-size=2", "--no-progress"]
    assert main([*common, "--steps=20", f"--out={first}"]) == 0
    monkeypatch.setenv("PIPESGD_FAULT", "kill@0:25")
    assert main([*common, "--steps=40", f"--resume={first}", "--max-restarts=1"]) == 0
    err = capsys.readouterr().err
    assert "restart 1 of 1" in err and "resuming from step 20" in err, err


def _start_joined(out: Path, algo: str, world_size: int) -> list[subprocess.Popen]:
    """The ranks of a joined job (as torchrun starts them: RANK, WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT), each in a session of its own: a signal reaches only the rank it is sent to."""
    from pipesgd_ref.methods.table import method
    from pipesgd_ref.runtime.launch import free_port

    port, ranks = free_port(), method(algo).ranks(world_size)
    procs = []
    for rank in range(ranks):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(ranks),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}  # fmt: skip
        argv = [sys.executable, "-m", "pipesgd_ref", "train", "--preset=tiny", f"--algo={algo}",
                f"--world-size={world_size}", "--steps=200000", "--no-progress",
                "--log-level=WARNING", f"--out={out}", "--checkpoint-every=50"]  # fmt: skip
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True,
                                      start_new_session=True))  # fmt: skip
    return procs


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_joined_ranks_stop_on_a_signal_with_one_line_each(tmp_path):
    """Ranks of a job that torchrun, mpirun or srun started: each handles the signal its
    launcher forwards; a sync rank 0 stops after a whole step, so its checkpoint is that
    step's (the replicas are identical)."""
    out = tmp_path / "joined"
    procs = _start_joined(out, "sync", world_size=2)
    try:
        _wait_for_checkpoint(out, procs[0])  # training has begun on every rank
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        for p in procs:
            p.send_signal(signal.SIGTERM)
        errs = [p.communicate(timeout=30)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
    for rank, (p, err) in enumerate(zip(procs, errs, strict=True)):
        lines = err.strip().splitlines()
        assert p.returncode == 143 and len(lines) == 1, f"rank {rank}: rc {p.returncode}\n{err}"
        assert "stopped by SIGTERM" in lines[0] and f"(rank {rank})" in lines[0], lines[0]
    with np.load(out / "checkpoint.npz") as z:
        assert int(z["next_step"]) > 0 and np.all(np.isfinite(z["params"]))


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "algo, world_size, signalled",
    [
        ("sync", 2, 1),  # the ring: rank 0 hears it from its neighbour
        ("pipe", 3, 0),  # the ring, with the AllReduce on a thread of its own
        ("ps-sync", 1, 1),  # the star: the server hears it from its worker
        ("ps-sync", 1, 0),  # the star: the worker hears it from the server
    ],
)
def test_a_joined_rank_stopped_by_a_signal_first_stops_the_others_too(
    algo, world_size, signalled, tmp_path
):
    """The ranks of a joined job are signalled by their launcher, one after another, and on a
    busy machine one may stop before another has even received its signal. Here only one rank
    is signalled: it tells its peers it stopped (not failed) as it leaves, and every other rank
    stops with the signal's code and its one line, instead of taking the close for a crash."""
    out = tmp_path / f"joined-{algo}-{signalled}"
    procs = _start_joined(out, algo, world_size)
    try:
        _wait_for_checkpoint(out, procs[0])  # training has begun on every rank
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        procs[signalled].send_signal(signal.SIGTERM)
        errs = [p.communicate(timeout=30)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
    for rank, (p, err) in enumerate(zip(procs, errs, strict=True)):
        lines = err.strip().splitlines()
        assert p.returncode == 143 and len(lines) == 1, f"rank {rank}: rc {p.returncode}\n{err}"
        assert "stopped by SIGTERM" in lines[0] and f"(rank {rank})" in lines[0], lines[0]
        assert "closed the connection" not in err and "crashed" not in err, err


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_job_without_steps_ends_at_once_on_a_signal(tmp_path):
    """A benchmark's workers have no step to finish: a signal ends them at once."""
    marker = str(tmp_path / "bench.json")
    argv = [sys.executable, "-m", "pipesgd_ref", "bench", "allreduce", "--world-size=2",
            "--sizes=16MB", "--reps=100000", "--no-gloo", f"--json={marker}"]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while len(_job_pids(marker)) < 3:  # the launcher and its two ranks
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - sent
        assert _gone_within(marker, 5.0) is not None
    finally:
        _kill_job(marker)
    assert proc.returncode == 130 and err.strip() == "pipesgd: stopped by SIGINT", err
    assert took < 5, f"took {took:.1f} s"


def test_max_restarts_is_refused_in_a_joined_rank(monkeypatch, capsys):
    for var, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "29999"}.items():  # fmt: skip
        monkeypatch.setenv(var, value)
    assert main(["train", "--preset=tiny", "--world-size=2", "--max-restarts=1"]) == 2
    err = capsys.readouterr().err
    assert "--max-restarts 1" in err and "torchrun" in err and len(err.splitlines()) == 1


def test_a_rank_killed_while_holding_the_plans_lock_does_not_stall_the_others():
    ctx = mp.get_context("fork")
    plan = StopPlan(ctx, 2)
    holder = ctx.Process(target=_take_the_lock_and_die, args=(plan,))
    holder.start()
    holder.join(timeout=30)
    t0 = time.monotonic()
    assert plan.entering(0, 0)  # after the wait, without the lock
    assert 0.5 < time.monotonic() - t0 < 10


def _take_the_lock_and_die(plan):
    plan._lock.acquire()
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_signal_inside_entering_does_not_deadlock_the_worker():
    """The worker's handler asks for the stop from a thread of its own: a handler that took
    the plan's lock itself would wait forever when the signal lands inside `entering`."""
    from pipesgd_ref.runtime import lifetime

    plan = StopPlan(mp.get_context("fork"), 1)
    old = {sig: signal.getsignal(sig) for sig in lifetime.STOP_SIGNALS}
    try:
        lifetime.worker_signals(plan)
        with plan._locked():  # as if the signal came while entering() held the lock
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)  # the handler has run by now, in this thread
        deadline = time.monotonic() + 10
        while plan.stop_at is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert plan.stop_at == 0 and plan.signum == signal.SIGTERM
        assert not plan.entering(0, 0)
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        lifetime.set_plan(lifetime._NeverStop())
