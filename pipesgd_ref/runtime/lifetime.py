"""A job's lifetime: stopping on a signal at one step on every rank, and workers that never
outlive their launcher.

What people send a running job, and what it does here (as torchrun and horovodrun do):

    SIGTERM (kill, scancel, a container stop, a CI timeout), SIGINT (Ctrl-C), SIGHUP
        the launcher asks every worker to stop (`StopPlan.request`); each finishes the step it
        is in, rank 0 writes a checkpoint when --out is set, and the job exits with 128 + the
        signal's number (130 for SIGINT, 143 for SIGTERM). Workers left after `grace`
        seconds, or at a second signal, are SIGKILLed.
    SIGKILL to the launcher
        cannot be caught; each worker asked the kernel for a SIGTERM when its parent dies
        (`bind_to_parent`, Linux's PR_SET_PDEATHSIG), stops as above and exits on its own,
        or is ended by its own watchdog `grace` seconds later. The launcher's janitor
        (runtime/janitor.py) sends every worker SIGTERM and SIGCONT too (a stopped one acts
        on no signal before it), and SIGKILLs what is left 2 s later: mpirun and its ranks
        as well, and it removes the job's temporary folders.

Stopping at one step. The ring methods cannot stop rank by rank: a rank that stopped after
step t while its neighbour began step t + 1 would leave the neighbour waiting for a chunk that
never comes. So the ranks agree on the first step nobody runs, `stop_at`, through a little
shared memory (`StopPlan`): every training loop calls `entering(rank, t)` at the top of each
step; under one lock, it records t as the rank's current step, or says "stop" once t >=
stop_at. A stop request sets, under the same lock,

    stop_at = 1 + max over ranks of the step each has entered

Every rank has entered at most that step, none stops before it, so each can finish it (the
AllReduce of a step needs every rank, and every rank does it), and no rank begins the next:
every rank ends having run steps start .. stop_at - 1, the same on all, whatever their skew.
The cost is one uncontended lock a step (about a microsecond). A parameter server's rank 0
takes part with its rounds (ps-sync); in ps-async, each worker runs up to stop_at and the
server counts its remaining pushes from that (`methods/ps.py` run_async).

A joined rank (torchrun, mpirun, srun, on several hosts) has no memory shared with the others:
its plan (`LocalStop`) stops it at the top of its next step, and its launcher signals every
rank. Rank 0 then checkpoints where it can; the last periodic checkpoint stands otherwise.
The launcher signals the ranks one by one, so one may stop before another has even received
its signal, and a peer still running would take its exit for a crash. So a rank that stops
on a signal tells its peers as it leaves (`stop_to_tell`, sent by comm/communicator.py's
close as ABORT news that says "stopped", not "failed"), and a rank that hears it stops as if
the signal had reached it too (`heard_stop`): every rank exits with the signal's code.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager

log = logging.getLogger("pipesgd.lifetime")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
NEVER = 1 << 62  # stop_at before any stop is asked for


class StopPlan:
    """The shared stop decision of one local job (see the module docstring): made in the
    launcher, handed to every worker process (it pickles for spawn, and forks)."""

    def __init__(self, ctx, world_size: int):
        self._lock = ctx.Lock()
        self._entered = ctx.Array("q", [-1] * world_size, lock=False)  # guarded by _lock
        self._stop_at = ctx.Value("q", NEVER, lock=False)
        self._signum = ctx.Value("i", 0, lock=False)
        self._by = ctx.Value("i", -1, lock=False)  # the rank that received it; -1 the launcher

    def entering(self, rank: int, step: int) -> bool:
        """At the top of `step` on `rank`: True to run it, False to stop before it."""
        with self._locked():
            if step >= self._stop_at.value:
                return False
            self._entered[rank] = step
            return True

    def request(self, signum: int = signal.SIGTERM, rank: int | None = None) -> int:
        """Ask every rank to stop after the step the furthest rank is in; returns stop_at.
        `rank`: the worker that received the signal (None: the launcher). A second request
        changes nothing."""
        with self._locked():
            if self._stop_at.value == NEVER:
                self._stop_at.value = max(self._entered) + 1
                self._signum.value = signum
                self._by.value = -1 if rank is None else rank
            return self._stop_at.value

    @property
    def stop_at(self) -> int | None:
        """The first step no rank runs, once a stop was asked for; else None."""
        value = self._stop_at.value
        return None if value == NEVER else value

    @property
    def started(self) -> bool:
        """Whether any rank has entered a step (a job that never does, a benchmark or a
        calibration, has no step to finish: stopping it means ending it)."""
        with self._locked():
            return max(self._entered) >= 0

    @property
    def signum(self) -> int:
        return self._signum.value

    @property
    def by_rank(self) -> int | None:
        """The worker whose signal asked for the stop; None when the launcher's did (or none)."""
        return self._by.value if self._signum.value and self._by.value >= 0 else None

    def stop_to_tell(self) -> None:
        """The ranks agreed on the step through the plan: none stops first, none is told."""
        return None

    @contextmanager
    def _locked(self):
        """The plan's lock, held for a few instructions. A rank SIGKILLed while it held it
        would leave it held: after LOCK_WAIT_S the others go on without it (the dead rank's
        closed connections then end the job as any death does)."""
        got = self._lock.acquire(timeout=LOCK_WAIT_S)
        try:
            yield
        finally:
            if got:
                self._lock.release()


