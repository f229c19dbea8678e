"""`pipesgd train` with local workers: the job's inputs checked and built once, p (or p + 1)
worker processes started over the chosen links, restarted from the last checkpoint after a
failure (--max-restarts), stopped on a signal at one step on every rank, and summarised.

The other ways to run: commands/train_joined.py (one rank of a job torchrun, mpirun or srun
started), commands/reference.py (the one-process oracle). Every rank of every job runs
runtime/job.py's `train_job`. With --out, DIR/summary.json (runtime/summary.py says what it
holds) and DIR/trace.json.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from pipesgd_ref.config import TrainConfig
from pipesgd_ref.methods.table import method
from pipesgd_ref.outputs import write_json
from pipesgd_ref.runtime.inputs import JobInputs
from pipesgd_ref.runtime.job import job_allreduce, load_before_fork, n_ranks, train_job
from pipesgd_ref.runtime.summary import summarise
from pipesgd_ref.units import format_bytes


def check_inputs(cfg: TrainConfig) -> JobInputs:
    """Every check before any worker waits, and the job's inputs built once: the options make
    a run together, the data loads, the checkpoint to resume from belongs to this run, the
    model fits in memory and the emulated link delivers a frame within --timeout. A bad spec
    is one line here rather than an error in every worker; the inputs are handed down to the
    workers (forked ones inherit them)."""
    from pipesgd_ref.runtime.preflight import check_config, check_run

    check_config(cfg)  # the options make a run together (a config built in code, compare's)
    inputs = JobInputs.load(cfg)
    check_run(cfg, inputs.model.n_params)  # the model fits in memory, the link is fast enough
    return inputs


def check_device(cfg: TrainConfig) -> None:
    """--device cuda: stop here, in one line, when no GPU (or driver) can run the kernels.

    Asks cuda_support.gpu_problem(), which in the simulator imports nothing and otherwise asks
    the driver whether a GPU is there: that initialises the driver but creates no CUDA context
    (a context is what a forked child must never inherit; the workers are spawned anyway)."""
    if cfg.device != "cuda":
        return
    from pipesgd_ref.errors import ConfigError
    from pipesgd_ref.ops.cuda_support import gpu_problem

    problem = gpu_problem()
    if problem is not None:
        raise ConfigError(f"--device cuda: {problem}")


def describe(cfg: TrainConfig, link) -> str:
    """The start-of-run line: method, workers, data, model, link, transport, AllReduce (what
    was asked for: under auto the choice is made per message size, and the end-of-run line
    names what ran)."""
    width = f", width {cfg.width}" if method(cfg.algo).pipelined else ""
    wire = "" if cfg.comm == "mpi" else f", transport {cfg.transport}"  # MPI picks its own
    asked = job_allreduce(cfg)
    if asked == "auto":
        asked = "auto (chosen per message size; named at the end)"
    ring = "" if method(cfg.algo).server else f", allreduce {asked}"
    return (
        f"{cfg.algo}: {cfg.world_size} workers, {cfg.dataset}, {cfg.model}{width}, "
        f"link: {link if link.enabled else 'not emulated'}{wire}{ring}"
    )


def ran_line(cfg: TrainConfig, summary: dict) -> str | None:
    """What carried the gradients (summary["allreduce_ran"]), in one line; None when nothing
    was recorded (no AllReduce, or no step)."""
    ran = summary.get("allreduce_ran")
    if not ran:
        return None
    parts = [
        f"{r['algorithm']} over {r['transport']} ({r['calls']} x {format_bytes(r['bytes'])}, "
        f"{format_bytes(r['bytes_sent'])} sent)"
        for r in ran
    ]
    return f"{cfg.algo}: gradients reduced by {', '.join(parts)} on rank 0"


def log_outcome(cfg: TrainConfig, summary: dict, wall: float, log) -> None:
    """The end-of-run lines: steps, time, iteration, loss, accuracy, the AllReduce that ran,
    and time to target."""
    log(
        f"{cfg.algo}: {summary['steps']} steps in {wall:.2f} s, iteration "
        f"{summary['iter_time_s'] * 1e3:.2f} ms, final train loss "
        f"{summary['final_train_loss']:.4f}, test accuracy {summary['test_accuracy']:.4f}"
    )
    if (line := ran_line(cfg, summary)) is not None:
        log(line)
    if summary["time_to_target_s"] is not None:
        log(
            f"{cfg.algo}: test accuracy {cfg.target_accuracy:.2%} reached at step "
            f"{summary['steps_to_target']}, {summary['time_to_target_s']:.2f} s into "
            f"training"
        )


def run_training(
    cfg: TrainConfig,
    progress: bool = True,
    log: Callable[[str], None] = print,
    label: str | None = None,
):
    """Run cfg.algo on cfg.world_size local worker processes; return (summary, results).
    `label` names the run on its progress bar (default: the algo).

    A worker that fails ends the job (WorkerFailed), or, with cfg.max_restarts, restarts it
    from the last checkpoint in cfg.out (`_launch_with_restarts`). A signal stops every worker
    after one common step (lifetime.py): the partial run's summary is written as usual, marked
    "stopped", and JobStopped is raised for the command's exit code."""
    from pipesgd_ref.comm.netem import link_of
    from pipesgd_ref.errors import JobStopped
    from pipesgd_ref.trace import chrome_trace

    inputs = check_inputs(cfg)  # bad specs fail here, in one line, before any fork
    check_device(cfg)
    link = link_of(cfg)
    log(describe(cfg, link))
    start = time.perf_counter()
    # fork: fast, and the workers share the parent's imports. --device cuda: spawn, because a
    # CUDA context does not survive a fork; each worker is a fresh interpreter that makes its
    # own (Worker.to_device), and this process never makes one.
    start_method = "spawn" if cfg.device == "cuda" else "fork"
    if start_method == "fork":
        load_before_fork(cfg)
    stopped = None
    try:
        ran, results, restarts = _launch_with_restarts(
            cfg,
            dict(
                link=link,
                star=method(cfg.algo).server,
                timeout=cfg.timeout,
                transport=cfg.transport,
                allreduce=job_allreduce(cfg),
                start_method=start_method,
                master_port=cfg.master_port or None,
            ),
            (progress, label),
            inputs,
            log,
        )
    except JobStopped as e:
        stopped, ran, results, restarts = e, e.cfg, e.results, e.restarts
        if results is None or not any(r.losses for r in results):  # nothing to summarise
            e.args = (stopped_line(cfg, e, None),)
            raise
    wall = time.perf_counter() - start
    summary = summarise(ran, results, wall)
    summary["config"] = cfg.to_dict()  # as asked for (a restart resumed from cfg.out)
    summary["restarts"] = restarts
    summary["stopped"] = None
    if stopped is not None:
        summary["stopped"] = {
            "signal": stopped.signal_name,
            "at_step": stopped.stop_at,
            "rank": stopped.rank,  # the worker that received it; None: the launcher
        }
    else:
        log_outcome(cfg, summary, wall, log)
    if cfg.out:
        out = Path(cfg.out)
        write_json(out / "summary.json", summary)
        write_json(out / "trace.json", chrome_trace([e for r in results for e in r.events]))
        if stopped is None:
            log(f"wrote {out / 'summary.json'} and {out / 'trace.json'}")
    if stopped is not None:
        stopped.args = (stopped_line(cfg, stopped, summary),)
        raise stopped
    return summary, results


