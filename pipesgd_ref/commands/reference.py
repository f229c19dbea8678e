"""`pipesgd reference`: the one-process oracle of a config, the yardstick a distributed run is
compared against (methods/reference.py's delayed SGD of cfg.width: sync for width 1, Pipe-SGD's
staleness K - 1 otherwise), with the same progress, evaluation and summary.json as a run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pipesgd_ref.config import TrainConfig
from pipesgd_ref.logs import progress_bar
from pipesgd_ref.methods.optimizer import SGD, schedule
from pipesgd_ref.methods.reference import delayed_sgd, model_grad_fn
from pipesgd_ref.outputs import write_json
from pipesgd_ref.runtime.inputs import JobInputs
from pipesgd_ref.runtime.summary import reaching_target
from pipesgd_ref.runtime.worker import diverged


class Curves:
    """The loss and test-accuracy curves of a one-process run, with its progress bar: what
    delayed_sgd calls after each step (`on_step`), and the evaluations every cfg.eval_every."""

    def __init__(self, cfg: TrainConfig, inputs: JobInputs, label: str, progress: bool, log):
        self.cfg, self.inputs, self.label, self.log = cfg, inputs, label, log
        # Batch norm's running statistics (empty without it): worker 0's, which its forward
        # passes update (model_grad_fn), and every evaluation uses, as in a distributed run.
        self.buffers = inputs.model.init_buffers()
        self.loss_curve: list[dict] = []
        self.eval_curve: list[dict] = []
        self.bar = progress_bar(inputs.steps, label, enabled=progress)
        self.samples_per_step = cfg.world_size * cfg.batch_size
        self.start = time.perf_counter()

    def evaluate(self, step: int, params: np.ndarray) -> float:
        data = self.inputs.data
        acc = self.inputs.model.accuracy(params, data.X_test, data.y_test, buffers=self.buffers)
        elapsed = time.perf_counter() - self.start
        self.eval_curve.append({"step": step, "wall_time_s": elapsed, "test_accuracy": acc})
        return acc

    def on_step(self, step: int, params: np.ndarray, loss: float) -> None:
        if not math.isfinite(loss):
            self.bar.close()
            raise diverged(self.label, f"the training loss is {loss} at step {step}", self.cfg)
        elapsed = time.perf_counter() - self.start
        self.loss_curve.append({"step": step, "wall_time_s": elapsed, "loss": loss})
        self.bar.update(1)
        rate = self.samples_per_step * (step + 1) / elapsed
        self.bar.set_postfix(loss=f"{loss:.4f}", samples_s=f"{rate:.0f}")
        done, steps, every = step + 1, self.inputs.steps, self.cfg.eval_every
        if every and done % every == 0 and done < steps:
            acc = self.evaluate(done, params)
            self.log(f"{self.label}: step {done}/{steps} loss {loss:.4f} test accuracy {acc:.4f}")


def run_reference(
    cfg: TrainConfig,
    progress: bool = True,
    log: Callable[[str], None] = print,
    label: str | None = None,
) -> dict[str, Any]:
    """Train with the one-process oracle of cfg.width; return (and maybe write) the summary."""
    inputs = JobInputs.load(cfg, resume=False)  # the oracle always starts from w_0
    data, model, steps = inputs.data, inputs.model, inputs.steps
    algo = "reference-sync" if cfg.width == 1 else f"reference-pipe(width={cfg.width})"
    label = label or algo
    log(
        f"{label}: {model} on {data.name} ({data.n_train} train / {data.n_test} test), "
        f"{cfg.world_size} workers x batch {cfg.batch_size}, {steps} steps, lr {cfg.lr}"
    )
    curves = Curves(cfg, inputs, label, progress, log)
    # A diverging run overflows before its loss turns inf; on_step reports that as one clear
    # error, so NumPy's own overflow warnings would only be noise on the way.
    with np.errstate(over="ignore", invalid="ignore"):
        traj = delayed_sgd(
            model_grad_fn(model, data, inputs.sampler, curves.buffers),
            model.init_params(cfg.seed),
            cfg.world_size,
            steps,
            schedule(cfg, steps),  # lr_t over this run's steps (cosine's horizon)
            staleness=cfg.width - 1,
            warmup_steps=cfg.warmup_steps,
            callback=curves.on_step,
            compensation=cfg.compensation,
            dc_lambda=cfg.dc_lambda,
            optimizer=SGD.of(cfg),  # --momentum, --nesterov, --weight-decay
        )
    curves.bar.close()
    final_acc = curves.evaluate(steps, traj.params)
    wall = time.perf_counter() - curves.start
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
        **reaching_target(curves.eval_curve, cfg.target_accuracy),
        "n_params": model.n_params,
        "loss_curve": curves.loss_curve,
        "eval_curve": curves.eval_curve,
        "config": cfg.to_dict(),
    }
    log(
        f"{label}: done in {wall:.2f} s, final train loss {summary['final_train_loss']:.4f}, "
        f"test accuracy {final_acc:.4f}"
    )
    if cfg.out:
        write_json(Path(cfg.out) / "summary.json", summary)
    return summary
