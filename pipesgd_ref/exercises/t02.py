"""Tutorial 02's checkable exercises (the ring AllReduce)."""

from __future__ import annotations

import math

from pipesgd_ref.exercises import close, exercise, same_function
from pipesgd_ref.timing import ring_allreduce_time

# the tutorial's emulated link (section 3) and its assumed LAN (section 0)
EMU_ALPHA, EMU_BANDWIDTH = 1e-3, 100e6  # 1 ms, 100 MB/s
LAN_ALPHA, LAN_BANDWIDTH = 50e-6, 10e9 / 8  # 50 us, 10 Gbit/s


@exercise(
    "02.1",
    "algbw (bytes/s) the ring formula predicts for 16 MB, p = 8, on the 1 ms, 100 MB/s link",
    "algbw = M / T with T = ring_allreduce_time(8, 16e6, 1e-3, 100e6); busbw = algbw 2(p-1)/p",
    judge=close(rel=0.01),
)
def algbw_at_eight() -> float:
    nbytes = 16e6
    return nbytes / ring_allreduce_time(8, nbytes, EMU_ALPHA, EMU_BANDWIDTH)


@exercise(
    "02.2",
    "the size M (bytes) at which the ring's latency and bandwidth terms are equal, p = 4, "
    "on the 1 ms, 100 MB/s link",
    "2(p-1) alpha = 2(p-1)/p M/B: the 2(p-1) cancels, M = p alpha B",
    judge=close(rel=0.01),
)
def latency_meets_bandwidth() -> float:
    latency_term = ring_allreduce_time(4, 0.0, EMU_ALPHA, EMU_BANDWIDTH)  # 2(p-1) alpha
    per_byte = ring_allreduce_time(4, 1.0, 0.0, EMU_BANDWIDTH)  # 2(p-1)/p / B
    return latency_term / per_byte


def recursive_doubling_time(p: int, nbytes: float, alpha: float, bandwidth: float) -> float:
    """log2(p) steps, each exchanging the whole M with the partner rank XOR 2^k: log2(p) (alpha +
    M/B) (p a power of two)."""
    return math.log2(p) * (alpha + nbytes / bandwidth)


def _doubling_cases() -> list[tuple]:
    return [(2, 1e6, 1e-3, 100e6), (8, 16e6, 50e-6, 1.25e9), (64, 1e3, 50e-6, 1.25e9)]


@exercise(
    "02.4",
    "a function (p, M, alpha, B) -> seconds: the alpha-beta cost of recursive doubling",
    "log2(p) steps; at each one every rank sends its whole current M bytes to one partner and "
    "receives the partner's: one alpha and M/B per step",
    judge=same_function(_doubling_cases, close(rel=1e-9)),
    wrong=lambda: ring_allreduce_time,  # the ring's cost: 2(p-1) steps of M/p, not log2(p) of M
)
def recursive_doubling() -> object:
    return recursive_doubling_time


@exercise(
    "02.5",
    "the size M (bytes) below which recursive doubling beats the ring, p = 64, alpha = 50 us, "
    "10 Gbit/s",
    "set log2(p) (alpha + M/B) = 2(p-1) alpha + 2(p-1)/p M/B and solve for M; or bisect on the "
    "two functions",
    judge=close(rel=0.01),
)
def doubling_beats_ring_below() -> float:
    p = 64

    def gap(m: float) -> float:  # recursive doubling minus the ring: < 0 where doubling wins
        return recursive_doubling_time(p, m, LAN_ALPHA, LAN_BANDWIDTH) - ring_allreduce_time(
            p, m, LAN_ALPHA, LAN_BANDWIDTH
        )

    lo, hi = 0.0, 1e9  # gap(lo) < 0 < gap(hi): the crossing lies between
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if gap(mid) < 0 else (lo, mid)
    return 0.5 * (lo + hi)
