"""`pipesgd compare`: the paper's comparison in miniature, measured and predicted side by side.

The same problem (data, model, seed, batch size, learning rate, steps) is trained seven ways on p
local worker processes over TCP, through one emulated network:

    ps-sync        parameter server, synchronous          (the conventional baseline)
    ps-async       parameter server, asynchronous          (no barrier; stale by up to ~p-1)
    sync           ring AllReduce, synchronous             (decentralized; compute then comm)
    ddp            ring AllReduce in buckets, synchronous  (each bucket during the backward)
    pipe           Pipe-SGD, width 2                       (comm of step t overlaps compute t+1)
    pipe+trunc16   Pipe-SGD, 16-bit truncation in the ring (half the bytes)
    pipe+q8        Pipe-SGD, 8-bit quantization in the ring (a quarter of the bytes)

Before the runs, `timing.calibrate.calibrate` measures this machine (t_comp, t_u, gamma, the
codecs, the cost of a hop: the machine's figures first, then the chosen link's) and
`timing.predict` gives each method's iteration time. Each run records its timeline
(trace.json), its loss at every step, and a copy of the weights every `eval_every` steps,
evaluated on the test set after training; the first evaluation at or above `target_accuracy`
gives the wall-clock time to target.

Repeats. Every method runs `repeats` times (2 by default, 1 with --quick), in passes: every
method once, then every one again, so a slow minute of the machine falls on one repeat of a few
methods, not on every repeat of one. The table keeps each method's repeat that reached the
target soonest (the fastest of its repeats, as timeit reports the fastest: on a machine shared
with other jobs, noise only ever adds time), and compare.json keeps every repeat's figures.

Output (in --out, default runs/compare): compare.json (calibration, predictions, every run's
summary, the table, the checks), one folder per run (summary.json, trace.json; with repeats,
one per repeat: ps-sync/repeat-1, ps-sync/repeat-2, ...), and with matplotlib:
loss_vs_time.png, time_breakdown.png, timeline.png, predicted_vs_bandwidth.png (drawn from the
kept repeats).

The default problem is the `compare` preset (presets.py), on an emulated network whose
bandwidth is chosen for this machine (`choose`; compare_link.py): the ring AllReduce of the
gradient takes as long as the computation of one step on its shared cores, the
communication-heavy regime of the paper, where pipelining pays most. A bandwidth the config
names is kept. The checks (compare_checks.py) hold the same meaning on any machine, and the
report says how busy the machine was with other programs (timing/load.py): a busy one makes
every timing figure unreliable.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pipesgd_ref import timing
from pipesgd_ref.commands.compare_checks import HEADLINE, check_targets
from pipesgd_ref.commands.compare_checks import check_compare_options as check_compare_options
from pipesgd_ref.commands.compare_figures import plot_compare
from pipesgd_ref.commands.compare_link import choose_link, given_link
from pipesgd_ref.commands.compare_peers import available, peer_checks, peer_note, run_peer_repeat
from pipesgd_ref.commands.train import run_training
from pipesgd_ref.config import TrainConfig, model_label
from pipesgd_ref.data import load_dataset
from pipesgd_ref.errors import JobStopped
from pipesgd_ref.methods.table import method
from pipesgd_ref.outputs import write_json, write_text_atomic
from pipesgd_ref.runtime.preflight import check_config, check_run, n_params_of
from pipesgd_ref.timing import load
from pipesgd_ref.timing.calibrate import calibrate, calibrate_machine
from pipesgd_ref.timing.sharing import CALIBRATION_REPS, CALIBRATION_TRIES, time_busy_compute

# What a finished comparison writes beside its run folders, and the file that marks a folder
# whose comparison has not finished (outputs.RUN_MARKERS keeps a second one off it too).
REPORT_FILES = (
    "compare.json",
    "loss_vs_time.png",
    "time_breakdown.png",
    "timeline.png",
    "predicted_vs_bandwidth.png",
)
INCOMPLETE = "INCOMPLETE"
REPEATS = 2  # runs of each method; the table keeps the one that reached the target soonest
# --quick calibrates as thoroughly as the full comparison: its checks hold each measured
# speedup against the model's, and a calibration of one launch per figure and 6 steps missed
# pipe's by 22% on a quiet machine here (the same run's full calibration: 3%).
QUICK_CALIBRATION_REPS = CALIBRATION_REPS  # timed steps per process in --quick's calibration
QUICK_CALIBRATION_TRIES = CALIBRATION_TRIES  # launches per figure, the fastest kept


def quick_config(cfg: TrainConfig) -> TrainConfig:
    """`--quick`: the same problem, four fifths of its steps (at least 10, never more than
    asked for), run once: for CI and tutorials, about a minute, and still long enough for the
    default problem to reach its target (in its last few steps)."""
    return cfg.replace(steps=min(cfg.steps, max(10, cfg.steps * 4 // 5)))


def calibrate_for(
    cfg: TrainConfig,
    runs=timing.COMPARE_RUNS,
    reps: int = CALIBRATION_REPS,
    tries: int = CALIBRATION_TRIES,
    network: dict | None = None,
    base: timing.Calibration | None = None,
) -> timing.Calibration:
    """The calibration compare uses: everything calibrate measures, plus Pipe-SGD's
    compute next to its communication for every codec a pipe run of `runs` uses. `network`:
    the wire's figures when measured elsewhere (calibrate's; compare_mpi.py measures MPI's);
    `base`: the machine's figures, measured already (calibrate_machine)."""
    busy = tuple(sorted({codec for algo, codec in runs if method(algo).pipelined}))
    return calibrate(cfg, network=network, busy_codecs=busy, reps=reps, tries=tries, base=base)


