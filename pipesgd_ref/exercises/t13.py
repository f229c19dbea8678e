"""Tutorial 13's checkable exercises (AllReduce algorithms by message size). 13.1 to 13.5 were
tutorial 02's 02.4, 02.5, 02.8, 02.9 and 02.10 (exercises.MOVED keeps those keys working)."""

from __future__ import annotations

import math

from pipesgd_ref.comm import algorithms
from pipesgd_ref.exercises import close, exercise, same_function
from pipesgd_ref.timing import ring_allreduce_time

# the tutorial's assumed LAN (section 0)
LAN_ALPHA, LAN_BANDWIDTH = 50e-6, 10e9 / 8  # 50 us, 10 Gbit/s


def recursive_doubling_time(p: int, nbytes: float, alpha: float, bandwidth: float) -> float:
    """log2(p) steps, each exchanging the whole M with the partner rank XOR 2^k: log2(p) (alpha +
    M/B) (p a power of two)."""
    return math.log2(p) * (alpha + nbytes / bandwidth)


def _doubling_cases() -> list[tuple]:
    return [(2, 1e6, 1e-3, 100e6), (8, 16e6, 50e-6, 1.25e9), (64, 1e3, 50e-6, 1.25e9)]


@exercise(
    "13.1",
    "a function (p, M, alpha, B) -> seconds: the alpha-beta cost of recursive doubling",
    "log2(p) steps; at each one every rank sends its whole current M bytes to one partner and "
    "receives the partner's: one alpha and M/B per step",
    judge=same_function(_doubling_cases, close(rel=1e-9)),
    wrong=lambda: ring_allreduce_time,  # the ring's cost: 2(p-1) steps of M/p, not log2(p) of M
)
def recursive_doubling() -> object:
    return recursive_doubling_time


@exercise(
    "13.2",
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


def _crossing(f, g, lo: float = 100.0, hi: float = 1e10) -> float:
    """The M in [lo, hi] where f(M) = g(M), by bisection on log M (f - g changes sign once)."""
    below = f(lo) < g(lo)
    for _ in range(100):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if (f(mid) < g(mid)) == below else (lo, mid)
    return math.sqrt(lo * hi)


def _lan_cost(algo: str, p: int):
    """M -> the alpha-beta time of `algo` on p ranks on the tutorial's LAN (section 1)."""
    if algo == "ring":
        return lambda m: ring_allreduce_time(p, m, LAN_ALPHA, LAN_BANDWIDTH)
    return lambda m: algorithms.cost(algo, p, m, LAN_ALPHA, LAN_BANDWIDTH)


def _rab_overtakes_rd(p: int) -> float:
    return _crossing(_lan_cost("rd", p), _lan_cost("rab", p))


@exercise(
    "13.3",
    "the size M (bytes) from which Rabenseifner beats recursive doubling, p = 16, alpha = "
    "50 us, 10 Gbit/s",
    "q = log2 p: q (alpha + M/B) = 2 q alpha + 2(p-1)/p M/B, so M = q alpha B / (q - 2(p-1)/p); "
    "or bisect on algorithms.cost('rd', 16, M, ...) - algorithms.cost('rab', 16, M, ...)",
    wrong=lambda: _rab_overtakes_rd(8),  # section 1's p = 8 crossover, not p = 16's
)
def rab_overtakes_rd_at_sixteen() -> float:
    return _rab_overtakes_rd(16)


@exercise(
    "13.4",
    "the steps of (recursive doubling, Rabenseifner) for p = 12, as a pair",
    "p2 = 8 ranks run the algorithm (log2 8 steps for rd, twice that for rab); the e = 4 "
    "pairs of ranks 0..7 fold: one step before, one after. Count them with "
    "len(algorithms.schedule(algo, 0, 12, n))",
    judge=close(rel=0.0),
    wrong=lambda: (math.ceil(math.log2(12)), 2 * math.ceil(math.log2(12))),  # no fold: (4, 8)
)
def steps_at_twelve() -> tuple[int, int]:
    rd, rab = (len(algorithms.schedule(a, 0, 12, 12)) for a in ("rd", "rab"))
    return rd, rab


@exercise(
    "13.5",
    "the size M (bytes) above which the ring beats Rabenseifner, p = 12, alpha = 50 us, 10 Gbit/s",
    "p2 = 8, and the fold adds two steps and 2M/B to rab: (2 log2 8 + 2) alpha + (2 x 7/8 + 2) "
    "M/B; the ring: 22 alpha + 22/12 M/B. Set them equal, or bisect",
)
def ring_beats_rab_at_twelve() -> float:
    return _crossing(_lan_cost("rab", 12), _lan_cost("ring", 12))
