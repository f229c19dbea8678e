"""`pipesgd predict`: each method's iteration time from the timing models, before any run.

The models are those of timing/iteration.py (docs/paper.md, section 3): ring AllReduce
T_ar = 2(p-1) alpha + 2(p-1)/p M/(rB) + (p-1)/p M gamma (+ codec), sync = t_comp + T_ar + t_u,
Pipe-SGD of width two = max(t_comp + t_u, T_ar), ddp (sync with the AllReduce in buckets
during the backward, each bucket's ring started as the backward writes it: Eq. 12), the
parameter server's (p + 1) M/B round, and the async server's p M/B link bound. This command
fills in their figures and prints, for every run of `pipesgd compare` (timing.COMPARE_RUNS),
the predicted iteration time, its parts (compute, communication, how much communication hides
under compute, what bounds the cycle) and the speedup over ps-sync:

    pipesgd predict                                     # laptop MLP, 4 workers, 50us, 1 Gbit/s
    pipesgd predict --hidden 512,512 --batch-size 64 --bandwidth 10Gbit
    pipesgd predict --params 25M --t-comp 200ms --world-size 8      # a ResNet-50-sized model
    pipesgd predict --sweep bandwidth=100Mbit..100Gbit --out runs/predict   # + plot and JSON
    pipesgd predict --sweep world_size=2..64 --params 25M --t-comp 200ms
    pipesgd predict --this-machine --world-size 2       # calibrated on this machine's cores

Where the figures come from. n (and so M = 4n bytes), t_comp and t_u: the model given by
--model/--hidden/--dataset/--batch-size is built and timed in this process (a worker's one
core, one BLAS thread), or --params N with --t-comp says them outright. gamma, the socket copy
cost and each codec's encode/decode seconds per byte are timed here on a gradient-sized array
(at most 4 MB: past the caches a per-byte cost no longer changes). The network is what you
say: alpha = --latency + --hop-cost (the software cost of one message, 0 unless given), B =
--bandwidth. The cores: by default a cluster, each worker its own machine with
--cores-per-worker cores (1: the one core jobenv.pin_to_core gives a worker), so no two workers
share a core. That takes a second or two (mostly loading the dataset) and starts no process.

--this-machine instead predicts p worker processes on this machine, as `pipesgd train` runs
them: timing/calibrate.py starts p processes to measure how compute slows when they share the
cores, the hop cost of a tiny ring AllReduce and the bandwidth loopback can stream (which caps
an emulated --bandwidth above it). A few seconds; a world_size sweep past p extrapolates the
shared compute from the p measured (timing.compute_time).

--sweep KEY=LOW..HIGH (bandwidth, latency: 13 log-spaced values; world_size: 2, 3, 4, 6, 8, ...)
prints one row per value with every run's iteration time and pipe's speedup over sync and over
ddp, then answers three questions, located exactly by bisecting the models between the rows
(predict_sweep.py):

    where does pipelining stop paying?  the first value past which pipe is under PAYS = 1.1x
                                        faster than sync (a smaller gain is not worth staleness)
    where does Pipe-SGD stop beating    the same against ddp: the overlap every DDP-style
    ddp?                                trainer already has, not plain sync, is the rival
    where does PS fall behind?          where ps-sync turns slower than sync

What decides the ddp answer is the backward's shape: a bucket's AllReduce can hide only behind
the backward left after the bucket is ready, (1 - f_j) t_comp, where f_j is the share of
t_comp done when the backward has written the bucket's last layer (backward_units). Pipe-SGD
hides the whole T_ar behind the next step. So pipe gains most over ddp where the big layers
are ready late (near the input: the compare preset's MLP has its 4.2 MB layer second from the
bottom, ready at about 2/3 of t_comp, and gains up to about 1.5x over ddp), and little where
they are ready early (the CNN's big dense layer is ready before half of t_comp). Where the
link is fast enough that every bucket fits in the backward left after it, ddp is compute
bound and equals pipe. A model given by its flags is timed here and brings its own profile
(--hidden 2048,512,512 has its 4 MB layer ready at about 0.72 of t_comp, --hidden
512,512,2048 at about 0.62: pipe's best over ddp about 1.38x and 1.48x on 4 one-core workers);
--params N --t-comp T has none, and ten equal layers, the forward a third of t_comp, are
assumed (timing/buckets.py). --bucket-size (default 32KB, --algo ddp's) sets how the layers
group into buckets: larger buckets start later, each bucket pays the ring's 2(p-1) alpha.

With --plot FILE (or --out DIR: DIR/predict_sweep.png) and matplotlib installed, the curves are
drawn: iteration time against the swept value, log axes, one line per run. --json FILE (or
--out DIR: DIR/predict.json) writes the calibration, the predictions and the answers.

Bad input (an unknown codec, a world size below 1, an unreadable bandwidth, --params without
--t-comp, ...) raises ConfigError with a message that says what to write instead
(predict_scenario.py), before anything is timed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pipesgd_ref import timing
from pipesgd_ref.commands.predict_scenario import (
    DEFAULT_CODECS,
    MAX_WORLD,
    Scenario,
    scenario_from_args,
)
from pipesgd_ref.commands.predict_sweep import PAYS, answer_questions, format_sweep, plot_sweep
from pipesgd_ref.errors import ConfigError
from pipesgd_ref.units import format_bandwidth, format_bytes, format_seconds

BASELINE = "ps-sync"  # the speedup column's reference, as in the paper's comparison


def add_parser(sub) -> argparse.ArgumentParser:
    """Add the `predict` command to `sub` (the subparsers object of the `pipesgd` parser)."""
    p = sub.add_parser(
        "predict",
        help="predicted iteration time of every method, from the timing models",
        description=__doc__.split("\n\n")[0],
        epilog="See pipesgd_ref/commands/predict.py for the models and where each figure "
        "comes from.",
    )
    m = p.add_argument_group("the model (timed here), or --params and --t-comp")
    m.add_argument("--model", default=None, metavar="{mlp,softmax,cnn}", help="default: mlp")
    m.add_argument("--hidden", default=None, help="MLP hidden widths, e.g. 512,512 (default 64)")
    m.add_argument("--channels", default=None, help="cnn: channels per conv layer (default 6,16)")
    m.add_argument("--kernels", default=None, help="cnn: kernel sizes, odd (default 5,5)")
    m.add_argument("--dataset", default=None, help="digits (default), synthetic:..., mnist:PATH")
    m.add_argument("--batch-size", type=int, default=None, help="per worker (default 32)")
    m.add_argument("--backend", default=None, help="numpy (default) or numba")
    m.add_argument("--params", default=None, help="a parameter count instead: 300000, 3e5, 25M")
    m.add_argument("--t-comp", default=None, help="forward + backward time, e.g. 10ms")
    m.add_argument("--t-update", default=None, help="SGD update time (default: timed here)")
    n = p.add_argument_group("the cluster and its network")
    n.add_argument("--world-size", type=int, default=4, help="workers p (default 4)")
    n.add_argument("--latency", default="50us", help="per message, e.g. 50us (default)")
    n.add_argument("--bandwidth", default="1Gbit", help="per link and direction (default 1Gbit)")
    n.add_argument("--hop-cost", default=None, help="software cost of one message (default 0)")
    n.add_argument("--cores-per-worker", type=int, default=1, help="cluster cores (default 1)")
    n.add_argument("--this-machine", action="store_true", help="p processes on this machine")
    r = p.add_argument_group("what to predict and where to write it")
    r.add_argument("--codecs", default=DEFAULT_CODECS, help="pipe runs with codecs, or none")
    r.add_argument("--width", type=int, default=2, help="pipeline width K of pipe (default 2)")
    r.add_argument(
        "--ps-pulls",
        default="sequential",
        choices=("sequential", "shared"),
        help="ps-sync's pulls: one after another, or all at once sharing the link "
        "(as pipesgd compare's baseline)",
    )
    r.add_argument(
        "--bucket-size",
        default="32KB",
        help="ddp's buckets: at least this many bytes each, e.g. 32KB (default), 1MB, 0 (a "
        "layer each)",
    )
    r.add_argument("--sweep", default=None, help="e.g. bandwidth=100Mbit..100Gbit")
    r.add_argument("--plot", default=None, help="write the sweep's figure here (.png, .pdf)")
    r.add_argument("--json", dest="json_path", default=None, help="write the predictions here")
    r.add_argument("--out", dest="out_dir", default=None, help="folder for the JSON and figure")
    from pipesgd_ref.runtime.launch import add_many_workers_flag

    add_many_workers_flag(n)  # --this-machine starts --world-size processes
    return p


def cmd_predict(args) -> int:
    """`pipesgd predict`: print (and write) the predictions; 0 on success, ConfigError on bad
    input (the CLI prints it as one line and exits 2)."""
    sweep = _sweep_of(args)
    out = Path(args.out_dir) if args.out_dir else None
    plot_path = args.plot or (out / "predict_sweep.png" if out and sweep else None)
    json_path = args.json_path or (out / "predict.json" if out else None)
    _prepare_outputs(args, plot_path, json_path)  # before the model is timed: never lost

    s = scenario_from_args(args)
    _print_scenario(s)
    preds = s.predict()
    print()
    print(format_table(preds))
    gain = preds["sync"].iter_time_s / preds["pipe"].iter_time_s
    lag = preds["ps-sync"].iter_time_s / preds["sync"].iter_time_s
    verdict = "pays" if gain >= PAYS else f"does not pay (under {PAYS:.1f}x)"
    ps_vs = f"{lag:.2f}x slower" if lag > 1 else f"{1 / lag:.2f}x faster"
    print(f"\npipe over sync: {gain:.2f}x faster, pipelining {verdict}; ps-sync vs sync: {ps_vs}")
    over_ddp = preds["ddp"].iter_time_s / preds["pipe"].iter_time_s
    print(
        f"pipe over ddp (buckets of {format_bytes(s.bucket_size)}, all-reduced during the "
        f"backward): {over_ddp:.2f}x faster"
    )
    ups = timing.speedups(preds, BASELINE)
    payload = {
        "command": "predict",
        "world_size": s.world_size,
        "width": s.width,
        "model": s.what,
        "mode": "this-machine" if s.cores_per_worker is None else "cluster",
        "network": {"latency_s": s.latency, "hop_s": s.hop, "bandwidth": s.cal.bandwidth},
        "bucket_size": s.bucket_size,
        "calibration": s.cal.to_dict(),
        "runs": {k: {**p.to_dict(), f"speedup_vs_{BASELINE}": ups[k]} for k, p in preds.items()},
    }
    if sweep:
        payload["sweep"] = _run_sweep(s, sweep[0], [float(v) for v in sweep[1]], plot_path)
    if json_path:
        from pipesgd_ref.outputs import write_json

        write_json(Path(json_path), payload)
        print(f"wrote {json_path}")
    return 0


def _sweep_of(args: argparse.Namespace) -> tuple | None:
    """--sweep's (key, values), checked with --plot; None without --sweep."""
    sweep = None
    if args.sweep:
        try:
            sweep = timing.sweep_values(args.sweep)
        except ValueError as e:
            raise ConfigError(f"--sweep: {e}") from None
        if sweep[0] == "world_size" and sweep[1][-1] > MAX_WORLD:
            raise ConfigError(
                f"--sweep {args.sweep}: predictions go up to world_size {MAX_WORLD} (the timing "
                f"model steps through every worker's ring schedule; beyond that it takes minutes)"
            )
    if args.plot and not sweep:
        raise ConfigError(
            "--plot draws a sweep: add --sweep, e.g. --sweep bandwidth=100Mbit..100Gbit"
        )
    return sweep


