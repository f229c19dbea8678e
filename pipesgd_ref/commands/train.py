"""Run a training job from a TrainConfig: the runners.

`run_training` runs cfg.algo (sync, pipe, ps-sync, ps-async) in local worker processes, and
restarts it from its checkpoint after a failure (--max-restarts); `run_training_joined` runs
it as one rank of a job that torchrun, mpirun or srun started on several hosts (`pipesgd
train` picks it when the environment describes a job); `run_reference` runs the one-process
oracle of the same config, the yardstick the distributed run is compared against.

Every rank of a job runs `_train_job`: it builds the rank's `Worker` once (the data, model,
w_0 or the checkpoint's weights) and hands it to the method; rank 0 also records the run
(summary.Recorder) and evaluates on the test set after training. Each runner writes, when
`cfg.out` is set, DIR/summary.json (summary.py says what it holds) and DIR/trace.json.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pipesgd_ref.config import TrainConfig
from pipesgd_ref.data import MinibatchSampler, load_dataset
from pipesgd_ref.logs import progress_bar, tag_log_lines
from pipesgd_ref.methods.reference import delayed_sgd, model_grad_fn
from pipesgd_ref.methods.table import method
from pipesgd_ref.models import model_for
from pipesgd_ref.outputs import write_json
from pipesgd_ref.runtime.hooks import Hooks
from pipesgd_ref.runtime.summary import (
    Recorder,
    gather_for_summary,
    reaching_target,
    summarise,
    summary_of_gathered,
)
from pipesgd_ref.runtime.worker import Worker, diverged, steps_for


def run_reference(
    cfg: TrainConfig,
    progress: bool = True,
    log: Callable[[str], None] = print,
    label: str | None = None,
) -> dict[str, Any]:
    """Train with the one-process oracle of cfg.width; return (and maybe write) the summary."""
    data = load_dataset(cfg.dataset)
    model = model_for(cfg, data, cfg.backend)
    sampler = MinibatchSampler(data.n_train, cfg.world_size, cfg.batch_size, cfg.seed)
    steps = steps_for(cfg, sampler)
    algo = "reference-sync" if cfg.width == 1 else f"reference-pipe(width={cfg.width})"
    label = label or algo
    log(
        f"{label}: {model} on {data.name} ({data.n_train} train / {data.n_test} test), "
        f"{cfg.world_size} workers x batch {cfg.batch_size}, {steps} steps, lr {cfg.lr}"
    )

    loss_curve: list[dict] = []
    eval_curve: list[dict] = []
    bar = progress_bar(steps, label, enabled=progress)
    samples_per_step = cfg.world_size * cfg.batch_size
    start = time.perf_counter()

    def evaluate(step: int, params: np.ndarray) -> float:
        acc = model.accuracy(params, data.X_test, data.y_test)
        elapsed = time.perf_counter() - start
        eval_curve.append({"step": step, "wall_time_s": elapsed, "test_accuracy": acc})
        return acc

    def on_step(step: int, params: np.ndarray, loss: float) -> None:
        if not math.isfinite(loss):
            bar.close()
            raise diverged(label, f"the training loss is {loss} at step {step}", cfg)
        elapsed = time.perf_counter() - start
        loss_curve.append({"step": step, "wall_time_s": elapsed, "loss": loss})
        bar.update(1)
        bar.set_postfix(
            loss=f"{loss:.4f}", samples_s=f"{samples_per_step * (step + 1) / elapsed:.0f}"
        )
        done = step + 1
        if cfg.eval_every and done % cfg.eval_every == 0 and done < steps:
            acc = evaluate(done, params)
            log(f"{label}: step {done}/{steps} loss {loss:.4f} test accuracy {acc:.4f}")

    # A diverging run overflows before its loss turns inf; on_step reports that as one clear
    # error, so NumPy's own overflow warnings would only be noise on the way.
    with np.errstate(over="ignore", invalid="ignore"):
        traj = delayed_sgd(
            model_grad_fn(model, data, sampler),
            model.init_params(cfg.seed),
            cfg.world_size,
            steps,
            cfg.lr_at,
            staleness=cfg.width - 1,
            warmup_steps=cfg.warmup_steps,
            callback=on_step,
            compensation=cfg.compensation,
            dc_lambda=cfg.dc_lambda,
        )
    bar.close()
    final_acc = evaluate(steps, traj.params)
    wall = time.perf_counter() - start
    tail = traj.losses[-min(len(traj.losses), max(1, steps // 20)) :]  # last 5% of steps
    summary = {
        "algo": algo,
        "world_size": cfg.world_size,
        "width": cfg.width,
        "steps": steps,
        "wall_time_s": wall,
        "iter_time_s": wall / steps,
        "final_train_loss": float(np.mean(tail)),
        "test_accuracy": final_acc,
        **reaching_target(eval_curve, cfg.target_accuracy),
        "n_params": model.n_params,
        "loss_curve": loss_curve,
        "eval_curve": eval_curve,
        "config": cfg.to_dict(),
    }
    log(
        f"{label}: done in {wall:.2f} s, final train loss {summary['final_train_loss']:.4f}, "
        f"test accuracy {final_acc:.4f}"
    )
    if cfg.out:
        write_json(Path(cfg.out) / "summary.json", summary)
    return summary


# --- distributed runs ----------------------------------------------------------------------


def n_ranks(cfg: TrainConfig) -> int:
    """Processes in a job of cfg: one per worker, plus the server for ps-sync and ps-async."""
    return method(cfg.algo).ranks(cfg.world_size)


def build_worker(cfg: TrainConfig, rank: int) -> Worker:
    """The Worker of `rank` in a job of cfg, as its method's row lays out the ranks."""
    row = method(cfg.algo)
    return Worker.for_rank(cfg, rank, row.server, row.stale_note(cfg))


