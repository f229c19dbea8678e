"""Run a training job from a TrainConfig and summarise it.

`run_training` runs cfg.algo in worker processes over TCP (sync, pipe; the parameter server
methods join as they land); `run_training_joined` runs it as one rank of a job that torchrun,
mpirun or srun started on several hosts (`pipesgd train` picks it when the environment
describes a job); `run_reference` runs the one-process oracle of the same config, the
yardstick the distributed run is compared against.

The summary (a dict, written as DIR/summary.json when `cfg.out` is set) holds: algo,
world_size, width, steps, wall_time_s, final_train_loss, test_accuracy, steps_to_target and
time_to_target_s (first evaluation at or above cfg.target_accuracy), loss_curve (a list of
{step, wall_time_s, loss}), eval_curve (a list of {step, wall_time_s, test_accuracy}), config.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pipesgd_ref.algorithms.reference import delayed_sgd, model_grad_fn
from pipesgd_ref.algorithms.worker import WorkerResult, steps_for
from pipesgd_ref.comm.ring import allgather
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.data import MinibatchSampler, load_dataset
from pipesgd_ref.errors import TrainingDiverged
from pipesgd_ref.logs import tag_log_lines
from pipesgd_ref.models import build_model


def run_reference(
    cfg: TrainConfig,
    progress: bool = True,
    log: Callable[[str], None] = print,
    label: str | None = None,
) -> dict[str, Any]:
    """Train with the one-process oracle of cfg.width; return (and maybe write) the summary."""
    data = load_dataset(cfg.dataset)
    model = build_model(cfg.model, data.n_features, data.n_classes, cfg.hidden, cfg.backend)
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
    bar = _progress_bar(steps, label, enabled=progress)
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
            raise TrainingDiverged(
                f"{label}: the training loss is {loss} at step {step}; the run diverged. "
                f"Lower --lr (now {cfg.lr}) or, with staleness {cfg.width - 1}, remember the "
                f"largest stable step size is smaller than for synchronous SGD"
            )
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


def reaching_target(eval_curve: list[dict], target: float) -> dict[str, Any]:
    """target_accuracy, steps_to_target and time_to_target_s of a summary: the first
    evaluation of `eval_curve` ({step, wall_time_s, test_accuracy}) at or above `target`."""
    reached = next((e for e in eval_curve if e["test_accuracy"] >= target), None)
    return {
        "target_accuracy": target,
        "steps_to_target": reached["step"] if reached else None,
        "time_to_target_s": reached["wall_time_s"] if reached else None,
    }


def write_json(path: Path, payload: dict) -> None:
    """Write atomically (temp file + rename): a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    os.replace(tmp, path)


def _progress_bar(total: int, label: str, enabled: bool):
    """A tqdm bar on stderr when it is a terminal (disable=None); a silent stand-in otherwise."""
    from tqdm.auto import tqdm

    return tqdm(
        total=total, desc=label, unit="step", disable=None if enabled else True, leave=False
    )


# --- distributed runs ----------------------------------------------------------------------


def _worker_fn(algo: str):
    if algo == "sync":
        from pipesgd_ref.algorithms.sync import sync_worker

        return sync_worker
    if algo == "pipe":
        from pipesgd_ref.algorithms.pipe import pipe_worker

        return pipe_worker
    from pipesgd_ref.algorithms.ps import ps_async_worker, ps_sync_worker

    return {"ps-sync": ps_sync_worker, "ps-async": ps_async_worker}[algo]


def is_ps(algo: str) -> bool:
    """Parameter-server methods run one more process: rank 0 is the server."""
    return algo.startswith("ps-")


def n_ranks(cfg: TrainConfig) -> int:
    """Processes in a job of cfg: one per worker, plus the server for ps-sync and ps-async."""
    return cfg.world_size + 1 if is_ps(cfg.algo) else cfg.world_size


SNAPSHOT_BUDGET = 1 << 30  # bytes of weight copies rank 0 may keep for the evaluation


