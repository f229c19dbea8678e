"""Tutorial 06's checkable exercises (staleness and convergence)."""

from __future__ import annotations

import math

import numpy as np

from pipesgd_ref.exercises import close, exercise


@exercise(
    "06.1",
    "the long-run growth factor of |w| per step, staleness one at lr * lambda = 1.1, after a "
    "synchronous warm-up",
    "after the warm-up the recurrence is w_{t+1} = w_t - a w_{t-1} again: |w| grows like the "
    "largest |root| of z^2 - z + a",
    judge=close(rel=1e-3),
)
def growth_after_warmup() -> float:
    return float(np.abs(np.roots([1.0, -1.0, 1.1])).max())  # sqrt(1.1): complex roots, |z|^2 = a


@exercise(
    "06.2",
    "the largest a for which both roots of z^2 - z + a are real",
    "the roots of z^2 - z + a are real while the discriminant 1 - 4a is at least 0",
    judge=close(rel=1e-6),
)
def real_roots_limit() -> float:
    return 1.0 / 4.0  # 1 - 4a >= 0


@exercise(
    "06.3",
    "the largest stable lr * lambda with staleness 2, as a share of the synchronous bound",
    "the bound is 2 sin(pi / (2 (2 tau + 1))); divide the tau = 2 bound by the tau = 0 one",
    judge=close(rel=0.01),
)
def staleness_two_share() -> float:
    def bound(tau: int) -> float:
        return 2.0 * math.sin(math.pi / (2.0 * (2.0 * tau + 1.0)))

    return bound(2) / bound(0)


@exercise(
    "06.6",
    "the factor by which avg |grad f|^2 falls from p = 4 to p = 16 workers at the same T",
    "the rate is O(1/sqrt(pT)): p and T enter only as their product",
    judge=close(rel=0.01),
)
def more_workers_factor() -> float:
    return math.sqrt(16 / 4)  # the rate 1/sqrt(pT) at 4 times p