def _train_job(
    comm,
    cfg: TrainConfig,
    show_progress: bool,
    label: str | None = None,
    worker: Worker | None = None,
):
    """One rank's part of a job: its Worker, built once here (a joined rank brings the one it
    checked its inputs with) and handed to cfg.algo's method, which trains with it. Rank 0
    also records the run (a progress bar, weight snapshots) and, after training, evaluates the
    snapshots and the final weights on the test set, into its result's extra: the summary
    needs neither model nor data then, and the evaluation costs the run nothing."""
    # Why once: a Worker loads the data and the checkpoint and builds w_0; building it again
    # (the recorder's sizes, then the method) would delay this rank's first step, and with
    # it every rank's.
    worker = worker or build_worker(cfg, comm.rank)
    row = method(cfg.algo)
    recorder = None
    if comm.rank == 0:
        # ps-async's server counts one update per push: p per step.
        per_step = cfg.world_size if row.checkpoint_rounds else 1
        recorder = Recorder(
            cfg,
            worker.steps * per_step,
            worker.sampler.steps_per_epoch * per_step,
            per_step,
            show_progress,
            label,
            worker.params.size,
        )
        model, data = worker.model, worker.data  # the host model (--device cuda replaces it)
    try:
        result = row.loop(comm, cfg, Hooks(comm.rank, worker, recorder))
    finally:
        if recorder is not None:
            recorder.close()
    if recorder is not None:  # after training: the evaluation costs the run nothing
        result.extra["eval_curve"] = recorder.eval_curve(model, data)
        result.extra["test_accuracy"] = model.accuracy(result.params, data.X_test, data.y_test)
        # where this run began: the checkpoint it resumed may be overwritten by now (a
        # restart resumes from the folder it writes to)
        result.extra["start_step"] = worker.start_step
    return result


