"""The processes a test started, read from /proc: which are still there, and stopping them.

A test that starts a job (a launcher and its ranks, mpirun, torchrun) must show that nothing it
started outlives it, and must stop what does. Each process's /proc/PID/stat gives its state,
parent, process group and session; a job started in a session of its own is found by that
session, even the ranks that a launcher put in groups of their own. Linux only: where there is
no /proc, `processes()` finds none, so the checks built on it find nothing left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class Process:
    """One process as /proc/PID/stat tells it (the fields after the command name)."""

    pid: int
    state: str  # R running, S sleeping, T stopped, Z zombie (exited, not yet waited for)...
    parent: int
    group: int
    session: int

    @property
    def alive(self) -> bool:
        return self.state != "Z"

    def cmdline(self) -> str | None:
        """Its command line, arguments joined by spaces; None when it is gone."""
        try:
            raw = (PROC / str(self.pid) / "cmdline").read_bytes()
        except OSError:
            return None
        return raw.replace(b"\0", b" ").decode(errors="replace").strip()

    def cwd(self) -> str | None:
        """Its working folder; None when it is gone (or not ours to read)."""
        try:
            return os.readlink(PROC / str(self.pid) / "cwd")
        except OSError:
            return None

    def exe(self) -> str | None:
        """The program it runs; None when it is gone (or a kernel thread)."""
        try:
            return os.readlink(PROC / str(self.pid) / "exe")
        except OSError:
            return None


def process(pid: int | str) -> Process | None:
    """The process `pid`, or None when it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # "pid (command) state parent group session ...": the command may hold spaces and ")".
    fields = text.rsplit(")", 1)[1].split()
    if len(fields) < 4:
        return None
    return Process(int(pid), fields[0], int(fields[1]), int(fields[2]), int(fields[3]))


def processes() -> list[Process]:
    """Every process there is now, this one included (those that exit meanwhile are left out);
    none where there is no /proc."""
    if not PROC.is_dir():
        return []
    found = (process(entry) for entry in os.listdir(PROC) if entry.isdigit())
    return [p for p in found if p is not None]


def in_session(sid: int) -> list[int]:
    """The processes of session `sid`, zombies included: Linux never hands a session's id to a
    new process while a member of that session is alive."""
    return [p.pid for p in processes() if p.session == sid]


def kill(pids) -> None:
    """SIGKILL each pid; one that is gone (or not ours) is passed over."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def signal_group(pgid: int, sig: int) -> None:
    """Send `sig` to process group `pgid`, if it is still there."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_sessions(procs: list[subprocess.Popen], grace_s: float = 5.0) -> None:
    """Stop what is still running of each process's session (each started with
    start_new_session=True): SIGTERM to its group first (mpirun and torchrun then stop their
    ranks), SIGKILL `grace_s` later to whatever is left in the session, which is all that
    mpirun's ranks share with it (each rank has a process group of its own)."""
    alive = [p for p in procs if p.poll() is None]
    for p in alive:
        signal_group(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in alive:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in procs:
        kill(in_session(p.pid))  # the process itself while it runs, and what it left
        if p.poll() is None:  # where there is no /proc
            p.kill()
        p.wait(timeout=10)
