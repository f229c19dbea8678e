"""Calibration: the figures the predictions read (timing/iteration.py), measured on this machine.

`calibrate(cfg)` measures every figure a `Calibration` holds for cfg's model, batch size,
world size and link:

- t_comp and t_u are timed on the actual model and batch size in this process
  (`time_compute_profile`, measure.py), and in the same calls, when the backward has written
  each layer's gradient (backward_units, what ddp's buckets wait for); t_comp with k = 1..p
  pinned worker processes computing at once (`time_shared_compute`, sharing.py: the median,
  the slowest rank of each step, the CPU time of a step), and, for Pipe-SGD, p workers
  computing while pipe's own communication thread AllReduces a gradient per step
  (`time_busy_compute`).
- gamma and the codecs' e and d are timed on gradient-sized arrays (`time_gamma_and_copy`,
  `time_codecs`, measure.py).
- alpha is the emulated link's latency plus the software cost of one hop, measured by a ring
  AllReduce among p local processes on the run's own link with a gradient chunk per hop
  (`measure_hop`, network.py: a ping-pong round the ring; on an emulated link the receiver
  then sleeps until the emulated arrival and must be woken, as in a real step).
- B is the emulated link's; the bandwidth of a streaming test between two processes
  (`p2p_figures`, `network_figures`) caps an emulated bandwidth set above what loopback can
  move, and `copy` is the CPU time the sending and the receiving thread of that stream spent
  per byte.

The figures split in two: the machine's (t_comp, t_u, the shared compute, gamma, copy, the
codecs, the stream), which no link changes (`calibrate_machine`), and the link's (the hop on
it, Pipe-SGD's compute beside its AllReduces on it). `calibrate(cfg, base=machine)` measures
only the link's, so a caller may choose the link from the machine's figures first (`pipesgd
compare` does: commands/compare_link.py) without measuring anything twice.

The shared and busy compute figures are the fastest of two launches, of three when they
disagree (`best_of`): on a shared machine a burst of other load only ever slows a launch down.
Calibrations of the same setup made minutes apart merge figure by figure into their median
(merge.py). benchmarks/RESULTS.md records what these choices did to the predictions' error.

Everything here launches processes or times this one; the equations themselves
(timing/iteration.py, terms.py) import nothing of it.
"""

from __future__ import annotations

import math
from dataclasses import replace

from pipesgd_ref.comm.netem import link_of
from pipesgd_ref.timing.figures import Calibration, describe
from pipesgd_ref.timing.measure import (
    time_codecs,
    time_compute_profile,
    time_gamma_and_copy,
    usable_cores,
)
from pipesgd_ref.timing.network import hop_message_bytes, measure_hop, network_figures
from pipesgd_ref.timing.sharing import (
    CALIBRATION_REPS,
    CALIBRATION_TRIES,
    MAX_CALIBRATION_REPS,
    steps_spanning,
    time_busy_compute,
    time_shared_compute,
)

BACKWARD_SOURCE = (
    "the same 10 timed loss_and_grad: per unit of grad_units(), the median fraction of the "
    "call elapsed when the backward's ready callback heard of it"
)


def calibrate(
    cfg,
    network: dict | None = None,
    log=None,
    busy_codecs=(),
    reps: int = CALIBRATION_REPS,
    tries: int = CALIBRATION_TRIES,
    span_s: float = 0.0,
    base: Calibration | None = None,
) -> Calibration:
    """Measure every figure the predictions read for cfg (model, batch size, world size, link).

    `network` may carry already measured {"hop": s, "stream": bytes/s, "copy": s/byte}
    (`network_figures`: the stream and copy depend only on the machine, so a grid or sweep
    measures them once; "hop" is measured on cfg's link unless given). `busy_codecs`: the
    codecs to time Pipe-SGD's computation under (t_comp_busy); none by default (then pipe's
    prediction uses the shared-core t_comp and its cpu bound). `reps`: timed steps per process in
    the shared and busy compute measurements (fewer: faster, noisier), more (up to
    MAX_CALIBRATION_REPS) where a step is shorter than `span_s` / reps (`steps_spanning`);
    `tries`: launches per shared or busy compute figure, the fastest kept (see best_of).
    `base`: the figures that do not depend on the link (`calibrate_machine`'s), measured
    already for the same model, batch and world size: only the link's are measured here (the
    hop on cfg's link and Pipe-SGD's compute beside its AllReduces on it)."""
    link = link_of(cfg)
    if base is None:
        base = calibrate_machine(cfg, network, reps, tries, span_s)
    reps = steps_spanning(base.t_comp, span_s, reps, max(reps, MAX_CALIBRATION_REPS))
    hop_bytes = hop_message_bytes(base.grad_bytes, cfg.world_size, link.enabled)
    busy, hop_busy = {}, None
    if busy_codecs and cfg.world_size > 1:
        busy, hop_busy = time_busy_compute(cfg, busy_codecs, reps, hop_bytes, tries)
    hop = (network or {}).get("hop")
    if hop is None:
        emulated = link if link.enabled else None
        hop = measure_hop(cfg.world_size, emulated, hop_bytes, transport=cfg.transport)
    cal = replace(
        base,
        alpha=link.latency + hop,
        bandwidth=link.bandwidth,
        latency=link.latency,
        allreduce=getattr(cfg, "allreduce", "ring"),
        transport="tcp" if getattr(cfg, "transport", "auto") == "tcp" else "shm",
        t_comp_busy=busy,
        alpha_busy=hop_busy,  # measured on the emulated link: its latency is in it
        source={
            **base.source,
            "alpha": f"emulated latency {link.latency:g} s + measured hop {hop:.3g} s "
            f"(a ring AllReduce of {hop_bytes} B per hop on this link, its wire time taken out)",
            "bandwidth": f"the emulated link: {link.bandwidth:.4g} bytes/s",
        },
    )
    if log:
        log(describe(cal))
    return cal


