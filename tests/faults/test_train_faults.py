"""Faults during training, for every method: what the surviving processes do, and how fast.

Each case starts an ordinary `pipesgd train` (a real job: local worker processes over TCP) with
PIPESGD_FAULT set (pipesgd_ref/runtime/faults.py), so that one rank fails in a chosen way at a
chosen step, and checks that:
- the job ends (every surviving process exits) within a stated bound after the fault;
- the error names the failed rank, and says what to do;
- no process of the job is left behind;
- for the methods that checkpoint, the last checkpoint written before the fault is intact and
  a resumed run from it ends with the same weights as a run that never failed.

The detection times (fault injected -> launcher exits) are printed; `pytest -s` shows them.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import numpy as np
import pytest
from procs import process, processes

from pipesgd_ref.commands.train import run_training
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.errors import WorkerFailed
from pipesgd_ref.runtime import faults

TIMEOUT = 2.0  # --timeout of every job here: how long a silent peer is waited for
STEPS = 14
FAULT_STEP = 5  # after the checkpoint of step 2 (every 3 steps: 2, 5, ...)
CHECKPOINT_EVERY = 3
# After the fault: a crash is seen at once (a closed connection); a silent rank after TIMEOUT
# on its neighbour, then the news goes round; the launcher gives survivors 2 x TIMEOUT to exit
# on their own before it stops them. Plus a loaded machine's slack.
BOUND_S = 3 * TIMEOUT + 4.0
ALGOS = ("sync", "pipe", "ps-sync", "ps-async")
RESUMABLE = ("sync", "pipe", "ps-sync")  # bitwise: a resumed run ends as an uninterrupted one


def session_processes() -> set[int]:
    """Live processes of this test's session that run this Python and are this test's: its
    descendants (the job's workers are forked from it), or orphans, re-parented out of the
    session (a worker that outlived its launcher). A shell or a sleep that something else
    started in the session is not one of them, nor another pytest run from a shell of the
    session (a stress run beside other work), nor that run's workers."""
    sid, me = os.getsid(0), os.getpid()
    python = process(me).exe()
    everyone = {p.pid: p for p in processes()}
    parent = {pid: p.parent for pid, p in everyone.items()}
    session = {pid: p.session for pid, p in everyone.items()}
    candidates = [
        p.pid
        for p in everyone.values()
        if p.pid != me and p.alive and p.session == sid and p.exe() == python
    ]

    def ours(pid: int) -> bool:
        if session.get(parent.get(pid), None) != sid:
            return True  # orphaned: its parent is gone from the session (init, a subreaper)
        while pid in parent and pid > 1:
            pid = parent[pid]
            if pid == me:
                return True
        return False

    return {pid for pid in candidates if ours(pid)}


def left_behind(before: set[int], wait_s: float = 5.0) -> str:
    """The processes of this session that were not there `before` and are still alive `wait_s`
    after the launcher returned, described one per line ("" when there are none). The wait
    lets a process the kernel is still tearing down finish; a hung one outlasts it."""
    end = time.monotonic() + wait_s
    while (left := session_processes() - before) and time.monotonic() < end:
        time.sleep(0.1)
    return describe(left) if left else ""


def describe(pids: set[int]) -> str:
    """One line per process: pid, parent, state, command line (for a failing assertion)."""
    lines = []
    for pid in sorted(pids):
        p = process(pid)
        cmd = p.cmdline() if p else None
        if p is None or cmd is None:
            lines.append(f"  {pid}: exited since")
            continue
        lines.append(f"  {pid}: parent {p.parent}, state {p.state}, {cmd[:200]}")
    return "\n".join(lines)


def config(algo: str, folder: Path, **more) -> TrainConfig:
    """The job of a case: over TCP unless `more` names another transport, and the ring (the
    faults injected on links' frames are these tests' subject; the default transport, auto,
    would take shared memory on one host, and the default AllReduce, auto, the shared-memory
    group there, which has no frames: tests/test_shm_group.py has its failures)."""
    return TrainConfig.preset("laptop").replace(
        algo=algo, steps=STEPS, timeout=TIMEOUT, out=str(folder),
        checkpoint_every=checkpoint_every(algo), eval_every=0,
        **{"transport": "tcp", "allreduce": "ring", **more},
    )  # fmt: skip


def checkpoint_every(algo: str) -> int:
    """ps-async checkpoints every round of p updates: its workers are not in lock step, so by a
    worker's step FAULT_STEP the server may have applied fewer than CHECKPOINT_EVERY rounds,
    but it has applied that worker's own FAULT_STEP pushes, more than one round's worth."""
    return 1 if algo == "ps-async" else CHECKPOINT_EVERY


def train(cfg: TrainConfig, fault: str | None, monkeypatch):
    """Run the job with PIPESGD_FAULT = `fault`; (the launcher's WorkerFailed or None, the
    time it returned)."""
    if fault:
        monkeypatch.setenv(faults.ENV, fault)
    else:
        monkeypatch.delenv(faults.ENV, raising=False)
    error = None
    try:
        run_training(cfg, progress=False, log=lambda line: None)
    except WorkerFailed as e:
        error = e
    return error, time.time()


def injected_at(stderr: str) -> float:
    """When the fault was injected (the faulty process announces it on stderr)."""
    match = re.search(re.escape(faults.ANNOUNCE) + r" \S+ at rank \d+ step \d+ time ([\d.]+)",
                      stderr)  # fmt: skip
    assert match, f"the fault was never injected:\n{stderr[-3000:]}"
    return float(match.group(1))


def final_weights(folder: Path) -> np.ndarray:
    with np.load(folder / "checkpoint.npz") as z:
        return z["params"].copy()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Each resumable method's final weights when nothing fails."""
    weights = {}
    with pytest.MonkeyPatch.context() as mp:
        for algo in RESUMABLE:
            folder = tmp_path_factory.mktemp(f"clean-{algo}")
            error, _ = train(config(algo, folder), None, mp)
            assert error is None, error
            weights[algo] = final_weights(folder)
    return weights


# (fault action, rank it hits: "worker" or "server", the words every error must contain)
CASES = [
    ("kill", "worker", "closed the connection"),
    ("stop", "worker", "alive"),
    ("close", "worker", "closed the connection"),
    ("garbage", "worker", "bad frame"),
    ("truncate", "worker", "no data from rank"),
    ("kill", "server", "closed the connection"),
    # The worker that cannot read the server's frame tells the server why before it exits;
    # the server passes that on, so every rank names rank 0, not the worker that left first.
    ("garbage", "server", "bad frame from rank 0"),
]


def _params(algo: str):
    for action, who, words in CASES:
        if who == "server" and not algo.startswith("ps"):
            continue
        yield pytest.param(algo, action, who, words, id=f"{algo}-{action}-{who}")


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("algo, action, who, words", [p for a in ALGOS for p in _params(a)])
def test_fault_ends_the_job_in_time_naming_the_rank(
    algo, action, who, words, tmp_path, uninterrupted, monkeypatch, capfd
):
    rank = 0 if who == "server" else 2  # ps: rank 0 is the server, rank 2 worker 1
    before = session_processes()
    error, end = train(config(algo, tmp_path), f"{action}@{rank}:{FAULT_STEP}", monkeypatch)
    stderr = capfd.readouterr().err
    assert error is not None, f"the job did not fail:\n{stderr[-3000:]}"
    detection = end - injected_at(stderr)
    with capfd.disabled():
        print(f"\n{algo:9s} {action:8s} rank {rank}: the job ended {detection:.2f} s after "
              f"the fault")  # fmt: skip
    assert detection < BOUND_S, f"took {detection:.1f} s > {BOUND_S} s:\n{error}"
    if action in ("kill", "close", "garbage"):  # no waiting on a timeout: seen at once
        assert detection < TIMEOUT, f"took {detection:.1f} s:\n{error}"
    # The launcher's report: the rank at fault first, then one line per failed rank.
    report = str(error)
    assert error.cause == rank, report
    assert f"the errors point to rank {rank}:" in report.splitlines()[0], report
    assert words in report, report
    left = left_behind(before)
    assert not left, f"processes of the job were left behind:\n{left}"
    # The last checkpoint before the fault is whole; resuming it (once per method, after a
    # crash) ends where a run that never failed ends, bitwise (ps-async: it finishes the run,
    # with each worker's remaining pushes; its arrival order, so its result, is its own).
    with np.load(tmp_path / "checkpoint.npz") as z:
        next_step = int(z["next_step"])
    assert next_step % checkpoint_every(algo) == 0 and 0 < next_step < STEPS
    if algo in RESUMABLE:  # lock step: nothing after the fault's step was completed
        assert next_step <= FAULT_STEP + 1
    if action == "kill":
        cfg = config(algo, tmp_path, resume=str(tmp_path))
        error, _ = train(cfg, None, monkeypatch)
        assert error is None, error
        if algo in RESUMABLE:
            np.testing.assert_array_equal(final_weights(tmp_path), uninterrupted[algo])
        else:
            with np.load(tmp_path / "checkpoint.npz") as z:
                assert int(z["next_step"]) == STEPS and np.all(np.isfinite(z["params"]))


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("algo", ["pipe", "ps-sync"])
@pytest.mark.parametrize("action, words", [(a, w) for a, who, w in CASES if who == "worker"])
def test_faults_on_shared_memory_end_the_job_naming_the_rank(
    algo, action, words, tmp_path, monkeypatch, capfd
):
    """The same faults with --transport shm: a crash closes the control socket (seen at once),
    a hung or truncated sender leaves a slot never filled (a timeout), garbage on the socket
    is a bad frame; the same bound, the same rank named, nothing left behind."""
    rank = 2
    before = session_processes()
    cfg = config(algo, tmp_path, transport="shm")
    error, end = train(cfg, f"{action}@{rank}:{FAULT_STEP}", monkeypatch)
    stderr = capfd.readouterr().err
    assert error is not None, f"the job did not fail:\n{stderr[-3000:]}"
    detection = end - injected_at(stderr)
    assert detection < BOUND_S, f"took {detection:.1f} s > {BOUND_S} s:\n{error}"
    if action in ("kill", "close", "garbage"):
        assert detection < TIMEOUT, f"took {detection:.1f} s:\n{error}"
    report = str(error)
    assert error.cause == rank, report
    assert words in report, report
    assert not left_behind(before)
