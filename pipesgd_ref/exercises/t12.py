"""Tutorial 12's checkable exercises (DDP-style overlap against Pipe-SGD)."""

from __future__ import annotations

from typing import Any

import numpy as np

from pipesgd_ref.commands.predict_sweep import PAYS, crossings
from pipesgd_ref.exercises import close, exercise, same_function
from pipesgd_ref.models import build_model
from pipesgd_ref.models.layout import buckets
from pipesgd_ref.timing.buckets import DEFAULT_UNITS, bucket_ready, schedule, units_of
from pipesgd_ref.timing.figures import Calibration
from pipesgd_ref.timing.iteration import ddp, pipe


@exercise(
    "12.1",
    "the bucket sizes in bytes, in the ring's order, of an MLP 256-1024-1024-1024-10 at 2MB",
    "units last layer first (W3+b3 is 41,000 bytes); a bucket closes once it holds at least "
    "2,000,000 bytes, and the last takes what is left",
    judge=close(rel=0, abs_=0.5),
)
def buckets_of_a_deeper_mlp() -> list[int]:
    model = build_model("mlp", 256, 10, hidden=(1024, 1024, 1024))
    return [4 * (hi - lo) for lo, hi in buckets(model.grad_units(), 2_000_000)]


@exercise(
    "12.2",
    "T_ddp / t_comp for the assumed profile, a bucket per layer, T_ar(M) = t_comp, t_u = 0",
    "the first bucket is ready at 0.4 t_comp; from then on the ring is never idle and carries "
    "ten buckets of 0.1 t_comp each",
    judge=close(rel=0.01),
)
def assumed_profile_iteration() -> float:
    cal = Calibration(n_params=1000, t_comp=1.0, t_update=0.0, alpha=0.0, bandwidth=1.0, gamma=0.0)
    plan = bucket_ready(units_of(cal), 0)  # no backward_units: the assumed equal layers
    assert len(plan) == DEFAULT_UNITS
    total = sum(b for b, _ in plan)
    spans, backward = schedule(
        [f for _, f in plan], 1.0, lambda j, _beside: plan[j][0] / total, lambda j: 0.0
    )
    return max(backward, spans[-1][1])


def _reference_ddp_iteration(ready, ar, t_comp) -> float:
    """Equation (12) without the CPU term and t_u, through timing/buckets.py's `schedule`."""
    spans, backward = schedule(list(ready), t_comp, lambda j, _beside: ar[j], lambda j: 0.0)
    return max(backward, spans[-1][1])


def _schedule_cases() -> list[tuple]:
    return [
        ((1.0,), (0.5,), 2.0),  # one bucket: sync, t_comp + T_ar
        ((0.35, 0.63, 1.0), (0.001, 0.101, 0.026), 0.077),  # the benchmark MLP: queued
        ((0.35, 0.63, 1.0), (0.001, 0.010, 0.004), 0.2),  # a fast link: all but the tail hidden
        ((0.2, 0.5, 0.9, 1.0), (0.05, 0.01, 0.3, 0.02), 1.0),  # the ring idle between buckets
        ((0.5, 0.6), (0.0, 0.0), 0.3),  # no communication at all
    ]


@exercise(
    "12.3",
    "a function ddp_iteration(ready, ar, t_comp): equation (12) without CPU term and t_u",
    "start each bucket at max(ready[j] * t_comp, end of the bucket before); the step ends at "
    "max(t_comp, end of the last bucket)",
    judge=same_function(_schedule_cases, close(rel=1e-9, abs_=1e-12)),
    wrong=lambda: lambda ready, ar, t_comp: t_comp + sum(ar),  # sync: nothing overlaps
)
def ddp_iteration():
    return _reference_ddp_iteration


EXERCISE_4: dict[str, Any] = dict(
    n_params=2_634_762,
    t_comp=0.040,
    t_update=0.0,
    alpha=50e-6,
    bandwidth=1e9 / 8,
    gamma=0.0,
    copy=0.0,
    cores=8,
    backward_units=((41_000, 0.35), (8_392_704, 0.63), (2_105_344, 1.0)),
)


@exercise(
    "12.4",
    "the bandwidth (Gbit/s) above which pipe is under 1.1x faster than ddp, 8 workers",
    "sweep the bandwidth (bytes/s in a Calibration) with timing.ddp and timing.pipe at p = 8 "
    "and locate the upper crossing of 1.1 with `crossings` (it lies between 1 and 100 Gbit/s)",
    judge=close(rel=0.03),
)
def where_pipe_stops_beating_ddp() -> float:
    cal = Calibration(**EXERCISE_4)

    def gain(bw: float) -> float:
        net = cal.with_network(bandwidth=bw)
        return ddp(8, net).iter_time_s / pipe(8, net).iter_time_s

    values = [float(b) for b in np.geomspace(10e6 / 8, 100e9 / 8, 41)]
    stops = [bw for bw, pays in crossings(gain, values, PAYS) if not pays]
    return 8 * stops[-1] / 1e9
