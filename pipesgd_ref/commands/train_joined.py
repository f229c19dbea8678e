"""`pipesgd train` as one rank of a job that torchrun, mpirun or srun started (on one host or
several): the environment says this rank's place, the ranks find each other (rendezvous on
MASTER_ADDR, or MPI), and each runs the same per-rank job as a local worker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from pipesgd_ref.comm.netem import link_of
from pipesgd_ref.commands.train import (
    check_device,
    check_inputs,
    describe,
    log_outcome,
    stopped_line,
)
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.errors import CommError, ConfigError, JobStopped, LaunchError
from pipesgd_ref.logs import tag_log_lines
from pipesgd_ref.methods.table import method
from pipesgd_ref.outputs import write_json
from pipesgd_ref.runtime.agreement import check_same_options, shared_options
from pipesgd_ref.runtime.job import build_worker, job_allreduce, n_ranks, train_job
from pipesgd_ref.runtime.jobenv import ENV_CONVENTIONS, detect_env, join_from_env
from pipesgd_ref.runtime.lifetime import LocalStop, worker_signals
from pipesgd_ref.runtime.summary import gather_for_summary, summary_of_gathered
from pipesgd_ref.trace import chrome_trace


def run_training_joined(
    cfg: TrainConfig,
    progress: bool = True,
    log: Callable[[str], None] = print,
    bind: str | None = None,
    mpi_comm=None,
):
    """Run cfg.algo as the one rank of a multi-host job that the environment describes
    (jobenv.detect_env: torchrun's, Open MPI's, MPICH's or SLURM's variables); every rank of
    the job runs this with the same config. Returns (summary, this rank's WorkerResult); the
    summary only on rank 0, None elsewhere.

    Each rank runs the same per-rank job as a local worker (`job.train_job`), so a joined run
    ends with the same weights as `run_training` of the same config: bitwise for sync, pipe
    and ps-sync. Rank 0 then writes --out: summary.json (same keys as a local run) from what it
    gathers from every rank without pickle (`summary.gather_for_summary`: ring AllReduces of
    float64 arrays), trace.json of rank 0's spans only (the others' stay on their hosts), and,
    for sync and pipe, checkpoint.npz as in a local run.

    Times: each rank measures from the moment the job formed (after the rendezvous, which
    every rank leaves within about a network round trip of the others), since the clocks of
    different hosts cannot be compared; wall_time_s counts training only, not process start.
    bind: the interface this rank's listeners use (default: loopback when MASTER_ADDR is
    loopback, else all interfaces). mpi_comm (--comm mpi): the MPI communicator whose ranks
    make the job (default MPI_COMM_WORLD; `pipesgd compare --comm mpi` runs the ring's
    methods on part of its world).
    """
    job = job_of(cfg, mpi_comm)
    # This rank's inputs and Worker, built once: its data and checkpoint are checked now (a bad
    # spec is one line on every rank, before any rank waits) and it trains in train_job.
    inputs = check_inputs(cfg)
    check_device(cfg)
    worker = build_worker(cfg, job.rank, inputs)
    link = link_of(cfg)
    # SIGINT, SIGTERM, SIGHUP: stop at the top of the next step (lifetime.LocalStop; the
    # launcher, torchrun, mpirun or srun, signals every rank). The ranks do not share memory
    # to agree on one step: a rank that stops first tells its peers so as it closes (they stop
    # with the signal's code too), and one that only sees a peer close after its own signal
    # takes that for the stop, not a failure. Rank 0 checkpoints where it can; else the last
    # periodic one stands.
    plan = LocalStop()
    worker_signals(plan)
    comm = join(cfg, link, bind, mpi_comm)
    try:
        tag_log_lines(comm.rank)
        if cfg.comm == "mpi":  # (the rendezvous store compared them on the other path)
            check_same_options(comm, cfg)  # every rank given the same run, or none trains
        t0 = time.perf_counter()  # "the job formed", on this rank's clock
        if comm.rank == 0:
            log(f"{describe(cfg, link)}; {joined_how(cfg, job)}")
        try:
            result = train_job(comm, cfg, progress, worker=worker)
        except CommError:
            if not plan.signum:  # else a peer that stopped first closed: that is the stop
                raise
        if plan.signum:  # the others may be gone: no gather, no summary
            stopped = JobStopped(plan.signum, None, plan.stop_at)
            line = stopped_line(cfg, stopped, None, local=False)
            stopped.args = (f"{line} (rank {comm.rank})",)
            if cfg.comm == "mpi":  # `train --comm mpi` run alone: its first process says it
                from pipesgd_ref.comm.mpi import report_stop

                stopped.told_launcher = report_stop(comm.rank, plan.signum, plan.stop_at, line)
            raise stopped
        wall = time.perf_counter() - t0
        # Every rank takes part in the gather (they are collectives); only rank 0 reads it.
        gathered = gather_for_summary(comm, result, t0)
    finally:
        comm.close()
    if comm.rank != 0:
        return None, result
    summary = summary_of_gathered(cfg, wall, result, gathered, t0)
    write_results(cfg, summary, result, wall, log)
    return summary, result


def stopped_mpi_job(cfg: TrainConfig, stops: list[dict]) -> JobStopped:
    """The end of `train --comm mpi` run alone whose ranks stopped on a signal (`stops`: the
    reports they left, comm/mpi.py report_stop): JobStopped with the signal and rank 0's line
    (its step and checkpoint), said once for the job, and with --out a summary.json that says
    the run was stopped. The ranks stop at the top of their next step, each on its own (they
    share no memory to agree on one), so no rank gathers the others' results: the summary
    holds the run's config and where each rank stopped, not its measurements."""
    # Rank 0's line (it writes the checkpoint), or, where rank 0 only heard of the stop from a
    # peer and never reached a step's top, the line of a rank that knows the step.
    first = sorted(stops, key=lambda s: (s["at_step"] is None, s["rank"] != 0, s["rank"]))[0]
    stopped = JobStopped(first["signal"], None, first["at_step"])
    stopped.args = (first["line"],)
    if cfg.out:
        summary = {
            "algo": cfg.algo,
            "world_size": cfg.world_size,
            "config": cfg.to_dict(),
            "stopped": {"signal": stopped.signal_name, "at_step": stopped.stop_at, "rank": None},
            "ranks_stopped_before_step": {str(s["rank"]): s["at_step"] for s in stops},
        }
        write_json(Path(cfg.out) / "summary.json", summary)
    return stopped