def run_config(
    cfg: TrainConfig, algo: str, codec: str, out: Path | None, repeat: int | None = None
) -> TrainConfig:
    """The config of one run of the comparison: cfg with this algo and codec, written to
    out/LABEL, or out/LABEL/repeat-K when the method runs more than once."""
    row = method(algo)
    folder = ""
    if out:
        run_dir = out / timing.run_label(algo, codec)
        folder = str(run_dir / f"repeat-{repeat}" if repeat is not None else run_dir)
    return cfg.replace(
        algo=algo,
        codec=codec,
        width=cfg.width if row.pipelined else 1,
        # cfg's compensation and staleness bound for the methods that take them, else none
        compensation=cfg.compensation if cfg.compensation in row.compensations else "none",
        max_staleness=cfg.max_staleness if row.bounded_staleness else -1,
        allreduce=cfg.allreduce if codec == "none" else "ring",  # a codec's is the ring's
        codec_pull="none",
        out=folder,
    )


def preflight_runs(cfg: TrainConfig, runs=timing.COMPARE_RUNS) -> None:
    """Every run of the comparison through the preflight (runtime/preflight.py) before any
    worker starts: its options make a run, its model fits in memory, its link delivers a frame
    within --timeout. One line for the first run that fails, not a failure minutes in; and
    auto's figures read once here (a broken models file: one line, not one per rank)."""
    from pipesgd_ref.comm.choose import launcher_models
    from pipesgd_ref.runtime.job import job_allreduce

    n_params = n_params_of(cfg, load_dataset(cfg.dataset))  # the same model in every run
    for algo, codec in runs:
        run = run_config(cfg, algo, codec, None)
        check_config(run)
        check_run(run, n_params)
    if cfg.world_size > 1 and any(
        job_allreduce(run_config(cfg, a, c, None)) == "auto" for a, c in runs
    ):
        launcher_models()


def soonest(repeats: list[dict]) -> int:
    """Index of the repeat (a list of run summaries) that reached the target soonest; where
    none reached it, the one with the shortest iteration."""

    def key(s: dict) -> tuple[float, float]:
        ttt = s["time_to_target_s"]
        return (math.inf if ttt is None else ttt, s["iter_time_s"])

    return min(range(len(repeats)), key=lambda i: key(repeats[i]))


