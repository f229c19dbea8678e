"""`pipesgd compare --study staleness`: where staleness costs accuracy, on a deep net with
momentum (SAPipe's setting in miniature). With `--model mlp`, softmax or cnn the study is
study.py's plain-SGD sweep of that model instead.

SAPipe (Chen et al., NeurIPS 2022) reimplemented Pipe-SGD and trained CIFAR-10 with momentum
SGD: staleness one cost a ResNet-50 3.9 points of test accuracy and a VGG-16 1.9, and weight
prediction won them back (their figures: `SAPIPE`). The staleness study of study.py trains an
MLP with plain SGD; this one trains the residual net with batch norm (models/resnet.py) at
momentum 0 and 0.9, and asks the same question.

The methods (`METHODS`): sync, ddp, pipe (width 2: staleness one), pipe+dc and pipe+predict
(methods/compensation.py). Each run is its one-process oracle (methods/reference.py), which the
distributed runs equal bitwise: sync_sgd, delayed_sgd with the compensation, and for ddp
sync_sgd with each bucket's mean summed in the ring's order (`ddp_average`), its own oracle.
ddp computes sync's update, so its column is the check that it does: after one step its
weights lie within float32 rounding of sync's (each ddp row keeps `weights_gap_to_sync`, the
largest difference over the largest weight after 1, 10, 100, ... steps). Training then
amplifies that difference as it would any other (measured: 1e-7 after one step, 20% of the
largest weight after 200), so two runs of the same update end with different weights, and
their final accuracies differ by up to 2 points: ddp's column is the spread of one run's result
from rounding alone, the noise floor under any small difference in the table. Worker 0's
forward passes keep batch norm's running statistics (reference.model_grad_fn's buffers), and
every evaluation uses them (study.run_one).

The grid is of effective steps. Heavy ball's velocity sums the gradients with weights 1, M,
M^2, ...: a steady gradient moves the weights by lr / (1 - M) per step, the effective step
eta = lr / (1 - M). The study runs each eta of `EFFECTIVE_LRS` at each momentum M, with
lr = eta (1 - M), so the two momenta are compared at the same speed. On a quadratic of
curvature lam, with x = lr lam (methods/optimizer.py derives it):

    fresh (sync, and predict with identical workers)   x < 2 (1 + M)   eta lam < 2 (1 + M) / (1 - M)
    staleness one (pipe, pipe+dc)                      x < 1 - M       eta lam < 1

so in effective steps, pipe's edge does not move with the momentum, while sync's moves out from
2 (M = 0) to 38 (M = 0.9). Practitioners tune a momentum run's lr to sync's range: lr 0.1 at
M = 0.9 is eta = 1, ten times plain SGD's 0.1. That is where the delay costs accuracy: with
momentum, most of the rates a synchronous run trains well at lie past pipe's edge. Without it
the two edges lie a factor 2 apart.

Which lam. study.py marks its bounds with lam_max of the Hessian at w_0. On this net that
number does not exist to useful precision: finite differences of a ReLU net with batch norm
depend on their step by an order of magnitude (along one direction at w_0, v.Hv came out 34,
238 and 191 at e = 1e-2, 1e-3, 1e-4), power iteration meets a negative eigenvalue as large as
the positive one, and the curvature the run meets falls far below w_0's anyway. So the study
calibrates instead: lam_eff is the curvature at which the quadratic puts sync's edge where the
study measured it (at the smallest momentum where sync's edge lies inside the grid;
`effective_curvature`), and from it the quadratic predicts every other edge: pipe's at
(1 - M) / lam_eff, sync's at 2 (1 + M) / lam_eff, at each M. The table prints them beside the
measured edges (study.edges: the largest lr before a run that diverged or ended below half the
best accuracy of its momentum).

The problem (`PROBLEM`, in place of the compare preset's MLP; the command line's own keys
win): digits, 4 workers of batch 32, a ResNet-20 of widths 8, 16, 32 (68,642 weights), 200
steps with a cosine schedule: 60 runs, 580 s on two cores here (1,030 to 1,190 s while others
shared them). `QUICK_PROBLEM` (--quick): a ResNet-8 of widths 4, 8, 16, 40 steps at two
effective steps, about 12 s (CI). --momentum M runs momenta 0 and M. The compare preset's
model is the MLP, so --channels with three widths needs --model resnet beside it.

Output (in --out): study.json (the problem, lam_eff, every run: method, momentum, lr,
effective lr, final test accuracy and what study.py's runs keep; per momentum the measured
edges, the predicted ones and the share of pipe's loss each compensation recovers; the
SAPipe-style rows beside their figures) and, with matplotlib, momentum_study.png.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from pipesgd_ref import timing
from pipesgd_ref.commands.study import BOUND_STYLES, edges, recovered, run_one, write_study
from pipesgd_ref.config import TrainConfig, model_label
from pipesgd_ref.methods.optimizer import heavy_ball_bound
from pipesgd_ref.methods.reference import bucketed_average
from pipesgd_ref.methods.table import method
from pipesgd_ref.models.layout import buckets
from pipesgd_ref.plots import method_style, pyplot, save_figure
from pipesgd_ref.runtime.preflight import check_config
from pipesgd_ref.runtime.worker import Worker
from pipesgd_ref.timing.calibrate import cluster_calibration
from pipesgd_ref.units import parse_size

# (label, algo, width, compensation): the methods the study compares; ddp's algo sums its mean
# bucket by bucket (table.py's `bucketed`)
METHODS = (
    ("sync", "sync", 1, "none"),
    ("ddp", "ddp", 1, "none"),
    ("pipe", "pipe", 2, "none"),
    ("pipe+dc", "pipe", 2, "dc"),
    ("pipe+predict", "pipe", 2, "predict"),
)
MOMENTA = (0.0, 0.9)
# the effective steps eta = lr / (1 - M): at M = 0 the lrs, at M = 0.9 a tenth of them
EFFECTIVE_LRS = (0.6, 1.2, 2.4, 4.8, 9.6, 19.2)
QUICK_EFFECTIVE_LRS = (0.6, 4.8)
SYNC = "sync"  # the label of the method every other is held against
PROBLEM = dict(
    model="resnet",
    depth=20,
    channels=(8, 16, 32),
    batch_size=32,
    steps=200,
    lr_schedule="cosine",
    eval_every=20,
    target_accuracy=0.95,
)
QUICK_PROBLEM = {
    **PROBLEM,
    "depth": 8,
    "channels": (4, 8, 16),
    "batch_size": 16,
    "steps": 40,
    "eval_every": 10,
    "target_accuracy": 0.5,
}
# SAPipe's CIFAR-10 test accuracies (%), momentum SGD: (synchronous, staleness one, staleness one
# with weight prediction), their Table; theirs, printed beside ours, never computed here
SAPIPE = {"ResNet-50": (93.2, 89.3, 93.2), "VGG-16": (92.5, 90.6, 92.6)}
SAPIPE_SOURCE = "SAPipe (Chen et al., NeurIPS 2022), CIFAR-10, their figures"
SAPIPE_RECIPE = (0.9, 0.1)  # (momentum, lr): the usual CIFAR-10 recipe, effective step 1


def study_config(cfg: TrainConfig, named_here: set[str], quick: bool = False) -> TrainConfig:
    """cfg with the study's problem (PROBLEM, or QUICK_PROBLEM) in place of every field the
    command line did not name itself (`named_here`: its --key=value keys and --config file's;
    `command_line_keys`)."""
    problem = QUICK_PROBLEM if quick else PROBLEM
    return cfg.replace(**{k: v for k, v in problem.items() if k not in named_here})


def command_line_keys(argv: list[str]) -> set[str]:
    """The config keys a `pipesgd compare ...` command line names itself: its --key=value (or
    --key value) overrides and its --config file's keys; not its preset's."""
    from pipesgd_ref.commands.parser import build_parser, split_overrides
    from pipesgd_ref.config import parse_overrides, read_config_file

    args, rest = build_parser().parse_known_args(argv)
    keys = {k.replace("-", "_") for k in parse_overrides(split_overrides(rest))}
    if getattr(args, "config", None):
        keys |= set(read_config_file(args.config))
    return keys


def run_from_command_line(
    cfg: TrainConfig, argv: list[str], quick: bool, effective_lrs, out: str | Path
) -> dict[str, Any]:
    """`pipesgd compare --study staleness`: cfg (the compare preset and the command line `argv`)
    with the study's problem wherever the command line named no value of its own."""
    named_here = command_line_keys(argv)
    problem = study_config(cfg, named_here, quick)
    return run_momentum_study(problem, effective_lrs, momenta_of(cfg, named_here), out=out)


