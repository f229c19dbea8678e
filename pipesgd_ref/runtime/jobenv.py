"""One rank of a job that another launcher started: which rank this process is, where the job
meets, and the share of the host's cores it takes.

From the environment (`detect_env`), so the same command runs under the launchers people use:

    torchrun / by hand   RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    mpirun (Open MPI)    OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE
    mpirun (MPICH, Intel MPI: Hydra)   PMI_RANK, PMI_SIZE
    srun (SLURM)         SLURM_PROCID, SLURM_NTASKS

MASTER_ADDR and MASTER_PORT say where rank 0's rendezvous store listens, and must be set (a
default would only leave every rank on another host waiting for a store that is not there);
under mpirun pass them with `-x MASTER_ADDR=... -x MASTER_PORT=...`. Under torchrun
itself, whose agent keeps its own store on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True), the
store listens on MASTER_PORT + 1; PIPESGD_MASTER_PORT, when set, overrides the port everywhere.
The job token comes from PIPESGD_JOB_TOKEN, a secret every rank must have (the launcher or the
batch script exports it); without it, ranks derive one from MASTER_ADDR and MASTER_PORT that
anyone can compute (what each protects against: comm/rendezvous.py's docstring).
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass

from pipesgd_ref.comm.netem import LinkSpec
from pipesgd_ref.comm.rendezvous import JobSpec, init_process_group
from pipesgd_ref.errors import LaunchError

# (rank variable, world-size variable, launcher name), in the order they are looked for.
ENV_CONVENTIONS = (
    ("RANK", "WORLD_SIZE", "torchrun"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI"),
    ("PMI_RANK", "PMI_SIZE", "MPICH/Hydra"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM"),
)


@dataclass(frozen=True)
class JobEnv:
    rank: int
    world_size: int
    master_addr: str
    master_port: int
    token: str
    source: str  # which launcher's variables were found


def detect_env(environ: Mapping[str, str] | None = None) -> JobEnv | None:
    """The job this process belongs to, from the environment; None when none is described.

    MASTER_ADDR and MASTER_PORT (or PIPESGD_MASTER_PORT) must be set whenever a rank is: as
    torch's env:// says "MASTER_ADDR expected, but not set", since a default (127.0.0.1:29500)
    would only make every rank on another host wait out the timeout for a store that is not
    there. LaunchError names what is missing or wrong."""
    env = os.environ if environ is None else environ
    for rank_var, size_var, source in ENV_CONVENTIONS:
        if rank_var in env or size_var in env:
            if rank_var not in env or size_var not in env:
                absent = size_var if rank_var in env else rank_var
                raise LaunchError(
                    f"{source} job: {absent} is not set (need both {rank_var} and {size_var})"
                )
            try:
                rank, world_size = int(env[rank_var]), int(env[size_var])
            except ValueError:
                raise LaunchError(
                    f"{source} job: {rank_var}={env[rank_var]!r} and {size_var}="
                    f"{env[size_var]!r} must be integers"
                ) from None
            if world_size < 1:
                raise LaunchError(
                    f"{source} job: {size_var}={world_size}, but the world size must be at "
                    f"least 1 (the number of ranks in the job)"
                )
            if not 0 <= rank < world_size:
                raise LaunchError(f"{source} job: rank {rank} is outside 0..{world_size - 1}")
            port_var = "PIPESGD_MASTER_PORT" if "PIPESGD_MASTER_PORT" in env else "MASTER_PORT"
            try:
                port = int(env.get(port_var, "0"))
            except ValueError:
                port = -1
            if port_var in env and not 0 < port < 65536:
                raise LaunchError(
                    f"{port_var}={env[port_var]!r} is not a port (1..65535)"
                ) from None
            missing = [var for var in ("MASTER_ADDR", port_var) if not env.get(var)]
            if missing:
                how = {
                    "Open MPI": "pass them with mpirun -x MASTER_ADDR=HOST -x MASTER_PORT=PORT",
                    "SLURM": "export them in the batch script (MASTER_ADDR: the first host of "
                    "$SLURM_JOB_NODELIST)",
                }.get(source, "export them on every rank")
                raise LaunchError(
                    f"{source} job: {' and '.join(missing)} expected, but not set: where rank "
                    f"0's rendezvous store listens, the same on every rank (MASTER_ADDR: rank "
                    f"0's host, MASTER_PORT: a free port there); {how}"
                )
            addr = env["MASTER_ADDR"]
            check_master_addr(addr)
            if port_var == "MASTER_PORT" and env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
                # Under torchrun, its own agent's store already listens on MASTER_PORT.
                port = port + 1 if port < 65535 else port - 1
            token = env.get("PIPESGD_JOB_TOKEN") or _default_token(addr, port)
            return JobEnv(rank, world_size, addr, port, token, source)
    return None


def check_master_addr(addr: str) -> None:
    """Refuse an IPv6 MASTER_ADDR in one line (LaunchError): the rendezvous and the data links
    listen on IPv4 (comm/sockets.py), so ranks would wait out the timeout for a store that
    never listens where they look."""
    if ":" in addr.strip("[]"):
        raise LaunchError(
            f"MASTER_ADDR={addr!r} is an IPv6 address, and pipesgd's rendezvous listens on IPv4 "
            f"only; use an IPv4 address of rank 0's host (127.0.0.1 for one host)"
        )


def default_bind(master_addr: str) -> str:
    """Where this rank's listeners bind when --bind is not given: the loopback address that
    MASTER_ADDR is (127.0.0.1 for `localhost`; 127.0.0.2 or 127.0.1.1 stay on that address),
    where every rank must be on this host anyway; else all interfaces (0.0.0.0), where ranks of
    other hosts reach it. A host name is not resolved here: a name that /etc/hosts maps to a
    loopback address on rank 0's host may name its network address on the others."""
    if master_addr == "localhost":
        return "127.0.0.1"
    try:
        return master_addr if ipaddress.ip_address(master_addr).is_loopback else "0.0.0.0"
    except ValueError:  # a host name
        return "0.0.0.0"