def job_of(cfg: TrainConfig, mpi_comm=None):
    """The job this rank belongs to (launch.Job: rank, world size, who started it), checked
    against cfg: a job of the wrong size, or --max-restarts, which only local jobs have, is
    one line on every rank before any waits."""
    if cfg.comm == "mpi":
        from pipesgd_ref.comm.mpi import mpi_job

        job = mpi_job(mpi_comm)  # rank and size from MPI: no MASTER_ADDR, no token
    else:
        job = detect_env()
    if job is None:
        raise LaunchError(
            "no job in the environment: set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, or "
            "start this under mpirun or srun (or run `pipesgd train` alone for local workers)"
        )
    if cfg.max_restarts:
        raise ConfigError(
            f"--max-restarts {cfg.max_restarts} restarts a job of local workers; this rank "
            f"joined a job that {job.source} started: use that launcher's restarts (torchrun "
            f"--max-restarts, srun --requeue), which start every rank again"
        )
    ranks = n_ranks(cfg)
    if job.world_size != ranks:
        size_var = next(
            (size for _, size, source in ENV_CONVENTIONS if source == job.source),
            "MPI_COMM_WORLD size",
        )
        servers = 1 if method(cfg.algo).server else 0
        need = f"{cfg.world_size} workers" + (" + 1 server" if servers else "")
        fix = (
            f"pass --world-size={job.world_size - servers}"
            if job.world_size > servers
            else f"start at least {servers + 1} ranks"
        )
        raise LaunchError(
            f"rank {job.rank}: the {job.source} job has {size_var}={job.world_size} ranks, but "
            f"{cfg.algo} with --world-size={cfg.world_size} needs {ranks} ({need}); start "
            f"{ranks} ranks, or {fix}"
        )
    return job


def join(cfg: TrainConfig, link, bind: str | None, mpi_comm=None):
    """This rank's Communicator: through MPI (--comm mpi), or the project's rendezvous on
    MASTER_ADDR with its links (`link`: the emulated network, when there is one)."""
    star = method(cfg.algo).server
    if cfg.comm == "mpi":
        from pipesgd_ref.comm.mpi import join_mpi
        from pipesgd_ref.runtime.jobenv import local_ranks, share_cores

        share_cores(local_ranks())  # as join_from_env does: each rank its share of the cores
        return join_mpi(timeout=cfg.timeout, star=star, mpi_comm=mpi_comm)
    return join_from_env(
        timeout=cfg.timeout,
        bind=bind,
        link=link,
        star=star,
        transport=cfg.transport,
        allreduce=job_allreduce(cfg),
        options=shared_options(cfg),  # compared at rendezvous, before any link
    )


def joined_how(cfg: TrainConfig, job) -> str:
    """How the ranks met, for rank 0's first line."""
    ranks = n_ranks(cfg)
    if cfg.comm == "mpi":
        from pipesgd_ref.comm.mpi import thread_level_name

        return (
            f"{ranks} ranks joined through MPI ({thread_level_name()}, the project's ring over "
            f"point-to-point)"
        )
    return (
        f"{ranks} ranks joined from {job.source} variables at {job.master_addr}:{job.master_port}"
    )


def write_results(cfg: TrainConfig, summary: dict, result, wall: float, log) -> None:
    """Rank 0's end of a joined run: the outcome lines, a warning if the replicas differ,
    and --out's summary.json and trace.json (rank 0's spans: the others' stay on their hosts)."""
    log_outcome(cfg, summary, wall, log)
    if not method(cfg.algo).server and not summary["params_identical_on_all_ranks"]:
        # (A parameter server's workers keep the weights they last pulled: they may differ.)
        logging.getLogger("pipesgd.train").warning(
            "the final weights differ between the ranks, which %s never should: the AllReduce "
            "hands every rank the same bytes; please report it with summary.json",
            cfg.algo,
        )
    if cfg.out:
        out = Path(cfg.out)
        write_json(out / "summary.json", summary)
        label = f"rank 0 of {n_ranks(cfg)} (a joined job's trace holds rank 0's spans only)"
        write_json(out / "trace.json", chrome_trace(result.events, labels={0: label}))
        log(f"wrote {out / 'summary.json'} and {out / 'trace.json'} (rank 0's spans only)")