def momenta_of(cfg: TrainConfig, named_here: set[str]) -> tuple[float, ...]:
    """0 and --momentum M when the command line names one (just 0 for M = 0), else MOMENTA."""
    if "momentum" not in named_here:
        return MOMENTA
    return (0.0,) if cfg.momentum == 0 else (0.0, cfg.momentum)


def ddp_average(cfg: TrainConfig) -> Callable:
    """ddp's mean for reference.sync_sgd: reference.bucketed_average over the buckets of cfg's
    model (models/layout.buckets of its grad_units at --bucket-size), bitwise what a ddp job
    computes."""
    model = Worker.build(cfg, 0, cfg.world_size).model
    return bucketed_average(buckets(model.grad_units(), parse_size(cfg.bucket_size)))


def iteration_times(cfg: TrainConfig, methods=METHODS) -> dict[str, float]:
    """Each method's predicted iteration time on p machines (one worker each) on cfg's link,
    compute timed here (as study.cluster_iteration_times)."""
    cal = cluster_calibration(cfg)
    bucket = parse_size(cfg.bucket_size)
    return {
        label: timing.predict(
            algo, cfg.world_size, cal, width=width, compensation=comp, bucket_size=bucket
        ).iter_time_s
        for label, algo, width, comp in methods
    }


