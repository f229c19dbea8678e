"""Run a training job from a TrainConfig and summarise it.

`run_training` runs cfg.algo in worker processes over TCP (sync, pipe; the parameter server
methods join as they land); `run_reference` runs the one-process oracle of the same config, the
yardstick the distributed run is compared against.

The summary (a dict, written as DIR/summary.json when `cfg.out` is set) holds: algo,
world_size, width, steps, wall_time_s, final_train_loss, test_accuracy, steps_to_target and
time_to_target_s (first evaluation at or above cfg.target_accuracy), loss_curve (a list of
{step, wall_time_s, loss}), eval_curve (a list of {step, wall_time_s, test_accuracy}), config.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pipesgd_ref.algorithms.reference import delayed_sgd, model_grad_fn
from pipesgd_ref.algorithms.worker import TrainingDiverged, WorkerResult, steps_for
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.data import MinibatchSampler, load_dataset
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
        setup = WorkerSetup.build(cfg, 0, cfg.world_size)
        # ps-async's server counts one update per push: p per step.
        per_step = cfg.world_size if cfg.algo == "ps-async" else 1
        recorder = _Recorder(cfg, setup.steps * per_step, setup.sampler.steps_per_epoch * per_step,
                             per_step, show_progress, label, setup.params.size)  # fmt: skip
    try:
        result = _worker_fn(cfg.algo)(comm, cfg, recorder)
    finally:
        if recorder is not None:
            recorder.close()
    if recorder is not None:  # after training: the evaluation costs the run nothing
        result.extra["eval_curve"] = recorder.eval_curve(setup.model, setup.data)
    return result


def summarise(cfg: TrainConfig, results: list[WorkerResult], wall: float) -> dict[str, Any]:
    """summary.json: what happened, measured."""
    from pipesgd_ref.algorithms.worker import WorkerSetup
    from pipesgd_ref.trace import hidden_fraction, median_duration

    setup = WorkerSetup.build(cfg, 0, cfg.world_size)
    events = [e for r in results for e in r.events]
    answer = results[0]  # rank 0: a ring rank, or the parameter server (its weights count)
    workers = results[1:] if is_ps(cfg.algo) else results
    steps = len(workers[0].losses)
    ends = np.array(workers[0].step_end)
    skip = min(steps - 1, cfg.warmup_steps + cfg.width + 1)  # steady state only
    iter_times = np.diff(ends[skip:]) if steps - skip > 1 else np.diff(ends)
    losses = np.mean([r.losses for r in workers], axis=0)  # the oracle's "mean worker loss"
    tail = losses[-max(1, steps // 20) :]
    start = min(e["ts"] for e in events) / 1e6 if events else ends[0]
    comm_names = ("allreduce", "push", "pull")
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
        "t_comp_s": median_duration(events, ("compute",)),
        "t_comm_s": median_duration(events, comm_names),
        "comm_hidden_fraction": hidden_fraction(events, comm_names),
        "final_train_loss": float(np.mean(tail)),
        "test_accuracy": test_accuracy,
        **reaching_target(eval_curve, cfg.target_accuracy),
        "bytes_sent_per_rank": [r.bytes_sent for r in results],
        "params_identical_on_all_ranks": all(
            np.array_equal(r.params, answer.params) for r in results
        ),
        "staleness_histogram": _histogram(answer.extra.get("staleness")),
        "config": cfg.to_dict(),
        "loss_curve": [
            {
                "step": setup.start_step + t,
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


def run_training(
    cfg: TrainConfig,
    progress: bool = True,
    log: Callable[[str], None] = print,
    label: str | None = None,
):
    """Run cfg.algo on cfg.world_size local worker processes; return (summary, results).
    `label` names the run on its progress bar (default: the algo)."""
    from pipesgd_ref.config import link_model
    from pipesgd_ref.launch import launch_local
    from pipesgd_ref.trace import chrome_trace

    data = load_dataset(cfg.dataset)  # bad data specs fail here, in one line, before any fork
    MinibatchSampler(data.n_train, cfg.world_size, cfg.batch_size, cfg.seed)
    if cfg.resume:
        from pipesgd_ref.algorithms.worker import WorkerSetup
        from pipesgd_ref.config import ConfigError

        setup = WorkerSetup.build(cfg, 0, cfg.world_size)  # loads and checks the checkpoint
        if setup.start_step >= setup.steps:
            raise ConfigError(
                f"--resume {cfg.resume}: the checkpoint is already at step {setup.start_step} "
                f"of {setup.steps}; nothing to do (raise --steps to train further)"
            )
    model = link_model(cfg)
    width = f", width {cfg.width}" if cfg.algo == "pipe" else ""
    log(f"{cfg.algo}: {cfg.world_size} workers, {cfg.dataset}, {cfg.model}{width}, "
        f"link: {model if model.enabled else 'not emulated'}")  # fmt: skip
    start = time.perf_counter()
    ranks = cfg.world_size + 1 if is_ps(cfg.algo) else cfg.world_size
    job_args = (cfg, progress, label)
    results = launch_local(ranks, _train_job, job_args, model=model, star=is_ps(cfg.algo),
                           timeout=cfg.timeout, start_method="fork")  # fmt: skip
    wall = time.perf_counter() - start
    summary = summarise(cfg, results, wall)
    log(
        f"{cfg.algo}: {summary['steps']} steps in {wall:.2f} s, iteration "
        f"{summary['iter_time_s'] * 1e3:.2f} ms, final train loss "
        f"{summary['final_train_loss']:.4f}, test accuracy {summary['test_accuracy']:.4f}"
    )
    if summary["time_to_target_s"] is not None:
        log(f"{cfg.algo}: test accuracy {cfg.target_accuracy:.2%} reached at step "
            f"{summary['steps_to_target']}, {summary['time_to_target_s']:.2f} s into "
            f"training")  # fmt: skip
    if cfg.out:
        out = Path(cfg.out)
        write_json(out / "summary.json", summary)
        write_json(out / "trace.json", chrome_trace([e for r in results for e in r.events]))
        log(f"wrote {out / 'summary.json'} and {out / 'trace.json'}")
    return summary, results
