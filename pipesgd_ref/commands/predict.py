"""`pipesgd predict`: each method's iteration time from the timing models, before any run.

The models are those of timing/models.py (shared/PAPER.md section 3): ring AllReduce
T_ar = 2(p-1) alpha + 2(p-1)/p M/(rB) + (p-1)/p M gamma (+ codec), sync = t_comp + T_ar + t_u,
Pipe-SGD of width two = max(t_comp + t_u, T_ar), the parameter server's (p + 1) M/B round, and
the async server's p M/B link bound. This command fills in their figures and prints, for every
run of `pipesgd compare` (timing.COMPARE_RUNS), the predicted iteration time, its parts
(compute, communication, how much communication hides under compute, what bounds the cycle) and
the speedup over ps-sync:

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
--cores-per-worker cores (1: the one core launch.pin_to_core gives a worker), so no two workers
share a core. That takes a second or two (mostly loading the dataset) and starts no process.

--this-machine instead predicts p worker processes on this machine, as `pipesgd train` runs
them: timing/calibrate.py starts p processes to measure how compute slows when they share the
cores, the hop cost of a tiny ring AllReduce and the bandwidth loopback can stream (which caps
an emulated --bandwidth above it). A few seconds; a world_size sweep past p extrapolates the
shared compute from the p measured (timing.compute_time).

--sweep KEY=LOW..HIGH (bandwidth, latency: 13 log-spaced values; world_size: 2, 3, 4, 6, 8, ...)
prints one row per value with every run's iteration time, then answers two questions, located
exactly by bisecting the models between the rows:

    where does pipelining stop paying?  the first value past which pipe is under PAYS = 1.1x
                                        faster than sync (a smaller gain is not worth staleness)
    where does PS fall behind?          where ps-sync turns slower than sync

With --plot FILE (or --out DIR: DIR/predict_sweep.png) and matplotlib installed, the curves are
drawn: iteration time against the swept value, log axes, one line per run. --json FILE (or
--out DIR: DIR/predict.json) writes the calibration, the predictions and the answers.

Bad input (an unknown codec, a world size below 1, an unreadable bandwidth, --params without
--t-comp, ...) raises ConfigError with a message that says what to write instead.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from pipesgd_ref import timing
from pipesgd_ref.config import TrainConfig, model_label
from pipesgd_ref.errors import ConfigError
from pipesgd_ref.timing import COMPARE_RUNS, Calibration, Prediction
from pipesgd_ref.timing.calibrate import (
    calibrate,
    network_figures,
    time_codecs,
    time_compute,
    time_gamma_and_copy,
)
from pipesgd_ref.units import format_bandwidth, format_bytes, format_seconds

PAYS = 1.1  # pipe must beat sync by this factor to be worth its staleness (PAPER.md section 5)
BASELINE = "ps-sync"  # the speedup column's reference, as in the paper's comparison
CODEC_CHOICES = ("trunc16", "bf16", "q8")
# The timing models step through the ring schedule of every worker: p = 4096 predicts in about a
# second, 8192 in tens of seconds (a sweep to it took 36 s), 100000 not within minutes.
MAX_WORLD = 4096
TIMING_CAP = 1 << 20  # float32 values timed for per-byte costs: 4 MB, past the caches

# The uncompressed runs of `pipesgd compare`; --codecs adds a pipe run for each codec.
_PLAIN_RUNS = tuple(run for run in COMPARE_RUNS if run[1] == "none")
_DEFAULT_CODECS = ",".join(codec for _, codec in COMPARE_RUNS if codec != "none")


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
    r.add_argument("--codecs", default=_DEFAULT_CODECS, help="pipe runs with codecs, or none")
    r.add_argument("--width", type=int, default=2, help="pipeline width K of pipe (default 2)")
    r.add_argument("--ps-pulls", default="sequential", choices=("sequential", "shared"),
                   help="ps-sync's pulls: one after another, or all at once sharing the link "
                   "(as pipesgd compare's baseline)")  # fmt: skip
    r.add_argument("--sweep", default=None, help="e.g. bandwidth=100Mbit..100Gbit")
    r.add_argument("--plot", default=None, help="write the sweep's figure here (.png, .pdf)")
    r.add_argument("--json", dest="json_path", default=None, help="write the predictions here")
    r.add_argument("--out", dest="out_dir", default=None, help="folder for the JSON and figure")
    from pipesgd_ref.runtime.launch import add_many_workers_flag

    add_many_workers_flag(n)  # --this-machine starts --world-size processes
    return p


# --- the scenario: a calibration, a world size, a network, and what changes in a sweep ------------


@dataclass(frozen=True)
class Scenario:
    """Everything a prediction needs; `at(key, value)` moves one knob for a sweep."""

    cal: Calibration  # at the base network and world size
    world_size: int  # p
    runs: tuple[tuple[str, str], ...]  # (algo, codec) pairs, in table order
    width: int  # K of the pipe runs
    latency: float  # s per message on the wire (alpha = latency + hop)
    hop: float  # s per message in software
    stream_cap: float  # bytes/s this machine can move (inf: a cluster, no cap)
    cores_per_worker: int | None  # a cluster: cores = p * this; None: this machine's cores
    what: str  # the model, in words
    ps_pulls: str = "sequential"  # ps-sync's server: pulls one after another, or shared

    def at(self, key: str | None = None, value: float | None = None) -> tuple[Calibration, int]:
        """(calibration, p) with `key` (bandwidth, latency, world_size) set to `value`."""
        cal, p = self.cal, self.world_size
        if key == "bandwidth":
            cal = cal.with_network(bandwidth=min(value, self.stream_cap))
        elif key == "latency":
            cal = cal.with_network(alpha=value + self.hop)
        elif key == "world_size":
            p = int(value)
        if self.cores_per_worker is not None:  # a cluster grows its cores with its workers
            cal = replace(cal, cores=p * self.cores_per_worker)
        return cal, p

    def predict(self, key: str | None = None, value: float | None = None) -> dict[str, Prediction]:
        """{label: Prediction} of every run, with `key` set to `value` (None: as calibrated)."""
        cal, p = self.at(key, value)
        return timing.predict_all(p, cal, self.runs, self.width, self.ps_pulls)


def _parse(parse: Callable, text, flag: str):
    try:
        return parse(text)
    except ValueError as e:
        raise ConfigError(f"{flag}: {e}") from None


def parse_count(text: str) -> int:
    """A parameter count: 300000, 300_000, 3e5, 300K, 25M, 1.5G (powers of 1000)."""
    t = str(text).strip().replace("_", "")
    scale = {"K": 10**3, "M": 10**6, "G": 10**9}.get(t[-1:].upper(), 1)
    try:
        value = float(t[:-1] if scale > 1 else t) * scale
    except ValueError:
        value = math.nan
    if not (value >= 1 and math.isfinite(value) and value == round(value)):
        raise ConfigError(
            f"--params expects a whole parameter count >= 1, like 300000, 3e5 or 25M; got {text!r}"
        )
    return int(round(value))


def parse_codecs(text: str) -> tuple[str, ...]:
    """'trunc16,q8' -> ('trunc16', 'q8'); 'none' or '' -> ()."""
    names = [c.strip() for c in text.split(",") if c.strip() and c.strip() != "none"]
    for name in names:
        if name not in CODEC_CHOICES:
            raise ConfigError(
                f"unknown codec {name!r} in --codecs {text!r}; choose from "
                f"{', '.join(CODEC_CHOICES)} (comma-separated), or none for no compressed runs"
            )
    return tuple(dict.fromkeys(names))  # once each, in the order given


def _model_config(args) -> TrainConfig:
    """The laptop preset with the model flags applied (each type-checked by TrainConfig)."""
    changes = {"world_size": args.world_size, "latency": args.latency, "bandwidth": args.bandwidth}
    for key in ("model", "hidden", "channels", "kernels", "dataset", "batch_size", "backend"):
        if getattr(args, key) is not None:
            changes[key] = getattr(args, key)
    return TrainConfig.preset("laptop").replace(**changes)


def _time_model(cfg: TrainConfig) -> tuple[int, float, float]:
    from pipesgd_ref.errors import DataError

    try:
        # one worker's compute does not depend on p: time it on a 1-worker shard, so a world
        # size larger than the dataset can hold shards for still predicts
        return time_compute(cfg.replace(world_size=1))
    except DataError as e:
        raise ConfigError(f"cannot build the model to time it: {e}") from None


def _time_update(n: int, backend: str, reps: int = 5) -> float:
    """t_u of an n-parameter SGD step: the median of `reps` steps over min(n, TIMING_CAP)
    values (after one untimed step: numba compiles there), scaled to n."""
    import numpy as np

    from pipesgd_ref.ops import get_backend

    k = min(n, TIMING_CAP)
    params, grads = np.ones(k, np.float32), np.ones(k, np.float32)
    sgd_step = get_backend(backend).sgd_step
    sgd_step(params, grads, 1e-12)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        sgd_step(params, grads, 1e-12)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * n / k


def scenario_from_args(args) -> Scenario:
    """Check every flag, then calibrate: from the model (or --params), the network flags and,
    with --this-machine, measurements of p processes here. ConfigError on bad input."""
    if args.world_size < 1:
        raise ConfigError(
            f"--world-size must be >= 1 (the number of workers), got {args.world_size}"
        )
    if args.world_size > MAX_WORLD:
        raise ConfigError(
            f"--world-size {args.world_size}: predictions go up to {MAX_WORLD} workers (the "
            f"timing model steps through every worker's ring schedule; beyond that it takes "
            f"minutes)"
        )
    if args.width < 1:
        raise ConfigError(f"--width must be >= 1 (1 = synchronous, 2 = Pipe-SGD), got {args.width}")
    if args.cores_per_worker < 1:
        raise ConfigError(f"--cores-per-worker must be >= 1, got {args.cores_per_worker}")
    if args.this_machine and args.cores_per_worker != 1:
        raise ConfigError(
            "--cores-per-worker describes a cluster; --this-machine uses this machine's cores "
            "as they are: drop one of the two"
        )
    from pipesgd_ref.units import parse_bandwidth, parse_latency

    latency = _parse(parse_latency, args.latency, "--latency")
    bandwidth = _parse(parse_bandwidth, args.bandwidth, "--bandwidth")
    hop = None if args.hop_cost is None else _parse(parse_latency, args.hop_cost, "--hop-cost")
    t_comp = None if args.t_comp is None else _parse(parse_latency, args.t_comp, "--t-comp")
    t_update = None if args.t_update is None else _parse(parse_latency, args.t_update, "--t-update")
    if t_comp is not None and t_comp <= 0:
        raise ConfigError(
            f"--t-comp must be > 0 (a forward + backward takes time), got {args.t_comp!r}"
        )
    codecs = parse_codecs(args.codecs)
    runs = _PLAIN_RUNS + tuple(("pipe", c) for c in codecs)
    model_keys = ("model", "hidden", "dataset", "batch_size")
    model_flags = [f"--{k.replace('_', '-')}" for k in model_keys if getattr(args, k) is not None]

    n_params = None if args.params is None else parse_count(args.params)
    if n_params is not None:
        if model_flags:
            raise ConfigError(
                f"--params replaces the model: drop {' '.join(model_flags)}, or drop --params "
                "to time that model here"
            )
        if t_comp is None:
            raise ConfigError(
                "--params needs --t-comp, the forward + backward time of one worker's minibatch "
                "(e.g. --params 25M --t-comp 200ms): there is no model here to time"
            )
        if args.this_machine:
            raise ConfigError(
                "--this-machine runs the model on this machine, and --params gives none: "
                "drop --this-machine, or give --model/--hidden instead of --params"
            )
    # fail fast on the config before anything is timed (TrainConfig checks every field)
    cfg = _model_config(args)
    if args.this_machine:
        cal, stream = _calibrate_here(cfg, hop)
        hop = cal.alpha - latency
        cores_per_worker = None
        what = _describe_model(cfg, cal.n_params)
    else:
        hop = hop or 0.0
        cal = _calibrate_cluster(args, cfg, n_params, t_comp, latency + hop, bandwidth)
        stream, cores_per_worker = math.inf, args.cores_per_worker
        what = (
            f"{n_params:,} parameters (--params)"
            if n_params is not None
            else _describe_model(cfg, cal.n_params)
        )
    if t_comp is not None and n_params is None:  # an override of the measured t_comp
        scale = t_comp / cal.t_comp  # keep the measured slowdown under sharing, rescaled
        cal = replace(
            cal,
            t_comp=t_comp,
            t_comp_shared=tuple(t * scale for t in cal.t_comp_shared),
            t_comp_lockstep=tuple(t * scale for t in cal.t_comp_lockstep),
            t_comp_cpu=tuple(t * scale for t in cal.t_comp_cpu),
            source={**cal.source, "t_comp": f"--t-comp {args.t_comp}"},
        )
    if t_update is not None:
        cal = replace(
            cal, t_update=t_update, source={**cal.source, "t_update": f"--t-update {args.t_update}"}
        )
    return Scenario(cal, args.world_size, runs, args.width, latency, hop, stream,
                    cores_per_worker, what, getattr(args, "ps_pulls", "sequential"))  # fmt: skip


def _describe_model(cfg: TrainConfig, n: int) -> str:
    return (
        f"{model_label(cfg)} on {cfg.dataset}, batch {cfg.batch_size} per worker ({n:,} parameters)"
    )


def _calibrate_cluster(
    args, cfg: TrainConfig, n: int | None, t_comp: float | None, alpha: float, bandwidth: float
) -> Calibration:
    """Calibration of p workers, each on its own machine: compute (cfg's model, or n params
    and t_comp as given) and per-byte costs timed in this process, the network as given."""
    if n is not None:
        t_update = _time_update(n, cfg.backend)
        source = {
            "t_comp": f"--t-comp {args.t_comp}",
            "t_update": "an SGD step timed here, per byte",
        }
    else:
        n, t_comp, t_update = _time_model(cfg)
        source = {
            "t_comp": f"median of 10 timed loss_and_grad, batch {cfg.batch_size}, this process",
            "t_update": "median of 10 timed sgd_step",
        }
    k = min(n, TIMING_CAP)
    gamma, copy = time_gamma_and_copy(k)
    codecs = time_codecs(k, cfg.backend, parse_codecs(args.codecs))  # those predicted
    return Calibration(
        n_params=n,
        t_comp=t_comp,
        t_update=t_update,
        alpha=alpha,
        bandwidth=bandwidth,
        gamma=gamma,
        copy=copy,
        cores=args.world_size * args.cores_per_worker,
        codecs=codecs,
        source={
            **source,
            "alpha": f"--latency {args.latency} + --hop-cost {args.hop_cost or 0}",
            "bandwidth": f"--bandwidth {args.bandwidth}",
            "gamma": "np.add timed here, per byte",
            "cores": f"a cluster: {args.cores_per_worker} per worker, none shared",
        },
    )


def _calibrate_here(cfg: TrainConfig, hop: float | None) -> tuple[Calibration, float]:
    """calibrate for cfg's p processes on this machine; also returns the streamed
    bandwidth (it caps every emulated bandwidth of a sweep, as it caps the base one)."""
    from pipesgd_ref.errors import DataError

    network = network_figures()
    if hop is not None:  # given: skip measuring it
        network["hop"] = hop
    try:
        cal = calibrate(cfg, network=network)
    except DataError as e:
        raise ConfigError(f"cannot calibrate {cfg.world_size} workers here: {e}") from None
    return cal, network["stream"]


# --- the answers of a sweep ----------------------------------------------------------------------


def crossings(
    f: Callable[[float], float], values: list[float], threshold: float, integer: bool = False
) -> list[tuple[float, bool]]:
    """Where `f(v) >= threshold` changes along the sorted `values`: [(v, state from v on)].

    Each change between two neighbouring values is located by bisection (the models are cheap):
    on integers to the first value of the new state, otherwise geometrically (the sweeps are
    log-spaced) to a relative 1e-12."""
    out = []
    states = [bool(f(v) >= threshold) for v in values]  # bool: numpy's is not JSON
    for lo, hi, s_lo, s_hi in zip(values[:-1], values[1:], states[:-1], states[1:], strict=True):
        if s_lo == s_hi:
            continue
        if integer:
            lo, hi = int(lo), int(hi)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if (f(mid) >= threshold) == s_lo else (lo, mid)
        else:
            while hi / lo > 1 + 1e-12:
                mid = math.sqrt(lo * hi)
                if mid in (lo, hi):  # no float strictly between: done
                    break
                lo, hi = (mid, hi) if (f(mid) >= threshold) == s_lo else (lo, mid)
        out.append((float(hi), bool(s_hi)))
    return out


def _intervals(values, first_state: bool, changes) -> list[tuple[float, float]]:
    """[lo, hi) ranges of `values` where the state holds, from its first value and changes."""
    out, start, state = [], (values[0] if first_state else None), first_state
    for v, new in changes:
        if state and not new:
            out.append((start, v))
        if new and not state:
            start = v
        state = new
    if state:
        out.append((start, values[-1]))
    return out


def format_value(key: str, v: float) -> str:
    """A swept value as people write it: 1 Gbit/s, 50 us, 8."""
    if key == "bandwidth":  # 9 digits: geomspace's 999.9999 Mbit/s is 1 Gbit/s, not "1e+03 Mbit"
        return format_bandwidth(float(f"{v:.9g}")).split(" (")[0]
    if key == "latency":
        return format_seconds(v)
    return f"{int(v)}" if v == int(v) else f"{v:g}"


def answer_questions(scenario: Scenario, key: str, values: list[float]) -> dict:
    """The two questions of a sweep, each as {"text": ..., and the figures behind it}."""
    integer = key == "world_size"

    def fmt(v: float) -> str:
        return format_value(key, v)

    def gain(v):  # pipe's speedup over sync
        preds = scenario.predict(key, v)
        return preds["sync"].iter_time_s / preds["pipe"].iter_time_s

    def lag(v):  # ps-sync's slowdown against sync
        preds = scenario.predict(key, v)
        return preds["ps-sync"].iter_time_s / preds["sync"].iter_time_s

    gains = [gain(v) for v in values]
    best = max(range(len(values)), key=gains.__getitem__)
    pay_changes = crossings(gain, values, PAYS, integer)
    pays = _intervals(values, gains[0] >= PAYS, pay_changes)
    stops = next((v for v, state in pay_changes if not state), None)
    most = f"most {gains[best]:.2f}x at {key} {fmt(values[best])}"
    if stops is not None:
        where = ", ".join(f"{fmt(a)}..{fmt(b)}" for a, b in pays)
        text = (
            f"pipelining stops paying at {key} {fmt(stops)}: from there pipe is under "
            f"{PAYS:.1f}x faster than sync (it pays over {where}; {most})"
        )
    elif pays:
        text = (
            f"pipelining pays to the end of the sweep: pipe is {PAYS:.1f}x or more faster "
            f"than sync from {key} {fmt(pays[-1][0])} on ({most})"
        )
    else:
        text = (
            f"pipelining never pays here: pipe is under {PAYS:.1f}x faster than sync "
            f"everywhere ({most})"
        )
    pipelining = {
        "question": "where does pipelining stop paying?",
        "threshold": PAYS,
        "stops_at": stops,
        "pays": pays,
        "changes": pay_changes,
        "peak": {"value": values[best], "speedup": gains[best]},
        "text": text,
    }

    lags = [lag(v) for v in values]
    # the state "ps-sync is slower" is lag > 1, i.e. not (1 / lag >= 1)
    ahead = crossings(lambda v: 1 / lag(v), values, 1.0, integer)
    ps_changes = [(v, not not_slower) for v, not_slower in ahead]
    behind = _intervals(values, lags[0] > 1, ps_changes)
    phrases = [
        f"ps-sync falls behind sync (slower) at {key} {fmt(v)} and above"
        if slower
        else f"ps-sync falls behind sync (slower) below {key} {fmt(v)}, ahead from there"
        for v, slower in ps_changes
    ]
    if not phrases:
        phrases = [
            f"ps-sync is behind sync over the whole sweep ({min(lags):.2f}x to "
            f"{max(lags):.2f}x slower)"
            if lags[0] > 1
            else f"ps-sync stays ahead of sync over the whole sweep (at most {max(lags):.2f}x "
            "its time)"
        ]
    falls = next((v for v, slower in ps_changes if slower), None)
    ps = {
        "question": "where does PS fall behind?",
        "falls_behind_at": falls,
        "behind": behind,
        "changes": ps_changes,
        "text": "; ".join(phrases),
    }
    return {"pipelining": pipelining, "ps": ps}


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


def format_sweep(key: str, values: list[float], rows: list[dict]) -> str:
    """One row per swept value: every run's iteration time, and pipe's speedup over sync."""
    labels = list(rows[0])
    widths = [max(len(label), 9) for label in labels]
    columns = list(zip(labels, widths, strict=True))
    head = f"{key:<12} " + " ".join(f"{lb:>{w}}" for lb, w in columns) + f" {'pipe/sync':>9}"
    lines = [head, "-" * len(head)]
    for v, preds in zip(values, rows, strict=True):
        cells = " ".join(f"{format_seconds(preds[lb].iter_time_s):>{w}}" for lb, w in columns)
        gain = preds["sync"].iter_time_s / preds["pipe"].iter_time_s
        lines.append(f"{format_value(key, v):<12} {cells} {gain:>8.2f}x")
    return "\n".join(lines)


def plot_sweep(
    key: str, values: list[float], rows: list[dict], answers: dict, path, title: str = ""
) -> Path | None:
    """Iteration time against the swept value (log-log), one line per run, the answers as
    dotted verticals. Returns the path written, or None without matplotlib."""
    from pipesgd_ref.plots import pyplot, save_figure

    plt = pyplot()
    if plt is None:
        return None
    scale, unit = {
        "bandwidth": (8e-9, "bandwidth (Gbit/s)"),
        "latency": (1e6, "latency (us)"),
        "world_size": (1.0, "world size p"),
    }[key]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    xs = [v * scale for v in values]
    for label in rows[0]:
        times_ms = [preds[label].iter_time_s * 1e3 for preds in rows]
        ax.plot(xs, times_ms, marker="o", ms=3, label=label)
    ax.set_xscale("log", base=2 if key == "world_size" else 10)
    ax.set_yscale("log")
    ax.set_xlabel(unit)
    ax.set_ylabel("predicted iteration time (ms)")
    pays = {True: "pipelining pays from here", False: "pipelining stops paying"}
    marks = [(v, pays[state], "tab:red") for v, state in answers["pipelining"]["changes"]]
    behind = {True: "ps-sync slower than sync from here", False: "ps-sync ahead from here"}
    marks += [(v, behind[slower], "tab:gray") for v, slower in answers["ps"]["changes"]]
    for v, text, color in marks:
        if v is not None:
            ax.axvline(v * scale, ls=":", color=color)
            top = ax.get_ylim()[1]
            ax.text(v * scale, top, f" {text}", color=color, fontsize=8, rotation=90, va="top")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=9)
    return save_figure(fig, path)


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


def cmd_predict(args) -> int:
    """`pipesgd predict`: print (and write) the predictions; 0 on success, ConfigError on bad
    input (the CLI prints it as one line and exits 2)."""
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
    out = Path(args.out_dir) if args.out_dir else None
    plot_path = args.plot or (out / "predict_sweep.png" if out and sweep else None)
    json_path = args.json_path or (out / "predict.json" if out else None)
    _prepare_outputs(args, plot_path, json_path)  # before the model is timed: never lost

    s = scenario_from_args(args)
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
    preds = s.predict()
    print()
    print(format_table(preds))
    gain = preds["sync"].iter_time_s / preds["pipe"].iter_time_s
    lag = preds["ps-sync"].iter_time_s / preds["sync"].iter_time_s
    verdict = "pays" if gain >= PAYS else f"does not pay (under {PAYS:.1f}x)"
    ps_vs = f"{lag:.2f}x slower" if lag > 1 else f"{1 / lag:.2f}x faster"
    print(f"\npipe over sync: {gain:.2f}x faster, pipelining {verdict}; ps-sync vs sync: {ps_vs}")
    ups = timing.speedups(preds, BASELINE)
    payload = {
        "command": "predict",
        "world_size": s.world_size,
        "width": s.width,
        "model": s.what,
        "mode": "this-machine" if s.cores_per_worker is None else "cluster",
        "network": {"latency_s": s.latency, "hop_s": s.hop, "bandwidth": s.cal.bandwidth},
        "calibration": s.cal.to_dict(),
        "runs": {k: {**p.to_dict(), f"speedup_vs_{BASELINE}": ups[k]} for k, p in preds.items()},
    }
    if sweep:
        key, values = sweep[0], [float(v) for v in sweep[1]]
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
        print(f"where does PS fall behind? {answers['ps']['text']}")
        payload["sweep"] = {
            "key": key,
            "values": values,
            "iter_time_s": {lb: [r[lb].iter_time_s for r in rows] for lb in rows[0]},
            "bound": {lb: [r[lb].bound for r in rows] for lb in rows[0]},
            "answers": answers,
        }
        if plot_path:
            title = f"{s.world_size} workers, {s.what}" if key != "world_size" else s.what
            if plot_sweep(key, values, rows, answers, plot_path, title) is None:
                print(
                    "no plot: matplotlib is not installed (pip install -e '.[plot]')",
                    file=sys.stderr,
                )
    if json_path:
        from pipesgd_ref.outputs import write_json

        write_json(Path(json_path), payload)
        print(f"wrote {json_path}")
    return 0