def theory_bounds(lam: float | None, momentum: float) -> dict[str, float]:
    """The quadratic's stable lrs at curvature lam (optimizer.heavy_ball_bound): pipe's
    (staleness one) and sync's (predict's too, with identical workers); {} without a lam."""
    if not lam or lam <= 0:
        return {}
    pipe, sync = heavy_ball_bound(momentum, 1), heavy_ball_bound(momentum, 0)
    return {"pipe": pipe / lam, "sync": sync / lam}


def effective_curvature(blocks: list[dict]) -> dict[str, Any]:
    """lam_eff: the curvature at which the quadratic puts sync's edge (2 (1 + M) / lam) where
    the study measured it, at the smallest momentum with a measured sync edge below the grid's
    top (at the top the edge lies somewhere beyond it); None when there is none."""
    for b in sorted(blocks, key=lambda b: b["momentum"]):
        edge, top = b["edges"].get("sync"), max(r["lr"] for r in b["rows"])
        if edge is not None and edge < top:
            m = b["momentum"]
            return {"lam_eff": heavy_ball_bound(m, 0) / edge, "from_momentum": m, "sync_edge": edge}
    return {"lam_eff": None, "from_momentum": None, "sync_edge": None}


def run_grid(
    cfg: TrainConfig, momentum: float, effective_lrs, methods, iters: dict, log
) -> list[dict]:
    """Every method at every effective step of `effective_lrs` at one momentum: study.json's
    rows (ddp's with its weights' gap to sync's, `SyncWatch`)."""
    rows = []
    run_cfg = cfg.replace(momentum=momentum, nesterov=cfg.nesterov and momentum > 0)
    ddp_mean = None
    for eta in effective_lrs:
        lr = float(f"{eta * (1.0 - momentum):.12g}")  # 0.06, not 0.059999999999999984
        watch = SyncWatch(gap_steps(run_cfg.steps))
        for label, algo, width, comp in methods:
            bucketed = method(algo).bucketed
            if bucketed:
                ddp_mean = ddp_mean or ddp_average(run_cfg)
            is_sync = width == 1 and not bucketed
            on_step = watch.keep if is_sync else watch.compare if bucketed else None
            got = run_one(run_cfg, width, comp, lr, ddp_mean if bucketed else None, on_step)
            if bucketed:
                got["weights_gap_to_sync"] = watch.gaps
            steps = got["steps_to_target"]
            row = {"method": label, "momentum": momentum, "lr": lr, "effective_lr": eta, **got}
            row["iter_time_s"] = iters[label]
            row["time_to_target_s"] = None if steps is None else steps * iters[label]
            rows.append(row)
        log(f"  momentum {momentum:g}, lr {lr:.4g} (eta {eta:g}): " + ", ".join(
            f"{r['method']} {_acc(r)}" for r in rows if r["effective_lr"] == eta
        ))  # fmt: skip
    return rows


