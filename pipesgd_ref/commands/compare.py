"""`pipesgd compare`: the paper's comparison in miniature, measured and predicted side by side.

The same problem (data, model, seed, batch size, learning rate, steps) is trained six ways on p
local worker processes over TCP, through one emulated network:

    ps-sync        parameter server, synchronous          (the conventional baseline)
    ps-async       parameter server, asynchronous          (no barrier; stale by up to ~p-1)
    sync           ring AllReduce, synchronous             (decentralized; compute then comm)
    pipe           Pipe-SGD, width 2                       (comm of step t overlaps compute t+1)
    pipe+trunc16   Pipe-SGD, 16-bit truncation in the ring (half the bytes)
    pipe+q8        Pipe-SGD, 8-bit quantization in the ring (a quarter of the bytes)

Before the runs, `timing.calibrate.calibrate` measures this machine (t_comp, t_u, gamma, the
codecs, the cost of a hop) and `timing.predict` gives each method's iteration time. Each run
records its timeline (trace.json), its loss at every step, and a copy of the weights every
`eval_every` steps, evaluated on the test set after training; the first evaluation at or above
`target_accuracy` gives the wall-clock time to target.

Repeats. Every method runs `repeats` times (2 by default, 1 with --quick), in passes: all six
methods once, then all six again, so a slow minute of the machine falls on one repeat of a few
methods, not on every repeat of one. The table keeps each method's repeat that reached the
target soonest (the fastest of its repeats, as timeit reports the fastest: on a machine shared
with other jobs, noise only ever adds time), and compare.json keeps every repeat's figures.

Output (in --out, default runs/compare): compare.json (calibration, predictions, every run's
summary, the table, the checks), one folder per run (summary.json, trace.json; with repeats,
one per repeat: ps-sync/repeat-1, ps-sync/repeat-2, ...), and with matplotlib:
loss_vs_time.png, time_breakdown.png, timeline.png, predicted_vs_bandwidth.png (drawn from the
kept repeats).

The default problem is the `compare` preset (config.py): an emulated network on which a ring
AllReduce of the gradient takes about as long as the computation of one step on this machine's
shared cores, the communication-heavy regime of the paper, where pipelining pays most.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipesgd_ref import timing
from pipesgd_ref.commands.train import run_training
from pipesgd_ref.config import TrainConfig, model_label
from pipesgd_ref.outputs import write_json
from pipesgd_ref.timing.calibrate import CALIBRATION_REPS, CALIBRATION_TRIES, calibrate

# The paper's headline and the issue's bars: (faster run, slower run, minimum ratio of their
# wall-clock times to the target accuracy).
CHECKS = (
    ("pipe+q8", "ps-sync", 5.4),
    ("pipe+trunc16", "ps-sync", 5.4),
    ("pipe", "sync", 1.7),
)


REPEATS = 2  # runs of each method; the table keeps the one that reached the target soonest
QUICK_CALIBRATION_REPS = 6  # timed steps per process in --quick's calibration...
QUICK_CALIBRATION_TRIES = 1  # ...and one launch per figure (the default takes the best of 2)


def quick_config(cfg: TrainConfig) -> TrainConfig:
    """`--quick`: the same problem, fewer steps, run once (CI and tutorials: under a minute;
    the default problem reaches its target at step 28-30 of 32); never more steps than asked
    for."""
    return cfg.replace(steps=min(cfg.steps, max(10, cfg.steps * 4 // 5)))


def calibrate_for(
    cfg: TrainConfig,
    runs=timing.COMPARE_RUNS,
    reps: int = CALIBRATION_REPS,
    tries: int = CALIBRATION_TRIES,
    network: dict | None = None,
) -> timing.Calibration:
    """The calibration compare uses: everything calibrate measures, plus Pipe-SGD's
    compute next to its communication for every codec a pipe run of `runs` uses. `network`:
    the wire's figures when measured elsewhere (calibrate's; compare_mpi.py measures MPI's)."""
    busy = tuple(sorted({codec for algo, codec in runs if algo == "pipe"}))
    return calibrate(cfg, network=network, busy_codecs=busy, reps=reps, tries=tries)


