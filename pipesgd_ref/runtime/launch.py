"""Start a job: p local worker processes, or one rank of a job described by the environment.

Local (`launch_local`): the launcher picks a free port and a random job token, starts p worker
processes (spawn by default: a worker must never inherit a CUDA context or a half-initialised
thread from the launcher), and each joins the job through the rendezvous on 127.0.0.1. The
launcher never touches the GPU.

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
The job token comes from PIPESGD_JOB_TOKEN; every rank must have the same one.

Failure handling: if a worker fails, the launcher reports every failed rank's error, headed by
the rank they point to, gives the others `grace` seconds to notice on their own (no longer when
all that is left is stopped or blamed by the others), then stops whatever is left: no orphan
processes. Signals (lifetime.py): SIGINT, SIGTERM and SIGHUP stop every worker before one
common step; a worker never outlives its launcher, a SIGKILLed one included.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import logging
import multiprocessing as mp
import os
import queue as queue_mod
import signal
import socket
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pipesgd_ref.comm.netem import LinkModel
from pipesgd_ref.comm.rendezvous import JobSpec, init_process_group, new_token
from pipesgd_ref.errors import (
    CommError,
    ConfigError,
    DataError,
    JobError,
    JobStopped,
    LaunchError,
    WorkerFailed,
)
from pipesgd_ref.logs import WorkerLogging
from pipesgd_ref.runtime.lifetime import (
    EXIT_ORPHANED,
    LauncherSignals,
    StopPlan,
    bind_to_parent,
    worker_signals,
)

log = logging.getLogger("pipesgd.launch")

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
                missing = size_var if rank_var in env else rank_var
                raise LaunchError(f"{source} job: {missing} is not set (need both {rank_var} "
                                  f"and {size_var})")  # fmt: skip
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
            if port_var == "MASTER_PORT" and env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
                # Under torchrun, its own agent's store already listens on MASTER_PORT.
                port = port + 1 if port < 65535 else port - 1
            token = env.get("PIPESGD_JOB_TOKEN") or _default_token(addr, port)
            return JobEnv(rank, world_size, addr, port, token, source)
    return None


def _default_token(addr: str, port: int) -> str:
    """Without PIPESGD_JOB_TOKEN every rank derives the same token from the store's address:
    it keeps two jobs on different ports apart, not a hostile process out."""
    return hashlib.sha256(f"pipesgd:{addr}:{port}".encode()).hexdigest()[:32]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# After a failure, a rank that still runs but cannot exit on its own (see _nothing_to_wait_for)
# is stopped once no other failure has been reported for this long.
REPORT_QUIET_S = 0.5
KILL_WAIT_S = 10.0  # how long a SIGKILLed worker is waited for before the launcher gives up
STOP_GRACE_S = 30.0  # after a stop signal: how long workers get to finish their step


def culprit(blamed: dict[int, int | None]) -> int | None:
    """The rank that the failed ranks' errors point to most often (ties: the lowest rank)."""
    votes = [r for r in blamed.values() if r is not None and r >= 0]
    if not votes:
        return None
    return min(set(votes), key=lambda r: (-votes.count(r), r))


def _nothing_to_wait_for(procs, values: dict, errors: dict, blamed: dict) -> bool:
    """After a failure: whether every rank still running is one that cannot exit on its own,
    being stopped (SIGSTOP) or being the rank the others' errors blame (hung, stuck): the
    launcher then stops them at once instead of waiting out the grace period."""
    accused = {r for r in blamed.values() if r is not None}
    left = [(r, p) for r, p in enumerate(procs) if r not in values and r not in errors]
    return bool(left) and all(r in accused or _state(p.pid) in ("T", "t") for r, p in left)


def _state(pid: int | None) -> str:
    """A process's state letter from /proc (R, S, T...); "" where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


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


def _worker_main(
    spec: JobSpec, target, args, results, logging_setup, pin: bool, star: bool, plan: StopPlan,
    parent: int, grace: float,
) -> None:  # fmt: skip
    # First: a signal from now on asks the job to stop (no KeyboardInterrupt traceback), and
    # this process never outlives the launcher (lifetime.py).
    worker_signals(plan)
    work_done = bind_to_parent(parent, grace, lambda: plan.request(signal.SIGTERM))
    logging_setup.worker_init(spec.rank)
    if pin:
        pin_to_core(spec.rank)
    comm = None
    try:
        comm = init_process_group(spec, star=star)
        value = target(comm, *args)
        results.put(("ok", spec.rank, value))
    except (CommError, JobError, ConfigError, DataError) as e:  # ours say what happened and
        # what to do (a ConfigError or DataError: found where only a worker could find it)
        # and whom they blame: a communication error names the peer at fault (None: unknown);
        # any other error of ours is this rank's own (a bad gradient, a diverged run)
        origin = getattr(e, "origin", None) if isinstance(e, CommError) else spec.rank
        results.put(("error", spec.rank, (str(e), origin)))
        raise SystemExit(1) from None
    except BaseException:
        results.put(("error", spec.rank, (traceback.format_exc(), spec.rank)))
        raise SystemExit(1) from None
    finally:
        if comm is not None:
            comm.close()
        work_done.set()  # an orphan may exit now (lifetime.bind_to_parent)
        if os.getppid() != parent:  # the launcher is gone: nobody reads the results, and
            # exiting as usual would wait for them to be read
            os._exit(EXIT_ORPHANED)


# --- how many local processes one command may start -------------------------------------------

ALLOW_MANY_ENV = "PIPESGD_ALLOW_MANY_WORKERS"  # =1: the same as --allow-many-workers


def add_many_workers_flag(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--allow-many-workers", action="store_true",
                    help=f"start more local workers than {local_worker_limit()} (this machine's "
                    f"bound; also {ALLOW_MANY_ENV}=1)")  # fmt: skip


def local_worker_limit() -> int:
    """The most worker processes one command starts on this machine without
    --allow-many-workers: max(64, 16 per core). Beyond it a typo (--world-size 100000) would
    start processes until the machine gives out, long before the first step."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(64, 16 * cores)


