"""Fault injection: make one rank fail in a chosen way at a chosen step, to test what the others do.

Driven by the environment, so a test can start an ordinary `pipesgd train` and break it from
inside, deterministically (an outside `kill` would race the run):

    PIPESGD_FAULT="ACTION@RANK:STEP[,ACTION@RANK:STEP ...]"

Process faults, at `at_step` (after rank RANK computed its gradient of step STEP; for a
parameter server, rank 0, when it applies update STEP):

    kill        SIGKILL itself: a crash with no goodbye (the kernel closes its sockets); as
                PID 1 of a PID namespace, whose own SIGKILL the kernel ignores, os._exit
                with status 137 (128 + SIGKILL) instead: as abrupt, no cleanup runs
    stop        SIGSTOP itself: a hung process whose sockets stay open, silent; as PID 1,
                whose own SIGSTOP the kernel ignores too, it freezes instead (`freeze`): no
                Python thread of it runs again, its sockets stay open and silent
    nan, inf    write NaN (or +Inf) into its gradient: a numerical fault

Wire faults, armed at `at_step` and acted out by the transport on the next frame with a payload
that this process sends (`sabotage`, called from transport.Link.send), whichever thread sends it:

    garbage     48 random bytes instead of that frame, then carry on
    truncate    the frame's header and half its payload, then silence: the sending thread
                stays stuck (up to STUCK_SECONDS) with the socket open
    close       the header and half the payload, then the socket reset and the process gone
                (exit status 3): a crash in the middle of a frame

Wire faults need frames: a job whose AllReduce goes through one host's shared-memory group
(comm/shm_group.py; --transport auto or shm with --allreduce auto, oneshot or twoshot) puts
none on its links, so `refuse_without_frames` (Worker.average, before the first AllReduce)
stops it with a ConfigError naming the fault and the fix, rather than inject nothing.

Nothing here runs unless PIPESGD_FAULT is set; a malformed value is an error at once, so a test
cannot silently inject nothing.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import struct
import time
from dataclasses import dataclass

import numpy as np

from pipesgd_ref.errors import ConfigError

ENV = "PIPESGD_FAULT"
PROCESS_ACTIONS = ("kill", "stop", "nan", "inf")
WIRE_ACTIONS = ("garbage", "truncate", "close")
CLOSE_EXIT_STATUS = 3
ANNOUNCE = "pipesgd fault injection:"
KILL_EXIT_STATUS = 128 + signal.SIGKILL  # kill as PID 1: what a shell reports for SIGKILL


@dataclass(frozen=True)
class Fault:
    action: str
    rank: int
    step: int


def parse(spec: str) -> list[Fault]:
    """The faults of a PIPESGD_FAULT value; ValueError naming what is wrong."""
    faults = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        try:
            action, where = item.split("@")
            rank, step = (int(x) for x in where.split(":"))
        except ValueError:
            raise ValueError(f"{ENV}: {item!r} is not ACTION@RANK:STEP (e.g. kill@2:10)") from None
        if action not in PROCESS_ACTIONS + WIRE_ACTIONS:
            raise ValueError(
                f"{ENV}: unknown action {action!r}; one of "
                f"{', '.join(PROCESS_ACTIONS + WIRE_ACTIONS)}"
            )
        if rank < 0 or step < 0:
            raise ValueError(f"{ENV}: rank and step must be >= 0 in {item!r}")
        faults.append(Fault(action, rank, step))
    return faults


def check(
    n_ranks: int, steps: int | None = None, ps_async: bool = False, environ=None, server=""
) -> None:
    """Refuse a PIPESGD_FAULT that would inject nothing in a job of `n_ranks` ranks running
    `steps` steps (None: not known yet): a rank outside the job, a step the run never reaches
    (ps-async's server, rank 0, counts updates: `steps` x its workers), or a gradient fault
    for a parameter server (`server`: the method's name when rank 0 is one), which computes
    no gradient. ValueError naming the fault; the CLI calls this before any worker starts."""
    spec = (os.environ if environ is None else environ).get(ENV, "")
    for f in parse(spec):
        if server and f.rank == 0 and f.action in ("nan", "inf"):
            raise ValueError(
                f"{ENV}: {f.action}@0:{f.step} writes into a gradient, and rank 0 of --algo "
                f"{server} is the parameter server, which computes none; name a worker "
                f"(rank 1..{n_ranks - 1}), e.g. {f.action}@1:{f.step}"
            )
        if f.rank >= n_ranks:
            raise ValueError(
                f"{ENV}: {f.action}@{f.rank}:{f.step} names rank {f.rank}, but the job has ranks "
                f"0..{n_ranks - 1}; it would never fire"
            )
        last = None if steps is None else steps * (n_ranks - 1 if ps_async and f.rank == 0 else 1)
        if last is not None and f.step >= last:
            raise ValueError(
                f"{ENV}: {f.action}@{f.rank}:{f.step} is at step {f.step}, but the run has steps "
                f"0..{last - 1}; it would never fire"
            )


_PLAN: dict[str, list[Fault]] = {}


def planned(environ=None) -> list[Fault]:
    """This process's faults (parsed once; empty without PIPESGD_FAULT)."""
    spec = (os.environ if environ is None else environ).get(ENV, "")
    if spec not in _PLAN:
        _PLAN[spec] = parse(spec)
    return _PLAN[spec]


def _due(rank: int, step: int, actions: tuple[str, ...]) -> list[str]:
    return [f.action for f in planned() if (f.rank, f.step) == (rank, step) and f.action in actions]


def at_step(rank: int, step: int, grads: np.ndarray | None = None) -> None:
    """Faults planned for (rank, step): called by every training loop each step (after the
    gradient is computed). Process faults happen now; wire faults are armed."""
    if not planned():  # the usual case: one dictionary lookup a step
        return
    for action in _due(rank, step, PROCESS_ACTIONS):
        announce(action, rank, step)
        if action == "kill":
            kill_self()
        elif action == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
            if os.getpid() == 1:  # ignored there, as kill's SIGKILL is: freeze instead
                freeze()
        elif grads is not None and grads.size:
            grads[grads.size // 2] = np.nan if action == "nan" else np.inf
    for action in _due(rank, step, WIRE_ACTIONS):
        announce(action, rank, step)
        ARMED.append(action)


def kill_self() -> None:
    """SIGKILL this process. PID 1 of a PID namespace (a container's entry point, `unshare
    --pid --fork`) cannot: the kernel drops the signals its init sends itself that it has no
    handler for, SIGKILL included, and the run would go on. There, os._exit(137) ends it as
    abruptly (no cleanup, no goodbye on its sockets, which the kernel closes)."""
    os.kill(os.getpid(), signal.SIGKILL)
    os._exit(KILL_EXIT_STATUS)  # reached only where the signal was ignored (PID 1)


def freeze() -> None:
    """stop for a process that SIGSTOP cannot stop (PID 1 of a PID namespace): never return,
    and let no other Python thread run, so nothing more leaves its sockets (no heartbeat from
    a sending thread). pause() called through ctypes.PyDLL keeps the interpreter lock (PyDLL
    calls do not release it), with every signal blocked in this thread: what ends a stopped
    process, SIGKILL (from outside the namespace, as for a container), ends this one."""
    signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    pause = ctypes.PyDLL(None).pause
    while True:
        pause()


def refuse_without_frames(comm) -> None:
    """ConfigError when a wire fault is planned and `comm`'s AllReduce goes through one host's
    shared-memory group (comm.group), which puts no frame on a link for the fault to act on.
    Every rank raises it (the plan is the job's), so the job stops at once, in one story. (A
    local `pipesgd train` refuses it before any worker starts: `wire_fault_refusal`.)"""
    if getattr(comm, "group", None) is not None:
        why = wire_fault_refusal()
        if why:
            raise ConfigError(why)


def wire_fault_refusal() -> str | None:
    """Why the planned wire fault cannot act in a job whose AllReduce goes through one host's
    shared-memory group, or None when no wire fault is planned."""
    wire = [f for f in planned() if f.action in WIRE_ACTIONS]
    if not wire:
        return None
    f = wire[0]
    return (
        f"{ENV}: {f.action}@{f.rank}:{f.step} acts on a frame sent on a link, but this "
        f"job's AllReduce goes through one host's shared-memory group, which sends none; "
        f"it would inject nothing. Run it with --allreduce ring (or rd, rab) or "
        f"--transport tcp"
    )


def announce(action: str, rank: int, step: int) -> None:
    """One line on this process's stderr, straight to the file descriptor (it may be the last
    thing it does): what is injected, and when (time.time()), for the tests to time detection."""
    os.write(2, f"{ANNOUNCE} {action} at rank {rank} step {step} time {time.time():.6f}\n".encode())


ARMED: list[str] = []  # wire faults waiting for this process's next data frame
STUCK_SECONDS = 600.0


def sabotage(link, header: bytes, payload: memoryview, on_socket: bool = True) -> bool:
    """Called by Link.send when ARMED: act out the first armed wire fault on this frame.
    True when the frame must not be sent as usual. `on_socket` False: the payload would have
    gone through a shared-memory slot (comm/shm.py), whose header is sent only once the slot
    is full, so a truncated frame or a crash in the middle of one puts nothing on the socket."""
    if not len(payload):  # heartbeats and empty frames: wait for one with data
        return False
    action = ARMED.pop(0)
    if action == "garbage":
        link.sock.sendall(os.urandom(len(header)))
        return True
    if on_socket:
        link.sock.sendall(header)
        link.sock.sendall(payload[: max(1, len(payload) // 2)])
    if action == "close":
        # A reset, not a clean close: what the peers of a crashed process see.
        link.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        link.sock.close()
        os._exit(CLOSE_EXIT_STATUS)
    deadline = time.monotonic() + STUCK_SECONDS  # truncate: a sender that never finishes
    while time.monotonic() < deadline:
        time.sleep(0.1)
    return True