def run_config(
    cfg: TrainConfig, algo: str, codec: str, out: Path | None, repeat: int | None = None
) -> TrainConfig:
    """The config of one run of the comparison: cfg with this algo and codec, written to
    out/LABEL, or out/LABEL/repeat-K when the method runs more than once."""
    folder = ""
    if out:
        folder = out / timing.run_label(algo, codec)
        folder = str(folder / f"repeat-{repeat}" if repeat is not None else folder)
    return cfg.replace(
        algo=algo,
        codec=codec,
        width=cfg.width if algo == "pipe" else 1,
        # pipe's compensation for pipe's runs, dc for ps-async's; the bound ps-async's alone
        compensation=cfg.compensation if _compensates(algo, cfg.compensation) else "none",
        max_staleness=cfg.max_staleness if algo == "ps-async" else -1,
        codec_pull="none",
        out=folder,
    )


def _compensates(algo: str, compensation: str) -> bool:
    return algo == "pipe" or (algo == "ps-async" and compensation.startswith("dc"))


def soonest(repeats: list[dict]) -> int:
    """Index of the repeat (a list of run summaries) that reached the target soonest; where
    none reached it, the one with the shortest iteration."""

    def key(s: dict) -> tuple[float, float]:
        ttt = s["time_to_target_s"]
        return (math.inf if ttt is None else ttt, s["iter_time_s"])

    return min(range(len(repeats)), key=lambda i: key(repeats[i]))


def repeat_brief(s: dict) -> dict:
    """What compare.json keeps of every repeat, kept or not."""
    keys = ("iter_time_s", "t_comp_s", "time_to_target_s", "steps_to_target", "test_accuracy",
            "wall_time_s")  # fmt: skip
    return {k: s[k] for k in keys}