LOCK_WAIT_S = 1.0


class LocalStop:
    """A joined rank's plan: no shared memory with the other ranks, so this rank stops at the
    top of its next step once asked."""

    def __init__(self):
        self._signum = 0
        self._stop_at: int | None = None
        self._current = -1

    def entering(self, rank: int, step: int) -> bool:
        if self._signum:
            self._stop_at = step if self._stop_at is None else self._stop_at
            return False
        self._current = step
        return True

    def request(self, signum: int = signal.SIGTERM, rank: int | None = None) -> int:
        self._signum = self._signum or signum
        return self._current + 1

    @property
    def stop_at(self) -> int | None:
        return self._stop_at if self._signum else None

    @property
    def signum(self) -> int:
        return self._signum

    def stop_to_tell(self) -> tuple[int, int | None] | None:
        """(signal, first step not run) once asked to stop: the others may still run."""
        return (self._signum, self.stop_at) if self._signum else None


class _NeverStop:
    """Outside a launched job (tests calling a worker function directly): never stop."""

    stop_at = None
    signum = 0

    def entering(self, rank: int, step: int) -> bool:
        return True

    def request(self, signum: int = signal.SIGTERM, rank: int | None = None) -> int:
        return NEVER

    def stop_to_tell(self) -> None:
        return None


_PLAN: StopPlan | LocalStop | _NeverStop = _NeverStop()


def set_plan(plan) -> None:
    """This process's stop plan (a worker's, set by the launcher's entry point)."""
    global _PLAN
    _PLAN = plan


def entering(rank: int, step: int) -> bool:
    """Called by every training loop at the top of each step: False means stop before it."""
    return _PLAN.entering(rank, step)


def stop_at() -> int | None:
    """The first step no rank runs, once this job was asked to stop; else None."""
    return _PLAN.stop_at


def stop_to_tell() -> tuple[int, int | None] | None:
    """(signal, first step not run, None when unknown) when this rank stops on a signal that
    the other ranks may not have received yet (a joined rank: `LocalStop`): what it tells its
    peers as it leaves, so that none takes its exit for a crash. None otherwise (no stop asked
    for, or a local job, whose ranks agree on the step through the shared plan)."""
    return _PLAN.stop_to_tell()


def heard_stop(signum: int) -> None:
    """A peer stopped on signal `signum` and said so (comm/links.py's read_abort): this rank
    stops as if the signal had reached it too, and exits with the signal's code."""
    _PLAN.request(signum)