def check_local_workers(n: int, allow: bool, what: str) -> None:
    """ConfigError when `n` local processes exceed local_worker_limit() and nothing allows it."""
    limit = local_worker_limit()
    if n > limit and not (allow or os.environ.get(ALLOW_MANY_ENV, "") not in ("", "0")):
        raise ConfigError(
            f"{what} would start {n} processes on this machine, more than {limit} (16 per core, "
            f"at least 64); lower --world-size, or pass --allow-many-workers to start them anyway"
        )


def launch_local(
    world_size: int,
    target: Callable[..., Any],
    args: tuple = (),
    *,
    start_method: str = "spawn",
    master_port: int | None = None,
    timeout: float = 30.0,
    model: LinkModel | None = None,
    job_timeout: float | None = None,
    grace: float | None = None,
    log_level: str | int | None = None,
    pin_cores: bool = True,
    star: bool = False,
    stop_grace: float = STOP_GRACE_S,
    transport: str = "tcp",
) -> list[Any]:
    """Run `target(comm, *args)` in `world_size` local worker processes; return the p results
    in rank order. `target` must be a module-level function (spawn pickles it by name).

    timeout: the communication timeout inside each worker. job_timeout: the whole job's limit
    (default: none). grace: how long survivors of a failure get to exit on their own (default
    2 x timeout) before they are stopped. pin_cores: bind rank r to core r mod the number of
    cores (as `mpirun --bind-to core` does); on the 2-core development machine this made a
    4-rank 16 MB AllReduce about 10% faster (median of 25, three alternations). star: also
    link every rank to rank 0 (the parameter server's links: `comm.server`, `comm.clients`).
    transport: tcp, unix, shm or auto, the data links' transport (comm/rendezvous.py).

    Signals (lifetime.py): a SIGINT, SIGTERM or SIGHUP to this process (or to the workers)
    stops every worker after one common step; JobStopped is raised, with the results when
    every rank returned one. Workers still running `stop_grace` seconds later, or at a second
    signal, are SIGKILLed.
    """
    if world_size < 1:
        raise LaunchError(f"world_size must be >= 1, got {world_size}")
    ctx = mp.get_context(start_method)
    if master_port:  # fail here, in one line, rather than in every worker
        try:
            with socket.socket() as probe:
                # As the store binds (rendezvous.listen): a port whose only users are the
                # closed connections of an earlier job (TIME_WAIT, ~60 s) is free to reuse;
                # one that something listens on is refused all the same.
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(("127.0.0.1", master_port))
        except OSError:
            raise LaunchError(
                f"port {master_port} on 127.0.0.1 is in use (another job, or an earlier one still "
                f"running?); choose another --master-port, or leave it out to pick a free one"
            ) from None
    port = master_port or free_port()
    spec = JobSpec(rank=0, world_size=world_size, master_port=port, token=new_token(),
                   timeout=timeout, model=model or LinkModel(), transport=transport)  # fmt: skip
    if log_level is None:  # the workers log at the level the parent's "pipesgd" logger has
        log_level = logging.getLogger("pipesgd").getEffectiveLevel()
    logging_setup = WorkerLogging.start(start_method, log_level)
    results = ctx.Queue()
    plan = StopPlan(ctx, world_size)
    procs = [
        ctx.Process(
            target=_worker_main,
            args=(
                dataclasses.replace(spec, rank=r),
                target,
                args,
                results,
                logging_setup,
                pin_cores,
                star,
                plan,
                os.getpid(),
                stop_grace,
            ),  # fmt: skip
            name=f"pipesgd-rank{r}",
            daemon=True,
        )
        for r in range(world_size)
    ]
    values: dict[int, Any] = {}
    errors: dict[int, str] = {}
    blamed: dict[int, int | None] = {}  # failed rank -> the rank its error points to
    grace = 2 * timeout if grace is None else grace
    try:
        with LauncherSignals(plan, stop_grace) as signals:  # before any worker starts
            _supervise(procs, results, world_size, values, errors, blamed, signals, grace,
                       job_timeout)  # fmt: skip
    finally:
        logging_setup.stop()
    if signals.signum:  # stopped on purpose: not a failure, whatever the ranks said
        done = len(values) == world_size and not errors
        if errors:
            log.warning(
                "while stopping: %s",
                "; ".join(
                    f"rank {r}: {msg.strip().splitlines()[-1]}" for r, msg in sorted(errors.items())
                ),
            )
        raise JobStopped(signals.signum, [values[r] for r in range(world_size)] if done else None,
                         plan.stop_at)  # fmt: skip
    if errors:
        lines = [f"  rank {r}: {msg.strip()}" for r, msg in sorted(errors.items())]
        cause = culprit(blamed)
        head = f"{len(errors)} of {world_size} workers failed"
        if cause is not None:
            head += f"; the errors point to rank {cause}"
        raise WorkerFailed(errors, f"{head}:\n" + "\n".join(lines), cause)
    return [values[r] for r in range(world_size)]


