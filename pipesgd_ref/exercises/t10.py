"""Tutorial 10's checkable exercises (delay compensation and weight prediction)."""

from __future__ import annotations

import numpy as np

from pipesgd_ref.exercises import close, exercise, same_function
from pipesgd_ref.methods.compensation import predicted_weights, stability_bound
from pipesgd_ref.timing import compensation_passes


@exercise(
    "10.1",
    "the largest stable lr * lambda of exact-curvature dc with lambda_dc = 0.25",
    "Jury: (1 - lambda_dc) x < 1 and (2 lambda_dc - 1) x < 2; for lambda_dc <= 1/2 only the "
    "first bounds x",
    judge=close(rel=1e-3),
)
def exact_dc_bound() -> float:
    return stability_bound("dc-exact", 0.25)


@exercise(
    "10.4",
    "the learning rate at which sync_sgd equals ps-async with max_staleness 0, p = 4, lr = 0.1",
    "a round applies p pushes, each lr * g_r at the same weights: lr * sum g_r = (p lr) * mean",
    judge=close(rel=1e-6),
)
def bounded_staleness_zero_lr() -> float:
    # the p updates of a round, all computed at the round's weights, add up to one step of
    # p * lr along their mean: reference.async_ps_sgd(max_staleness=0) is sync_sgd at p * lr
    p, lr = 4, 0.1
    return p * lr


def _prediction_cases() -> list[tuple]:
    rng = np.random.default_rng(10)
    w = rng.standard_normal(7).astype(np.float32)
    g_local = rng.standard_normal(7).astype(np.float32)

    def decaying(step: int) -> float:
        return 0.5 * 0.8**step

    return [(w, g_local, decaying, t) for t in (1, 2, 5)]


def _predict_s1(w: np.ndarray, g_local: np.ndarray, lr_at, t: int) -> np.ndarray:
    """w^_t for staleness one: the gradient in flight, g_{t-1}, is applied at step t = (t-1) + s,
    so its lr is lr_at(t) (PipeCompensation.weights_for: lr_at(u + s))."""
    return predicted_weights(w, [(lr_at(t), g_local)], np.empty_like(w))


def _predict_wrong_lr(w: np.ndarray, g_local: np.ndarray, lr_at, t: int) -> np.ndarray:
    return predicted_weights(w, [(lr_at(t - 1), g_local)], np.empty_like(w))


@exercise(
    "10.5",
    "a function predict(w, g_local, lr_at, t) -> the predicted weights w^_t for staleness one",
    "w^_t = w_t - lr * g_local_{t-1}, where lr is the one of the step that applies g_{t-1}: step t",
    judge=same_function(_prediction_cases, close(rel=1e-5, abs_=1e-6)),
    wrong=lambda: _predict_wrong_lr,  # the lr of the step that computed g_{t-1}
)
def prediction() -> object:
    return _predict_s1


@exercise(
    "10.6",
    "the elementwise passes over the weights that predict adds per step at width 3",
    "two copies (the weights, this worker's gradient), then a product and a subtraction for "
    "each of the s = K - 1 steps in flight",
    judge=close(rel=0, abs_=0),
)
def predict_passes_width_three() -> int:
    return compensation_passes("predict", width=3)