def _check_inputs(cfg: TrainConfig, worker: Worker | None = None) -> None:
    """The data and the checkpoint to resume from, checked before any worker waits: a bad spec
    is one line here rather than an error in every worker. `worker`: the Worker this process
    trains with (a joined rank: its data and checkpoint are loaded once, by Worker.build);
    without one (the launcher of local workers, which trains nothing) they are read here for
    the check alone."""
    from pipesgd_ref.config import check_before_run, n_params_of
    from pipesgd_ref.errors import ConfigError

    if worker is not None:
        data, start_step, steps = worker.data, worker.start_step, worker.steps
    else:
        data = load_dataset(cfg.dataset)
        sampler = MinibatchSampler(data.n_train, cfg.world_size, cfg.batch_size, cfg.seed)
        start_step, steps = 0, steps_for(cfg, sampler)
    check_before_run(cfg, data)  # the model fits in memory, the link delivers a frame in time
    if cfg.resume and worker is None:
        from pipesgd_ref.runtime import checkpoint

        # n_params: a checkpoint of another model's size is refused here, in one line
        _, start_step, _ = checkpoint.load(cfg.resume, cfg, n_params=n_params_of(cfg, data))
    if cfg.resume and start_step >= steps:
        raise ConfigError(
            f"--resume {cfg.resume}: the checkpoint is already at step {start_step} of "
            f"{steps}; nothing to do (raise --steps to train further)"
        )


def _check_device(cfg: TrainConfig) -> None:
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


def _describe(cfg: TrainConfig, model) -> str:
    """The start-of-run line: method, workers, data, model, link."""
    width = f", width {cfg.width}" if method(cfg.algo).pipelined else ""
    return (
        f"{cfg.algo}: {cfg.world_size} workers, {cfg.dataset}, {cfg.model}{width}, "
        f"link: {model if model.enabled else 'not emulated'}"
    )


def _log_outcome(cfg: TrainConfig, summary: dict, wall: float, log) -> None:
    """The end-of-run lines: steps, time, iteration, loss, accuracy, and time to target."""
    log(
        f"{cfg.algo}: {summary['steps']} steps in {wall:.2f} s, iteration "
        f"{summary['iter_time_s'] * 1e3:.2f} ms, final train loss "
        f"{summary['final_train_loss']:.4f}, test accuracy {summary['test_accuracy']:.4f}"
    )
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
    from pipesgd_ref.config import link_model
    from pipesgd_ref.errors import JobStopped
    from pipesgd_ref.trace import chrome_trace

    _check_inputs(cfg)  # bad data specs fail here, in one line, before any fork
    _check_device(cfg)
    model = link_model(cfg)
    log(_describe(cfg, model))
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
                model=model,
                star=method(cfg.algo).server,
                timeout=cfg.timeout,
                transport=cfg.transport,
                start_method=start_method,
                master_port=cfg.master_port or None,
            ),
            (progress, label),
            log,
        )
    except JobStopped as e:
        stopped, ran, results, restarts = e, e.cfg, e.results, e.restarts
        if results is None or not any(r.losses for r in results):  # nothing to summarise
            e.args = (_stopped_line(cfg, e, None),)
            raise
    wall = time.perf_counter() - start
    summary = summarise(ran, results, wall)
    summary["config"] = cfg.to_dict()  # as asked for (a restart resumed from cfg.out)
    summary["restarts"] = restarts
    summary["stopped"] = None
    if stopped is not None:
        summary["stopped"] = {"signal": stopped.signal_name, "at_step": stopped.stop_at}
    else:
        _log_outcome(cfg, summary, wall, log)
    if cfg.out:
        out = Path(cfg.out)
        write_json(out / "summary.json", summary)
        write_json(out / "trace.json", chrome_trace([e for r in results for e in r.events]))
        if stopped is None:
            log(f"wrote {out / 'summary.json'} and {out / 'trace.json'}")
    if stopped is not None:
        stopped.args = (_stopped_line(cfg, stopped, summary),)
        raise stopped
    return summary, results