def gap_steps(steps: int) -> tuple[int, ...]:
    """Where ddp's weights are held against sync's: after 1, 10, 100, ... steps and the last."""
    marks = [10**k for k in range(len(str(steps))) if 10**k < steps]
    return (*marks, steps)


class SyncWatch:
    """sync's weights after each step of `at` (`keep`, its run's watch), and ddp's distance
    from them (`compare`, ddp's): gaps = [[step, max |w_ddp - w_sync| / max |w_sync|], ...],
    as far as both runs went."""

    def __init__(self, at: tuple[int, ...]):
        self.at = set(at)
        self.seen: dict[int, np.ndarray] = {}
        self.gaps: list[list[float]] = []

    def keep(self, step: int, params: np.ndarray) -> None:
        if step in self.at:
            self.seen[step] = params.copy()

    def compare(self, step: int, params: np.ndarray) -> None:
        sync = self.seen.get(step)
        if sync is not None:
            gap = np.max(np.abs(params - sync)) / np.max(np.abs(sync))
            self.gaps.append([step, float(gap)])


def ddp_vs_sync(rows: list[dict], sync_edge: float | None) -> dict[str, Any] | None:
    """How far ddp ended from sync at one momentum, at the lrs up to sync's edge (where sync
    trains; past it both are chaotic): the largest weights gap after each step `SyncWatch`
    held them at, and the largest difference of final test accuracy. None without ddp rows
    or without an lr where sync trains."""
    ddp = [r for r in rows if "weights_gap_to_sync" in r and sync_edge and r["lr"] <= sync_edge]
    if not ddp:
        return None
    by_step: dict[int, float] = {}
    for r in ddp:
        for step, gap in r["weights_gap_to_sync"]:
            by_step[step] = max(gap, by_step.get(step, 0.0))
    acc = _accuracies(rows)
    diffs = [abs(acc(r["method"], r["lr"]) - acc(SYNC, r["lr"])) for r in ddp]
    return {
        "lrs": [r["lr"] for r in ddp],
        "weights_gap_by_step": {str(s): g for s, g in sorted(by_step.items())},
        "max_accuracy_gap": max(diffs),
    }


def ddp_line(d: dict) -> str:
    """The table's line on ddp against sync (`ddp_vs_sync`)."""
    apart = ", ".join(f"{g:.1e} after {s}" for s, g in d["weights_gap_by_step"].items())
    return (
        f"ddp against sync (the same update, summed in the ring's order), at lr <= "
        f"{max(d['lrs']):.4g}: weights apart by at most {apart} steps (largest gap / largest "
        f"weight: rounding, then training's own amplification of it); final accuracies differ "
        f"by up to {100 * d['max_accuracy_gap']:.1f} points, one run's spread from rounding alone"
    )


def _acc(row: dict) -> str:
    return "div" if row["diverged"] else f"{row['test_accuracy']:.4f}"