def _supervise(
    procs,
    results,
    world_size: int,
    values: dict,
    errors: dict,
    blamed: dict,
    signals: LauncherSignals,
    grace: float,
    job_timeout: float | None,
) -> None:
    """Start the workers, collect their results and errors, and leave no process behind: the
    loop of launch_local, filling `values` (rank -> result), `errors` and `blamed`."""
    deadline = time.monotonic() + job_timeout if job_timeout else None
    first_failure: float | None = None
    last_report = 0.0  # when the last failure was reported
    try:
        for proc in procs:
            proc.start()
        while len(values) + len(errors) < world_size:
            now = time.monotonic()
            if signals.urgent:  # a second signal, or the grace is over: stop what is left
                break
            if deadline and now > deadline:
                errors.setdefault(-1, f"the job did not finish within {job_timeout:.1f} s")
                break
            if first_failure is not None and now > first_failure + grace:
                break
            if (first_failure is not None and now > last_report + REPORT_QUIET_S
                    and _nothing_to_wait_for(procs, values, errors, blamed)):  # fmt: skip
                break
            try:
                status, rank, value = results.get(timeout=0.1)
            except queue_mod.Empty:
                for r, proc in enumerate(procs):  # died without a word (SIGKILL, segfault)
                    if proc.exitcode not in (None, 0) and r not in errors and r not in values:
                        errors[r] = f"rank {r} died with exit code {proc.exitcode}"
                        blamed[r] = r
                        last_report = time.monotonic()
                        first_failure = first_failure or time.monotonic()
                continue
            if status == "ok":
                values[rank] = value
            else:
                errors[rank], blamed[rank] = value
                first_failure = first_failure or time.monotonic()
                last_report = time.monotonic()
    finally:
        for proc in procs:
            proc.join(timeout=0 if signals.urgent else 0.5 if errors else 5.0)
        for r, proc in enumerate(procs):  # nothing is left behind
            if proc.is_alive() and r not in values and r not in errors and not signals.signum:
                errors[r] = f"rank {r} never reported (hung or stopped); the launcher stopped it"
                blamed[r] = r
            # SIGKILL, not SIGTERM: a worker takes SIGTERM as "stop after this step"
            # (lifetime.py); SIGKILL cannot be refused, only delayed (a loaded kernel), and
            # ends a SIGSTOPped process too.
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=KILL_WAIT_S)
            if proc.is_alive():
                log.warning("rank %d (pid %d) outlived SIGKILL by %.0f s; it is left behind",
                            r, proc.pid, KILL_WAIT_S)  # fmt: skip
        results.close()


def join_from_env(
    timeout: float = 30.0,
    bind: str | None = None,
    model: LinkModel | None = None,
    star: bool = False,
    transport: str = "tcp",
):
    """Join the job the environment describes (see detect_env); returns the Communicator.

    bind: the interface for this rank's listeners (default: loopback when MASTER_ADDR is
    loopback, else all interfaces). star: also link every rank to rank 0, as the parameter
    server methods need (`comm.server`, `comm.clients`); every rank of the job must agree.
    """
    job = detect_env()
    if job is None:
        raise LaunchError(
            "no job in the environment: set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (or run "
            "under mpirun or srun)"
        )
    host = bind or ("127.0.0.1" if job.master_addr in ("127.0.0.1", "localhost") else "0.0.0.0")
    spec = JobSpec(job.rank, job.world_size, job.master_addr, job.master_port, job.token,
                   bind=host, timeout=timeout, model=model or LinkModel(),
                   transport=transport)  # fmt: skip
    share_cores(local_ranks())
    return init_process_group(spec, star=star)


# As each launcher says it (torchrun, Open MPI, MPICH/Hydra, SLURM): how many ranks of the job
# run on this host, and this process's rank among them (GPUs are numbered from 0 on every host).
LOCAL_SIZE_VARS = ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                   "SLURM_NTASKS_PER_NODE")  # fmt: skip
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