def _stopped_line(cfg: TrainConfig, stopped, summary: dict | None, local: bool = True) -> str:
    """The one line a stopped job ends with: which signal, where, and how to go on (local:
    a job of local workers, whose results are missing only where some were killed)."""
    where = f" before step {stopped.stop_at}" if stopped.stop_at is not None else ""
    line = f"{cfg.algo}: stopped by {stopped.signal_name}{where}"
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


def _launch_with_restarts(cfg: TrainConfig, launch: dict, job_args: tuple, log):
    """launch_local of cfg's job, restarted after a worker failure up to cfg.max_restarts
    times, as torchrun's --max-restarts: each restart resumes from the checkpoint in cfg.out
    (the last periodic one, --checkpoint-every), or starts over without one, and is logged
    with its cause. A fault injected through PIPESGD_FAULT fires in the first run only.
    Returns (the config of the last run, its results, the restarts as summary.json lists
    them); JobStopped carries the same three as .cfg, .results, .restarts."""
    from pipesgd_ref.errors import JobStopped, WorkerFailed
    from pipesgd_ref.runtime import checkpoint, faults
    from pipesgd_ref.runtime.launch import launch_local

    ran, restarts = cfg, []
    fault_env = os.environ.get(faults.ENV)
    try:
        while True:
            try:
                results = launch_local(n_ranks(ran), _train_job, (ran, *job_args), **launch)
                return ran, results, restarts
            except JobStopped as e:
                e.cfg, e.restarts = ran, restarts
                raise
            except WorkerFailed as e:
                if len(restarts) >= cfg.max_restarts:
                    if restarts:
                        e.args = (
                            f"{e.args[0]}\n(after {len(restarts)} restart(s), "
                            f"--max-restarts {cfg.max_restarts})",
                        )
                    raise
                saved = Path(cfg.out) / checkpoint.FILE if cfg.out else None
                ran = cfg.replace(resume=cfg.out) if saved and saved.is_file() else cfg
                from_step = _checkpoint_step(saved) if ran.resume else 0
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
                    f"resuming from step {from_step} ({saved})"
                    if ran.resume
                    else "starting over (no checkpoint: --out DIR --checkpoint-every N)",
                )
                os.environ.pop(faults.ENV, None)  # injected faults fire once per job
    finally:
        if fault_env is not None:
            os.environ[faults.ENV] = fault_env


def _checkpoint_step(path: Path) -> int:
    with np.load(path) as z:
        return int(z["next_step"])


# --- one rank of a job started by torchrun, mpirun or srun ---------------------------------


def load_before_fork(cfg: TrainConfig) -> None:
    """Import and load in this process what every forked worker of cfg would otherwise load
    on its own: Numba and the codecs, and the algorithm's module. Forked workers inherit it
    all. Why: each worker would pay the import itself, all of them at once on the same cores
    when there are more workers than cores, and a short run's wall time is then mostly imports
    (the measured cost is in benchmarks/RESULTS.md, load_before_fork)."""
    from pipesgd_ref.codecs import get_codec

    get_codec(cfg.codec, cfg.codec_backend)
    _ = method(cfg.algo).loop  # the property imports the method's module