def worker_signals(plan, rank: int | None = None) -> None:
    """In a worker: SIGINT, SIGTERM and SIGHUP ask the job to stop (a terminal's Ctrl-C
    reaches every process of its group: each then asks, and no worker prints a
    KeyboardInterrupt traceback). A signal sent to one worker alone (`kill PID`, an
    out-of-memory killer's SIGTERM) stops the whole job as one sent to the launcher does:
    the plan keeps `rank`, the worker that received it, for the job's last line."""
    set_plan(plan)
    asked = threading.Event()
    received: list[int] = []

    def on_signal(signum, frame):
        # Not plan.request here: a handler runs in the main thread between two bytecodes,
        # perhaps inside plan.entering, which holds the plan's lock; taking it again would
        # wait forever. A thread of its own asks instead.
        received.append(signum)
        asked.set()

    def ask():
        asked.wait()
        plan.request(received[0], rank)

    threading.Thread(target=ask, name="stop-request", daemon=True).start()
    for sig in STOP_SIGNALS:
        signal.signal(sig, on_signal)


PR_SET_PDEATHSIG = 1


def bind_to_parent(
    parent_pid: int, grace: float, on_orphan: Callable[[], object]
) -> threading.Event:
    """Make this worker stop when its launcher dies, even by SIGKILL; returns the event the
    worker sets once its work is done (all that is left is handing its result over).

    The kernel sends SIGTERM to this process when its parent thread dies (PR_SET_PDEATHSIG,
    Linux), which asks the job to stop (worker_signals). A thread also watches for a new
    parent process (POLL_S; where prctl is missing, macOS, it alone notices), calls
    `on_orphan`, and ends the process once the work is done, or `grace` seconds later: the
    result can no longer be handed over, and exiting as usual would wait for the launcher's
    queue to take it. (PR_SET_PDEATHSIG fires when the forking thread dies, while the rest
    of the launcher may still be dying: the parent process id then has not changed yet, so
    the worker cannot tell at that moment that it is orphaned; the watcher can, later.)"""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    except (OSError, AttributeError):
        pass

    done = threading.Event()

    def watch():
        while os.getppid() == parent_pid:
            time.sleep(POLL_S)
        log.warning(
            "the launcher (pid %d) is gone: stopping, then exiting within %.0f s", parent_pid, grace
        )
        on_orphan()
        done.wait(grace)
        os._exit(EXIT_ORPHANED)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    return done


POLL_S = 0.2
EXIT_ORPHANED = 128 + int(signal.SIGTERM)


class LauncherSignals:
    """The launcher's handlers for the job's lifetime: the first SIGINT, SIGTERM or SIGHUP asks
    every worker to stop (`plan.request`) and starts the grace period; a second one, the end
    of the grace, or a job with no step begun (nothing to finish) means stop now (`urgent`).
    A signal that reached one worker alone stops the job all the same: that worker asked the
    plan, and the launcher takes the plan's stop as its own (`signum`, `urgent`); a signal
    that then reaches the launcher is the first it received, not a second (a terminal's
    Ctrl-C reaches the launcher and its workers at once, in no set order).
    Installed only in the main thread (where Python delivers signals); restored on exit."""

    def __init__(self, plan, grace: float):
        self.plan = plan
        self.grace = grace
        self.received = 0  # the first signal the launcher itself received
        self.deadline: float | None = None
        self.hurry = False
        self._old: dict = {}

    def _on_signal(self, signum, frame):
        if self.received:
            self.hurry = True
            return
        self.received = signum
        self.plan.request(signum)
        self._stopping()

    def _stopping(self) -> None:
        """A stop was asked for: the grace period starts, and a job with no step begun ends
        now (no step to finish, nothing to save)."""
        if self.deadline is None:
            self.deadline = time.monotonic() + self.grace
        if not self.plan.started:
            self.hurry = True

    @property
    def signum(self) -> int:
        """The signal that stopped the job, whether the launcher or a worker received it (the
        plan keeps the first); 0 while none did."""
        return self.plan.signum or self.received

    @property
    def by_rank(self) -> int | None:
        """The worker that received the stopping signal; None when the launcher did, too (a
        Ctrl-C reaches every process of the group: a worker may ask first, but the job was
        not stopped through that worker alone)."""
        return None if self.received else self.plan.by_rank

    @property
    def urgent(self) -> bool:
        """Stop what is left now: a second signal, or the grace period is over."""
        if self.deadline is None and self.plan.signum:  # a worker's signal stopped the job
            self._stopping()
        return self.hurry or (self.deadline is not None and time.monotonic() > self.deadline)

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._old[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        return False
