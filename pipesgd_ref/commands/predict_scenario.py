"""`pipesgd predict`'s scenario: its flags checked, then turned into a calibration, a world size
and a network, with what a sweep may change (where each figure comes from: predict.py).

Bad input (an unknown codec, a world size below 1, an unreadable bandwidth, --params without
--t-comp, ...) raises ConfigError with a message that says what to write instead, before
anything is timed.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from pipesgd_ref import timing
from pipesgd_ref.config import TrainConfig, model_label
from pipesgd_ref.errors import ConfigError, DataError
from pipesgd_ref.runtime.preflight import check_config
from pipesgd_ref.timing import COMPARE_RUNS, Calibration, Prediction
from pipesgd_ref.timing.calibrate import BACKWARD_SOURCE, calibrate
from pipesgd_ref.timing.measure import time_codecs, time_compute_profile, time_gamma_and_copy
from pipesgd_ref.timing.network import network_figures
from pipesgd_ref.units import parse_bandwidth, parse_latency, parse_size

CODEC_CHOICES = ("trunc16", "bf16", "q8")
# The timing models step through every worker's ring schedule, a cost that grows faster than p:
# up to this many workers a prediction takes about a second, beyond it tens of seconds and more.
MAX_WORLD = 4096
TIMING_CAP = 1 << 20  # float32 values timed for per-byte costs: 4 MB, past the caches

# The uncompressed runs of `pipesgd compare`; --codecs adds a pipe run for each codec.
PLAIN_RUNS = tuple(run for run in COMPARE_RUNS if run[1] == "none")
DEFAULT_CODECS = ",".join(codec for _, codec in COMPARE_RUNS if codec != "none")


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
    bucket_size: int = timing.DEFAULT_BUCKET_BYTES  # ddp's buckets: at least this many bytes

    def at(self, key: str | None = None, value: float | None = None) -> tuple[Calibration, int]:
        """(calibration, p) with `key` (bandwidth, latency, world_size) set to `value`."""
        cal, p = self.cal, self.world_size
        if key is not None:
            assert value is not None, key  # a knob moves to a value
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
        return timing.predict_all(
            p, cal, self.runs, self.width, self.ps_pulls, bucket_size=self.bucket_size
        )


def _parse(parse: Callable, text, flag: str):
    try:
        return parse(text)
    except ValueError as e:
        raise ConfigError(f"{flag}: {e}") from None


MAX_PARAMS = 1e13  # the most --params takes: beyond any model, a float's integers are exact


def parse_count(text: str) -> int:
    """A parameter count: 300000, 300_000, 3e5, 300K, 25M, 1.5G (powers of 1000)."""
    t = str(text).strip().replace("_", "")
    scale = {"K": 10**3, "M": 10**6, "G": 10**9}.get(t[-1:].upper(), 1)
    try:
        value = float(t[:-1] if scale > 1 else t) * scale
    except ValueError:
        value = math.nan
    if MAX_PARAMS < value < math.inf:
        raise ConfigError(
            f"--params {text}: more than {MAX_PARAMS:.0e} parameters (10 trillion, beyond any "
            f"model); give a whole count up to 1e13, like 300000, 25M or 1.5G"
        )
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


def _time_model(cfg: TrainConfig) -> tuple[int, float, float, tuple]:
    """(n, t_comp, t_u, the backward's units) of cfg's model (time_compute_profile)."""
    try:
        # one worker's compute does not depend on p: time it on a 1-worker shard, so a world
        # size larger than the dataset can hold shards for still predicts
        return time_compute_profile(cfg.replace(world_size=1))
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


def scenario_from_args(args: argparse.Namespace) -> Scenario:
    """Check every flag, then calibrate: from the model (or --params), the network flags and,
    with --this-machine, measurements of p processes here. ConfigError on bad input."""
    _check_counts(args)
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
    bucket = _parse(parse_size, getattr(args, "bucket_size", "32KB"), "--bucket-size")
    runs = PLAIN_RUNS + tuple(("pipe", c) for c in codecs)
    n_params = None if args.params is None else parse_count(args.params)
    if n_params is not None:
        _check_params(args, t_comp)
    # fail fast on the config before anything is timed (TrainConfig checks every field)
    cfg = _model_config(args)
    check_config(cfg)
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
        cal = _with_t_comp(cal, t_comp, f"--t-comp {args.t_comp}")
    if t_update is not None:
        source = {**cal.source, "t_update": f"--t-update {args.t_update}"}
        cal = replace(cal, t_update=t_update, source=source)
    pulls = getattr(args, "ps_pulls", "sequential")
    return Scenario(
        cal,
        args.world_size,
        runs,
        args.width,
        latency,
        hop,
        stream,
        cores_per_worker,
        what,
        pulls,
        bucket,
    )


def _check_counts(args: argparse.Namespace) -> None:
    """The workers, the pipeline's width and the cores: whole numbers in range."""
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


def _check_params(args: argparse.Namespace, t_comp: float | None) -> None:
    """--params replaces the model: no model flags, a --t-comp, and nothing to run here."""
    model_keys = ("model", "hidden", "dataset", "batch_size")
    model_flags = [f"--{k.replace('_', '-')}" for k in model_keys if getattr(args, k) is not None]
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


def _with_t_comp(cal: Calibration, t_comp: float, source: str) -> Calibration:
    """cal with a given t_comp in place of the measured one, the measured slowdown under
    sharing kept, rescaled."""
    scale = t_comp / cal.t_comp
    return replace(
        cal,
        t_comp=t_comp,
        t_comp_shared=tuple(t * scale for t in cal.t_comp_shared),
        t_comp_lockstep=tuple(t * scale for t in cal.t_comp_lockstep),
        t_comp_cpu=tuple(t * scale for t in cal.t_comp_cpu),
        source={**cal.source, "t_comp": source},
    )


def _describe_model(cfg: TrainConfig, n: int) -> str:
    return (
        f"{model_label(cfg)} on {cfg.dataset}, batch {cfg.batch_size} per worker ({n:,} parameters)"
    )


def _calibrate_cluster(
    args, cfg: TrainConfig, n: int | None, t_comp: float | None, alpha: float, bandwidth: float
) -> Calibration:
    """Calibration of p workers, each on its own machine: compute (cfg's model, or n params
    and t_comp as given) and per-byte costs timed in this process, the network as given."""
    units: tuple = ()  # --params: no model, the backward's profile assumed (timing/buckets.py)
    if n is not None:
        assert t_comp is not None  # _check_params: --params comes with --t-comp
        t_update = _time_update(n, cfg.backend)
        source = {
            "t_comp": f"--t-comp {args.t_comp}",
            "t_update": "an SGD step timed here, per byte",
        }
    else:
        n, t_comp, t_update, units = _time_model(cfg)
        source = {
            "t_comp": f"median of 10 timed loss_and_grad, batch {cfg.batch_size}, this process",
            "t_update": "median of 10 timed sgd_step",
            "backward_units": BACKWARD_SOURCE,
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
        backward_units=units,
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
    network = network_figures()
    if hop is not None:  # given: skip measuring it
        network["hop"] = hop
    try:
        cal = calibrate(cfg, network=network)
    except DataError as e:
        raise ConfigError(f"cannot calibrate {cfg.world_size} workers here: {e}") from None
    return cal, network["stream"]
