"""Tutorial 14's checkable exercises (where staleness costs accuracy: momentum, the effective
step lr / (1 - M), and the stable ranges of delayed heavy ball)."""

from __future__ import annotations

from pipesgd_ref.exercises import close, exercise
from pipesgd_ref.methods.optimizer import heavy_ball_bound


@exercise(
    "14.1",
    "with momentum M = 0.9: sync's largest stable lr * lambda over staleness one's (a factor)",
    "fresh heavy ball is stable for lr * lambda < 2 (1 + M), at staleness one for < 1 - M; "
    "divide the two (optimizer.heavy_ball_bound(M, staleness) computes each)",
    wrong=lambda: 2.0,  # plain SGD's factor (M = 0): 2 against 1
)
def sync_over_pipe_at_momentum_09() -> float:
    return heavy_ball_bound(0.9, 0) / heavy_ball_bound(0.9, 1)


@exercise(
    "14.2",
    "the largest stable effective step lr * lambda / (1 - M) at staleness one for M = 0.5",
    "staleness one is stable for lr * lambda < 1 - M; divide by 1 - M. Then try M = 0 and "
    "M = 0.9: what moves?",
    wrong=lambda: 0.5,  # the bound on lr * lambda itself, 1 - M, not on the effective step
)
def pipe_effective_edge_at_half() -> float:
    return heavy_ball_bound(0.5, 1) / (1 - 0.5)


@exercise(
    "14.3",
    "the largest stable lr * lambda of heavy ball with M = 0.9 at staleness two (width 3)",
    "w_{t+1} = (1 + M) w_t - M w_{t-1} - x w_{t-2}: the roots of z^3 - (1 + M) z^2 + M z + x "
    "must lie inside the unit circle; scan x with np.roots (or simulate the recurrence) and "
    "find where the largest |z| reaches 1",
    judge=close(rel=0.005),
    wrong=lambda: (1 - 0.9) / 2,  # staleness one's bound halved: a guess, not the roots
)
def staleness_two_bound() -> float:
    return heavy_ball_bound(0.9, 2)