def stopped_line(cfg: TrainConfig, stopped, summary: dict | None, local: bool = True) -> str:
    """The one line a stopped job ends with: which signal, sent to which rank when a worker
    received it rather than the launcher, where, and how to go on (local: a job of local
    workers, whose results are missing only where some were killed)."""
    where = f" before step {stopped.stop_at}" if stopped.stop_at is not None else ""
    line = f"{cfg.algo}: stopped by {stopped.signal_name}{_sent_to(cfg, stopped.rank)}{where}"
    if summary is not None:
        line += f" ({summary['steps']} steps run)"
    if local and stopped.results is None:
        line += "; workers that did not finish their step were killed"
    ckpt = Path(cfg.out) / "checkpoint.npz" if cfg.out else None
    if ckpt is not None and ckpt.is_file():
        line += f"; checkpoint {ckpt}: continue with --resume {cfg.out}"
    elif cfg.out:
        line += f"; no checkpoint in {cfg.out}"
    return line


def _sent_to(cfg: TrainConfig, rank: int | None) -> str:
    """The words " sent to rank r (its role)" when one worker received the stopping signal."""
    if rank is None:
        return ""
    if not method(cfg.algo).server:
        return f" sent to rank {rank}"
    role = "the parameter server" if rank == 0 else f"worker {rank - 1}"
    return f" sent to rank {rank} ({role})"


