"""Nothing is left behind when the launcher dies by SIGKILL: within DEADLINE_S, no process it
started is alive in any state (a rank stopped by the `stop` fault included; a zombie counts as
gone), and no /tmp/pipesgd-* entry it made is left (runtime/janitor.py).

Each test starts a command in a session of its own, waits until its processes run (for the
`stop` fault: until a rank is stopped), records every descendant of the launcher, SIGKILLs the
launcher alone, and watches the recorded pids. Whatever happens, the session is SIGKILLed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from jobs import REPO, clean_env
from procs import kill, process, stop_sessions

from pipesgd_ref.comm.mpi import find_mpirun

DEADLINE_S = 5.0  # after the launcher's SIGKILL: everything it started is gone by then
START_S = 60.0  # how long the job may take to get going on a loaded machine
TMP = Path(tempfile.gettempdir())


def descendants(pid: int) -> set[int]:
    """Every descendant of `pid` now (/proc/PID/task/*/children, recursively)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        for children in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                kids = [int(k) for k in children.read_text().split()]
            except OSError:
                continue
            for kid in kids:
                if kid not in found:
                    found.add(kid)
                    todo.append(kid)
    return found


def alive(pids) -> list[int]:
    """Those of `pids` alive (a zombie is gone)."""
    return [p for p in pids if (proc := process(p)) is not None and proc.alive]


def ours() -> set[str]:
    return {p.name for p in TMP.glob("pipesgd-*")}


def kill_launcher_and_watch(argv, env, ready, what: str) -> None:
    """Start `argv`; once `ready(descendants)` holds, SIGKILL it alone and assert that within
    DEADLINE_S none of its descendants then is alive, and no new /tmp/pipesgd-* entry stays."""
    before = ours()
    proc = subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + START_S
        while not ready(descendants(proc.pid)):
            assert proc.poll() is None, f"{what}: the launcher exited ({proc.returncode}) early"
            assert time.monotonic() < deadline, f"{what}: not running after {START_S:.0f} s"
            time.sleep(0.1)
        seen = descendants(proc.pid)
        proc.kill()
        proc.wait()
        killed = time.monotonic()
        while (left := alive(seen)) or (ours() - before):
            seen |= {d for p in left for d in descendants(p)}
            waited = time.monotonic() - killed
            assert waited < DEADLINE_S, (
                f"{what}: {DEADLINE_S:.0f} s after the launcher's SIGKILL, still alive: "
                f"{[(p, process(p)) for p in left]}; left in /tmp: {sorted(ours() - before)}"
            )
            time.sleep(0.05)
        print(f"{what}: all {len(seen)} gone {time.monotonic() - killed:.2f} s after the SIGKILL")
    finally:
        kill(seen)
        stop_sessions([proc], grace_s=0.5)


def stopped_rank(pids) -> bool:
    """A rank is stopped (the `stop` fault)."""
    return any((p := process(pid)) is not None and p.state == "T" for pid in pids)


TRAIN = [sys.executable, "-m", "pipesgd_ref", "train", "--preset=tiny", "--world-size=2",
         "--steps=100000", "--no-progress"]  # fmt: skip


@pytest.mark.slow
def test_local_launch_with_a_stopped_rank(tmp_path):
    env = clean_env(PIPESGD_FAULT="stop@1:2")
    kill_launcher_and_watch(TRAIN + [f"--out={tmp_path}"], env, stopped_rank, "local launch")


needs_mpirun = pytest.mark.skipif(find_mpirun() is None, reason="no mpirun")


@pytest.mark.slow
@needs_mpirun
def test_comm_mpi_with_a_stopped_rank(tmp_path):
    env = clean_env(PIPESGD_FAULT="stop@1:2")
    argv = TRAIN + ["--comm=mpi", f"--out={tmp_path}"]
    kill_launcher_and_watch(argv, env, stopped_rank, "--comm mpi")


@pytest.mark.slow
@needs_mpirun
def test_bench_mpi_peers():
    argv = [sys.executable, "-m", "pipesgd_ref", "bench", "allreduce", "--peers", "mpi",
            "--world-size=2", "--reps=100000"]  # fmt: skip

    def ranks_running(pids) -> bool:  # mpirun and its two ranks, and the bench's own
        return sum("bench_mpi" in ((p := process(pid)) and p.cmdline() or "") for pid in pids) >= 2

    kill_launcher_and_watch(argv, clean_env(), ranks_running, "bench --peers mpi")


def test_no_janitor_left_after_a_normal_run():
    """The janitor of an ordinary launch_local exits with it (nothing waits for it later)."""
    from pipesgd_ref.runtime.janitor import Janitor

    with Janitor.start() as janitor:
        janitor.watch(os.getpid())
        pid = janitor.pid
    assert process(pid) is None
    os.kill(os.getpid(), 0)  # the launcher watched itself; the janitor left it alone
    assert signal.getsignal(signal.SIGTERM) is not None