def run_compare(
    cfg: TrainConfig,
    out: str | Path | None = "runs/compare",
    progress: bool = True,
    log: Callable[[str], None] = print,
    runs=timing.COMPARE_RUNS,
    calibration: timing.Calibration | None = None,
    calibration_reps: int = CALIBRATION_REPS,
    calibration_tries: int = CALIBRATION_TRIES,
    repeats: int = REPEATS,
    train: Callable[..., tuple[dict, list]] = run_training,
) -> dict[str, Any]:
    """Calibrate, predict, run every method `repeats` times, and report; returns what
    compare.json holds. `train(cfg, progress=, log=, label=)` runs one method and returns
    (summary, results): run_training's local workers by default, a job of MPI ranks under
    `--comm mpi` (compare_mpi.py)."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    out_dir = Path(out) if out else None
    started = time.perf_counter()
    times = f" x {repeats} repeats" if repeats > 1 else ""
    log(f"compare: {len(runs)} runs{times} of {cfg.world_size} workers, {cfg.dataset}, "
        f"{model_label(cfg)}, batch {cfg.batch_size}, {cfg.steps} steps, link "
        f"{timing_link(cfg)}")  # fmt: skip
    if calibration is None:
        log("calibrating the timing model on this machine ...")
    cal = calibration or calibrate_for(cfg, runs, calibration_reps, calibration_tries)
    log("  " + timing.describe(cal))
    preds = timing.predict_all(cfg.world_size, cal, runs, width=cfg.width,
                               ps_pulls=cfg.ps_pulls, compensation=cfg.compensation)  # fmt: skip

    labels = [timing.run_label(algo, codec) for algo, codec in runs]
    done: dict[str, list[dict]] = {label: [] for label in labels}
    all_traces: dict[str, list[list[dict]]] = {label: [] for label in labels}
    total = len(runs) * repeats
    for k in range(repeats):
        for i, (algo, codec) in enumerate(runs):
            label = labels[i]
            run_cfg = run_config(cfg, algo, codec, out_dir, k + 1 if repeats > 1 else None)
            n = k * len(runs) + i + 1
            tag = f"[{n}/{total}] {label}" + (f" (repeat {k + 1})" if repeats > 1 else "")
            if k == 0:
                log(f"{tag}: predicted iteration {preds[label].iter_time_s * 1e3:.1f} ms")
            summary, results = train(run_cfg, progress=progress, log=_quiet, label=tag)
            done[label].append(summary)
            all_traces[label].append([e for r in results for e in r.events])
            reached = summary["time_to_target_s"]
            got = f"reached in {reached:.2f} s" if reached is not None else "not reached"
            log(f"{tag}: iteration {summary['iter_time_s'] * 1e3:.1f} ms, test accuracy "
                f"{summary['test_accuracy']:.4f}, target {got}")  # fmt: skip

    summaries: dict[str, dict] = {}
    traces: dict[str, list[dict]] = {}
    for label in labels:
        kept = soonest(done[label])
        summaries[label] = {**done[label][kept], "repeat": kept + 1,
                            "repeats": [repeat_brief(s) for s in done[label]]}  # fmt: skip
        traces[label] = all_traces[label][kept]

    rows = table_rows(summaries, preds)
    checks = check_targets(rows)
    report = {
        "kind": "compare",
        "config": cfg.to_dict(),
        "calibration": cal.to_dict(),
        "predictions": {k: v.to_dict() for k, v in preds.items()},
        "table": rows,
        "checks": checks,
        "repeats": repeats,
        "runs": {k: _without_heavy(v) for k, v in summaries.items()},
        "wall_time_s": time.perf_counter() - started,
    }
    log("")
    log(format_table(rows, cfg))
    if repeats > 1:
        log(f"(each method ran {repeats} times; the table keeps the repeat that reached the "
            f"target soonest; every repeat is in compare.json)")  # fmt: skip
    log("")
    for c in checks:
        log(c["text"])
    if cfg.model != "mlp":
        log(f"(the bars are the paper's headline on the MLP problem of the compare preset; on "
            f"--model {cfg.model} they are figures to read, not targets)")  # fmt: skip
    if out_dir is not None:
        write_json(out_dir / "compare.json", report)
        figures = plot_compare(report, summaries, traces, cal, cfg, out_dir)
        extra = f" and {len(figures)} figures" if figures else " (no matplotlib: no figures)"
        log(f"wrote {out_dir / 'compare.json'}{extra}")
    log(f"compare: done in {report['wall_time_s']:.0f} s")
    return report


def _quiet(*_: Any) -> None:
    pass


def timing_link(cfg: TrainConfig) -> str:
    from pipesgd_ref.config import link_model

    if cfg.comm == "mpi":
        return "MPI's own, not emulated"
    model = link_model(cfg)
    return str(model) if model.enabled else "loopback, not emulated"


def _without_heavy(summary: dict) -> dict:
    """A run's summary for compare.json: the loss curve thinned to at most 200 points."""
    curve = summary["loss_curve"]
    stride = max(1, len(curve) // 200)
    return {**summary, "loss_curve": curve[::stride]}


def table_rows(summaries: dict[str, dict], preds: dict) -> list[dict]:
    """One row per run: measured and predicted iteration, error, speedups, time to target."""
    base = summaries.get("ps-sync")
    rows = []
    for label, s in summaries.items():
        pred = preds[label].iter_time_s
        meas = s["iter_time_s"]
        ttt = s["time_to_target_s"]
        base_ttt = base["time_to_target_s"] if base else None
        rows.append(
            {
                "run": label,
                "iter_ms": meas * 1e3,
                "predicted_ms": pred * 1e3,
                "error": (pred - meas) / meas,
                "iter_speedup": (base["iter_time_s"] / meas) if base else None,
                "time_to_target_s": ttt,
                "steps_to_target": s["steps_to_target"],
                "speedup_to_target": (base_ttt / ttt) if base_ttt and ttt else None,
                "test_accuracy": s["test_accuracy"],
                "t_comp_ms": (s["t_comp_s"] or 0.0) * 1e3,
                "comm_hidden_fraction": s["comm_hidden_fraction"],
            }
        )
    return rows


def format_table(rows: list[dict], cfg: TrainConfig) -> str:
    target = f"to {cfg.target_accuracy:.0%} s"
    head = (f"{'run':<13} {'iter ms':>8} {'predicted':>9} {'error':>6} {'x ps-sync':>9} "
            f"{target:>9} {'steps':>5} {'x ps-sync':>9} {'test acc':>8}")  # fmt: skip
    lines = [
        f"{cfg.world_size} workers, {cfg.dataset}, link {timing_link(cfg)}; 'x ps-sync': "
        f"speedup over ps-sync per iteration, then in time to {cfg.target_accuracy:.0%} test "
        f"accuracy",
        head,
        "-" * len(head),
    ]

    def num(x, fmt):  # a missing figure keeps the column's width (fmt is ">W..." here)
        width = int(re.match(r">(\d*)", fmt).group(1) or 0)
        return format(x, fmt) if x is not None else "-".rjust(width)

    for r in rows:
        lines.append(
            f"{r['run']:<13} {r['iter_ms']:>8.1f} {r['predicted_ms']:>9.1f} "
            f"{r['error']:>+6.0%} {num(r['iter_speedup'], '>8.2f')}x "
            f"{num(r['time_to_target_s'], '>9.2f')} {num(r['steps_to_target'], '>5')} "
            f"{num(r['speedup_to_target'], '>8.2f')}x {r['test_accuracy']:>8.4f}"
        )
    errors = [abs(r["error"]) for r in rows]
    if not errors:
        return "\n".join(lines)
    lines.append(
        f"timing model: median |error| {sorted(errors)[len(errors) // 2]:.0%}, worst "
        f"{max(errors):.0%}"
    )
    return "\n".join(lines)


def check_targets(rows: list[dict]) -> list[dict]:
    """The comparison's claims, each measured: every run reaches the target, and the wall-clock
    ratios of CHECKS hold."""
    by = {r["run"]: r for r in rows}
    out = []
    missed = [r["run"] for r in rows if r["time_to_target_s"] is None]
    out.append(
        {
            "check": "every run reaches the target",
            "ok": not missed,
            "text": "every run reached the target accuracy"
            if not missed
            else f"did not reach the target accuracy: {', '.join(missed)}",
        }
    )
    for fast, slow, bar in CHECKS:
        if fast not in by or slow not in by:
            continue
        a, b = by[fast]["time_to_target_s"], by[slow]["time_to_target_s"]
        ratio = b / a if a and b else None
        ok = ratio is not None and ratio >= bar
        text = (
            f"{fast} reached the target {ratio:.2f}x sooner than {slow} (bar: {bar}x): "
            f"{'met' if ok else 'NOT met'}"
            if ratio is not None
            else f"{fast} vs {slow}: a run did not reach the target"
        )
        out.append({"check": f"{fast} vs {slow}", "ratio": ratio, "bar": bar, "ok": ok,
                    "text": text})  # fmt: skip
    return out


# --- figures -------------------------------------------------------------------------------

COLORS = {
    "ps-sync": "tab:red",
    "ps-async": "tab:orange",
    "sync": "tab:blue",
    "pipe": "tab:green",
    "pipe+trunc16": "tab:olive",
    "pipe+q8": "tab:purple",
}


def plot_compare(report, summaries, traces, cal, cfg, out_dir: Path) -> list[Path]:
    """The four figures of the comparison; [] without matplotlib."""
    from pipesgd_ref.plots import pyplot, save_figure

    plt = pyplot()
    if plt is None:
        return []
    paths = []

    # 1. loss and test accuracy against wall-clock time
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for label, s in summaries.items():
        c = COLORS.get(label)
        ax1.plot([p["wall_time_s"] for p in s["loss_curve"]],
                 [p["loss"] for p in s["loss_curve"]], label=label, color=c, lw=1)  # fmt: skip
        ax2.plot([p["wall_time_s"] for p in s["eval_curve"]],
                 [p["test_accuracy"] for p in s["eval_curve"]], label=label, color=c)  # fmt: skip
    ax1.set(xlabel="wall-clock time (s)", ylabel="training loss (mean over workers)",
            yscale="log", title="loss against wall-clock time")  # fmt: skip
    ax2.axhline(cfg.target_accuracy, color="gray", ls="--", lw=1, label="target")
    ax2.set(xlabel="wall-clock time (s)", ylabel="test accuracy",
            title="test accuracy against wall-clock time")  # fmt: skip
    ax1.legend(fontsize=8)
    ax2.legend(fontsize=8)
    paths.append(save_figure(fig, out_dir / "loss_vs_time.png"))

    # 2. stacked compute / exposed communication per iteration, predicted marked
    fig, ax = plt.subplots(figsize=(8, 4))
    labels = list(summaries)
    comp = [summaries[k]["t_comp_s"] * 1e3 for k in labels]
    iters = [summaries[k]["iter_time_s"] * 1e3 for k in labels]
    rest = [max(0.0, it - c) for it, c in zip(iters, comp, strict=True)]
    ax.bar(labels, comp, label="compute (measured)", color="tab:blue")
    ax.bar(labels, rest, bottom=comp, label="communication not hidden (measured)",
           color="tab:orange")  # fmt: skip
    pred = [report["predictions"][k]["iter_time_s"] * 1e3 for k in labels]
    ax.scatter(labels, pred, marker="_", s=600, color="black", zorder=3,
               label="predicted iteration")  # fmt: skip
    ax.set(ylabel="time per iteration (ms)", title="where an iteration's time goes")
    ax.legend(fontsize=8)
    plt.setp(ax.get_xticklabels(), rotation=20)
    paths.append(save_figure(fig, out_dir / "time_breakdown.png"))

    # 3. timeline: a few steady-state iterations of sync against pipe
    pair = [k for k in ("sync", "pipe") if k in traces]
    if pair:
        fig, axes = plt.subplots(len(pair), 1, figsize=(11, 2.2 * len(pair) + 0.6))
        axes = [axes] if len(pair) == 1 else list(axes)
        span = None
        for ax, label in zip(axes, pair, strict=True):
            span = _plot_timeline(ax, traces[label], label, span)
        axes[-1].set_xlabel("time (ms)")
        paths.append(save_figure(fig, out_dir / "timeline.png"))

    # 4. predicted iteration time against bandwidth, the measured points on top
    fig, ax = plt.subplots(figsize=(8, 4.5))
    grid = _geomspace(10e6 / 8, 100e9 / 8, 40)
    for label, pr in report["predictions"].items():
        ys = [timing.predict(pr["algo"], cfg.world_size, cal.with_network(bandwidth=b),
                             pr["codec"], pr["width"], cfg.ps_pulls).iter_time_s * 1e3
              for b in grid]  # fmt: skip
        ax.plot([b * 8 / 1e9 for b in grid], ys, color=COLORS.get(label), label=label)
        if math.isfinite(cal.bandwidth):  # unemulated: no bandwidth to put the dot at
            ax.scatter([cal.bandwidth * 8 / 1e9], [summaries[label]["iter_time_s"] * 1e3],
                       color=COLORS.get(label), edgecolor="black", zorder=3)  # fmt: skip
    ax.set(xscale="log", yscale="log", xlabel="link bandwidth (Gbit/s)",
           ylabel="iteration time (ms)",
           title="predicted (lines) and measured (dots) iteration time")  # fmt: skip
    ax.legend(fontsize=8)
    paths.append(save_figure(fig, out_dir / "predicted_vs_bandwidth.png"))
    return paths


def _geomspace(lo: float, hi: float, n: int) -> list[float]:
    return [lo * (hi / lo) ** (i / (n - 1)) for i in range(n)]


def _plot_timeline(ax, events: list[dict], label: str, span):
    """Spans of compute (blue), communication (orange) and update (green) per rank and thread
    for about four iterations from the middle of the run."""
    steps = sorted({e["args"]["step"] for e in events})
    mid = steps[len(steps) // 2] if steps else 0
    chosen = [e for e in events if mid <= e["args"]["step"] < mid + 4]
    if not chosen:
        return span
    t0 = min(e["ts"] for e in chosen)
    colors = {"compute": "tab:blue", "allreduce": "tab:orange", "update": "tab:green"}
    rows = sorted({(e["pid"], e["tid"]) for e in chosen})
    for y, (pid, tid) in enumerate(rows):
        bars = [((e["ts"] - t0) / 1e3, e["dur"] / 1e3) for e in chosen
                if e["pid"] == pid and e["tid"] == tid]  # fmt: skip
        cols = [
            colors.get(e["name"], "gray") for e in chosen if e["pid"] == pid and e["tid"] == tid
        ]
        # white edges: back-to-back spans (a busy comm thread) stay apart
        ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=cols, edgecolor="white", linewidth=0.8)
    ax.set_yticks(range(len(rows)), [f"rank {p} {t}" for p, t in rows], fontsize=7)
    end = max((e["ts"] + e["dur"] - t0) / 1e3 for e in chosen)
    span = max(span or 0.0, end)
    ax.set_xlim(0, span)
    ax.set_title(f"{label}: 4 iterations (compute blue, AllReduce orange, update green)",
                 fontsize=9)  # fmt: skip
    return span
