"""Tutorial 03's checkable exercises (the parameter server)."""

from __future__ import annotations

from pipesgd_ref.exercises import close, exercise
from pipesgd_ref.timing import Calibration, ps_sync

EMU_PARAMS = 76_810  # section 5's MLP 64-1024-10: 64*1024 + 1024 + 1024*10 + 10 parameters
EMU_ALPHA = 100e-6  # section 5's emulated latency, s


def _cluster(n_params: int, t_comp: float, alpha: float, bandwidth: float) -> Calibration:
    """One machine per process (no shared cores), no update, no reduction cost: the formulas
    of the tutorial's sections 0 and 5 without their headers."""
    return Calibration(
        n_params=n_params,
        t_comp=t_comp,
        t_update=0.0,
        alpha=alpha,
        bandwidth=bandwidth,
        gamma=0.0,
        cores=10**9,
    )


@exercise(
    "03.1",
    "ps-sync's predicted iteration (s) at p = 4 on a 20 MB/s link, t_c = 1 ms, alpha = 100 us, "
    "M = 307,240 bytes",
    "T_it = t_c + 2 alpha + (p + 1) M / B (Eq. 5), with B = 20e6 bytes/s",
    judge=close(rel=0.01),
)
def ps_sync_on_slow_link() -> float:
    return ps_sync(4, _cluster(EMU_PARAMS, 1e-3, EMU_ALPHA, 20e6)).iter_time_s


@exercise(
    "03.2",
    "a ps-sync round with shared pulls over one with sequential pulls, p = 4, alpha = 0, t_c = M/B",
    "in units of M/B: sequential t_c + p + 1 (Eq. 5), shared t_c + 2p (Eq. 6)",
    judge=close(rel=0.01),
)
def shared_over_sequential() -> float:
    n_params, bandwidth = 1_000_000, 1e9
    t_wire = 4 * n_params / bandwidth  # M/B
    cal = _cluster(n_params, t_wire, 0.0, bandwidth)  # t_c = M/B, alpha = 0
    shared = ps_sync(4, cal, ps_pulls="shared").iter_time_s
    return shared / ps_sync(4, cal).iter_time_s


@exercise(
    "03.3",
    "bytes into one server's link per round with the weights sharded over S = 4 servers, "
    "p = 8 workers, M = 25 MB",
    "each of the p workers pushes every server its slice of M/S bytes",
    judge=close(rel=0.01),
)
def sharded_server_bytes() -> float:
    p, servers, nbytes = 8, 4, 25e6
    return p * nbytes / servers