def run_training_joined(
    cfg: TrainConfig,
    progress: bool = True,
    log: Callable[[str], None] = print,
    bind: str | None = None,
    mpi_comm=None,
):
    """Run cfg.algo as the one rank of a multi-host job that the environment describes
    (launch.detect_env: torchrun's, Open MPI's, MPICH's or SLURM's variables); every rank of
    the job runs this with the same config. Returns (summary, this rank's WorkerResult); the
    summary only on rank 0, None elsewhere.

    Each rank runs the same per-rank job as a local worker (`_train_job`), so a joined run
    ends with the same weights as `run_training` of the same config: bitwise for sync, pipe
    and ps-sync. Rank 0 then writes --out: summary.json (same keys as a local run) from what it
    gathers from every rank without pickle (`summary.gather_for_summary`: ring AllReduces of float64
    arrays), trace.json of rank 0's spans only (the others' stay on their hosts), and, for
    sync and pipe, checkpoint.npz as in a local run.

    Times: each rank measures from the moment the job formed (after the rendezvous, which
    every rank leaves within about a network round trip of the others), since the clocks of
    different hosts cannot be compared; wall_time_s counts training only, not process start.
    bind: the interface this rank's listeners use (default: loopback when MASTER_ADDR is
    loopback, else all interfaces). mpi_comm (--comm mpi): the MPI communicator whose ranks
    make the job (default MPI_COMM_WORLD; `pipesgd compare --comm mpi` runs the ring's
    methods on part of its world).
    """
    from pipesgd_ref.config import link_model
    from pipesgd_ref.errors import CommError, JobStopped, LaunchError
    from pipesgd_ref.runtime.launch import ENV_CONVENTIONS, detect_env, join_from_env
    from pipesgd_ref.runtime.lifetime import LocalStop, worker_signals
    from pipesgd_ref.trace import chrome_trace

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
        from pipesgd_ref.errors import ConfigError

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
    # This rank's Worker, built once: its data and checkpoint are checked now (a bad spec is
    # one line on every rank, before any rank waits) and it trains in _train_job.
    worker = build_worker(cfg, job.rank)
    _check_inputs(cfg, worker)
    _check_device(cfg)
    model = link_model(cfg)
    # SIGINT, SIGTERM, SIGHUP: stop at the top of the next step (lifetime.LocalStop; the
    # launcher, torchrun, mpirun or srun, signals every rank). The ranks do not share memory
    # to agree on one step, so a rank whose peers stopped first sees them close: that is the
    # stop, not a failure. Rank 0 checkpoints where it can; else the last periodic one stands.
    plan = LocalStop()
    worker_signals(plan)
    if cfg.comm == "mpi":
        from pipesgd_ref.comm.mpi import join_mpi
        from pipesgd_ref.runtime.launch import local_ranks, share_cores

        share_cores(local_ranks())  # as join_from_env does: each rank its share of the cores
        comm = join_mpi(timeout=cfg.timeout, star=method(cfg.algo).server, mpi_comm=mpi_comm)
    else:
        comm = join_from_env(
            timeout=cfg.timeout,
            bind=bind,
            model=model,
            star=method(cfg.algo).server,
            transport=cfg.transport,
        )
    try:
        t0 = time.perf_counter()  # "the job formed", on this rank's clock
        tag_log_lines(comm.rank)
        if comm.rank == 0:
            if cfg.comm == "mpi":
                from pipesgd_ref.comm.mpi import thread_level_name

                log(
                    f"{_describe(cfg, model)}; {ranks} ranks joined through MPI ("
                    f"{thread_level_name()}, the project's ring over point-to-point)"
                )
            else:
                log(
                    f"{_describe(cfg, model)}; {ranks} ranks joined from {job.source} variables "
                    f"at {job.master_addr}:{job.master_port}"
                )
        try:
            result = _train_job(comm, cfg, progress, worker=worker)
        except CommError:
            if not plan.signum:  # else a peer that stopped first closed: that is the stop
                raise
        if plan.signum:  # the others may be gone: no gather, no summary
            stopped = JobStopped(plan.signum, None, plan.stop_at)
            line = _stopped_line(cfg, stopped, None, local=False)
            stopped.args = (f"{line} (rank {comm.rank})",)
            raise stopped
        wall = time.perf_counter() - t0
        # Every rank takes part in the gather (they are collectives); only rank 0 reads it.
        gathered = gather_for_summary(comm, result, t0)
    finally:
        comm.close()
    if comm.rank != 0:
        return None, result
    summary = summary_of_gathered(cfg, wall, result, gathered, t0)
    _log_outcome(cfg, summary, wall, log)
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
        label = f"rank 0 of {ranks} (a joined job's trace holds rank 0's spans only)"
        write_json(out / "trace.json", chrome_trace(result.events, labels={0: label}))
        log(f"wrote {out / 'summary.json'} and {out / 'trace.json'} (rank 0's spans only)")
    return summary, result
