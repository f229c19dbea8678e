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
its pipeline fills: two different warm-ups.) Cosine reaches 0 at t = T and stays there: pipe's
drain applies its last s gradients at updates T .. T + s - 1, which get lr 0. The choice keeps
the schedule one function of (cfg, T), the same for every method and its oracle; what the
drain's updates lose is what cosine's own last updates would have added, lr_{T-1} being already
lr sin^2(pi / (2 (T - W))) (3e-6 lr for T = 600).

Where the state lives: the velocity v is as large as the weights. The ring methods (sync, ddp,
pipe) keep one in every replica: they apply the same averaged gradients in the same order, so
the velocities stay bitwise identical, as the weights do. A parameter server (ps-sync,
ps-async) keeps it on the server (rank 0), beside the only copy of the weights that is
updated; the workers hold none. A checkpoint carries it (runtime/checkpoint.py).
"""

from __future__ import annotations

import math

SCHEDULES = ("constant", "inverse", "step", "cosine")


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
    if cfg.lr_warmup < 0:
        problems.append(f"lr_warmup must be >= 0 (0: none), got {cfg.lr_warmup}")
    return problems


def learning_rate(cfg, t: int, total_steps: int) -> float:
    """lr_t of update t in a run of `total_steps` steps (the module docstring's schedule)."""
    kind, lr, W = cfg.lr_schedule, cfg.lr, cfg.lr_warmup
    if kind == "inverse":
        lr_t = lr / (1.0 + cfg.lr_decay * t)
    elif kind == "step":
        lr_t = lr * cfg.lr_gamma ** sum(1 for m in cfg.lr_milestones if m <= t)
    elif kind == "cosine":
        span = total_steps - W
        done = min(max(t - W, 0), span) / span if span > 0 else 1.0
        lr_t = lr * 0.5 * (1.0 + math.cos(math.pi * done))
    else:
        lr_t = lr
    if t < W:  # linear warm-up of the learning rate
        lr_t = lr_t * (t + 1) / W
    return lr_t
