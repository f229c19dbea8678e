"""Start a job of p local worker processes (`launch_local`), supervise it, and leave nothing
behind.

The launcher picks a free port and a random job token, starts p worker processes (spawn by
default: a worker must never inherit a CUDA context or a half-initialised thread from the
launcher), and each joins the job through the rendezvous on 127.0.0.1. The launcher never
touches the GPU. A rank of a job that another launcher started (torchrun, mpirun, srun) joins
through runtime/jobenv.py instead.

Failure handling: if a worker fails, the launcher reports every failed rank's error, headed by
the rank they point to, gives the others `grace` seconds to notice on their own (no longer when
all that is left is stopped or blamed by the others), then stops whatever is left: no orphan
processes. Signals (lifetime.py): SIGINT, SIGTERM and SIGHUP stop every worker before one
common step; a worker never outlives its launcher, a SIGKILLed one included.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import multiprocessing as mp
import os
import queue as queue_mod
import signal
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any

from pipesgd_ref.comm.netem import LinkSpec
from pipesgd_ref.comm.rendezvous import JobSpec, init_process_group, new_token
from pipesgd_ref.errors import (
    CommError,
    ConfigError,
    DataError,
    JobError,
    JobStopped,
    LaunchError,
    WorkerFailed,
    error_text,
)
from pipesgd_ref.logs import WorkerLogging
from pipesgd_ref.runtime.janitor import Janitor
from pipesgd_ref.runtime.jobenv import pin_to_core
from pipesgd_ref.runtime.lifetime import (
    EXIT_ORPHANED,
    LauncherSignals,
    StopPlan,
    bind_to_parent,
    worker_signals,
)

log = logging.getLogger("pipesgd.launch")


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


def _worker_main(
    spec: JobSpec,
    target,
    args,
    results,
    logging_setup,
    pin: bool,
    star: bool,
    plan: StopPlan,
    parent: int,
    grace: float,
    store_sock: socket.socket,
) -> None:
    # First: a signal from now on asks the job to stop (no KeyboardInterrupt traceback), and
    # this process never outlives the launcher (lifetime.py).
    worker_signals(plan, spec.rank)
    work_done = bind_to_parent(parent, grace, lambda: plan.request(signal.SIGTERM))
    logging_setup.worker_init(spec.rank)
    store: socket.socket | None = store_sock
    if spec.rank != 0:  # a forked worker's copy of the store's listener: rank 0's alone
        store_sock.close()
        store = None
    if pin:
        pin_to_core(spec.rank)
    comm = None
    try:
        comm = init_process_group(spec, star=star, store_sock=store)
        value = target(comm, *args)
        results.put(("ok", spec.rank, value))
    except (CommError, JobError, ConfigError, DataError) as e:  # ours say what happened and
        # what to do (a ConfigError or DataError: found where only a worker could find it)
        # and whom they blame: a communication error names the peer at fault (None: unknown);
        # any other error of ours is this rank's own (a bad gradient, a diverged run)
        origin = getattr(e, "origin", None) if isinstance(e, CommError) else spec.rank
        results.put(("error", spec.rank, (error_text(e), origin)))
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
    sp.add_argument(
        "--allow-many-workers",
        action="store_true",
        help=f"start more local workers than {local_worker_limit()} (this machine's "
        f"bound; also {ALLOW_MANY_ENV}=1)",
    )


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
    link: LinkSpec | None = None,
    job_timeout: float | None = None,
    grace: float | None = None,
    log_level: str | int | None = None,
    pin_cores: bool = True,
    star: bool = False,
    stop_grace: float = STOP_GRACE_S,
    transport: str = "tcp",
    allreduce: str = "ring",
) -> list[Any]:
    """Run `target(comm, *args)` in `world_size` local worker processes; return the p results
    in rank order. `target` must be a module-level function (spawn pickles it by name).

    timeout: the communication timeout inside each worker. job_timeout: the whole job's limit
    (default: none). grace: how long survivors of a failure get to exit on their own (default
    2 x timeout) before they are stopped. pin_cores: bind rank r to core r mod the number of
    cores (as `mpirun --bind-to core` does), so ring neighbours land on different cores and
    no rank migrates between them (benchmarks/RESULTS.md has the measured gain). star: the
    parameter server's links too. transport, allreduce: as JobSpec's (comm/rendezvous.py).

    Signals (lifetime.py): a SIGINT, SIGTERM or SIGHUP to this process, or to any worker,
    stops every worker after one common step; JobStopped is raised, with the results when
    every rank returned one (and the worker that received the signal, if one did). Workers
    still running `stop_grace` seconds later, or at a second signal, are SIGKILLed.
    """
    if world_size < 1:
        raise LaunchError(f"world_size must be >= 1, got {world_size}")
    ctx = mp.get_context(start_method)
    store = hold_store_port(master_port)  # in use: one line here, before any worker starts
    port = store.getsockname()[1]
    spec = JobSpec(
        rank=0,
        world_size=world_size,
        master_port=port,
        token=new_token(),
        timeout=timeout,
        link=link or LinkSpec(),
        transport=transport,
        allreduce=allreduce,
    )
    if log_level is None:  # the workers log at the level the parent's "pipesgd" logger has
        log_level = logging.getLogger("pipesgd").getEffectiveLevel()
    logging_setup = WorkerLogging.start(start_method, log_level)
    results = ctx.Queue()
    plan = StopPlan(ctx, world_size)
    # every worker gets the same arguments but its own rank: _worker_main(spec_r, *shared)
    shared = (target, args, results, logging_setup, pin_cores, star, plan, os.getpid(), stop_grace)
    procs = _workers(ctx, spec, shared, store)
    values: dict[int, Any] = {}
    errors: dict[int, str] = {}
    blamed: dict[int, int | None] = {}  # failed rank -> the rank its error points to
    grace = 2 * timeout if grace is None else grace
    try:  # before any worker starts: the signals, and the janitor (ends them if we're SIGKILLed)
        with Janitor.start() as janitor, LauncherSignals(plan, stop_grace) as signals:
            _supervise(
                procs,
                results,
                world_size,
                values,
                errors,
                blamed,
                signals,
                grace,
                job_timeout,
                (store, janitor),
            )
    finally:
        store.close()  # rank 0 has its own copy (or never started)
        logging_setup.stop()
    stop = (signals.signum, plan.stop_at, signals.by_rank)
    _raise_unless_done(world_size, values, errors, blamed, stop)
    return [values[r] for r in range(world_size)]


def _workers(ctx, spec: JobSpec, shared: tuple, store: socket.socket) -> list:
    """The worker processes, not started: rank r runs _worker_main(spec of rank r, *shared,
    store), and rank 0 serves the store on that listener (the others close their copies: a
    forked worker has one whether it is handed over or not)."""
    return [
        ctx.Process(
            target=_worker_main,
            args=(dataclasses.replace(spec, rank=r), *shared, store),
            name=f"pipesgd-rank{r}",
            daemon=True,
        )
        for r in range(spec.world_size)
    ]


def hold_store_port(master_port: int | None) -> socket.socket:
    """The rendezvous store's listener on 127.0.0.1:master_port (None or 0: a free port the OS
    picks), bound here and handed to rank 0: a port checked free and bound later by rank 0 could
    be taken in between by another job started at the same moment. A port something listens on
    is refused in one line (LaunchError)."""
    sock = socket.socket()
    # As comm/sockets.listen binds: a port whose only users are the closed connections of an
    # earlier job (TIME_WAIT, ~60 s) is free to reuse; one that something listens on is not.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", master_port or 0))
        sock.listen(128)
    except OSError:
        sock.close()
        raise LaunchError(
            f"port {master_port} on 127.0.0.1 is in use (another job, or an earlier one still "
            f"running?); choose another --master-port, or leave it out to pick a free one"
        ) from None
    return sock


def _raise_unless_done(world_size: int, values: dict, errors: dict, blamed: dict, stop) -> None:
    """The end of a job that did not simply succeed: JobStopped after a stop signal to the
    launcher or to any worker (with every rank's result when all returned one; errors while
    stopping are only logged), else WorkerFailed naming every failed rank, headed by the rank
    their errors point to. `stop`: (signal or 0, the first step not run, the worker that
    received the signal or None)."""
    signum, stop_at, by_rank = stop
    if signum:  # stopped on purpose: not a failure, whatever the ranks said
        done = len(values) == world_size and not errors
        if errors:
            last = [f"rank {r}: {m.strip().splitlines()[-1]}" for r, m in sorted(errors.items())]
            log.warning("while stopping: %s", "; ".join(last))
        results = [values[r] for r in range(world_size)] if done else None
        raise JobStopped(signum, results, stop_at, by_rank)
    if errors:
        lines = [f"  rank {r}: {msg.strip()}" for r, msg in sorted(errors.items())]
        cause = culprit(blamed)
        head = f"{len(errors)} of {world_size} workers failed"
        if cause is not None:
            head += f"; the errors point to rank {cause}"
        raise WorkerFailed(errors, f"{head}:\n" + "\n".join(lines), cause)


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
    keep: tuple[socket.socket, Janitor],
) -> None:
    """Start the workers, collect their results and errors, and leave no process behind: the
    loop of launch_local, filling `values` (rank -> result), `errors` and `blamed`. `keep`:
    the launcher's copy of rank 0's store listener, closed once rank 0 has its own, and the
    janitor told of every worker (it ends them should the launcher die by SIGKILL)."""
    store, janitor = keep
    deadline = time.monotonic() + job_timeout if job_timeout else None
    first_failure: float | None = None
    last_report = 0.0  # when the last failure was reported
    try:
        for proc in procs:
            proc.start()
            janitor.watch(proc.pid)
        store.close()
        while len(values) + len(errors) < world_size:
            now = time.monotonic()
            if signals.urgent:  # a second signal, or the grace is over: stop what is left
                break
            if deadline and now > deadline:
                errors.setdefault(-1, f"the job did not finish within {job_timeout:.1f} s")
                break
            if first_failure is not None and now > first_failure + grace:
                break
            if (
                first_failure is not None
                and now > last_report + REPORT_QUIET_S
                and _nothing_to_wait_for(procs, values, errors, blamed)
            ):
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
                log.warning(
                    "rank %d (pid %d) outlived SIGKILL by %.0f s; it is left behind",
                    r,
                    proc.pid,
                    KILL_WAIT_S,
                )
        results.close()
