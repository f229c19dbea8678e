"""Paying back staleness: delay compensation (DC-ASGD) and weight prediction (SAPipe).

Pipe-SGD of width K applies at step t the averaged gradient of step t - s (s = K - 1), computed
at w_{t-s}, to the weights w_t. Two remedies from the work around the paper (DC-ASGD, 2017, a
year before Pipe-SGD; SAPipe, 2022, after it); both run on every replica in the same order of
operations, so the replicas stay bitwise identical and the one-process oracles
(reference.py) use these very functions.

    dc           apply  g~ = g + lam * g (.) g (.) (w_t - w_{t-s})       instead of g
                 (DC-ASGD, Zheng et al., ICML 2017: a first-order Taylor step of the gradient
                 from w_{t-s} to w_t, with the Hessian replaced by lam * g (.) g, a cheap
                 diagonal estimate of it). Default lam 0.04, as MXNet's dcasgd optimizer.
    dc-adaptive  the same, lam elementwise: lam_t = lam0 / sqrt(MS_t + eps), where
                 MS_t = m * MS_{t-1} + (1 - m) * g (.) g is a moving mean square (m = 0.95),
                 updated with each stale gradient applied before it is used
    predict      each worker computes its gradient at the weights the pipeline will have when
                 that gradient is applied, predicted from its own newest gradients:
                     w^_t = w_t - sum over the s steps u in flight of lr_{u+s} * g_local_u
                 (s = 1: w^_t = w_t - lr_t * g_local_{t-1}), while the stale averaged gradient
                 is still applied to the true weights w_t (SAPipe's "local" prediction).
                 With momentum (SAPipe predicts with the momentum term) and weight decay: the
                 optimiser's own updates (optimizer.py), previewed on copies of w and v with
                 g_local in place of the average, oldest first; s = 1:
                     w^_t = w_t - lr_t (M v_t + g_local_{t-1} + wd w_t)   (nesterov likewise)

With momentum, dc and dc-adaptive correct the stale gradient as above, and the corrected one
enters the optimiser as its gradient (d = g~ + wd w, v = M v + d, ...).

Where the warm-up applies fresh gradients, nothing is compensated (and MS is not updated).

Cost per step (n parameters): dc keeps a copy of the weights of each step in flight (K copies
of n floats, reused) and makes six elementwise passes (the copy, w_t - w_{t-s}, two products,
the scale, the sum; the adaptive form six more for MS and the elementwise lam); predict keeps
the weights w^ and a copy of
this worker's own gradient for each step in flight (the AllReduce overwrites the gradient in
place), and makes 2 + 2 s passes (the copies, then a product and a subtraction per step in
flight; with momentum or weight decay the preview copies v and each g too and runs the
optimiser's passes per step in flight). The timing model charges these passes to the compute
thread, each at the reduction's cost per byte (timing/terms.py: `compensation_passes`: dc 6,
dc-adaptive 12, predict 2 + 2 s; the preview's extra passes with momentum are not modelled).

Stability, on a quadratic f(w) = 1/2 w^T A w (noise-free gradients, every worker the same),
along an eigenvector of A with eigenvalue lam_A, x = lr * lam_A (derived below, and tested on
both sides of each bound in tests/test_compensation.py):

  synchronous        w_{t+1} = (1 - x) w_t                 stable iff 0 < x < 2
  plain staleness 1  w_{t+1} = w_t - x w_{t-1}             z^2 - z + x = 0: the roots have
                     |z| < 1 iff 0 < x < 1 (Jury: |a0| = x < 1; 1 + a1 + a0 = x > 0;
                     1 - a1 + a0 = 2 + x > 0)
  dc, exact curvature: the Hessian lam_A in place of g (.) g, with a weight c:
                     g~ = lam_A w_{t-1} + c lam_A (w_t - w_{t-1}), so
                     w_{t+1} = (1 - c x) w_t - (1 - c) x w_{t-1},
                     z^2 - (1 - c x) z + (1 - c) x = 0, stable iff
                     x (1 - c) < 1 and x (2 c - 1) < 2, i.e. for 0 <= c <= 1
                     x < min(1 / (1 - c), 2 / (2 c - 1)) (a term with a zero or negative
                     denominator sets no bound): c = 0 is plain (x < 1), c = 1/2 gives x < 2,
                     c = 1 the synchronous recurrence (x < 2); the widest, c = 3/4, x < 4
  dc, diagonal estimate (the implemented one): the correction lam g^2 (w_t - w_{t-1}) is of
                     third order in w, so the linearisation at the optimum is plain staleness
                     one: locally stable iff x < 1, whatever lam (far from the optimum it acts;
                     near it, no longer). dc-adaptive: g^2 / sqrt(MS) is of the size of |g|,
                     still of second order: the same local bound x < 1.
  predict            with identical workers the local gradient is the averaged one:
                     g_{t-1} = A w^_{t-1}, and w^_t = w_t - lr g_{t-1} = w_{t+1} exactly (the
                     update of step t applies g_{t-1}). So g_t is computed at w_{t+1}, the
                     weights it is applied to: w_{t+2} = (1 - x) w_{t+1}, the synchronous
                     recurrence, stable iff x < 2. With different workers (data-parallel
                     noise) the prediction is only approximate.
  with momentum M    (optimizer.py derives it): heavy ball is stable iff x < 2 (1 + M)
                     fresh, x < 1 - M at staleness one; predict previews the optimiser's own
                     update, so with identical workers it is again exact: x < 2 (1 + M).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from pipesgd_ref.config import COMPENSATIONS, TrainConfig
from pipesgd_ref.methods.optimizer import SGD
from pipesgd_ref.ops import get_backend

PLAIN = SGD()  # w <- w - lr g: predicted_weights' default, the plain step
__all__ = [
    "COMPENSATIONS",
    "DC_LAMBDA",
    "DelayCompensation",
    "PipeCompensation",
    "predicted_weights",
    "stability_bound",
]

DC_LAMBDA = TrainConfig.dc_lambda  # 0.04, MXNet's dcasgd default
DC_MOMENTUM = 0.95  # of the moving mean square of dc-adaptive
DC_EPS = 1e-7  # under the square root of dc-adaptive


class DelayCompensation:
    """dc or dc-adaptive (module docstring): `correct(g, w_now, w_then)` returns the
    compensated gradient. One per replica (or per server); the adaptive form keeps its moving
    mean square, so every replica must see the same gradients in the same order."""

    def __init__(self, kind: str, lam: float, n: int, dtype=np.float32):
        if kind not in ("dc", "dc-adaptive"):
            raise ValueError(f"delay compensation is dc or dc-adaptive, got {kind!r}")
        self.kind = kind
        self.dtype = np.dtype(dtype)
        self.lam = self.dtype.type(lam)
        self.mean_square = np.zeros(n, self.dtype) if kind == "dc-adaptive" else None
        self._delta = np.empty(n, self.dtype)

    def correct(self, g: np.ndarray, w_now: np.ndarray, w_then: np.ndarray) -> np.ndarray:
        """g + lam * g * g * (w_now - w_then), a new array (g is left as it is)."""
        d = self._delta
        np.subtract(w_now, w_then, out=d)  # how far the weights moved while g travelled
        d *= g
        d *= g
        if self.mean_square is None:
            d *= self.lam
        else:
            ms = self.mean_square
            m = self.dtype.type(DC_MOMENTUM)
            ms *= m
            ms += (self.dtype.type(1) - m) * (g * g)
            d *= self.lam / np.sqrt(ms + self.dtype.type(DC_EPS))
        return g + d


def predicted_weights(
    w: np.ndarray,
    local: Iterable[tuple[float, np.ndarray]],
    out: np.ndarray,
    rule: SGD = PLAIN,
    velocity: np.ndarray | None = None,
) -> np.ndarray:
    """w - sum of lr * g over `local` ((lr, this worker's own gradient) of each step in
    flight, oldest first), into `out`: the weights when the gradient computed now is applied.

    With momentum or weight decay (`rule`, and the optimiser's `velocity` now), the same
    updates as the optimiser's own (optimizer.py), previewed on copies: for each step in flight
    d = g + wd w^, v^ = M v^ + d, w^ -= lr (d + M v^ if nesterov else v^); at staleness one
    w^ = w - lr (M v + g + wd w). The velocity and each g are left as they are."""
    np.copyto(out, w)
    if rule.plain:
        for lr, g in local:
            out -= out.dtype.type(lr) * g
        return out
    v = None  # the preview's own velocity: a copy (zeros before the first update)
    if rule.momentum:
        v = np.zeros_like(w) if velocity is None else velocity.copy()
    numpy_ops = get_backend("numpy")
    for lr, g in local:
        rule.step(numpy_ops, out, g.copy(), lr, v)  # g copied: step leaves d in it
    return out


def stability_bound(variant: str, c: float = 1.0) -> float:
    """The largest stable x = lr * lam_max on a quadratic (module docstring), for variant
    sync, pipe (plain staleness one), dc-exact (curvature weight c), dc (the diagonal
    estimate: locally), dc-adaptive (locally) or predict (identical workers)."""
    if variant in ("sync", "predict"):
        return 2.0
    if variant in ("pipe", "dc", "dc-adaptive"):
        return 1.0
    if variant == "dc-exact":
        if not 0.0 <= c <= 1.0:
            raise ValueError(f"the curvature weight c must be in [0, 1], got {c}")
        bounds = [1.0 / (1.0 - c) if c < 1.0 else np.inf]
        if c > 0.5:
            bounds.append(2.0 / (2.0 * c - 1.0))
        return float(min(bounds))
    raise ValueError(f"unknown variant {variant!r}")


class PipeCompensation:
    """One Pipe-SGD replica's --compensation (the functions above, with the state they keep
    between steps), in the order the oracle
    (reference.delayed_sgd) uses, so the replicas stay bitwise identical and equal to it:

        weights_for(in flight)  the weights g_t is computed at: w_t (None: the worker's own),
                                or for predict w_t - sum over the steps u in flight of
                                lr_{u+s} * (this worker's own g_u) (with momentum or weight
                                decay, the optimiser's updates of them from (w_t, v_t))
        computed(t, g_t)        after the computation, before the AllReduce overwrites g_t:
                                dc keeps a copy of w_t, predict a copy of g_t
        applied(u, avg)         what the update of avg(g_u) applies: avg, or for dc
                                avg + lam * avg * avg * (w_now - w_u)

    Memory: K vectors (one per step in flight and the one being computed, reused as the pipe's
    gradient buffers are: step t's in slot t % K), and predict's weights."""

    def __init__(self, cfg, worker):
        self.kind, self.s, self.lr_at, self.worker = (
            cfg.compensation,
            cfg.staleness,
            worker.lr_at,  # the run's schedule (cosine's horizon: its steps)
            worker,
        )
        self.rule = SGD.of(cfg)  # predict previews the optimiser's own updates
        w = worker.params
        self.kept = [np.empty_like(w) for _ in range(cfg.width)] if self.kind != "none" else []
        self.dc = None
        if self.kind in ("dc", "dc-adaptive"):
            self.dc = DelayCompensation(self.kind, cfg.dc_lambda, w.size, w.dtype)
        self.predicted = np.empty_like(w) if self.kind == "predict" else None

    def weights_for(self, in_flight: list[int]):
        if self.predicted is None:
            return None
        ahead = [(self.lr_at(u + self.s), self.kept[u % len(self.kept)]) for u in in_flight]
        w = self.worker
        return predicted_weights(w.params, ahead, self.predicted, self.rule, w.velocity)

    def computed(self, t: int, grads: np.ndarray) -> None:
        if self.kept:
            np.copyto(
                self.kept[t % len(self.kept)], grads if self.dc is None else self.worker.params
            )

    def applied(self, u: int, avg: np.ndarray) -> np.ndarray:
        if self.dc is None:
            return avg
        return self.dc.correct(avg, self.worker.params, self.kept[u % len(self.kept)])