class _Recorder:
    """Rank 0's view of a run, called after every update: a progress bar (iterations, loss,
    samples/s; optional), a loss line per epoch, and a copy of the weights every
    cfg.eval_every steps. The copies are evaluated on the test set only after training
    (`eval_curve`): evaluating during the run would slow rank 0, and with it every rank, by
    exactly the time it took, and distort the times it measures."""

    def __init__(self, cfg: TrainConfig, total: int, per_epoch: int, per_step: int, bar: bool,
                 label: str | None = None, n_params: int = 0):  # fmt: skip
        from tqdm.auto import tqdm

        self.cfg = cfg
        self.steps, self.steps_per_epoch = total, per_epoch  # in updates of rank 0
        self.per_step = per_step  # updates per step: p for ps-async's server, else 1
        self.bar = tqdm(total=total, desc=label or cfg.algo, unit="step",
                        disable=None if bar else True, leave=False)  # fmt: skip
        self.log = logging.getLogger("pipesgd.train")
        self.every = cfg.eval_every * per_step  # updates between snapshots (0: none)
        self.snapshots: list[tuple[int, float, int]] = []  # (step, perf_counter, row of store)
        self.store = np.empty((0, 0), np.float32)
        if self.every:
            rows = total // self.every
            if n_params * 4 * rows > SNAPSHOT_BUDGET:  # thin out rather than run out of memory
                thin = math.ceil(n_params * 4 * rows / SNAPSHOT_BUDGET)
                self.every *= thin
                rows = total // self.every
                self.log.warning(
                    "keeping a copy of the weights every %d steps instead of every %d (memory "
                    "budget %d MB): the time to target is that coarse",
                    self.every // per_step, cfg.eval_every, SNAPSHOT_BUDGET >> 20,
                )  # fmt: skip
            # Allocated and touched now, before training: a copy during the run is then a
            # plain memcpy, not page faults on fresh memory that would slow rank 0, and
            # with it every rank that waits for it.
            self.store = np.empty((rows, n_params), np.float32)
            self.store.fill(0.0)  # np.zeros would only map the pages; fill touches them
        self.start = time.perf_counter()

    def __call__(self, step: int, params: np.ndarray, loss: float) -> None:
        now = time.perf_counter()
        done = step + 1
        if self.every and done % self.every == 0 and len(self.snapshots) < len(self.store):
            row = len(self.snapshots)
            self.store[row] = params
            self.snapshots.append((done // self.per_step, now, row))
        self.bar.update(1)
        rate = self.cfg.world_size * self.cfg.batch_size * done / max(now - self.start, 1e-9)
        self.bar.set_postfix(loss=f"{loss:.4f}", samples_s=f"{rate / self.per_step:.0f}")
        if done % self.steps_per_epoch == 0 and done < self.steps:
            self.log.info("epoch %d (step %d): loss %.4f", done // self.steps_per_epoch,
                          done // self.per_step, loss)  # fmt: skip

    def eval_curve(self, model, data) -> list[dict]:
        """[{step, time (perf_counter s), test_accuracy}] of the snapshots, evaluated now."""
        return [
            {"step": step, "time": when, "test_accuracy": model.accuracy(self.store[row],
                                                                         data.X_test, data.y_test)}
            for step, when, row in self.snapshots
        ]  # fmt: skip

    def close(self) -> None:
        self.bar.close()


def _train_job(comm, cfg: TrainConfig, show_progress: bool, label: str | None = None):
    from pipesgd_ref.algorithms.worker import WorkerSetup

    recorder = setup = None
    if comm.rank == 0:
        # Built once, here: the recorder needs its sizes, and the worker (or the server) of
        # rank 0 trains with it (a second build delayed rank 0's first step by 60-140 ms).
        setup = WorkerSetup.build(cfg, 0, cfg.world_size)
        # ps-async's server counts one update per push: p per step.
        per_step = cfg.world_size if cfg.algo == "ps-async" else 1
        recorder = _Recorder(cfg, setup.steps * per_step, setup.sampler.steps_per_epoch * per_step,
                             per_step, show_progress, label, setup.params.size)  # fmt: skip
        model, data = setup.model, setup.data  # the host model (--device cuda replaces it)
    try:
        result = _worker_fn(cfg.algo)(comm, cfg, recorder, setup)
    finally:
        if recorder is not None:
            recorder.close()
    if recorder is not None:  # after training: the evaluation costs the run nothing
        result.extra["eval_curve"] = recorder.eval_curve(model, data)
        # where this run began: the checkpoint it resumed may be overwritten by now (a
        # restart resumes from the folder it writes to)
        result.extra["start_step"] = setup.start_step
    return result


COMM_SPANS = ("allreduce", "push", "pull")  # the timeline spans that are communication


def summarise(cfg: TrainConfig, results: list[WorkerResult], wall: float) -> dict[str, Any]:
    """summary.json: what happened, measured."""
    from pipesgd_ref.trace import hidden_fraction

    events = [e for r in results for e in r.events]
    answer = results[0]  # rank 0: a ring rank, or the parameter server (its weights count)
    workers = results[1:] if is_ps(cfg.algo) else results
    ends = np.array(workers[0].step_end)
    return _summary(
        cfg,
        wall,
        answer,
        worker_losses=np.array([r.losses for r in workers]),
        ends=ends,
        start=min(e["ts"] for e in events) / 1e6 if events else ends[0],
        compute_s=_durations(events, ("compute",)),
        comm_s=_durations(events, COMM_SPANS),
        hidden=hidden_fraction(events, COMM_SPANS),
        bytes_sent=[r.bytes_sent for r in results],
        identical=all(np.array_equal(r.params, answer.params) for r in results),
    )


def _durations(events: list[dict], names: tuple[str, ...]) -> list[float]:
    """Lengths in seconds of the spans called one of `names`."""
    return [e["dur"] / 1e6 for e in events if e["name"] in names]


def _median(values) -> float | None:
    return float(statistics.median(values)) if len(values) else None


def _summary(
    cfg: TrainConfig,
    wall: float,
    answer: WorkerResult,
    *,
    worker_losses: np.ndarray,
    ends: np.ndarray,
    start: float,
    compute_s,
    comm_s,
    hidden: float | None,
    bytes_sent: list[int],
    identical: bool,
) -> dict[str, Any]:
    """The summary from what it is made of, however that was collected (all WorkerResults in
    one process, or gathered over the ring in a joined job): rank 0's result `answer`, every
    worker's per-step losses (n_workers x steps), worker 0's step ends and the trace's start
    (perf_counter s, rank 0's clock), the compute and communication span lengths (s) of every
    rank, the share of communication hidden under computation, and per rank the bytes sent."""
    from pipesgd_ref.algorithms.worker import WorkerSetup

    setup = WorkerSetup.build(cfg.replace(resume=""), 0, cfg.world_size)  # the model and data
    start_step = answer.extra.get("start_step", 0)
    steps = worker_losses.shape[1]
    skip = min(steps - 1, cfg.warmup_steps + cfg.width + 1)  # steady state only
    iter_times = np.diff(ends[skip:]) if steps - skip > 1 else np.diff(ends)
    if not len(iter_times) and steps:  # one step: its time from the first span's start
        iter_times = np.array([ends[-1] - start])
    # the oracle's "mean worker loss" (a NaN loss left out by --skip-nonfinite is not averaged)
    with warnings.catch_warnings():  # a step where every loss was NaN stays NaN, silently
        warnings.simplefilter("ignore", RuntimeWarning)
        losses = np.nanmean(worker_losses, axis=0)
        tail = losses[-max(1, steps // 20) :]
        final_loss = float(np.nanmean(tail))
    test_accuracy = setup.model.accuracy(answer.params, setup.data.X_test, setup.data.y_test)
    eval_curve = [
        {"step": e["step"], "wall_time_s": float(e["time"] - start),
         "test_accuracy": e["test_accuracy"]}
        for e in answer.extra.get("eval_curve", [])
    ]  # fmt: skip
    return {
        "algo": cfg.algo,
        "world_size": cfg.world_size,
        "width": cfg.width,
        "codec": cfg.codec,
        "error_feedback": cfg.error_feedback,
        "codec_pull": cfg.codec_pull if is_ps(cfg.algo) else None,
        "steps": steps,
        "wall_time_s": wall,
        "iter_time_s": float(np.median(iter_times)) if len(iter_times) else None,
        "t_comp_s": _median(compute_s),
        "t_comm_s": _median(comm_s),
        "comm_hidden_fraction": hidden,
        "final_train_loss": final_loss,
        "test_accuracy": test_accuracy,
        **reaching_target(eval_curve, cfg.target_accuracy),
        "bytes_sent_per_rank": bytes_sent,
        "params_identical_on_all_ranks": identical,
        "staleness_histogram": _histogram(answer.extra.get("staleness")),
        # --skip-nonfinite: each step (ps-async: update) where gradients were left out, and
        # whose (ranks; in ps methods worker i is rank i + 1)
        "nonfinite_skipped": [
            {"step": int(t), "ranks": [int(r) for r in ranks]}
            for t, ranks in answer.extra.get("nonfinite_skipped", [])
        ],
        "config": cfg.to_dict(),
        "loss_curve": [
            {
                "step": start_step + t,
                "wall_time_s": float(ends[t] - start),
                "loss": float(losses[t]),
            }
            for t in range(steps)
        ],
        "eval_curve": eval_curve,
    }


def _histogram(values: list[int] | None) -> dict[str, int] | None:
    """{staleness: count} of the applied gradients (ps-async), keys as strings for JSON."""
    if values is None:
        return None
    counts = np.bincount(np.asarray(values, dtype=np.int64)) if values else np.zeros(0, int)
    return {str(k): int(c) for k, c in enumerate(counts) if c}


def _check_inputs(cfg: TrainConfig) -> None:
    """The data and the checkpoint to resume from, checked in this process: a bad spec is one
    line here rather than an error in every worker."""
    from pipesgd_ref.config import check_before_run

    data = load_dataset(cfg.dataset)
    MinibatchSampler(data.n_train, cfg.world_size, cfg.batch_size, cfg.seed)
    check_before_run(cfg, data)  # the model fits in memory, the link delivers a frame in time
    if cfg.resume:
        from pipesgd_ref.algorithms.worker import WorkerSetup
        from pipesgd_ref.errors import ConfigError

        setup = WorkerSetup.build(cfg, 0, cfg.world_size)  # loads and checks the checkpoint
        if setup.start_step >= setup.steps:
            raise ConfigError(
                f"--resume {cfg.resume}: the checkpoint is already at step {setup.start_step} "
                f"of {setup.steps}; nothing to do (raise --steps to train further)"
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
    width = f", width {cfg.width}" if cfg.algo == "pipe" else ""
    return (f"{cfg.algo}: {cfg.world_size} workers, {cfg.dataset}, {cfg.model}{width}, "
            f"link: {model if model.enabled else 'not emulated'}")  # fmt: skip


def _log_outcome(cfg: TrainConfig, summary: dict, wall: float, log) -> None:
    """The end-of-run lines: steps, time, iteration, loss, accuracy, and time to target."""
    log(
        f"{cfg.algo}: {summary['steps']} steps in {wall:.2f} s, iteration "
        f"{summary['iter_time_s'] * 1e3:.2f} ms, final train loss "
        f"{summary['final_train_loss']:.4f}, test accuracy {summary['test_accuracy']:.4f}"
    )
    if summary["time_to_target_s"] is not None:
        log(f"{cfg.algo}: test accuracy {cfg.target_accuracy:.2%} reached at step "
            f"{summary['steps_to_target']}, {summary['time_to_target_s']:.2f} s into "
            f"training")  # fmt: skip


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
    # own (WorkerSetup.to_device), and this process never makes one.
    start_method = "spawn" if cfg.device == "cuda" else "fork"
    if start_method == "fork":
        load_before_fork(cfg)
    stopped = None
    try:
        ran, results, restarts = _launch_with_restarts(
            cfg, dict(model=model, star=is_ps(cfg.algo), timeout=cfg.timeout,
                      start_method=start_method, master_port=cfg.master_port or None),
            (progress, label), log,
        )  # fmt: skip
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
    from pipesgd_ref import checkpoint, faults
    from pipesgd_ref.errors import JobStopped, WorkerFailed
    from pipesgd_ref.launch import launch_local

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
                        e.args = (f"{e.args[0]}\n(after {len(restarts)} restart(s), "
                                  f"--max-restarts {cfg.max_restarts})",)  # fmt: skip
                    raise
                saved = Path(cfg.out) / checkpoint.FILE if cfg.out else None
                ran = cfg.replace(resume=cfg.out) if saved and saved.is_file() else cfg
                from_step = _checkpoint_step(saved) if ran.resume else 0
                cause = e.errors.get(e.cause) if e.cause is not None else None
                cause = (cause or next(iter(e.errors.values()), "")).strip().splitlines()[-1]
                restarts.append({"restart": len(restarts) + 1, "cause_rank": e.cause,
                                 "cause": cause, "resumed_from_step": from_step})  # fmt: skip
                logging.getLogger("pipesgd.train").warning(
                    "restart %d of %d: %s; %s", len(restarts), cfg.max_restarts, cause,
                    f"resuming from step {from_step} ({saved})" if ran.resume
                    else "starting over (no checkpoint: --out DIR --checkpoint-every N)",
                )  # fmt: skip
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
    on its own: Numba and the codecs (0.3 s a process, measured; four workers on two cores
    made a 20-step run of the tiny preset take 1.1-1.6 s instead of 0.5-0.7 s) and the
    algorithm's module. Forked workers inherit it all."""
    from pipesgd_ref.codecs import get_codec

    get_codec(cfg.codec, cfg.codec_backend)
    _worker_fn(cfg.algo)


def run_training_joined(
    cfg: TrainConfig,
    progress: bool = True,
    log: Callable[[str], None] = print,
    bind: str | None = None,
):
    """Run cfg.algo as the one rank of a multi-host job that the environment describes
    (launch.detect_env: torchrun's, Open MPI's, MPICH's or SLURM's variables); every rank of
    the job runs this with the same config. Returns (summary, this rank's WorkerResult); the
    summary only on rank 0, None elsewhere.

    Each rank runs the same per-rank job as a local worker (`_train_job`), so a joined run
    ends with the same weights as `run_training` of the same config: bitwise for sync, pipe
    and ps-sync. Rank 0 then writes --out: summary.json (same keys as a local run) from what it
    gathers from every rank without pickle (`_gather_for_summary`: ring AllReduces of float64
    arrays), trace.json of rank 0's spans only (the others' stay on their hosts), and, for
    sync and pipe, checkpoint.npz as in a local run.

    Times: each rank measures from the moment the job formed (after the rendezvous, which
    every rank leaves within about a network round trip of the others), since the clocks of
    different hosts cannot be compared; wall_time_s counts training only, not process start.
    bind: the interface this rank's listeners use (default: loopback when MASTER_ADDR is
    loopback, else all interfaces).
    """
    from pipesgd_ref.config import link_model
    from pipesgd_ref.errors import CommError, JobStopped, LaunchError
    from pipesgd_ref.launch import ENV_CONVENTIONS, detect_env, join_from_env
    from pipesgd_ref.lifetime import LocalStop, worker_signals
    from pipesgd_ref.trace import chrome_trace

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
        size_var = next(size for _, size, source in ENV_CONVENTIONS if source == job.source)
        servers = 1 if is_ps(cfg.algo) else 0
        need = f"{cfg.world_size} workers" + (" + 1 server" if servers else "")
        fix = (f"pass --world-size={job.world_size - servers}" if job.world_size > servers
               else f"start at least {servers + 1} ranks")  # fmt: skip
        raise LaunchError(
            f"rank {job.rank}: the {job.source} job has {size_var}={job.world_size} ranks, but "
            f"{cfg.algo} with --world-size={cfg.world_size} needs {ranks} ({need}); start "
            f"{ranks} ranks, or {fix}"
        )
    _check_inputs(cfg)  # a bad data spec: one line on every rank, before any rank waits
    _check_device(cfg)
    model = link_model(cfg)
    # SIGINT, SIGTERM, SIGHUP: stop at the top of the next step (lifetime.LocalStop; the
    # launcher, torchrun, mpirun or srun, signals every rank). The ranks do not share memory
    # to agree on one step, so a rank whose peers stopped first sees them close: that is the
    # stop, not a failure. Rank 0 checkpoints where it can; else the last periodic one stands.
    plan = LocalStop()
    worker_signals(plan)
    comm = join_from_env(timeout=cfg.timeout, bind=bind, model=model, star=is_ps(cfg.algo))
    try:
        t0 = time.perf_counter()  # "the job formed", on this rank's clock
        tag_log_lines(comm.rank)
        if comm.rank == 0:
            log(f"{_describe(cfg, model)}; {ranks} ranks joined from {job.source} variables "
                f"at {job.master_addr}:{job.master_port}")  # fmt: skip
        try:
            result = _train_job(comm, cfg, progress)
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
        gathered = _gather_for_summary(comm, result, t0)
    finally:
        comm.close()
    if comm.rank != 0:
        return None, result
    summary = _summary_of_gathered(cfg, wall, result, gathered, t0)
    _log_outcome(cfg, summary, wall, log)
    if not is_ps(cfg.algo) and not summary["params_identical_on_all_ranks"]:
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


def fingerprint(params: np.ndarray) -> float:
    """48 bits of the SHA-256 of the weights' bytes, as a float64 (exact: below 2^53): two
    ranks' weights are bitwise equal when their fingerprints are (up to a 2^-48 collision)."""
    digest = hashlib.sha256(np.ascontiguousarray(params).tobytes()).digest()
    return float(int.from_bytes(digest[:6], "big"))


# The per-rank numbers of `_gather_for_summary`, in this order.
_SCALARS = ("fingerprint", "bytes_sent", "hidden_s", "comm_s", "first_span")


def _gather_for_summary(comm, result: WorkerResult, t0: float) -> dict[str, list[np.ndarray]]:
    """What rank 0's summary needs from every rank, via `allgather` (float64 arrays, no
    pickle): per rank the _SCALARS (the weights' fingerprint, bytes sent, the communication
    time hidden under computation and its total, the first span's start), its per-step losses
    and step ends, and the lengths of its compute and communication spans. Times are seconds
    since this rank's t0; the whole gather is a few AllReduces of about 8 x steps bytes per
    rank. Rank 0's own events stay whole (trace.json); the others' never leave their hosts."""
    from pipesgd_ref.trace import hidden_fraction

    events = result.events
    comm_s = _durations(events, COMM_SPANS)
    hidden = (hidden_fraction(events, COMM_SPANS) or 0.0) * sum(comm_s)
    first = min(e["ts"] for e in events) / 1e6 - t0 if events else np.inf  # inf: no spans
    scalars = [fingerprint(result.params), result.bytes_sent, hidden, sum(comm_s), first]
    return {
        "scalars": allgather(comm, np.array(scalars, np.float64)),
        "losses": allgather(comm, np.asarray(result.losses, np.float64)),
        "step_end": allgather(comm, np.asarray(result.step_end, np.float64) - t0),
        "compute_s": allgather(comm, np.array(_durations(events, ("compute",)), np.float64)),
        "comm_s": allgather(comm, np.array(comm_s, np.float64)),
    }


def _summary_of_gathered(
    cfg: TrainConfig, wall: float, answer: WorkerResult, gathered: dict, t0: float
) -> dict[str, Any]:
    """Rank 0's summary of a joined job: `_summary` from rank 0's own result and what
    `_gather_for_summary` brought from the others (times moved onto rank 0's clock)."""
    scalars = [dict(zip(_SCALARS, row, strict=True)) for row in gathered["scalars"]]
    workers = range(1, len(scalars)) if is_ps(cfg.algo) else range(len(scalars))
    ends = gathered["step_end"][workers[0]] + t0
    first = min(s["first_span"] for s in scalars)
    comm_total = sum(s["comm_s"] for s in scalars)
    return _summary(
        cfg,
        wall,
        answer,
        worker_losses=np.array([gathered["losses"][r] for r in workers]),
        ends=ends,
        start=t0 + first if math.isfinite(first) else ends[0],
        compute_s=np.concatenate(gathered["compute_s"]),
        comm_s=np.concatenate(gathered["comm_s"]),
        hidden=sum(s["hidden_s"] for s in scalars) / comm_total if comm_total > 0 else None,
        bytes_sent=[int(s["bytes_sent"]) for s in scalars],
        identical=all(s["fingerprint"] == scalars[0]["fingerprint"] for s in scalars),
    )
