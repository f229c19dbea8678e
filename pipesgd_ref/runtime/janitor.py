"""What a launcher leaves behind when it is SIGKILLed, ended by a process of its own.

A launcher that dies by SIGKILL runs no clean-up. Its workers ask the kernel for a SIGTERM
when it dies (lifetime.bind_to_parent), but a stopped worker (SIGSTOP, state T) never acts on
it; mpirun asked for nothing and keeps its ranks training; and a temporary folder stays.

So a launcher starts a janitor first (`Janitor.start`): a small process that does nothing but
wait. The launcher tells it, over a pipe, the processes it starts (`watch`: a worker, mpirun)
and the paths it creates (`remove`). When the launcher ends as usual it says goodbye
(`close`) and the janitor exits untouched. When the launcher dies instead (the janitor's
parent changes; polled, since forked workers hold the pipe too and no end of file comes),
the janitor:

    1. takes every watched process and all its descendants (mpirun's ranks);
    2. sends each SIGTERM (a worker or a rank stops as on any stop signal) and SIGCONT
       (a stopped one acts on it, and on the SIGTERM its parent's death sent);
    3. SIGKILLs whatever is still alive `grace` seconds later;
    4. removes the watched paths, and exits.

A watched pid is known by its start time too: a pid that the kernel handed to another process
after the watched one exited is left alone. Linux (/proc); elsewhere only the watched pids are
signalled, not their descendants.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

GRACE_S = 2.0  # how long the left-behind processes get to stop on SIGTERM before SIGKILL
POLL_S = 0.1  # how often the janitor looks whether its launcher is still there
CLOSE_WAIT_S = 2.0  # how long `close` waits for the janitor to exit before SIGKILLing it


class Janitor:
    """The launcher's end of a janitor (see the module docstring). A context manager: `close`
    on the way out, whatever the way."""

    def __init__(self, proc: subprocess.Popen):
        self._proc = proc

    @property
    def pid(self) -> int:
        return self._proc.pid

    @classmethod
    def start(cls, grace: float = GRACE_S) -> Janitor:
        """Start the janitor of this process: a fresh Python (not a fork, whose command line
        would be the launcher's, and which would hold copies of its descriptors), reading
        its orders on its standard input."""
        root = str(Path(__file__).resolve().parent.parent.parent)  # the folder of pipesgd_ref
        path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
        argv = [sys.executable, "-m", __name__, str(os.getpid()), str(grace)]
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": path},
        )
        return cls(proc)

    def watch(self, pid: int) -> None:
        """End process `pid`, and its descendants, if the launcher dies."""
        self._say(f"pid {pid}")

    def remove(self, path: str) -> None:
        """Remove `path` (a file, or a folder and all it holds) if the launcher dies."""
        self._say(f"path {path}")

    def close(self) -> None:
        """The launcher ends as usual: the janitor exits, leaving everything alone."""
        if self._proc.stdin is None or self._proc.stdin.closed:
            return
        self._say("bye")
        try:
            self._proc.stdin.close()
        except OSError:
            pass
        try:
            self._proc.wait(timeout=CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def _say(self, line: str) -> None:
        if "\n" in line:
            raise ValueError(f"a janitor's message is one line: {line!r}")
        stdin = self._proc.stdin
        assert stdin is not None  # started with stdin=PIPE
        try:
            stdin.write((line + "\n").encode())
            stdin.flush()
        except (OSError, ValueError):  # the janitor is gone: nothing to tell
            pass

    def __enter__(self) -> Janitor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --- the janitor's side ------------------------------------------------------------------------


def _serve(fd: int, launcher: int, grace: float) -> None:
    """The janitor's life: read what to clean until the launcher says goodbye or dies."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # a Ctrl-C, a stop: the launcher's to act on
    _close_other_fds(fd)
    orders = _Orders(fd)
    while os.getppid() == launcher:
        if orders.read(POLL_S):
            return
    if orders.read(0):  # what the launcher said before it died
        return
    _clean(orders.watched, orders.paths, grace)


class _Orders:
    """What the launcher said: the pids to watch, the paths to remove, or goodbye."""

    def __init__(self, fd: int):
        self.fd = fd
        self.watched: dict[int, int | None] = {}  # pid -> its start time
        self.paths: list[str] = []
        self._pending = b""

    def read(self, timeout: float) -> bool:
        """Take what has come within `timeout` seconds; True on goodbye."""
        while self.fd >= 0 and select.select([self.fd], [], [], timeout)[0]:
            data = os.read(self.fd, 65536)
            if not data:  # every writer closed its end (forked workers may hold one)
                os.close(self.fd)
                self.fd = -1
                break
            *lines, self._pending = (self._pending + data).split(b"\n")
            for line in lines:
                what, _, arg = line.decode(errors="replace").partition(" ")
                if what == "bye":
                    return True
                if what == "pid":
                    self.watched[int(arg)] = _started(int(arg))
                elif what == "path":
                    self.paths.append(arg)
            timeout = 0
        if self.fd < 0:
            time.sleep(timeout)
        return False


def _close_other_fds(keep: int) -> None:
    """Close every inherited descriptor but `keep` and stdio: a listener, a queue's pipe or
    mpirun's output held here would keep them open for others waiting on their end."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 1024))
    for fd in fds:
        if fd > 2 and fd != keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _clean(watched: dict[int, int | None], paths: list[str], grace: float) -> None:
    """The launcher died: end what it left (SIGTERM and SIGCONT, SIGKILL after `grace`), then
    remove its paths."""
    left = _with_descendants(watched)
    for sig in (signal.SIGTERM, signal.SIGCONT):
        for pid in left:
            _signal(pid, sig)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        left = _with_descendants(left)
        if not left:
            break
        time.sleep(POLL_S)
    for _ in range(3):  # descendants a dying process may still have started meanwhile
        left = _with_descendants(left)
        for pid in left:
            _signal(pid, signal.SIGKILL)
        if not left:
            break
        time.sleep(POLL_S)
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            try:
                os.unlink(path)
            except OSError:
                pass


def _with_descendants(procs: dict[int, int | None]) -> dict[int, int | None]:
    """`procs` (pid -> start time) still alive as the same processes, with all their
    descendants alive now."""
    table = _process_table()
    found = {pid: start for pid, start in procs.items() if _same(pid, start, table)}
    todo = list(found)
    while todo:
        parent = todo.pop()
        for pid, (ppid, start, _state) in table.items():
            if ppid == parent and pid not in found:
                found[pid] = start
                todo.append(pid)
    return found


def _same(pid: int, start: int | None, table: dict) -> bool:
    """Whether `pid` is the live (not zombie) process that started at `start`."""
    if not table:  # no /proc: signal 0 says whether the pid exists
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True
    entry = table.get(pid)
    return entry is not None and entry[2] != "Z" and (start is None or entry[1] == start)


def _process_table() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent, start time, state) of every process, from /proc; {} without it."""
    table: dict[int, tuple[int, int, str]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return table
    for name in names:
        if name.isdigit():
            fields = _stat(int(name))
            if fields:
                table[int(name)] = (int(fields[1]), int(fields[19]), fields[0])
    return table


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first); None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields if len(fields) > 19 else None


def _started(pid: int) -> int | None:
    """Process `pid`'s start time (clock ticks after boot); None where unknown."""
    fields = _stat(pid)
    return int(fields[19]) if fields else None


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass


if __name__ == "__main__":  # Janitor.start: python -m pipesgd_ref.runtime.janitor LAUNCHER GRACE
    try:
        _serve(0, int(sys.argv[1]), float(sys.argv[2]))
    finally:
        os._exit(0)
