"""Tutorial 09's checkable exercises (reproduce the paper: `pipesgd compare`)."""

from __future__ import annotations

from pipesgd_ref.config import TrainConfig
from pipesgd_ref.exercises import close, equal, exercise

T_COMP, T_UPDATE = 0.030, 0.0002  # the fixed compute figures the exercises give, seconds


def _preset() -> TrainConfig:
    """The tutorial's preset: `compare` on the 700 Mbit/s link it fixes."""
    return TrainConfig.preset("compare").replace(bandwidth="700Mbit")


def _cluster_calibration():
    """Section 1's cluster calibration, with the exercises' fixed t_comp and t_u."""
    from pipesgd_ref import timing
    from pipesgd_ref.comm.netem import link_of
    from pipesgd_ref.models import MLP

    cfg = _preset()
    link = link_of(cfg)
    n = MLP(64, 10, hidden=cfg.hidden).n_params  # digits: 64 features, 10 classes
    return timing.Calibration(n_params=n, t_comp=T_COMP, t_update=T_UPDATE, alpha=link.latency,
                              bandwidth=link.bandwidth, gamma=0.0, cores=10**9)  # fmt: skip


@exercise(
    "09.1",
    "how many times more bytes the server's link carries than a ring link, at p = 8",
    "2pM / (2(p-1)/p M) = p^2 / (p-1)",
    judge=close(rel=0.01),
)
def byte_ratio_at_eight() -> float:
    p = 8
    server = 2 * p  # in units of M: p pushes in, p pulls out
    ring = 2 * (p - 1) / p
    return server / ring


@exercise(
    "09.3",
    "ps-sync's predicted iteration with shared pulls over sequential pulls (t_comp = 30 ms)",
    "timing.predict('ps-sync', 4, cal, ps_pulls='shared').iter_time_s divided by the same with "
    "ps_pulls='sequential'; equations (6) and (5) differ in p M/B against M/B",
    judge=close(rel=0.01),
)
def shared_over_sequential() -> float:
    from pipesgd_ref import timing

    cal, p = _cluster_calibration(), _preset().world_size
    shared = timing.predict("ps-sync", p, cal, ps_pulls="shared").iter_time_s
    sequential = timing.predict("ps-sync", p, cal, ps_pulls="sequential").iter_time_s
    return shared / sequential


@exercise(
    "09.4",
    "the bandwidth (Gbit/s) above which pipe's predicted speedup over sync falls under 1.1x",
    "there the speedup is 1 + T_ar / (t_comp + t_u): solve T_ar = 0.1 (t_comp + t_u) for B, "
    "T_ar = 2(p-1) alpha + 2(p-1)/p M/B",
    judge=close(rel=0.02),
)
def pipelining_stops_paying() -> float:
    from pipesgd_ref import timing
    from pipesgd_ref.commands.predict_sweep import PAYS

    cal, p = _cluster_calibration(), _preset().world_size

    def speedup(bandwidth: float) -> float:
        net = cal.with_network(bandwidth=bandwidth)
        return (
            timing.predict("sync", p, net).iter_time_s / timing.predict("pipe", p, net).iter_time_s
        )

    # past the balance point the speedup falls as the link gets faster: bisect in log space
    lo, hi = cal.n_params * 4 / T_COMP, 1e15  # bytes/s: from near the balance to far past it
    for _ in range(100):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if speedup(mid) >= PAYS else (lo, mid)
    return hi * 8 / 1e9


@exercise(
    "09.6",
    "the steps_to_target reported with eval_every = 10 when the copies reach the target from "
    "step 21 on",
    "copies are kept after steps 10, 20, 30, ...; the first one at or above the target counts",
    judge=equal,
    wrong=lambda: 21,  # the step itself: what a grid of every step would report
)
def coarse_grid_steps() -> int:
    from pipesgd_ref.runtime.summary import reaching_target

    every, reached, steps = 10, 21, 40
    curve = [  # the Recorder keeps a copy after every `every` steps
        {"step": s, "wall_time_s": float(s), "test_accuracy": 1.0 if s >= reached else 0.0}
        for s in range(every, steps + 1, every)
    ]
    return reaching_target(curve, target=0.5)["steps_to_target"]
