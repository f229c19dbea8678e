"""The figures of `pipesgd compare` (with matplotlib): loss and accuracy against wall-clock
time, where an iteration's time goes, a timeline of sync against pipe, and the predicted
iteration time against bandwidth with the measured points on top.
"""

from __future__ import annotations

import math
from pathlib import Path

from pipesgd_ref import timing
from pipesgd_ref.plots import method_style

TIMELINE_RUNS = ("sync", "pipe")  # the runs whose timelines are drawn, one above the other


def plot_compare(report, summaries, traces, cal, cfg, out_dir: Path) -> list[Path]:
    """The four figures of the comparison; [] without matplotlib."""
    from pipesgd_ref.plots import pyplot, save_figure

    plt = pyplot()
    if plt is None:
        return []
    paths = [
        save_figure(_loss_figure(plt, summaries, cfg), out_dir / "loss_vs_time.png"),
        save_figure(_breakdown_figure(plt, report, summaries), out_dir / "time_breakdown.png"),
    ]
    pair = [k for k in TIMELINE_RUNS if k in traces]
    if pair:
        paths.append(save_figure(_timeline_figure(plt, traces, pair), out_dir / "timeline.png"))
    fig = _bandwidth_figure(plt, report, summaries, cal, cfg)
    paths.append(save_figure(fig, out_dir / "predicted_vs_bandwidth.png"))
    return paths


def _loss_figure(plt, summaries, cfg):
    """1. Loss and test accuracy against wall-clock time, one line per run."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for label, s in summaries.items():
        style = method_style(label)
        loss, evals = s["loss_curve"], s["eval_curve"]
        ax1.plot(
            [p["wall_time_s"] for p in loss], [p["loss"] for p in loss], label=label, lw=1, **style
        )
        ax2.plot(
            [p["wall_time_s"] for p in evals],
            [p["test_accuracy"] for p in evals],
            label=label,
            **style,
        )
    ax1.set(
        xlabel="wall-clock time (s)",
        ylabel="training loss (mean over workers)",
        yscale="log",
        title="loss against wall-clock time",
    )
    ax2.axhline(cfg.target_accuracy, color="gray", ls="--", lw=1, label="target")
    ax2.set(
        xlabel="wall-clock time (s)",
        ylabel="test accuracy",
        title="test accuracy against wall-clock time",
    )
    ax1.legend(fontsize=8)
    ax2.legend(fontsize=8)
    return fig


def _breakdown_figure(plt, report, summaries):
    """2. Stacked compute and exposed communication per iteration, the prediction marked."""
    fig, ax = plt.subplots(figsize=(8, 4))
    labels = list(summaries)
    comp = [summaries[k]["t_comp_s"] * 1e3 for k in labels]
    iters = [summaries[k]["iter_time_s"] * 1e3 for k in labels]
    rest = [max(0.0, it - c) for it, c in zip(iters, comp, strict=True)]
    ax.bar(labels, comp, label="compute (measured)", color="tab:blue")
    exposed = "communication not hidden (measured)"
    ax.bar(labels, rest, bottom=comp, label=exposed, color="tab:orange")
    pred = [report["predictions"][k]["iter_time_s"] * 1e3 for k in labels]
    ax.scatter(
        labels, pred, marker="_", s=600, color="black", zorder=3, label="predicted iteration"
    )
    ax.set(ylabel="time per iteration (ms)", title="where an iteration's time goes")
    ax.legend(fontsize=8)
    plt.setp(ax.get_xticklabels(), rotation=20)
    return fig


def _timeline_figure(plt, traces, pair: list[str]):
    """3. A few steady-state iterations of each run of `pair` (sync against pipe), same scale."""
    fig, axes = plt.subplots(len(pair), 1, figsize=(11, 2.2 * len(pair) + 0.6))
    axes = [axes] if len(pair) == 1 else list(axes)
    span = None
    for ax, label in zip(axes, pair, strict=True):
        span = _plot_timeline(ax, traces[label], label, span)
    axes[-1].set_xlabel("time (ms)")
    return fig


def _bandwidth_figure(plt, report, summaries, cal, cfg):
    """4. Predicted iteration time against bandwidth, the measured points on top."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    grid = _geomspace(10e6 / 8, 100e9 / 8, 40)
    for label, pr in report["predictions"].items():
        style = method_style(label)
        ys = [_predicted_ms(pr, cfg, cal.with_network(bandwidth=b)) for b in grid]
        ax.plot([b * 8 / 1e9 for b in grid], ys, label=label, **style)
        if math.isfinite(cal.bandwidth):  # unemulated: no bandwidth to put the dot at
            x, y = cal.bandwidth * 8 / 1e9, summaries[label]["iter_time_s"] * 1e3
            ax.scatter([x], [y], color=style["color"], edgecolor="black", zorder=3)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="link bandwidth (Gbit/s)",
        ylabel="iteration time (ms)",
        title="predicted (lines) and measured (dots) iteration time",
    )
    ax.legend(fontsize=8)
    return fig


def _predicted_ms(pr: dict, cfg, cal) -> float:
    """The iteration time in ms that the timing model gives run `pr` (a prediction's dict)."""
    args = (pr["algo"], cfg.world_size, cal, pr["codec"], pr["width"], cfg.ps_pulls)
    return timing.predict(*args).iter_time_s * 1e3


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
        bars = [
            ((e["ts"] - t0) / 1e3, e["dur"] / 1e3)
            for e in chosen
            if e["pid"] == pid and e["tid"] == tid
        ]
        cols = [
            colors.get(e["name"], "gray") for e in chosen if e["pid"] == pid and e["tid"] == tid
        ]
        # white edges: back-to-back spans (a busy comm thread) stay apart
        ax.broken_barh(bars, (y - 0.4, 0.8), facecolors=cols, edgecolor="white", linewidth=0.8)
    ax.set_yticks(range(len(rows)), [f"rank {p} {t}" for p, t in rows], fontsize=7)
    end = max((e["ts"] + e["dur"] - t0) / 1e3 for e in chosen)
    span = max(span or 0.0, end)
    ax.set_xlim(0, span)
    ax.set_title(
        f"{label}: 4 iterations (compute blue, AllReduce orange, update green)", fontsize=9
    )
    return span
