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

MASTER_ADDR and MASTER_PORT (default 127.0.0.1 and 29500) say where rank 0's rendezvous store
listens; under mpirun pass them with `-x MASTER_ADDR=... -x MASTER_PORT=...`. The job token comes
from PIPESGD_JOB_TOKEN; every rank must have the same one.

Failure handling: if a worker fails, the launcher reports every failed rank's error (the first
one is usually the cause), gives the others `grace` seconds to notice on their own, then stops
whatever is left: no orphan processes.
"""

from __future__ import annotations

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
from pipesgd_ref.comm.transport import CommError
from pipesgd_ref.logs import WorkerLogging

log = logging.getLogger("pipesgd.launch")

# (rank variable, world-size variable, launcher name), in the order they are looked for.
ENV_CONVENTIONS = (
    ("RANK", "WORLD_SIZE", "torchrun"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI"),
    ("PMI_RANK", "PMI_SIZE", "MPICH/Hydra"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM"),
)


class JobError(RuntimeError):
    """An error inside a worker whose message says it all (no traceback is shown)."""


class LaunchError(RuntimeError):
    """The job's environment is inconsistent, or workers failed; the message says which."""


@dataclass(frozen=True)
class JobEnv:
    rank: int
    world_size: int
    master_addr: str
    master_port: int
    token: str
    source: str  # which launcher's variables were found


def detect_env(environ: Mapping[str, str] | None = None) -> JobEnv | None:
    """The job this process belongs to, from the environment; None when none is described."""
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
            if world_size < 1 or not 0 <= rank < world_size:
                raise LaunchError(f"{source} job: rank {rank} is outside 0..{world_size - 1}")
            addr = env.get("MASTER_ADDR", "127.0.0.1")
            try:
                port = int(env.get("MASTER_PORT", "29500"))
            except ValueError:
                port = -1
            if not 0 < port < 65536:
                raise LaunchError(
                    f"MASTER_PORT={env['MASTER_PORT']!r} is not a port (1..65535)"
                ) from None
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


class WorkerFailed(LaunchError):
    """One or more workers failed; `errors` maps rank -> its error text."""

    def __init__(self, errors: dict[int, str], summary: str):
        super().__init__(summary)
        self.errors = errors