def _launch_with_restarts(cfg: TrainConfig, launch: dict, job_args: tuple, inputs, log):
    """launch_local of cfg's job, restarted after a worker failure up to cfg.max_restarts
    times, as torchrun's --max-restarts: each restart resumes from the checkpoint in cfg.out
    (the last periodic one, --checkpoint-every), or starts over without one, and is logged
    with its cause. A fault injected through PIPESGD_FAULT fires in the first run only.
    Returns (the config of the last run, its results, the restarts as summary.json lists
    them); JobStopped carries the same three as .cfg, .results, .restarts. `inputs`: the
    job's data, model and checkpoint, built once by the caller (a restart reads its own)."""
    from pipesgd_ref.errors import JobStopped, OutputError, Recurring, WorkerFailed
    from pipesgd_ref.runtime import checkpoint, faults
    from pipesgd_ref.runtime.launch import launch_local

    ran = cfg
    restarts: list[dict] = []
    fault_env = os.environ.get(faults.ENV)
    try:
        while True:
            try:
                args = (ran, *job_args, None, inputs)  # train_job(comm, *args)
                results = launch_local(n_ranks(ran), train_job, args, **launch)
                return ran, results, restarts
            except JobStopped as e:
                e.cfg, e.restarts = ran, restarts
                raise
            except WorkerFailed as e:
                recurs = [t for t in e.errors.values() if isinstance(t, Recurring)]
                if recurs:  # a full disk stays full: not retried, and the one line to show
                    raise OutputError(recurs[0]) from None
                if len(restarts) >= cfg.max_restarts:
                    if restarts:
                        e.args = (
                            f"{e.args[0]}\n(after {len(restarts)} restart(s), "
                            f"--max-restarts {cfg.max_restarts})",
                        )
                    raise
                saved = Path(cfg.out) / checkpoint.FILE if cfg.out else None
                ran = cfg.replace(resume=cfg.out) if saved and saved.is_file() else cfg
                # The restart resumes from cfg.out's checkpoint, else from --resume's own
                resumed = Path(ran.resume) / checkpoint.FILE
                from_step = _checkpoint_step(resumed) if ran.resume else 0
                cause = e.errors.get(e.cause) if e.cause is not None else None
                cause = (cause or next(iter(e.errors.values()), "")).strip().splitlines()[-1]
                restarts.append(
                    {
                        "restart": len(restarts) + 1,
                        "cause_rank": e.cause,
                        "cause": cause,
                        "resumed_from_step": from_step,
                    }
                )
                logging.getLogger("pipesgd.train").warning(
                    "restart %d of %d: %s; %s",
                    len(restarts),
                    cfg.max_restarts,
                    cause,
                    f"resuming from step {from_step} ({resumed})"
                    if ran.resume
                    else "starting over (no checkpoint: --out DIR --checkpoint-every N)",
                )
                os.environ.pop(faults.ENV, None)  # injected faults fire once per job
                inputs = JobInputs.load(ran)  # the checkpoint it resumes from is new
    finally:
        if fault_env is not None:
            os.environ[faults.ENV] = fault_env


def _checkpoint_step(path: Path) -> int:
    with np.load(path) as z:
        return int(z["next_step"])
