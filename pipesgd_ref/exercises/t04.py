"""Tutorial 04's checkable exercises (timing models of the ring and the parameter server)."""

from __future__ import annotations

from pipesgd_ref import timing
from pipesgd_ref.exercises import close, equal, exercise
from pipesgd_ref.units import parse_bandwidth, parse_latency


def _lan() -> tuple[float, float]:
    """Section 0's LAN: (alpha s, B bytes/s)."""
    return parse_latency("50us"), parse_bandwidth("1Gbit")


@exercise(
    "04.1",
    "the p at which the ring's latency and bandwidth terms are equal, for 25 MB and 250 KB",
    "2(p-1) alpha = 2(p-1)/p M/B gives p = M / (alpha B): the chunk M/p equals n_1/2",
    judge=close(rel=0.01),
)
def ring_terms_equal() -> tuple[float, float]:
    alpha, bandwidth = _lan()
    # 2(p-1) alpha = 2(p-1)/p * M/B  <=>  p = M / (alpha B): the hop's chunk M/p is n_1/2
    return 25e6 / (alpha * bandwidth), 250e3 / (alpha * bandwidth)


@exercise(
    "04.2",
    "the smallest p at which ps-async is bound by the server's link, in section 2's cluster",
    "the server needs p M/B per round of pulls; a worker's own cycle is t_comp + 2 alpha + "
    "2M/B + t_u (about 0.6 s): the smallest whole p with p M/B above it",
    judge=equal,
    wrong=lambda: 3,
)
def ps_async_server_bound() -> int:
    alpha, bandwidth = _lan()
    cluster = timing.Calibration(
        n_params=int(25e6 / 4), t_comp=0.2, t_update=0.005, alpha=alpha, bandwidth=bandwidth,
        gamma=0.0, cores=10**9,
    )  # fmt: skip
    server_bound = (
        p for p in range(2, 1000) if timing.predict("ps-async", p, cluster).bound == "server"
    )
    return next(server_bound)


@exercise(
    "04.3",
    "n_1/2 of a link with alpha = 5 us and B = 10 Gbit/s, in bytes",
    "n_1/2 = alpha * B, with B in bytes per second: 10 Gbit/s is 1.25e9 B/s",
    judge=close(rel=0.01),
)
def half_performance_size() -> float:
    return parse_latency("5us") * parse_bandwidth("10Gbit")