def _default_token(addr: str, port: int) -> str:
    """Without PIPESGD_JOB_TOKEN every rank derives the same token from the store's address:
    it keeps two jobs on different addresses or ports apart and turns away programs that are
    not pipesgd, but anyone can compute it: it keeps no hostile process out."""
    return hashlib.sha256(f"pipesgd:{addr}:{port}".encode()).hexdigest()[:32]


def pin_to_core(rank: int) -> int | None:
    """Bind this process to one CPU core, rank r to the r-th allowed core (mod their count),
    so ring neighbours land on different cores and no rank migrates between them; returns the
    core, or None where the OS has no affinity call (macOS)."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    core = cores[rank % len(cores)]
    os.sched_setaffinity(0, {core})
    limit_blas_threads(1)  # one core, one BLAS thread: more would only take turns on it
    return core


def limit_blas_threads(threads: int) -> bool:
    """Cap this process's BLAS threads; False where threadpoolctl (which comes with
    scikit-learn) is missing, and BLAS decides."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return False
    threadpool_limits(threads)
    return True


def join_from_env(
    timeout: float = 30.0,
    bind: str | None = None,
    link: LinkSpec | None = None,
    star: bool = False,
    transport: str = "auto",
    allreduce: str = "ring",
    options: dict | None = None,
):
    """Join the job the environment describes (see detect_env); returns the Communicator.

    bind: the interface for this rank's listeners (default: `default_bind`). star: also link
    every rank to rank 0, as the parameter server methods need (`comm.server`,
    `comm.clients`); every rank of the job must agree. transport, allreduce: JobSpec's (auto:
    shared memory between ranks on one host, tcp across; the AllReduce algorithm). options:
    what else every rank must give alike (JobSpec.options: compared by the store).
    """
    job = detect_env()
    if job is None:
        raise LaunchError(
            "no job in the environment: set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (or run "
            "under mpirun or srun)"
        )
    host = bind or default_bind(job.master_addr)
    spec = JobSpec(
        job.rank,
        job.world_size,
        job.master_addr,
        job.master_port,
        job.token,
        bind=host,
        timeout=timeout,
        link=link or LinkSpec(),
        transport=transport,
        allreduce=allreduce,
        options=options or {},
    )
    share_cores(local_ranks())
    return init_process_group(spec, star=star)


# As each launcher says it (torchrun, Open MPI, MPICH/Hydra, SLURM): how many ranks of the job
# run on this host, and this process's rank among them (GPUs are numbered from 0 on every host).
LOCAL_SIZE_VARS = (
    "LOCAL_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MPI_LOCALNRANKS",
    "SLURM_NTASKS_PER_NODE",
)


LOCAL_RANK_VARS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")


def _first_count(names: tuple[str, ...], least: int, environ) -> int | None:
    """The first of the variables `names` that holds a whole number >= least (SLURM may write
    "2(x3)": the part before the bracket), else None."""
    env = os.environ if environ is None else environ
    for name in names:
        try:
            n = int(env.get(name, "").split("(")[0])
        except ValueError:
            continue
        if n >= least:
            return n
    return None


def local_ranks(environ: Mapping[str, str] | None = None) -> int | None:
    """How many ranks of the job run on this host, where the launcher says (else None)."""
    return _first_count(LOCAL_SIZE_VARS, 1, environ)


def local_rank(rank: int, environ: Mapping[str, str] | None = None) -> int:
    """This process's rank among the job's ranks on its host, where the launcher says; else
    `rank` (local workers all run on this host)."""
    found = _first_count(LOCAL_RANK_VARS, 0, environ)
    return rank if found is None else found


def share_cores(n_local: int | None) -> int | None:
    """Give this rank's BLAS its share of the host's cores: cores // n_local threads (at least
    one). Ranks that share a host each starting one BLAS thread per core would take turns on
    every core, and a step would take a hundred times longer (benchmarks/RESULTS.md). Returns
    the thread count set, or None where n_local is unknown (then set OMP_NUM_THREADS yourself)."""
    if not n_local:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = max(1, (cores or 1) // n_local)
    return threads if limit_blas_threads(threads) else None