def calibrate_machine(
    cfg,
    network: dict | None = None,
    reps: int = CALIBRATION_REPS,
    tries: int = CALIBRATION_TRIES,
    span_s: float = 0.0,
) -> Calibration:
    """The figures of `calibrate` that do not depend on the link, each measured once: t_comp
    and t_u, t_comp with k = 1..p workers at once (shared, lockstep, CPU), gamma, the copy
    cost, the codecs, and what loopback streams. The link's figures are placeholders (alpha 0,
    B unlimited): `calibrate(cfg, base=this)` measures them on the link chosen after."""
    n, t_comp, t_update, units = time_compute_profile(cfg)
    reps = steps_spanning(t_comp, span_s, reps, max(reps, MAX_CALIBRATION_REPS))
    shared, lockstep, per_step_cpu = time_shared_compute(cfg, cfg.world_size, reps, tries)
    gamma, copy = time_gamma_and_copy(n)
    codecs = time_codecs(n, cfg.codec_backend)
    net = {**(network or {})}
    if "stream" not in net or "copy" not in net:
        net = {**network_figures(), **net}
    return Calibration(
        n_params=n,
        t_comp=t_comp,
        t_update=t_update,
        alpha=0.0,
        bandwidth=math.inf,
        loop_bandwidth=net["stream"],
        gamma=gamma,
        # Each byte a rank sends or receives costs the cores the socket path's CPU time (kernel
        # copies and TCP: measured on a stream), which is far above a memcpy.
        copy=max(copy, net["copy"]),
        cores=usable_cores(),
        t_comp_shared=shared,
        t_comp_lockstep=lockstep,
        t_comp_cpu=per_step_cpu,
        backward_units=units,
        codecs=codecs,
        source={
            "t_comp": f"median of 10 timed loss_and_grad, batch {cfg.batch_size}, this process",
            "t_update": "median of 10 timed updates by the run's optimiser rule",
            "backward_units": BACKWARD_SOURCE,
            "loop_bandwidth": "the median of 6 streams of 16 MB between two local processes",
            "copy": "CPU time per byte of the sending and receiving thread of those streams "
            "(their mean)",
            "gamma": "np.add over the gradient",
            "cores": "os.sched_getaffinity",
            "t_comp_shared": f"median of {reps} timed loss_and_grad in k pinned processes at "
            f"once, every step started together, the fastest of {tries} launches (one more "
            "when they disagree)",
            "t_comp_lockstep": "the same launches: the median over steps of the slowest rank",
            "t_comp_cpu": "the same launches: the median CPU time (thread_time) of a step",
        },
    )


def cluster_calibration(cfg) -> Calibration:
    """The figures of p workers on a cluster, each its own machine of one core, on cfg's link:
    t_comp and t_u of cfg's model and batch timed in this process, gamma and the copy cost on
    the gradient (at most 4 MB of it: past the caches a per-byte cost no longer changes), alpha
    and B the link's. Starts no process (`pipesgd compare --study`, tutorial 11)."""
    n, t_comp, t_update, units = time_compute_profile(cfg)
    gamma, copy = time_gamma_and_copy(min(n, 1 << 20))
    link = link_of(cfg)
    return Calibration(
        n_params=n,
        t_comp=t_comp,
        t_update=t_update,
        alpha=link.latency,
        bandwidth=link.bandwidth,
        gamma=gamma,
        copy=copy,
        cores=cfg.world_size,
        backward_units=units,
        source={"backward_units": BACKWARD_SOURCE},
    )
