"""The figures every prediction reads (`Calibration`), and one paragraph of them (`describe`).

Symbols as in timing/iteration.py: n parameters (M = 4n gradient bytes), t_comp, t_u, alpha,
B, gamma, the socket path's copy cost, the cores, the codecs' r, e and d. timing/calibrate.py
measures them on this machine; `cluster_calibration` sets them for a cluster.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

from pipesgd_ref.units import format_bandwidth, format_bytes, format_seconds


@dataclass(frozen=True)
class Calibration:
    """The figures every prediction reads, and where each came from."""

    n_params: int  # n: float32 parameters (M = 4n gradient bytes)
    t_comp: float  # s: forward + backward of one worker's minibatch, alone on a core
    t_update: float  # s: one update by the run's optimiser rule (momentum: 3 passes, not 1)
    alpha: float  # s per message: link latency + software cost of one hop
    bandwidth: float  # bytes/s per link and direction (the emulated link's; inf: none)
    gamma: float  # s per byte added (float32 dst += src)
    copy: float = 0.0  # CPU s per byte sent or received through a local socket
    # bytes/s two local processes stream over loopback TCP: this machine's own limit under any
    # emulated link (inf on a cluster). p ranks moving bytes at once on C < p cores share it:
    # a ring gets loop_bandwidth * C / p per link.
    loop_bandwidth: float = math.inf
    cores: int = 1  # CPU cores the worker processes share (1e9: no sharing)
    # t_comp when k = 1, 2, ... worker processes compute at once on this machine (measured;
    # empty: t_comp * max(1, k / cores)). Sharing costs more than k / cores: caches and memory
    # bandwidth are shared too.
    t_comp_shared: tuple = ()
    # The same launches, per step the slowest of the k (the median over steps of the per-step
    # maximum over ranks): what a ring method gets, whose every step waits for its slowest
    # rank. On shared cores the ranks' steps differ (time slices, caches), so this is above
    # t_comp_shared (by how much: benchmarks/RESULTS.md). Empty: t_comp_shared.
    t_comp_lockstep: tuple = ()
    # The same launches, the CPU time of one step (the thread's own, median over ranks and
    # steps): what a step costs the core it runs on. Not the wall time over the sharing: with
    # k > cores two processes take turns on a core, one finishes first, and the median wall
    # time is below twice the CPU time. Each step costs more CPU when processes share a core
    # (caches; benchmarks/RESULTS.md). Empty: t_comp_shared at k = cores, where every core
    # runs one process.
    t_comp_cpu: tuple = ()
    # t_comp of p workers at once while each one's communication thread runs one ring AllReduce
    # of the gradient per step, on the same link with this codec: what Pipe-SGD's compute
    # thread gets (measured: its cycle, computing and waiting for the AllReduce of the step
    # before, the median over ranks and steps; codec name -> s).
    # On shared cores the comm threads' wake-ups, copies and cache traffic slow the
    # computation beyond the bytes' own CPU cost.
    t_comp_busy: dict = field(default_factory=dict)
    # alpha while the workers compute: a ring hop must wait for a core, a wake-up, the GIL
    # (measured the same way, a ping-pong round the ring, next to the computations); what
    # Pipe-SGD's AllReduces pay. None: not measured, alpha applies.
    alpha_busy: float | None = None
    # The backward's profile, what ddp's buckets wait for: per unit of the model's gradient
    # (`grad_units()`: a layer's weights and bias), in the order the backward writes them (last
    # layer first), (bytes, the fraction of t_comp elapsed when that unit is ready), measured
    # in this process (the median over the timed loss_and_grad). Empty: not measured;
    # timing/buckets.py `DEFAULT_UNITS` then says what is assumed.
    backward_units: tuple = ()
    codecs: dict = field(default_factory=dict)  # name -> (ratio r, encode s/B, decode s/B)
    # The job's AllReduce algorithm (ring, rd, rab, oneshot, twoshot, or auto: chosen per
    # message as the workers choose, comm/choose.py), the links' transport as the workers see
    # it (shm on one host), and the emulated link's latency: auto's choice reads them.
    allreduce: str = "ring"
    transport: str = "shm"
    latency: float = 0.0
    source: dict = field(default_factory=dict)  # figure -> how it was obtained

    @property
    def grad_bytes(self) -> int:
        return 4 * self.n_params

    def codec(self, name: str) -> tuple[float, float, float]:
        """(r, e, d) of a codec; none is (1, 0, 0)."""
        if name == "none":
            return 1.0, 0.0, 0.0
        if name not in self.codecs:
            raise ValueError(f"no calibration for codec {name!r}; have {sorted(self.codecs)}")
        return tuple(self.codecs[name])

    def with_network(self, alpha: float | None = None, bandwidth: float | None = None):
        """The same machine on another network (for sweeps)."""
        return replace(
            self,
            alpha=self.alpha if alpha is None else alpha,
            bandwidth=self.bandwidth if bandwidth is None else bandwidth,
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Calibration:
        # JSON has no tuples: turn the lists back, so that from_dict(to_dict(c)) == c after a
        # round trip through a file, too.
        return cls(
            **{
                **d,
                "t_comp_shared": tuple(d.get("t_comp_shared", ())),
                "t_comp_lockstep": tuple(d.get("t_comp_lockstep", ())),
                "t_comp_cpu": tuple(d.get("t_comp_cpu", ())),
                "t_comp_busy": dict(d.get("t_comp_busy", {})),
                "backward_units": tuple(tuple(u) for u in d.get("backward_units", ())),
                "codecs": {k: tuple(v) for k, v in d.get("codecs", {}).items()},
            }
        )


def describe(cal: Calibration) -> str:
    """One paragraph of the calibrated figures, in the units people read."""
    codecs = ", ".join(
        f"{k}: r={r:.2f} e={e * 1e9:.2f} d={d * 1e9:.2f} ns/B"
        for k, (r, e, d) in cal.codecs.items()
    )
    return (
        f"n={cal.n_params} params (M={format_bytes(cal.grad_bytes)}), "
        f"t_comp={format_seconds(cal.t_comp)}, t_u={format_seconds(cal.t_update)}, "
        f"alpha={format_seconds(cal.alpha)}"
        + (f" ({format_seconds(cal.alpha_busy)} computing)" if cal.alpha_busy else "")
        + f", B={format_bandwidth(cal.bandwidth)}, "
        f"gamma={cal.gamma * 1e9:.3f} ns/B, copy={cal.copy * 1e9:.3f} ns/B, cores={cal.cores}"
        + (
            f", t_comp(k=1..)=[{', '.join(f'{t * 1e3:.2f}' for t in cal.t_comp_shared)}] ms"
            if cal.t_comp_shared
            else ""
        )
        + (
            f" (the slowest of k: [{', '.join(f'{t * 1e3:.2f}' for t in cal.t_comp_lockstep)}] ms)"
            if cal.t_comp_lockstep
            else ""
        )
        + (
            f" (CPU a step: [{', '.join(f'{t * 1e3:.2f}' for t in cal.t_comp_cpu)}] ms)"
            if cal.t_comp_cpu
            else ""
        )
        + (
            f", backward ready at [{', '.join(f'{f:.2f}' for _, f in cal.backward_units)}] "
            "of t_comp"
            if cal.backward_units
            else ""
        )
        + (f"; {codecs}" if codecs else "")
    )