def _print_scenario(s: Scenario) -> None:
    """The header: the workers and the model, the network and the cores, the calibration."""
    if s.cores_per_worker is None:
        where = f"this machine: {s.cal.cores} cores shared by {s.world_size} worker processes"
    else:
        cores = f"{s.cores_per_worker} core" + ("s" if s.cores_per_worker > 1 else "")
        where = f"a cluster: each worker its own machine of {cores}"
    print(
        f"pipesgd predict: {s.world_size} workers, {s.what}, M = {format_bytes(s.cal.grad_bytes)};"
        f" pipe of width {s.width} (staleness {s.width - 1})"
    )
    print(
        f"network: latency {format_seconds(s.latency)} + hop {format_seconds(s.hop)}, "
        f"bandwidth {format_bandwidth(s.cal.bandwidth)}; {where}"
    )
    print(f"calibration: {timing.describe(s.cal)}")


def _run_sweep(s: Scenario, key: str, values: list[float], plot_path) -> dict:
    """Print the sweep's table and answers, draw it to `plot_path`; what predict.json keeps."""
    rows = [s.predict(key, v) for v in values]
    answers = answer_questions(s, key, values)
    print(f"\nsweep of {key}: predicted iteration time of every run")
    if key == "bandwidth" and values[-1] > s.stream_cap:
        cap = format_bandwidth(s.stream_cap)
        print(f"(this machine streams {cap}: faster links predict as that)")
    if key == "world_size" and s.cores_per_worker is None and values[-1] > s.world_size:
        print(f"(compute sharing measured up to p = {s.world_size}, extrapolated beyond)")
    print(format_sweep(key, values, rows))
    print(f"\nwhere does pipelining stop paying? {answers['pipelining']['text']}")
    print(f"where does Pipe-SGD stop beating ddp? {answers['ddp']['text']}")
    print(f"where does PS fall behind? {answers['ps']['text']}")
    if plot_path:
        title = f"{s.world_size} workers, {s.what}" if key != "world_size" else s.what
        if plot_sweep(key, values, rows, answers, plot_path, title) is None:
            print(
                "no plot: matplotlib is not installed (pip install -e '.[plot]')", file=sys.stderr
            )
    return {
        "key": key,
        "values": values,
        "iter_time_s": {lb: [r[lb].iter_time_s for r in rows] for lb in rows[0]},
        "bound": {lb: [r[lb].bound for r in rows] for lb in rows[0]},
        "answers": answers,
    }


