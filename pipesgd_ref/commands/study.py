"""`pipesgd compare --study staleness --model mlp` (or softmax, cnn): where Pipe-SGD's one-step
delay costs accuracy with plain SGD, and how much each compensation pays back.

The same problem is trained at several learning rates by sync, pipe (width 2: staleness one),
pipe+dc, pipe+dc-adaptive and pipe+predict (methods/compensation.py), for the same number of
steps. Each run is the method's one-process oracle (methods/reference.py: delayed_sgd with
the compensation), which the distributed runs equal bitwise for p <= 2 and to float32 rounding
beyond (tests/test_compensation.py): the study measures accuracy, not speed, and the oracles are
p times cheaper than p processes on shared cores. For each run: the final test accuracy (or
"diverged": the loss went non-finite), the steps to the target accuracy (evaluated every
`eval_every` steps), and the predicted time to it: those steps times the method's iteration
time from the timing equations (timing/iteration.py) on a cluster of p machines, one worker
each, on the config's link, with compute timed in this process (as `pipesgd predict` does by
default).

The theory's marks. On a quadratic, plain staleness one is stable for lr * lam_max < 1 and sync
(and, with identical workers, predict) for lr * lam_max < 2 (compensation.py derives them). The
study estimates lam_max, the largest eigenvalue of the Hessian of the training loss (the mean
over the p workers' first minibatches) at w_0, by power iteration on finite-difference
Hessian-vector products (`hessian_lam_max`), and marks lr = 1 / lam_max and 2 / lam_max on the
plot. A net's Hessian changes as it trains (on the compare preset's MLP, lam_max falls by an
order of magnitude within the study's steps), so these are the starting point's bounds, not a
promise for every step, and the net trains at rates far past them. What carries over is the
ratio: the plot also marks half of sync's measured edge, where the theory puts
pipe's. Each method's measured edge (`edges`) is the largest lr before a run that diverged or
ended below half the study's best accuracy.

The same question on a deep net with momentum, SAPipe's setting, is what `--study staleness`
runs when the command line names no other model: study_momentum.py, which reuses this module's
runs, edges and recovered shares.

Output (in --out): study.json (the problem, lam_max, the bounds, every run's figures, the
table) and, with matplotlib, staleness_study.png: final test accuracy and predicted time to
target against the learning rate, one line per method.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pipesgd_ref import timing
from pipesgd_ref.config import TrainConfig, model_label
from pipesgd_ref.data import load_dataset
from pipesgd_ref.errors import ConfigError
from pipesgd_ref.methods.optimizer import SGD
from pipesgd_ref.methods.reference import delayed_sgd, model_grad_fn, sync_sgd
from pipesgd_ref.outputs import write_json
from pipesgd_ref.plots import method_style, pyplot, save_figure
from pipesgd_ref.runtime.preflight import check_config, check_memory, n_params_of
from pipesgd_ref.runtime.worker import Worker
from pipesgd_ref.timing.calibrate import cluster_calibration

# (label, width, compensation): the methods the study compares
METHODS = (
    ("sync", 1, "none"),
    ("pipe", 2, "none"),
    ("pipe+dc", 2, "dc"),
    ("pipe+dc-adaptive", 2, "dc-adaptive"),
    ("pipe+predict", 2, "predict"),
)
# the study's default problem: the compare preset as it is (digits, MLP 1024-1024, 4 workers
# of batch 352, 40 steps), at learning rates on both sides of pipe's and of sync's edges, pipe's
# below sync's (README: "Staleness")
LRS = (0.1, 0.3, 0.5, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4)
QUICK_LRS = (0.3, 0.8, 1.0, 1.2)
GAP_KEYS = ("lr", "sync", "pipe", "gap")  # a `recovered` entry's keys besides the compensations
BOUND_STYLES = {"pipe": "--", "sync": ":"}  # the plot's line for each stability bound at w_0


def hessian_lam_max(cfg: TrainConfig, iters: int = 30, eps: float = 1e-3) -> float:
    """The largest eigenvalue of the Hessian of the training loss at w_0 (the mean loss of the
    p workers on their minibatch 0), by power iteration: H v ~ (g(w + e v) - g(w - e v)) / 2e
    in float64 (central differences of the model's own gradient)."""
    worker = Worker.build(cfg, 0, cfg.world_size)
    grad_fn = model_grad_fn(worker.model, worker.data, worker.sampler)
    w0 = worker.params.astype(np.float64)

    def grad(w: np.ndarray) -> np.ndarray:
        total = np.zeros_like(w)
        for r in range(cfg.world_size):
            total += grad_fn(w.astype(np.float32), r, 0)[1]
        return total / cfg.world_size

    rng = np.random.default_rng(cfg.seed)
    v = rng.standard_normal(w0.size)
    v /= np.linalg.norm(v)
    lam = 0.0
    for _ in range(iters):
        hv = (grad(w0 + eps * v) - grad(w0 - eps * v)) / (2 * eps)
        lam = float(v @ hv)
        norm = np.linalg.norm(hv)
        if norm == 0:
            break
        v = hv / norm
    return lam


def run_one(
    cfg: TrainConfig,
    width: int,
    compensation: str,
    lr: float,
    average: Callable | None = None,
    watch: Callable[[int, np.ndarray], None] | None = None,
) -> dict[str, Any]:
    """One oracle run: final test accuracy (None when it diverged), steps to the target. With
    batch norm (the resnet) worker 0's forward passes keep the running statistics
    (model_grad_fn's `buffers`), and every evaluation uses them. `average` (width 1 only):
    how sync's mean is summed (reference.sync_sgd's; ddp's bucket by bucket). `watch(steps
    done, weights)`: called after every step (before the drain)."""
    run = cfg.replace(lr=lr, width=width, compensation=compensation)
    worker = Worker.build(run, 0, run.world_size)
    model, data = worker.model, worker.data
    buffers = model.init_buffers()  # empty for a model without batch norm
    grad_fn = model_grad_fn(model, data, worker.sampler, buffers)
    evals: list[tuple[int, float]] = []

    class Diverged(Exception):
        pass

    def on_step(step: int, params: np.ndarray, loss: float) -> None:
        if not math.isfinite(loss):
            raise Diverged
        done = step + 1
        if run.eval_every and done % run.eval_every == 0:
            evals.append((done, model.accuracy(params, data.X_test, data.y_test, buffers=buffers)))
        if watch is not None:
            watch(done, params)

    common: dict[str, Any] = dict(callback=on_step, optimizer=SGD.of(run))
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            if average is not None:
                if width != 1:
                    raise ValueError(f"`average` is sync's (width 1), not width {width}'s")
                traj = sync_sgd(
                    grad_fn, worker.params, run.world_size, worker.steps, worker.lr_at,
                    average=average, **common,
                )  # fmt: skip
            else:
                traj = delayed_sgd(
                    grad_fn, worker.params, run.world_size, worker.steps, worker.lr_at,
                    staleness=width - 1, compensation=compensation, dc_lambda=run.dc_lambda,
                    **common,
                )  # fmt: skip
            if not (np.all(np.isfinite(traj.params)) and np.all(np.isfinite(buffers))):
                raise Diverged
            accuracy = model.accuracy(traj.params, data.X_test, data.y_test, buffers=buffers)
    except Diverged:
        return {"test_accuracy": None, "diverged": True, "steps_to_target": None}
    reached = next((s for s, a in evals if a >= run.target_accuracy), None)
    return {"test_accuracy": accuracy, "diverged": False, "steps_to_target": reached}


def cluster_iteration_times(cfg: TrainConfig) -> dict[str, float]:
    """Each method's predicted iteration time on p machines (one worker each) on cfg's link."""
    cal = cluster_calibration(cfg)

    def iteration(width: int, compensation: str) -> float:  # sync is the pipe of width 1
        return timing.predict(
            "pipe", cfg.world_size, cal, width=width, compensation=compensation
        ).iter_time_s

    return {label: iteration(width, compensation) for label, width, compensation in METHODS}


def run_staleness_study(
    cfg: TrainConfig,
    lrs=LRS,
    methods=METHODS,
    out: str | Path | None = "runs/study",
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Every method of `methods` at every lr of `lrs` on cfg's problem; returns (and writes to
    `out`) what study.json holds."""
    for _, width, compensation in methods:  # every run's options, before the first run
        check_config(cfg.replace(width=width, compensation=compensation))
    check_memory(cfg, n_params_of(cfg, load_dataset(cfg.dataset)))  # a huge --hidden: one line
    started = time.perf_counter()
    log(
        f"staleness study: {cfg.world_size} workers, {cfg.dataset}, {model_label(cfg)}, batch "
        f"{cfg.batch_size}, {cfg.steps} steps, lr {', '.join(f'{lr:g}' for lr in lrs)}"
    )
    lam = hessian_lam_max(cfg)
    bounds = {"pipe": 1.0 / lam, "sync": 2.0 / lam} if lam > 0 else {}
    log(
        f"  lam_max of the Hessian at w_0: {lam:.3g}; stability (quadratic theory): pipe "
        f"lr < {bounds.get('pipe', math.inf):.3g}, sync and predict lr < "
        f"{bounds.get('sync', math.inf):.3g}"
    )
    iters = cluster_iteration_times(cfg)
    rows = []
    for label, width, compensation in methods:
        for lr in lrs:
            got = run_one(cfg, width, compensation, lr)
            steps = got["steps_to_target"]
            ttt = None if steps is None else steps * iters[label]
            row = {"method": label, "lr": lr, **got, "iter_time_s": iters[label]}
            rows.append({**row, "time_to_target_s": ttt})
        log("  " + label + ": " + ", ".join(_cell(r) for r in rows if r["method"] == label))
    report = {
        "kind": "staleness-study",
        "config": cfg.to_dict(),
        "lrs": list(lrs),
        "methods": [m[0] for m in methods],
        "lam_max": lam,
        "bounds": bounds,
        "rows": rows,
        "edges": edges(rows),
        "recovered": recovered(rows, methods),
        "wall_time_s": time.perf_counter() - started,
    }
    log("")
    log(format_table(report))
    if out:
        write_study(report, Path(out), plot_study, "staleness_study.png", log)
    return report


def parse_lrs(text: str) -> tuple[float, ...]:
    """--lrs: a comma list of distinct positive learning rates (a ConfigError otherwise)."""
    try:
        lrs = tuple(float(x) for x in text.split(","))
    except ValueError:
        lrs = ()
    if not lrs or not all(math.isfinite(x) and x > 0 for x in lrs):
        raise ConfigError(
            f"--lrs {text!r}: give a comma list of positive learning rates, e.g. --lrs 0.1,0.5,1"
        )
    if len(set(lrs)) != len(lrs):
        raise ConfigError(f"--lrs {text!r} names a learning rate more than once")
    return lrs


def write_study(report: dict, out: Path, plot: Callable, figure: str, log: Callable) -> None:
    """study.json and, with matplotlib, the figure `plot` draws, in `out`; logged."""
    write_json(out / "study.json", report)
    drawn = plot(report, out / figure)
    log(f"wrote {out / 'study.json'}" + (f" and {drawn}" if drawn else " (no matplotlib)"))


def _cell(row: dict) -> str:
    acc = "diverged" if row["diverged"] else f"{row['test_accuracy']:.3f}"
    return f"{row['lr']:g}: {acc}"


def _failure(rows: list[dict]) -> Callable[[dict], bool]:
    """Whether a run failed: it diverged or ended below half the best test accuracy of the
    study's `rows` (a network whose loss stays finite can still have stopped learning)."""
    best = max((r["test_accuracy"] for r in rows if not r["diverged"]), default=0.0)
    return lambda r: r["diverged"] or r["test_accuracy"] < best / 2


def edges(rows: list[dict]) -> dict[str, float | None]:
    """Each method's measured edge: the largest lr below its first failure (`_failure`); None
    where it failed at the smallest lr."""
    failed = _failure(rows)
    out = {}
    for method in dict.fromkeys(r["method"] for r in rows):
        ok = None
        for r in sorted((r for r in rows if r["method"] == method), key=lambda r: r["lr"]):
            if failed(r):
                break
            ok = r["lr"]
        out[method] = ok
    return out


def recovered(rows: list[dict], methods=METHODS) -> list[dict]:
    """At each lr where sync trains (edges' sense) and plain pipe ends at least one point below
    it, or diverges: how much of the gap each compensation of `methods` closes (1 = all of it;
    negative: it did worse than plain pipe)."""
    compensated = [label for label, _, compensation in methods if compensation != "none"]
    by = {(r["method"], r["lr"]): r for r in rows}
    failed = _failure(rows)
    out = []
    for lr in sorted({r["lr"] for r in rows}):
        sync, pipe = by.get(("sync", lr)), by.get(("pipe", lr))
        if sync is None or pipe is None or failed(sync):
            continue
        pipe_acc = 0.0 if pipe["diverged"] else pipe["test_accuracy"]
        gap = sync["test_accuracy"] - pipe_acc
        if gap < 0.01:
            continue
        entry = {"lr": lr, "sync": sync["test_accuracy"], "pipe": pipe["test_accuracy"], "gap": gap}
        for label in compensated:
            r = by.get((label, lr))
            if r is not None:
                acc = 0.0 if r["diverged"] else r["test_accuracy"]
                entry[label] = (acc - pipe_acc) / gap
        out.append(entry)
    return out


def format_table(report: dict) -> str:
    """Final test accuracy (or 'div'), one row per lr, one column per method."""
    methods, lrs = report["methods"], report["lrs"]
    by = {(r["method"], r["lr"]): r for r in report["rows"]}
    width = max(8, *(len(m) for m in methods))
    head = f"{'lr':>6} " + " ".join(f"{m:>{width}}" for m in methods)
    title = f"final test accuracy after {report['config']['steps']} steps ('div': diverged)"
    lines = [title, head, "-" * len(head)]
    for lr in lrs:
        cells = []
        for m in methods:
            r = by[(m, lr)]
            acc = "div" if r["diverged"] else format(r["test_accuracy"], ".4f")
            cells.append(f"{acc:>{width}}")
        lines.append(f"{lr:>6g} " + " ".join(cells))
    edge = report["edges"]
    edges_text = ", ".join(
        f"{m} {'-' if edge[m] is None else format(edge[m], 'g')}" for m in methods
    )
    lines.append(
        "measured edge (largest lr before a run diverges or ends below half the best "
        "accuracy): " + edges_text
    )
    b = report["bounds"]
    if b:
        lines.append(
            f"theory (lam_max {report['lam_max']:.3g} at w_0): pipe stable for lr < "
            f"{b['pipe']:.3g}, sync and predict for lr < {b['sync']:.3g}"
        )
    for e in report["recovered"]:
        # the entry's other keys are the compensations, each with its share of the gap
        share = ", ".join(f"{k} {v:.0%}" for k, v in e.items() if k not in GAP_KEYS)
        pipe = "diverged" if e["pipe"] is None else f"{e['pipe']:.4f}"
        lines.append(
            f"lr {e['lr']:g}: pipe {pipe} vs sync {e['sync']:.4f}; of that gap recovered: {share}"
        )
    return "\n".join(lines)


def plot_study(report: dict, path: Path) -> Path | None:
    """Final test accuracy and predicted time to target against lr, the bounds marked."""
    plt = pyplot()
    if plt is None:
        return None
    fig, (acc_ax, time_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    for m in report["methods"]:
        rows = [r for r in report["rows"] if r["method"] == m]
        lrs = [r["lr"] for r in rows]
        acc = [np.nan if r["diverged"] else r["test_accuracy"] for r in rows]
        ttt = [np.nan if r["time_to_target_s"] is None else r["time_to_target_s"] for r in rows]
        acc_ax.plot(lrs, acc, marker="o", label=m, **method_style(m))
        time_ax.plot(lrs, ttt, marker="o", label=m, **method_style(m))
    marks = [
        (lr, f"{name} bound at w_0", BOUND_STYLES[name]) for name, lr in report["bounds"].items()
    ]
    sync_edge = report["edges"].get("sync")
    if sync_edge:  # the theory's ratio, read from the measured edge: pipe's at half of sync's
        marks.append((sync_edge / 2, "sync's edge / 2", "-."))
    for ax in (acc_ax, time_ax):
        for lr, text, style in marks:
            ax.axvline(lr, color="gray", linestyle=style, linewidth=1)
            ax.text(
                lr,
                0.02,
                f" {text}",
                transform=ax.get_xaxis_transform(),
                fontsize=7,
                va="bottom",
                rotation=90,
                color="gray",
            )
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
    acc_ax.set_ylabel("final test accuracy (missing: diverged)")
    time_ax.set_ylabel(f"predicted time to {report['config']['target_accuracy']:.0%} (s)")
    acc_ax.legend(fontsize=8)
    c = report["config"]
    fig.suptitle(f"staleness study: {c['world_size']} workers, {c['dataset']}, {c['steps']} steps")
    return save_figure(fig, path)  # announced, and shown inline in a notebook
