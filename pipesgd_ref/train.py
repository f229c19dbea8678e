"""Run a training job from a TrainConfig and summarise it.

For now every run is the one-process reference (algorithms/reference.py): p workers emulated in
this process, synchronous (width 1) or pipelined with staleness width - 1. The distributed
implementations (worker processes over TCP) will run the same configs and write the same
summary, so a reference run is also the yardstick a distributed run is compared against.

The summary (a dict, written as DIR/summary.json when `cfg.out` is set) holds: algo,
world_size, width, steps, wall_time_s, final_train_loss, test_accuracy, steps_to_target and
time_to_target_s (first evaluation at or above cfg.target_accuracy), loss_curve (a list of
{step, wall_time_s, loss}), eval_curve (a list of {step, wall_time_s, test_accuracy}), config.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pipesgd_ref.algorithms.reference import delayed_sgd, model_grad_fn
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.data import MinibatchSampler, load_dataset
from pipesgd_ref.models import build_model


class TrainingDiverged(RuntimeError):
    """The loss became NaN or Inf: the run stopped instead of training on garbage."""


def total_steps(cfg: TrainConfig, sampler: MinibatchSampler) -> int:
    """cfg.steps, or cfg.epochs passes over each worker's shard when epochs > 0."""
    if cfg.epochs > 0:
        return max(1, math.ceil(cfg.epochs * sampler.steps_per_epoch))
    return cfg.steps


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
    steps = total_steps(cfg, sampler)
    algo = "reference-sync" if cfg.width == 1 else f"reference-pipe(width={cfg.width})"
    label = label or algo
    log(
        f"{label}: {model} on {data.name} ({data.n_train} train / {data.n_test} test), "
        f"{cfg.world_size} workers x batch {cfg.batch_size}, {steps} steps, lr {cfg.lr}"
    )

    loss_curve: list[dict] = []
    eval_curve: list[dict] = []
    target: dict[str, float | int | None] = {"step": None, "time": None}
    bar = _progress_bar(steps, label, enabled=progress)
    samples_per_step = cfg.world_size * cfg.batch_size
    start = time.perf_counter()

    def evaluate(step: int, params: np.ndarray) -> float:
        acc = model.accuracy(params, data.X_test, data.y_test)
        elapsed = time.perf_counter() - start
        eval_curve.append({"step": step, "wall_time_s": elapsed, "test_accuracy": acc})
        if target["step"] is None and acc >= cfg.target_accuracy:
            target.update(step=step, time=elapsed)
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
        "target_accuracy": cfg.target_accuracy,
        "steps_to_target": target["step"],
        "time_to_target_s": target["time"],
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