# --- printing -------------------------------------------------------------------------------------


def format_table(preds: dict) -> str:
    """One row per run: iteration time, its parts, the bound and the speedup over ps-sync."""
    ups = timing.speedups(preds, BASELINE)
    head = (
        f"{'run':<14} {'iter time':>10} {'compute':>10} {'comm':>10} {'hidden':>16} "
        f"{'bound':>8} {'vs ' + BASELINE:>11}"
    )
    lines = [head, "-" * len(head)]
    for label, p in preds.items():
        share = f" ({p.hidden_s / p.comm_s:.0%})" if p.comm_s > 0 else ""
        hidden = format_seconds(p.hidden_s) + share
        lines.append(
            f"{label:<14} {format_seconds(p.iter_time_s):>10} {format_seconds(p.compute_s):>10} "
            f"{format_seconds(p.comm_s):>10} {hidden:>16} {p.bound:>8} {ups[label]:>10.2f}x"
        )
    return "\n".join(lines)


def _prepare_outputs(args, plot_path, json_path) -> None:
    """--out, --plot and --json checked and their folders made (outputs.py), and the figure's
    suffix one matplotlib writes: an error now, not after the calibration."""
    from pipesgd_ref.outputs import prepare_file, prepare_out_dir
    from pipesgd_ref.plots import figure_formats

    if args.out_dir is not None:
        prepare_out_dir(args.out_dir, overwrite=True)  # predict's files are replaced freely
    if plot_path:
        flag = "--plot" if args.plot else "--out"
        prepare_file(plot_path, flag)
        formats = figure_formats()
        suffix = Path(plot_path).suffix[1:].lower()
        if formats and suffix not in formats:
            raise ConfigError(
                f"{flag} {str(plot_path)!r}: matplotlib cannot write a {suffix or 'suffix-less'} "
                f"file; end the name in one of .{', .'.join(formats)}"
            )
    if json_path:
        prepare_file(json_path, "--json" if args.json_path else "--out")
