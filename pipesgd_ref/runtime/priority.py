"""The CPU priority of a worker's computation (--comm-first): a thread that computes yields its
core at once to any thread that communicates.

Used by runtime/worker.py around each forward and backward pass."""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager

_PRIORITY = {"toggle": hasattr(os, "SCHED_IDLE")}  # per process: can we switch back and forth?


@contextmanager
def compute_priority(low: bool):
    """Run the body at the lowest CPU priority (SCHED_IDLE) when `low` (--comm-first).

    Why: p workers on fewer than p cores take turns, and a ring hop (or a parameter server's
    reply) that wakes up would wait up to a scheduler slice (of the order of a millisecond)
    for some worker's computation to yield its core; a pipelined AllReduce pays that at every
    one of its 2(p-1) hops, so an iteration grows by up to 2(p-1) slices (the measured share
    is in benchmarks/RESULTS.md, --comm-first). A SCHED_IDLE thread is preempted at
    once by any normal one, and such threads share the cores fairly among themselves, so the
    computations still take turns as before. Linux only; elsewhere, or where the OS refuses,
    nothing changes. An unprivileged thread may not return from SCHED_IDLE (RLIMIT_NICE): it
    then stays at the low priority, which only the thread's own communication notices.
    """
    if not (low and _PRIORITY["toggle"]):
        yield
        return
    tid = threading.get_native_id()
    try:
        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
    except OSError:
        _PRIORITY["toggle"] = False
        yield
        return
    try:
        yield
    finally:
        try:
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
        except OSError:  # not permitted: stay low, and stop switching
            _PRIORITY["toggle"] = False