def repeat_brief(s: dict) -> dict:
    """What compare.json keeps of every repeat, kept or not."""
    keys = (
        "iter_time_s",
        "t_comp_s",
        "time_to_target_s",
        "steps_to_target",
        "test_accuracy",
        "wall_time_s",
    )
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
    choose: bool = False,
    peers: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Calibrate, predict, run every method `repeats` times, and report; returns what
    compare.json holds. `train(cfg, progress=, log=, label=)` runs one method and returns
    (summary, results): run_training's local workers by default, a job of MPI ranks under
    `--comm mpi` (compare_mpi.py). `choose`: set cfg's bandwidth for this machine from the
    calibration (compare_link.py; `pipesgd compare` without --bandwidth), else keep cfg's.
    `peers`: other libraries' rows (compare_peers.py: torch-ddp, torch-pipe), run in the same
    passes; without torch they are skipped in one line."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    if choose and calibration is not None:
        raise ValueError("choose measures the machine to choose the link: give no calibration")
    preflight_runs(cfg, runs)  # before the calibration starts a worker
    out_dir = Path(out) if out else None
    if out_dir is not None:
        mark_incomplete(out_dir)
    how = dict(progress=progress, log=log, runs=runs, calibration=calibration, choose=choose)
    how["peers"], how["skipped"] = available(list(peers), log)
    cal_options = dict(reps=calibration_reps, tries=calibration_tries)
    try:
        return _compare(cfg, out_dir, how, cal_options, repeats, train)
    except JobStopped as e:
        e.args = (compare_stopped_line(e, out_dir, runs),)
        raise


def _compare(cfg, out_dir, how: dict, cal_options: dict, repeats, train) -> dict[str, Any]:
    """run_compare's work, once the folder is marked incomplete."""
    started = time.perf_counter()
    start, log, runs = load.sample(), how["log"], how["runs"]
    before = load.quiet_window()  # other programs' load before the calibration starts any
    times = f" x {repeats} repeats" if repeats > 1 else ""
    link_words = timing_link(cfg)
    if how["choose"]:  # the bandwidth is not known yet: the calibration chooses it
        link_words = f"latency {cfg.latency}, bandwidth chosen for this machine after measuring it"
    also = f" (and {', '.join(how['peers'])})" if how["peers"] else ""
    log(
        f"compare: {len(runs)} runs{also}{times} of {cfg.world_size} workers, {cfg.dataset}, "
        f"{model_label(cfg)}, batch {cfg.batch_size}, {cfg.steps} steps, link {link_words}"
    )
    cfg, cal, link = _calibrated(cfg, how, cal_options)
    options = dict(width=cfg.width, ps_pulls=cfg.ps_pulls, compensation=cfg.compensation)
    preds = timing.predict_all(cfg.world_size, cal, runs, **options)
    progress, peers = how["progress"], how["peers"]
    done, all_traces = run_repeats(
        cfg, runs, preds, out_dir, repeats, progress, log, train, peers=peers
    )
    summaries: dict[str, dict] = {}
    traces: dict[str, list[dict]] = {}
    for label, repeat_summaries in done.items():
        kept = soonest(repeat_summaries)
        briefs = [repeat_brief(s) for s in repeat_summaries]
        summaries[label] = {**repeat_summaries[kept], "repeat": kept + 1, "repeats": briefs}
        traces[label] = all_traces[label][kept]
    after = load.quiet_window()
    rows = table_rows(summaries, preds)
    report = {
        "kind": "compare",
        "config": cfg.to_dict(),
        "link": link,
        "load": load.report(before, load.others_between(start, load.sample()), after),
        "calibration": cal.to_dict(),
        "predictions": {k: v.to_dict() for k, v in preds.items()},
        "table": rows,
        "checks": check_targets([r for r in rows if r["run"] not in peers]) + peer_checks(rows),
        "repeats": repeats,
        "runs": {k: _without_heavy(v) for k, v in summaries.items()},
        "peers": {"ran": peers, "skipped": how["skipped"], "note": peer_note(cfg, peers)},
        "wall_time_s": time.perf_counter() - started,
    }
    _log_report(report, cfg, log)
    if out_dir is not None:
        write_json(out_dir / "compare.json", report)
        ours = {k: v for k, v in summaries.items() if k not in peers}  # the figures': ours
        figures = plot_compare(report, ours, traces, cal, cfg, out_dir)
        extra = f" and {len(figures)} figures" if figures else " (no matplotlib: no figures)"
        log(f"wrote {out_dir / 'compare.json'}{extra}")
        (out_dir / INCOMPLETE).unlink(missing_ok=True)
    log(f"compare: done in {report['wall_time_s']:.0f} s")
    return report


