"""The optimiser every method applies: torch.optim.SGD (heavy ball, Nesterov, weight decay) with
a learning-rate schedule and a linear warm-up.

The rule, update t, gradient g (the averaged one, or a push at the server), weights w:

    d  = g + wd * w                       weight decay (L2), --weight-decay
    v <- M v + d                          the velocity (v = 0 before the first update), --momentum
    d  = d + M v   (--nesterov)   else  d = v
    w <- w - lr_t d

exactly torch.optim.SGD's definition, in its order of operations (torch copies d into v at the
first update; M * 0 + d is the same number, up to the sign of a zero). With M = 0 and wd = 0
it is today's plain step w <- w - lr_t g, the very `sgd_step` call: every plain-SGD result
stays bitwise what it was.

The schedule, lr_t for update t (T = the run's steps, W = --lr-warmup):

    constant   lr
    inverse    lr / (1 + lr_decay * t)
    step       lr * lr_gamma ** (number of --lr-milestones <= t)
    cosine     lr * (1 + cos(pi * min(t - W, T - W) / (T - W))) / 2   for t >= W
    warm-up    for t < W: the schedule's lr_t times (t + 1) / W (cosine's is lr there)

(--lr-warmup is the learning rate's warm-up; --warmup-steps is pipe's synchronous steps before
its pipeline fills: two different warm-ups.) t counts the optimiser's updates, as a torch
scheduler stepped after each optimizer.step(): one per step in sync, ddp, pipe and ps-sync;
in ps-async one per push, p per step, so there T = p * steps and the milestones and the
warm-up count pushes (and inverse decays per push, as it always has).

Cosine reaches 0 at t = T and stays there: pipe's drain applies its last s gradients at
updates T .. T + s - 1, which get lr 0 (w is left as it is; v still takes them in). The choice
keeps the schedule one function of (cfg, T), the same for every method and its oracle; what
the drain's updates lose is what cosine's own last updates would have added, lr_{T-1} being
already lr sin^2(pi / (2 (T - W))) (7e-6 lr for T = 600, W = 0).

Where the state lives: the velocity v is as large as the weights. The ring methods (sync, ddp,
pipe) keep one in every replica: they apply the same averaged gradients in the same order, so
the velocities stay bitwise identical, as the weights do. A parameter server (ps-sync,
ps-async) keeps it on the server (rank 0), beside the only copy of the weights that is
updated; the workers hold none. A checkpoint carries it (runtime/checkpoint.py).

Momentum and staleness add up. On a quadratic f(w) = 1/2 w^T A w, along an eigenvector of A
with eigenvalue lambda, x = lr * lambda, heavy ball applying gradients s steps old
(compensation.py derives the plain staleness-one case, M = 0):

    v_{t+1} = M v_t + lambda w_{t-s},   w_{t+1} = w_t - lr v_{t+1}

and since lr v_t = w_{t-1} - w_t,

    w_{t+1} = (1 + M) w_t - M w_{t-1} - x w_{t-s}.

    s = 0  z^2 - (1 + M - x) z + M = 0. Jury's conditions for z^2 + a1 z + a0:
           |a0| = M < 1;  p(1) = x > 0;  p(-1) = 2 (1 + M) - x > 0:
           stable iff 0 <= M < 1 and 0 < x < 2 (1 + M)  (momentum widens plain SGD's x < 2)
    s = 1  z^2 - (1 + M) z + (M + x) = 0:
           |M + x| < 1;  p(1) = x > 0;  p(-1) = 2 + 2 M + x > 0:
           stable iff 0 < x < 1 - M

So the delay and the momentum compound: the stable range, 2 (1 + M) without delay, shrinks to
1 - M at staleness one (M = 0.9: from 3.8 to 0.1, 38 times smaller; plain SGD loses only a
factor 2). A pipe with momentum needs a learning rate well under the synchronous run's.
`heavy_ball_bound` returns the bound (from s = 2 on, found from the roots numerically),
tests/test_optimizer.py simulates both sides of it. predict (compensation.py) computes each
gradient at the weights the optimiser's own pending updates will give; with identical workers
those are exactly the weights it is applied to, and the synchronous range 2 (1 + M) comes back.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

SCHEDULES = ("constant", "inverse", "step", "cosine")


@dataclass(frozen=True)
class SGD:
    """torch.optim.SGD's rule (the module docstring): the hyperparameters, no state. The state,
    the velocity, is the caller's: one per replica in the ring methods, the server's in ps-sync
    and ps-async, a local array in the oracles (reference.py), all updated by `step`."""

    momentum: float = 0.0  # M; 0: no velocity is kept
    nesterov: bool = False
    weight_decay: float = 0.0  # wd

    @classmethod
    def of(cls, cfg) -> SGD:
        """The rule of a config.TrainConfig (--momentum, --nesterov, --weight-decay)."""
        return cls(cfg.momentum, cfg.nesterov, cfg.weight_decay)

    @property
    def plain(self) -> bool:
        """w <- w - lr_t g: no velocity, no decay (the project's SGD before this rule)."""
        return self.momentum == 0 and self.weight_decay == 0

    def step(self, ops, params, grads, lr: float, velocity=None) -> None:
        """One update of `params` in place, with the backend `ops` (ops/: numpy, numba or
        cuda arrays alike; only sgd_step, scale and add_into, so no backend needs a kernel
        of its own). `grads` is scratch: with weight decay or nesterov it is left holding d.
        `velocity` (momentum > 0: zeros before the first update) is updated in place.

        Each line is one op, and each op rounds once, in torch's order: sgd_step(x, y, -a)
        is x - (-a) y = x + a y exactly (negating is exact), so d + wd w and d + M v are
        formed as torch forms them."""
        if self.plain:
            ops.sgd_step(params, grads, lr)  # w <- w - lr_t g: bitwise the plain step
            return
        d = grads
        if self.weight_decay:
            ops.sgd_step(d, params, -self.weight_decay)  # d = g + wd w
        if self.momentum:
            ops.scale(velocity, self.momentum)
            ops.add_into(velocity, d)  # v <- M v + d
            if self.nesterov:
                ops.sgd_step(d, velocity, -self.momentum)  # d = d + M v
            else:
                d = velocity  # d = v
        ops.sgd_step(params, d, lr)  # w <- w - lr_t d


def optimizer_problems(cfg) -> list[str]:
    """The optimiser's options on their own (config.TrainConfig's check), one phrase each."""
    problems = []
    if not 0 <= cfg.momentum < 1:  # NaN fails too
        problems.append(f"momentum must be in [0, 1) (0: plain SGD), got {cfg.momentum}")
    if cfg.nesterov and not cfg.momentum > 0:
        problems.append("nesterov needs a momentum > 0: pass --momentum 0.9, say")
    if not 0 <= cfg.weight_decay < math.inf:
        problems.append(f"weight_decay must be a finite number >= 0, got {cfg.weight_decay}")
    if cfg.lr_schedule not in SCHEDULES:
        problems.append(
            f"lr_schedule must be one of {', '.join(SCHEDULES)}, got {cfg.lr_schedule!r}"
        )
    elif cfg.lr_decay > 0 and cfg.lr_schedule != "inverse":
        problems.append(
            f"lr_decay {cfg.lr_decay:g} is the inverse schedule's: pass --lr-schedule inverse "
            f"(now {cfg.lr_schedule})"
        )
    ms = cfg.lr_milestones
    if cfg.lr_schedule == "step" and not ms:
        problems.append("lr_schedule step needs --lr-milestones, e.g. --lr-milestones 300,450")
    elif ms and cfg.lr_schedule != "step":
        problems.append(
            f"lr_milestones are the step schedule's: pass --lr-schedule step "
            f"(now {cfg.lr_schedule})"
        )
    elif ms and (ms[0] < 1 or any(b <= a for a, b in zip(ms, ms[1:], strict=False))):
        problems.append(f"lr_milestones must be strictly increasing steps > 0, got {ms}")
    if not 0 < cfg.lr_gamma <= 1:
        problems.append(f"lr_gamma must be in (0, 1], got {cfg.lr_gamma}")
    elif cfg.lr_gamma != type(cfg).lr_gamma and cfg.lr_schedule != "step":
        problems.append(
            f"lr_gamma {cfg.lr_gamma:g} is the step schedule's: pass --lr-schedule step "
            f"--lr-milestones ..., or drop --lr-gamma"
        )
    if cfg.lr_warmup < 0:
        problems.append(f"lr_warmup must be >= 0 (0: none), got {cfg.lr_warmup}")
    return problems


def schedule(cfg, total_steps: int) -> Callable[[int], float]:
    """lr_at(t) of cfg's schedule for a run of `total_steps` steps (the oracles' `lr`)."""
    return lambda t: learning_rate(cfg, t, total_steps)


def learning_rate(cfg, t: int, total_steps: int) -> float:
    """lr_t of update t in a run of `total_steps` steps (the module docstring's schedule)."""
    kind, lr, W = cfg.lr_schedule, cfg.lr, cfg.lr_warmup
    if kind == "inverse":
        lr_t = lr / (1.0 + cfg.lr_decay * t)
    elif kind == "step":
        lr_t = lr * cfg.lr_gamma ** sum(1 for m in cfg.lr_milestones if m <= t)
    elif kind == "cosine":
        span = total_steps - W
        # how far along the cosine is, 0 .. 1 (a warm-up as long as the run leaves it no room:
        # lr until T, 0 from T on)
        done = min(max(t - W, 0), span) / span if span > 0 else float(t >= total_steps)
        lr_t = lr * 0.5 * (1.0 + math.cos(math.pi * done))
    else:
        lr_t = lr
    if t < W:  # linear warm-up of the learning rate
        lr_t = lr_t * (t + 1) / W
    return lr_t


# --- stability of delayed heavy ball on a quadratic (the module docstring's derivation) ------


def heavy_ball_roots(x: float, momentum: float, staleness: int) -> np.ndarray:
    """The roots z of w_{t+1} = (1 + M) w_t - M w_{t-1} - x w_{t-s}: with d = max(2, s + 1),
    z^d - (1 + M) z^(d-1) + M z^(d-2) + x z^(d-1-s) = 0."""
    d = max(2, staleness + 1)
    coeffs = np.zeros(d + 1)  # coeffs[k]: the coefficient of z^(d - k)
    coeffs[0], coeffs[1], coeffs[2] = 1.0, -(1.0 + momentum), momentum
    coeffs[1 + staleness] += x
    return np.roots(coeffs)


def heavy_ball_stable(x: float, momentum: float, staleness: int) -> bool:
    """Whether every root lies strictly inside the unit circle (the recurrence decays)."""
    return bool(np.max(np.abs(heavy_ball_roots(x, momentum, staleness))) < 1.0)


def heavy_ball_bound(momentum: float, staleness: int) -> float:
    """The largest stable x = lr * lambda of heavy ball with gradients `staleness` steps old:
    2 (1 + M) fresh, 1 - M at staleness one (the docstring's Jury conditions); from s = 2 on,
    the first x whose roots leave the unit circle, found numerically (a scan, then bisection)."""
    if not 0 <= momentum < 1 or staleness < 0:
        raise ValueError(f"want 0 <= momentum < 1 and staleness >= 0, got {momentum}, {staleness}")
    if staleness == 0:
        return 2.0 * (1.0 + momentum)
    if staleness == 1:
        return 1.0 - momentum
    top = 2.0 * (1.0 + momentum)  # staleness only shrinks the range
    grid = np.linspace(0.0, top, 4097)[1:]
    lo = 0.0
    for x in grid:  # the stable x form an interval (0, bound): find where it ends
        if not heavy_ball_stable(x, momentum, staleness):
            hi = x
            break
        lo = x
    else:
        return top
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if heavy_ball_stable(mid, momentum, staleness) else (lo, mid)
    return float(lo)
