"""The link of `pipesgd compare`: chosen for the machine at hand, unless --bandwidth names one.

A fixed bandwidth puts the comparison in a different regime on every machine: on a faster one
communication is cheap and pipelining has little to hide, on a slower one the network swamps
everything. So by default compare measures the machine first (the figures no link changes:
timing.calibrate.calibrate_machine) and sets the emulated bandwidth B where the ring AllReduce
of the whole gradient takes as long as one step's computation of p workers here:

    T_ar(M; alpha, B) = t_comp(p)          (timing/regime.py: the model's own ring term, the
                                            lockstep compute on shared cores; bisection on B)

alpha is the link's latency plus the software cost of a hop. That cost is a figure of the link,
measured on it: so B is first solved with the latency alone, the hop is measured on that link
(its wire time taken out, so it holds at any B), and B solved again with the measured alpha.

Which computation? On shared cores Pipe-SGD's compute thread runs slower than the lockstep
figure while its AllReduces take CPU beside it (t_comp_busy: 54 against 46 ms here). Pipe's
iteration is max(t_busy, T_ar) and sync's t_comp + T_ar, so their ratio is least, pipelining
pays most, at T_ar = t_busy; balancing against the lockstep figure instead leaves pipe
compute-bound at t_busy / (2 t_comp), 0.59x sync here, not 0.54x. So where `busy` is given
(compare: a pipe run is in the comparison) pipe's compute thread is also measured on the
trial link and B solved against the larger of the two;
the calibration then measures only what depends on the link (calibrate(base=...)), reusing
that hop. B is rounded to three figures (e.g. 712 Mbit/s), the text a --bandwidth would be.

Where even loopback's ring is slower than the computation, no emulated link can make
communication as cheap as compute: the runs go unemulated, and the report says so. An explicit
--bandwidth (on the command line, in --config's file, or in a preset such as
compare-cnn-compute) is kept as given. Under --comm mpi the library owns the wire, and nothing
is chosen.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from pipesgd_ref.comm.netem import link_of
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.timing.figures import Calibration
from pipesgd_ref.timing.network import hop_message_bytes, measure_hop
from pipesgd_ref.timing.regime import balanced_bandwidth, ring_and_compute
from pipesgd_ref.units import format_bandwidth, format_bytes, format_seconds


def bandwidth_text(bandwidth: float) -> str:
    """Bytes/s as a --bandwidth value of three significant figures: 87.5e6 -> "700Mbit"."""
    bits = bandwidth * 8
    for unit, scale in (("Tbit", 1e12), ("Gbit", 1e9), ("Mbit", 1e6), ("Kbit", 1e3)):
        if bits >= scale:
            return f"{bits / scale:.3g}{unit}"
    return f"{bits:.3g}bit"


def choose_link(
    cfg: TrainConfig,
    base: Calibration,
    measure: Callable[..., float] = measure_hop,
    busy: Callable[[TrainConfig, int], float] | None = None,
) -> tuple[TrainConfig, dict, dict]:
    """(cfg on the link chosen for this machine, the report's "link" entry, the network figures
    measured on the way, {"hop": s}, for calibrate to reuse). `base`: the machine's figures
    (calibrate_machine). `measure(p, link, hop_bytes)`: a hop's software cost on that link;
    `busy(cfg, hop_bytes)`: Pipe-SGD's compute thread on cfg's link (None: not measured, the
    lockstep figure is balanced)."""
    p, latency = cfg.world_size, link_of(cfg).latency
    first = balanced_bandwidth(p, base, latency)
    if first is None:
        return _unemulated(cfg, base, latency)
    on_trial = cfg.replace(bandwidth=bandwidth_text(first))
    hop_bytes = hop_message_bytes(base.grad_bytes, p, True)
    hop = measure(p, link_of(on_trial), hop_bytes)
    t_busy = busy(on_trial, hop_bytes) if busy is not None else None
    _, lockstep = ring_and_compute(p, base, latency + hop, math.inf)
    target = max(lockstep, t_busy) if t_busy is not None else None
    chosen = balanced_bandwidth(p, base, latency + hop, t_comp=target)
    if chosen is None:
        return _unemulated(cfg, base, latency + hop)
    run = cfg.replace(bandwidth=bandwidth_text(chosen))
    bandwidth = link_of(run).bandwidth  # as the rounded text reads
    t_ar, tc = ring_and_compute(p, base, latency + hop, bandwidth)
    which = f"a step's compute with {p} workers here, {format_seconds(tc)}"
    if target is not None and target > tc:
        which = (
            f"Pipe-SGD's compute thread beside its AllReduces with {p} workers here, "
            f"{format_seconds(target)} (alone in lock step: {format_seconds(tc)})"
        )
    reason = (
        f"{format_bandwidth(bandwidth)}, latency {format_seconds(latency)}: the ring AllReduce "
        f"of the {format_bytes(base.grad_bytes)} gradient then takes as long as {which} "
        f"(T_ar {format_seconds(t_ar)} with alpha {format_seconds(latency + hop)} a hop)"
    )
    link = {
        "chosen": "balanced",
        "bandwidth": run.bandwidth,
        "latency": run.latency,
        "bandwidth_bytes_s": bandwidth,
        "alpha_s": latency + hop,
        "t_ar_s": t_ar,
        "t_comp_s": tc,
        "t_comp_busy_s": t_busy,
        "reason": reason,
    }
    return run, link, {"hop": hop}


def _unemulated(cfg: TrainConfig, base: Calibration, alpha: float):
    """No link balances: loopback's ring is already slower than the computation."""
    t_ar, tc = ring_and_compute(cfg.world_size, base, alpha, math.inf)
    reason = (
        f"not emulated: over loopback alone the ring AllReduce of the "
        f"{format_bytes(base.grad_bytes)} gradient takes {format_seconds(t_ar)}, already more "
        f"than a step's compute with {cfg.world_size} workers here, {format_seconds(tc)}: no "
        f"emulated link can make communication as cheap as compute"
    )
    link = {
        "chosen": "unemulated",
        "bandwidth": "inf",
        "latency": "0",
        "bandwidth_bytes_s": math.inf,
        "t_ar_s": t_ar,
        "t_comp_s": tc,
        "reason": reason,
    }
    return cfg.replace(bandwidth="inf", latency="0"), link, {}


def given_link(cfg: TrainConfig, cal: Calibration) -> dict:
    """The report's "link" entry where compare did not choose: the link as given (or MPI's
    own), and what the ring then takes against a step's compute, by the calibration."""
    if cfg.comm == "mpi":
        reason = "MPI's own wire: under --comm mpi the library owns it, so none is chosen"
        return {"chosen": "mpi", "bandwidth": cfg.bandwidth, "latency": cfg.latency,
                "reason": reason}  # fmt: skip
    link = link_of(cfg)
    t_ar, tc = ring_and_compute(cfg.world_size, cal, cal.alpha, link.bandwidth)
    where = str(link) if link.enabled else "loopback, not emulated"
    reason = (
        f"{where}, as given: the ring AllReduce of the {format_bytes(cal.grad_bytes)} gradient "
        f"takes {format_seconds(t_ar)} against a step's compute with {cfg.world_size} workers "
        f"here, {format_seconds(tc)} ({t_ar / tc if tc else math.inf:.2f}x)"
    )
    return {
        "chosen": "given",
        "bandwidth": cfg.bandwidth,
        "latency": cfg.latency,
        "bandwidth_bytes_s": link.bandwidth,
        "t_ar_s": t_ar,
        "t_comp_s": tc,
        "reason": reason,
    }
