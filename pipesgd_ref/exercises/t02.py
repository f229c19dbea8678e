"""Tutorial 02's checkable exercises (the ring AllReduce: its cost, its failures). Exercises
that tutorial 02 once had on other algorithms live in t13.py now (exercises.MOVED)."""

from __future__ import annotations

from pipesgd_ref.exercises import close, equal, exercise
from pipesgd_ref.timing import ring_allreduce_time

# the tutorial's emulated link (section 4)
EMU_ALPHA, EMU_BANDWIDTH = 1e-3, 100e6  # 1 ms, 100 MB/s


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


@exercise(
    "02.3",
    "p = 6, rank 4 killed while every rank waits in the first ring step: the rank whose error "
    "must name rank 4",
    "rank r receives from rank r - 1 and sends to rank r + 1; a receive cannot complete without "
    "its sender, a send may already be in the kernel's buffers",
    judge=equal,
    wrong=lambda: 3,  # the left neighbour: its send to rank 4 may have gone out before the kill
)
def names_the_dead_rank() -> int:
    p, dead = 6, 4
    return (dead + 1) % p  # the right neighbour, which receives from it