def pin_to_core(rank: int) -> int | None:
    """Bind this process to one CPU core, rank r to the r-th allowed core (mod their count),
    so ring neighbours land on different cores and no rank migrates between them; returns the
    core, or None where the OS has no affinity call (macOS)."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    core = cores[rank % len(cores)]
    os.sched_setaffinity(0, {core})
    try:  # one core, one BLAS thread: more would only take turns on it
        from threadpoolctl import threadpool_limits

        threadpool_limits(1)
    except ImportError:  # threadpoolctl comes with scikit-learn; without it, BLAS decides
        pass
    return core


def _worker_main(
    spec: JobSpec, target, args, results, logging_setup, pin: bool, star: bool
) -> None:
    logging_setup.worker_init(spec.rank)
    if pin:
        pin_to_core(spec.rank)
    comm = None
    try:
        comm = init_process_group(spec, star=star)
        value = target(comm, *args)
        results.put(("ok", spec.rank, value))
    except (CommError, JobError) as e:  # our own errors say what happened and what to do
        results.put(("error", spec.rank, str(e)))
        raise SystemExit(1) from None
    except BaseException:
        results.put(("error", spec.rank, traceback.format_exc()))
        raise SystemExit(1) from None
    finally:
        if comm is not None:
            comm.close()


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
) -> list[Any]:
    """Run `target(comm, *args)` in `world_size` local worker processes; return the p results
    in rank order. `target` must be a module-level function (spawn pickles it by name).

    timeout: the communication timeout inside each worker. job_timeout: the whole job's limit
    (default: none). grace: how long survivors of a failure get to exit on their own (default
    2 x timeout) before they are stopped. pin_cores: bind rank r to core r mod the number of
    cores (as `mpirun --bind-to core` does); on the 2-core development machine this made a
    4-rank 16 MB AllReduce about 10% faster (median of 25, three alternations). star: also
    link every rank to rank 0 (the parameter server's links: `comm.server`, `comm.clients`).
    """
    if world_size < 1:
        raise LaunchError(f"world_size must be >= 1, got {world_size}")
    ctx = mp.get_context(start_method)
    if master_port:  # fail here, in one line, rather than in every worker
        try:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", master_port))
        except OSError:
            raise LaunchError(
                f"port {master_port} on 127.0.0.1 is in use (another job, or an earlier one still "
                f"running?); choose another --master-port, or leave it out to pick a free one"
            ) from None
    port = master_port or free_port()
    spec = JobSpec(rank=0, world_size=world_size, master_port=port, token=new_token(),
                   timeout=timeout, model=model or LinkModel())  # fmt: skip
    if log_level is None:  # the workers log at the level the parent's "pipesgd" logger has
        log_level = logging.getLogger("pipesgd").getEffectiveLevel()
    logging_setup = WorkerLogging.start(start_method, log_level)
    results = ctx.Queue()
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
            ),  # fmt: skip
            name=f"pipesgd-rank{r}",
            daemon=True,
        )
        for r in range(world_size)
    ]
    values: dict[int, Any] = {}
    errors: dict[int, str] = {}
    grace = 2 * timeout if grace is None else grace
    deadline = time.monotonic() + job_timeout if job_timeout else None
    first_failure: float | None = None
    try:
        for proc in procs:
            proc.start()
        while len(values) + len(errors) < world_size:
            now = time.monotonic()
            if deadline and now > deadline:
                errors.setdefault(-1, f"the job did not finish within {job_timeout:.1f} s")
                break
            if first_failure is not None and now > first_failure + grace:
                break
            try:
                status, rank, value = results.get(timeout=0.1)
            except queue_mod.Empty:
                for r, proc in enumerate(procs):  # died without a word (SIGKILL, segfault)
                    if proc.exitcode not in (None, 0) and r not in errors and r not in values:
                        errors[r] = f"rank {r} died with exit code {proc.exitcode}"
                        first_failure = first_failure or time.monotonic()
                continue
            if status == "ok":
                values[rank] = value
            else:
                errors[rank] = value
                first_failure = first_failure or time.monotonic()
    finally:
        for proc in procs:
            proc.join(timeout=0.5 if errors else 5.0)
        for r, proc in enumerate(procs):  # nothing is left behind
            if proc.is_alive():
                if r not in values and r not in errors:
                    errors[r] = (
                        f"rank {r} never reported (hung or stopped); the launcher stopped it"
                    )
                proc.terminate()
                try:  # a stopped process acts on SIGTERM only once woken
                    os.kill(proc.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                proc.join(timeout=2.0)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=2.0)
        results.close()
        logging_setup.stop()
    if errors:
        lines = [f"  rank {r}: {msg.strip()}" for r, msg in sorted(errors.items())]
        raise WorkerFailed(
            errors, f"{len(errors)} of {world_size} workers failed:\n" + "\n".join(lines)
        )
    return [values[r] for r in range(world_size)]


def join_from_env(timeout: float = 30.0, bind: str | None = None, model: LinkModel | None = None):
    """Join the job the environment describes (see detect_env); returns the Communicator."""
    job = detect_env()
    if job is None:
        raise LaunchError(
            "no job in the environment: set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (or run "
            "under mpirun or srun)"
        )
    host = bind or ("127.0.0.1" if job.master_addr in ("127.0.0.1", "localhost") else "0.0.0.0")
    spec = JobSpec(job.rank, job.world_size, job.master_addr, job.master_port, job.token,
                   bind=host, timeout=timeout, model=model or LinkModel())  # fmt: skip
    return init_process_group(spec)