def _calibrated(cfg: TrainConfig, how: dict, cal_options: dict):
    """(cfg on its link, the calibration, the report's "link" entry): the calibration given,
    or measured here; with how["choose"], the machine's figures first, the link chosen from
    them (compare_link.choose_link), then the link's figures on it."""
    log, runs, cal = how["log"], how["runs"], how["calibration"]
    reps, tries = cal_options["reps"], cal_options["tries"]
    if cal is None:
        log("calibrating the timing model on this machine ...")
    if how["choose"]:
        base = calibrate_machine(cfg, reps=reps, tries=tries)
        busy = None
        if any(method(algo).pipelined for algo, _ in runs):  # balance pipe's compute thread

            def busy(on_link: TrainConfig, hop_bytes: int) -> float:
                return time_busy_compute(on_link, ("none",), reps, hop_bytes, tries)[0]["none"]

        cfg, link, network = choose_link(cfg, base, busy=busy)
        log(f"  link: {link['reason']}")
        preflight_runs(cfg, runs)  # the chosen link against --timeout
        cal = calibrate_for(cfg, runs, reps, tries, network, base=base)
    else:
        cal = cal or calibrate_for(cfg, runs, reps, tries)
        link = given_link(cfg, cal)
    log("  " + timing.describe(cal))
    return cfg, cal, link


def mark_incomplete(out_dir: Path) -> None:
    """Before the first run: the folder says it holds an unfinished comparison (INCOMPLETE,
    removed once compare.json is written), and an earlier comparison's report and figures
    (--overwrite) go, so none of them stands beside the new runs' half-finished folders."""
    for name in REPORT_FILES:
        (out_dir / name).unlink(missing_ok=True)
    write_text_atomic(
        out_dir / INCOMPLETE,
        "This comparison did not finish: the run folders here are partial and there is no "
        "compare.json yet.\nA comparison does not resume: run `pipesgd compare` again with "
        "--overwrite.\n",
    )


def compare_stopped_line(stopped: JobStopped, out_dir: Path | None, runs) -> str:
    """The one line a stopped comparison ends with: the signal, the run it stopped, and what
    to do (a run's own advice, --resume of its folder, would not finish the comparison)."""
    run = stopped.cfg
    which = f" during {timing.run_label(run.algo, run.codec)}" if run is not None else ""
    line = f"compare: stopped by {stopped.signal_name}{which} ({len(runs)} runs in all)"
    if out_dir is None:
        return line
    return (
        f"{line}; {out_dir} is incomplete (see {out_dir / INCOMPLETE}): a comparison does not "
        f"resume, run it again with --overwrite"
    )


def run_repeats(
    cfg: TrainConfig,
    runs,
    preds: dict,
    out_dir: Path | None,
    repeats: int,
    progress: bool,
    log: Callable[[str], None],
    train: Callable[..., tuple[dict, list]],
    peers: Sequence[str] = (),
) -> tuple[dict[str, list[dict]], dict[str, list[list[dict]]]]:
    """Every run `repeats` times, in passes (all runs once, then all again, each pass ending
    with the `peers`' runs): {label: each repeat's summary} and {label: each repeat's trace
    events} (none for a peer)."""
    labels = [timing.run_label(algo, codec) for algo, codec in runs] + list(peers)
    done: dict[str, list[dict]] = {label: [] for label in labels}
    all_traces: dict[str, list[list[dict]]] = {label: [] for label in labels}
    total = len(labels) * repeats
    for k in range(repeats):
        for i, label in enumerate(labels):
            repeat = k + 1 if repeats > 1 else None
            n = k * len(labels) + i + 1
            tag = f"[{n}/{total}] {label}" + (f" (repeat {k + 1})" if repeats > 1 else "")
            if label in peers:  # another library's run (compare_peers.py): no prediction
                summary, events = run_peer_repeat(cfg, label, out_dir, repeat)
            else:
                algo, codec = runs[i]
                if k == 0:
                    log(f"{tag}: predicted iteration {preds[label].iter_time_s * 1e3:.1f} ms")
                run_cfg = run_config(cfg, algo, codec, out_dir, repeat)
                summary, results = train(run_cfg, progress=progress, log=_quiet, label=tag)
                events = [e for r in results for e in r.events]
            done[label].append(summary)
            all_traces[label].append(events)
            reached = summary["time_to_target_s"]
            got = f"reached in {reached:.2f} s" if reached is not None else "not reached"
            log(
                f"{tag}: iteration {summary['iter_time_s'] * 1e3:.1f} ms, test accuracy "
                f"{summary['test_accuracy']:.4f}, target {got}"
            )
    return done, all_traces


