"""The link on which communication and computation balance: the ring AllReduce of the whole
gradient takes as long as one step's computation of p workers on this machine.

    T_ar(M; alpha, B) = t_comp(p)                 solved for B

T_ar is the timing model's own ring term (terms.ring_terms: Eq. 1 with gamma, B capped by what
loopback moves with p ranks on C cores) and t_comp(p) the lockstep compute of p workers sharing
the cores (terms.compute_time, lockstep=True), both from a calibration. That is the regime of
the paper where pipelining pays most: synchronous SGD runs t_comp + T_ar = 2 t_comp, Pipe-SGD
max(t_comp, T_ar) = t_comp, half. T_ar falls as B grows, down to what loopback itself moves; a
machine whose loopback ring is already slower than its compute has no such B (None).
"""

from __future__ import annotations

import math

from pipesgd_ref.timing.figures import Calibration
from pipesgd_ref.timing.terms import ring_terms

MIN_BANDWIDTH = 1e3  # bytes/s: the slowest link the search considers (8 Kbit/s)
MAX_BANDWIDTH = 1e15  # bytes/s: where "unlimited" starts when loopback is not measured


def ring_and_compute(world_size: int, cal: Calibration, alpha: float, bandwidth: float):
    """(T_ar of the whole gradient, lockstep t_comp of p workers) on a link of `alpha` per hop
    and `bandwidth` bytes/s, the rest of the figures cal's (the model's own ring term)."""
    at = cal.with_network(alpha=alpha, bandwidth=bandwidth)
    tc, t_ar, _ = ring_terms(world_size, at, "none", alpha)
    return t_ar, tc


def balanced_bandwidth(
    world_size: int,
    cal: Calibration,
    alpha: float,
    iterations: int = 200,
    t_comp: float | None = None,
) -> float | None:
    """The B (bytes/s) at which T_ar(M) = t_comp(p), by bisection on log B; None where even
    the fastest link (loopback's, B unlimited) leaves T_ar at or above t_comp. `t_comp`: the
    computation to balance, when not the lockstep figure (Pipe-SGD's compute thread measured
    beside its AllReduces, which on shared cores is longer: compare_link.py)."""
    if world_size < 2:
        return None

    def excess(b: float) -> float:  # T_ar - t_comp: falls as b grows
        t_ar, tc = ring_and_compute(world_size, cal, alpha, b)
        return t_ar - (tc if t_comp is None else t_comp)

    if excess(math.inf) >= 0:
        return None
    cap = cal.loop_bandwidth * min(1.0, cal.cores / world_size)
    lo, hi = MIN_BANDWIDTH, min(cap, MAX_BANDWIDTH) if math.isfinite(cap) else MAX_BANDWIDTH
    if excess(lo) <= 0:  # compute so slow that the slowest link considered already balances
        return lo
    for _ in range(iterations):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if excess(mid) > 0 else (lo, mid)
        if hi / lo < 1 + 1e-9:
            break
    return hi