def run_momentum_study(
    cfg: TrainConfig,
    effective_lrs=EFFECTIVE_LRS,
    momenta=MOMENTA,
    methods=METHODS,
    out: str | Path | None = "runs/study",
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Every method of `methods` at every effective step of `effective_lrs` and every momentum
    of `momenta` on cfg's problem; returns (and writes to `out`) what study.json holds."""
    for _, algo, width, comp in methods:  # every run's options, before the first run
        check_config(cfg.replace(algo=algo, width=width, compensation=comp))
    started = time.perf_counter()
    log(
        f"momentum study: {cfg.world_size} workers, {cfg.dataset}, {model_label(cfg)}, batch "
        f"{cfg.batch_size}, {cfg.steps} steps ({cfg.lr_schedule} lr), momentum "
        f"{', '.join(f'{m:g}' for m in momenta)}, effective step lr/(1-M) "
        f"{', '.join(f'{e:g}' for e in effective_lrs)}"
    )
    iters = iteration_times(cfg, methods)
    triples = [(label, width, comp) for label, _, width, comp in methods]
    blocks = []
    for m in momenta:
        rows = run_grid(cfg, m, effective_lrs, methods, iters, log)
        found: dict[str, Any] = {"edges": edges(rows), "recovered": recovered(rows, triples)}
        found["ddp_vs_sync"] = ddp_vs_sync(rows, found["edges"].get(SYNC))
        blocks.append({"momentum": m, **found, "rows": rows})
    curvature = effective_curvature(blocks)
    for b in blocks:  # the quadratic's edges at lam_eff, beside the measured ones
        b["bounds"] = theory_bounds(curvature["lam_eff"], b["momentum"])
    report = {
        "kind": "staleness-momentum-study",
        "config": cfg.to_dict(),
        "model": model_label(cfg),
        "effective_lrs": list(effective_lrs),
        "momenta": list(momenta),
        "methods": [m[0] for m in methods],
        "curvature": curvature,
        "blocks": blocks,
        "rows": [r for b in blocks for r in b["rows"]],
        "sapipe": sapipe_rows(blocks),
        "sapipe_theirs": {"source": SAPIPE_SOURCE, "figures": SAPIPE},
        "wall_time_s": time.perf_counter() - started,
    }
    log("")
    log(format_momentum_table(report))
    if out:
        write_study(report, Path(out), plot_momentum_study, "momentum_study.png", log)
    return report


def sapipe_rows(blocks: list[dict]) -> list[dict]:
    """SAPipe's columns from our runs, per momentum: each method's final accuracy at sync's
    best lr (the smallest of the grid's lrs where sync's accuracy is highest: the rate a run
    tuned for sync would use), each method's best over the grid (its own lr tuned), and at
    SAPipe's momentum the grid's lr nearest their recipe's (`SAPIPE_RECIPE`)."""
    return [row for b in blocks for row in _sapipe_block(b["momentum"], b["rows"])]


def _sapipe_block(m: float, rows: list[dict]) -> list[dict]:
    acc = _accuracies(rows)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    lrs = sorted({r["lr"] for r in rows})

    def row(at: str, lr: float | None) -> dict:  # lr None: each method at its own best
        cells = {k: acc(k, lr) if lr else max(acc(k, x) for x in lrs) for k in methods}
        return {"momentum": m, "at": at, "lr": lr, **cells}

    out = [row("sync's best lr", max(lrs, key=lambda lr: (acc(SYNC, lr), -lr)))]
    out.append(row("each method's best lr", None))
    recipe_m, recipe_lr = SAPIPE_RECIPE
    if m == recipe_m:
        nearest = min(lrs, key=lambda lr: abs(np.log(lr / recipe_lr)))
        out.append(row(f"lr nearest SAPipe's {recipe_lr:g}", nearest))
    return out


def _accuracies(rows: list[dict]) -> Callable[[str, float], float]:
    """(method, lr) -> its final test accuracy in `rows`, 0 where it diverged or is missing."""
    by = {(r["method"], r["lr"]): r for r in rows}

    def acc(label: str, lr: float) -> float:
        r = by.get((label, lr))
        return 0.0 if r is None or r["diverged"] else r["test_accuracy"]

    return acc


def format_momentum_table(report: dict) -> str:
    """Per momentum: final test accuracy, one row per lr, one column per method, the edges,
    the bounds and the recovered shares; then SAPipe's table, ours beside theirs."""
    methods = report["methods"]
    width = max(8, *(len(m) for m in methods))
    head = f"{'lr':>7} {'lr/(1-M)':>8} " + " ".join(f"{m:>{width}}" for m in methods)
    steps = report["config"]["steps"]
    lines = []
    for b in report["blocks"]:
        m = b["momentum"]
        by = {(r["method"], r["effective_lr"]): r for r in b["rows"]}
        lines += [f"momentum {m:g}: final test accuracy after {steps} steps ('div': diverged)"]
        lines += [head, "-" * len(head)]
        for eta in report["effective_lrs"]:
            cells = " ".join(f"{_acc(by[(k, eta)]):>{width}}" for k in methods)
            lines.append(f"{eta * (1 - m):>7.4g} {eta:>8g} {cells}")
        lines.append("measured edge (lr): " + ", ".join(
            f"{k} {'-' if v is None else format(v, '.4g')}" for k, v in b["edges"].items()
        ))  # fmt: skip
        if b["bounds"]:
            lines.append(
                f"theory at lam_eff {report['curvature']['lam_eff']:.3g}: pipe lr < (1-M)/lam = "
                f"{b['bounds']['pipe']:.3g}, sync and predict lr < 2(1+M)/lam = "
                f"{b['bounds']['sync']:.3g}"
            )
        if b.get("ddp_vs_sync"):
            lines.append(ddp_line(b["ddp_vs_sync"]))
        for e in b["recovered"]:
            share = ", ".join(f"{k} {e[k]:.0%}" for k in e if k.startswith("pipe+"))
            pipe = "diverged" if e["pipe"] is None else f"{e['pipe']:.4f}"
            share = f"; of that gap recovered: {share}" if share else ""
            lines.append(f"lr {e['lr']:.4g}: pipe {pipe} vs sync {e['sync']:.4f}{share}")
        lines.append("")
    lines.append(format_sapipe(report))
    return "\n".join(lines)


def format_sapipe(report: dict) -> str:
    """SAPipe's table in miniature: sync | staleness one | staleness one + prediction (and dc),
    ours per momentum, theirs below, labelled as theirs."""
    cols = ("sync", "pipe", "pipe+predict", "pipe+dc")
    head = f"{'':<44} {'sync':>6} {'stale 1':>8} {'+predict':>9} {'+dc':>6}"
    lines = [
        f"test accuracy (%), SAPipe's columns: sync | staleness one | staleness one + "
        f"prediction (ours: {report['model']} on {report['config']['dataset']})",
        head,
    ]
    for r in report["sapipe"]:
        at = "each at its own best lr" if r["lr"] is None else f"{r['at']}: {r['lr']:.4g}"
        name = f"ours, M {r['momentum']:g}, {at}"
        cells = [f"{100 * r[c]:.1f}" if c in r else "-" for c in cols]
        lines.append(f"{name:<44} {cells[0]:>6} {cells[1]:>8} {cells[2]:>9} {cells[3]:>6}")
    for net, (sync, stale, predict) in report["sapipe_theirs"]["figures"].items():
        name = f"theirs: {net}, CIFAR-10, M 0.9"
        lines.append(f"{name:<44} {sync:>6.1f} {stale:>8.1f} {predict:>9.1f} {'-':>6}")
    lines.append(f"(rows marked theirs: {report['sapipe_theirs']['source']})")
    return "\n".join(lines)


def plot_momentum_study(report: dict, path: Path) -> Path | None:
    """Final test accuracy against the effective step lr/(1-M), one panel per momentum, with
    the quadratic's edges at lam_eff in effective steps (pipe's the same in every panel)."""
    plt = pyplot()
    if plt is None:
        return None
    blocks = report["blocks"]
    fig, axes = plt.subplots(1, len(blocks), figsize=(5.5 * len(blocks), 4.2), squeeze=False)
    for ax, b in zip(axes[0], blocks, strict=True):
        m = b["momentum"]
        for label in report["methods"]:
            rows = [r for r in b["rows"] if r["method"] == label]
            acc = [np.nan if r["diverged"] else r["test_accuracy"] for r in rows]
            ax.plot([r["effective_lr"] for r in rows], acc, marker="o", label=label,
                    **method_style(label))  # fmt: skip
        for name, lr in b["bounds"].items():
            ax.axvline(lr / (1 - m), color="gray", linestyle=BOUND_STYLES[name], linewidth=1,
                       label=f"{name}'s edge, theory at lam_eff")  # fmt: skip
        ax.set_xscale("log")
        ax.set_xlabel("effective step lr / (1 - M)")
        ax.set_title(f"momentum {m:g}")
        ax.set_ylim(0, 1.02)
    axes[0][0].set_ylabel("final test accuracy (missing: diverged)")
    axes[0][0].legend(fontsize=7)
    c = report["config"]
    fig.suptitle(
        f"staleness with momentum: {c['world_size']} workers, {c['dataset']}, "
        f"{report['model']}, {c['steps']} steps"
    )
    return save_figure(fig, path)  # announced, and shown inline in a notebook