def _log_report(report: dict, cfg: TrainConfig, log: Callable[[str], None]) -> None:
    """The table, the checks, and what to read them as."""
    log("")
    log(format_table(report["table"], cfg))
    if report["peers"]["note"]:
        log(report["peers"]["note"])
    if report["repeats"] > 1:
        log(
            f"(each method ran {report['repeats']} times; the table keeps the repeat that "
            f"reached the target soonest; every repeat is in compare.json)"
        )
    log("")
    for c in report["checks"]:
        log(c["text"])
    if cfg.model != "mlp":
        log(
            f"(the {HEADLINE}x bar is the paper's headline on the MLP problem of the compare "
            f"preset; on --model {cfg.model} it is a figure to read, not a target)"
        )
    log("")
    log(f"link: {report['link']['reason']}")
    log(load.describe(report["load"]))
    if report["load"]["warning"]:
        log(report["load"]["warning"])


def _quiet(*_: Any) -> None:
    pass


def timing_link(cfg: TrainConfig) -> str:
    """The link the runs share, in words."""
    from pipesgd_ref.comm.netem import link_of

    if cfg.comm == "mpi":
        return "MPI's own, not emulated"
    link = link_of(cfg)
    return str(link) if link.enabled else "loopback, not emulated"


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
        pred = preds[label].iter_time_s if label in preds else None  # a peer has none
        meas = s["iter_time_s"]
        ttt = s["time_to_target_s"]
        base_ttt = base["time_to_target_s"] if base else None
        rows.append(
            {
                "run": label,
                "iter_ms": meas * 1e3,
                "predicted_ms": pred * 1e3 if pred is not None else None,
                "error": (pred - meas) / meas if pred is not None else None,
                "iter_speedup": (base["iter_time_s"] / meas) if base else None,
                "time_to_target_s": ttt,
                "steps_to_target": s["steps_to_target"],
                "speedup_to_target": (base_ttt / ttt) if base_ttt and ttt else None,
                "test_accuracy": s["test_accuracy"],
                "t_comp_ms": None if pred is None else (s["t_comp_s"] or 0.0) * 1e3,
                "comm_hidden_fraction": s["comm_hidden_fraction"],
            }
        )
    return rows


def format_table(rows: list[dict], cfg: TrainConfig) -> str:
    target = f"to {cfg.target_accuracy:.0%} s"
    head = (
        f"{'run':<13} {'iter ms':>8} {'predicted':>9} {'error':>6} {'x ps-sync':>9} "
        f"{target:>9} {'steps':>5} {'x ps-sync':>9} {'test acc':>8}"
    )
    lines = [
        f"{cfg.world_size} workers, {cfg.dataset}, link {timing_link(cfg)}; 'x ps-sync': "
        f"speedup over ps-sync per iteration, then in time to {cfg.target_accuracy:.0%} test "
        f"accuracy",
        head,
        "-" * len(head),
    ]

    def num(x, fmt):  # a missing figure keeps the column's width (fmt is ">W..." here)
        m = re.match(r">[+ -]?(\d*)", fmt)
        width = int(m.group(1) or 0) if m else 0
        return format(x, fmt) if x is not None else "-".rjust(width)

    for r in rows:
        lines.append(
            f"{r['run']:<13} {r['iter_ms']:>8.1f} {num(r['predicted_ms'], '>9.1f')} "
            f"{num(r['error'], '>+6.0%')} {num(r['iter_speedup'], '>8.2f')}x "
            f"{num(r['time_to_target_s'], '>9.2f')} {num(r['steps_to_target'], '>5')} "
            f"{num(r['speedup_to_target'], '>8.2f')}x {r['test_accuracy']:>8.4f}"
        )
    errors = [abs(r["error"]) for r in rows if r["error"] is not None]
    if not errors:
        return "\n".join(lines)
    lines.append(
        f"timing model: median |error| {sorted(errors)[len(errors) // 2]:.0%}, worst "
        f"{max(errors):.0%}"
    )
    return "\n".join(lines)
