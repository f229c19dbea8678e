"""One-process oracles: each training method of the project, stated as plain NumPy.

These functions are the *definitions*. They run all p workers inside one process, in a fixed
order, with no threads and no sockets, so that each line reads as the math. The distributed
implementations (sync.py, ddp.py, pipe.py, ps.py) are tested against them.

Every oracle takes a gradient oracle

    grad_fn(params, rank, step) -> (loss, grad)

which returns worker `rank`'s loss and gradient on its own minibatch number `step`, evaluated at
`params` (see `model_grad_fn` for the data-backed one). The gradient average over p workers is

    g_t = (1/p) * sum_{r=0}^{p-1} grad f_r(w_t; minibatch (r, t))      # summed in rank order

The methods:
- `sync_sgd`: w_{t+1} = w_t - lr_t * g_t. Equal to large-batch SGD on the union of the p
  minibatches (batch p*B), because the mean of p means of B terms is the mean of the p*B terms.
  Synchronous AllReduce SGD, DDP-style bucketed SGD and synchronous parameter-server SGD all
  compute exactly this (up to the order in which the mean's terms are added).
- `delayed_sgd` (staleness s = K - 1 for Pipe-SGD of width K):
      w_{t+1} = w_t - lr_t * g_{t-s}    for t >= warmup + s
      w_{t+1} = w_t                     for warmup <= t < warmup + s   (the pipeline fills)
      w_{t+1} = w_t - lr_t * g_t        for t < warmup                 (synchronous warm-up)
  where g_t is computed at w_t. After the last step the s gradients still in flight are applied
  in order (the drain), so every computed gradient is applied exactly once.
- `async_ps_sgd`: a parameter server applies each worker's gradient the moment it arrives, in a
  given arrival order; a worker's gradient was computed on the weights it last pulled, so it is
  `staleness = (updates applied since that pull)` old. The staleness of every update is recorded.
  With `max_staleness` S (stale synchronous parallel), a worker that would start a step more
  than S steps ahead of the slowest worker gets its pull only once the slowest catches up
  (S = 0: every worker waits for every other each step, ps-sync's schedule).

Compensation (compensation.py): `delayed_sgd(..., compensation="dc" | "dc-adaptive")` applies
g + lam * g * g * (w_t - w_{t-s}) instead of the stale g; `compensation="predict"` computes each
worker's gradient at its predicted weights w_t - sum lr * g_local (its own gradients in
flight). `async_ps_sgd(..., compensation="dc" | "dc-adaptive")` compensates each push for the
updates applied since its worker pulled.

Optimiser (optimizer.py): every update above is written w - lr_t g, plain SGD, which is each
oracle's default. `optimizer=SGD(momentum, nesterov, weight_decay)` applies torch.optim.SGD's
rule instead (d = g + wd w, v = M v + d, w -= lr_t (d + M v or v)), with one velocity that
every update, in the order the oracle applies them, advances: the replicas' (ring methods) or
the server's (parameter servers). `lr` is any schedule lr_at(t) (optimizer.schedule).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from pipesgd_ref.methods.compensation import DC_LAMBDA, DelayCompensation, predicted_weights
from pipesgd_ref.methods.optimizer import SGD
from pipesgd_ref.ops import get_backend

GradFn = Callable[[np.ndarray, int, int], tuple[float, np.ndarray]]
LR = float | Callable[[int], float]
Callback = Callable[[int, np.ndarray, float], None]  # (step, params after the step, loss)


@dataclass
class Trajectory:
    """What an oracle run produced."""

    params: np.ndarray  # final weights (after the drain, for delayed SGD)
    losses: list[float] = field(default_factory=list)  # mean worker loss at each step, at w_t
    history: list[np.ndarray] | None = None  # w_0, w_1, ..., w_final when record=True
    staleness: list[int] | None = None  # async PS: age of each applied gradient, in updates


def _lr_fn(lr: LR) -> Callable[[int], float]:
    return lr if callable(lr) else (lambda step: lr)


class _Update:
    """The optimiser of an oracle run: `optimizer`'s rule (optimizer.py; default plain SGD,
    w -= lr_t g, bitwise the line it replaces) with its velocity, on NumPy."""

    def __init__(self, optimizer: SGD | None, w: np.ndarray):
        self.rule = optimizer or SGD()
        self.velocity = np.zeros_like(w) if self.rule.momentum else None
        self.ops = get_backend("numpy")

    def __call__(self, w: np.ndarray, g: np.ndarray, lr: float, own: bool = True) -> None:
        """w <- the update of g at lr; `own`: g is the oracle's to overwrite (else copied)."""
        scratch = g if own or self.rule.plain else g.copy()
        self.rule.step(self.ops, w, scratch, lr, self.velocity)


def average_gradient(
    grad_fn: GradFn, params: np.ndarray, world_size: int, step: int
) -> tuple[float, np.ndarray]:
    """(mean loss, mean gradient) of the p workers at `params`, summed in rank order."""
    total = np.zeros_like(params)
    loss = 0.0
    for rank in range(world_size):
        loss_r, grad_r = grad_fn(params, rank, step)
        total += grad_r
        loss += loss_r
    total /= world_size
    return loss / world_size, total


def bucketed_average(plan: Iterable[tuple[int, int]]) -> Callable:
    """ddp's mean, an `average` for sync_sgd: each bucket [lo, hi) of `plan` (its own ring
    AllReduce in a ddp job) averaged alone, in the ring's order of additions
    (comm/schedule.simulate_allreduce), bitwise what a ddp job computes."""
    from pipesgd_ref.comm.schedule import simulate_allreduce  # the ring's order, replayed

    plan = list(plan)

    def average(grad_fn: GradFn, params: np.ndarray, world_size: int, step: int):
        losses, grads = zip(*(grad_fn(params, r, step) for r in range(world_size)), strict=True)
        mean = np.empty_like(params)
        for lo, hi in plan:
            mean[lo:hi] = simulate_allreduce([g[lo:hi] for g in grads], "mean")[0]
        return sum(losses) / world_size, mean

    return average


def sync_sgd(
    grad_fn: GradFn,
    params0: np.ndarray,
    world_size: int,
    steps: int,
    lr: LR,
    record: bool = False,
    callback: Callback | None = None,
    average: Callable | None = None,
    optimizer: SGD | None = None,
) -> Trajectory:
    """Synchronous data-parallel SGD: w_{t+1} = w_t - lr_t * mean_r grad f_r(w_t).
    `average(grad_fn, params, world_size, step) -> (loss, mean gradient)`: how the mean is
    summed (default `average_gradient`, rank order); ddp is this oracle with each bucket's
    mean summed in the ring's order for that bucket (the tests' oracles). `optimizer`: the
    rule applying the mean (optimizer.SGD: momentum, nesterov, weight decay; default plain)."""
    lr_at = _lr_fn(lr)
    average = average or average_gradient
    w = params0.copy()
    update = _Update(optimizer, w)
    out = Trajectory(params=w, history=[w.copy()] if record else None)
    for t in range(steps):
        loss, g = average(grad_fn, w, world_size, t)
        update(w, g, lr_at(t), own=average is average_gradient)
        out.losses.append(loss)
        if out.history is not None:  # record
            out.history.append(w.copy())
        if callback:
            callback(t, w, loss)
    return out


def _predicted_gradient(grad_fn, w, world_size: int, t: int, in_flight, lr_ahead, update):
    """predict: each worker computes its gradient at w_t less its own gradients in flight,
    each times the lr of the step that will apply it (u + s): the weights its gradient will
    be applied to (with momentum or weight decay: the optimiser `update`'s own updates of
    them, previewed). Returns (loss, the average gradient, each worker's own gradient)."""
    predicted = np.empty_like(w)
    grads = []
    for rank in range(world_size):
        ahead = [(lr_ahead(u), own[rank]) for u, _, _, own in in_flight]
        at = predicted_weights(w, ahead, predicted, update.rule, update.velocity)
        grads.append(grad_fn(at, rank, t))
    loss, g = average_gradient(lambda _w, r, _t: grads[r], w, world_size, t)
    return loss, g, [gr for _, gr in grads]


def delayed_sgd(
    grad_fn: GradFn,
    params0: np.ndarray,
    world_size: int,
    steps: int,
    lr: LR,
    *,
    staleness: int,
    warmup_steps: int = 0,
    drain: bool = True,
    record: bool = False,
    callback: Callback | None = None,
    compensation: str = "none",
    dc_lambda: float = DC_LAMBDA,
    curvature: Callable[[np.ndarray], np.ndarray] | None = None,
    optimizer: SGD | None = None,
) -> Trajectory:
    """Delayed (pipelined) SGD: the update at step t applies the average gradient of step t-s.

    `staleness=0` is `sync_sgd`; `staleness=1` is Pipe-SGD of width 2. See the module docstring
    for the fill, warm-up and drain phases, and compensation.py for `compensation` (none, dc,
    dc-adaptive, predict; nothing is compensated in the warm-up). "dc-exact" (the theory's
    variant, no training option): g + dc_lambda * curvature(w_t - w_{t-s}), curvature(v) the
    Hessian times v. `optimizer` (optimizer.SGD; default plain): the rule every update (warm-up,
    steady state, drain) applies, its velocity updated in the order the updates come.
    """
    if staleness < 0 or warmup_steps < 0:
        raise ValueError(
            f"staleness and warmup_steps must be >= 0, got {staleness}, {warmup_steps}"
        )
    if compensation not in ("none", "dc", "dc-adaptive", "predict", "dc-exact"):
        raise ValueError(f"unknown compensation {compensation!r}")
    if (compensation == "dc-exact") != (curvature is not None):
        raise ValueError("compensation 'dc-exact' takes a curvature (Hessian-vector) function")
    lr_at = _lr_fn(lr)
    w = params0.copy()
    update = _Update(optimizer, w)
    out = Trajectory(params=w, history=[w.copy()] if record else None)
    # (t, g_t, w_t or None, [each worker's own g_t] or None) of the gradients "on the wire"
    in_flight: deque[tuple] = deque()
    dc = None
    if compensation in ("dc", "dc-adaptive"):
        dc = DelayCompensation(compensation, dc_lambda, w.size, w.dtype)

    def stale(u: int, g: np.ndarray, w_then) -> np.ndarray:
        if curvature is not None:
            return g + w.dtype.type(dc_lambda) * curvature(w - w_then)
        return g if dc is None else dc.correct(g, w, w_then)

    for t in range(steps):
        if compensation == "predict" and t >= warmup_steps:
            lr_ahead = lambda u: lr_at(u + staleness)  # noqa: E731 (the step that applies g_u)
            loss, g, own = _predicted_gradient(
                grad_fn, w, world_size, t, in_flight, lr_ahead, update
            )
        else:
            loss, g = average_gradient(grad_fn, w, world_size, t)  # g_t, computed at w_t
            own = None
        if t < warmup_steps:
            update(w, g, lr_at(t))  # warm-up: synchronous, fresh gradient
        else:
            keep = dc is not None or curvature is not None
            in_flight.append((t, g, w.copy() if keep else None, own))
            if len(in_flight) > staleness:  # steady state: g_{t-s} has arrived
                u, g_old, w_then, _ = in_flight.popleft()
                update(w, stale(u, g_old, w_then), lr_at(t))
            # else: fill phase, no gradient has finished its trip yet; w_{t+1} = w_t
        out.losses.append(loss)
        if out.history is not None:  # record
            out.history.append(w.copy())
        if callback:
            callback(t, w, loss)
    t = steps
    while drain and in_flight:  # drain: apply what is still in flight, oldest first
        u, g_old, w_then, _ = in_flight.popleft()
        update(w, stale(u, g_old, w_then), lr_at(t))
        t += 1
        if out.history is not None:  # record
            out.history.append(w.copy())
    return out


def async_ps_sgd(
    grad_fn: GradFn,
    params0: np.ndarray,
    world_size: int,
    arrival_order: Iterable[int],
    lr: LR,
    record: bool = False,
    compensation: str = "none",
    dc_lambda: float = DC_LAMBDA,
    max_staleness: int | None = None,
    optimizer: SGD | None = None,
) -> Trajectory:
    """Asynchronous parameter-server SGD for a given arrival order of worker gradients.

    Every worker starts from w_0. When worker r's gradient arrives, the server applies it at
    once (w <- w - lr_u * g, u = number of updates so far), and r pulls the new weights and
    computes its next gradient (its own minibatch counter advances). `losses[u]` is the loss
    worker r saw when it computed the u-th applied gradient; `staleness[u]` its age.

    compensation dc or dc-adaptive: the server applies g + lam * g * g * (w - w_r) instead, w_r
    the weights worker r computed g on. max_staleness S: after its push, worker r, now done
    with local_step[r] steps, gets its pull only while local_step[r] - min(local_step) <= S;
    else when the slowest catches up (the weights of that moment). An order in which a held
    back worker arrives is not one the server can see: ValueError. `optimizer` (optimizer.SGD;
    default plain): the server's rule, its velocity the server's, updated push by push.
    """
    if max_staleness is not None and max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
    lr_at = _lr_fn(lr)
    w = params0.copy()
    update = _Update(optimizer, w)
    staleness: list[int] = []  # the age of each applied gradient
    out = Trajectory(params=w, history=[w.copy()] if record else None, staleness=staleness)
    pulled = [(w.copy(), 0) for _ in range(world_size)]  # (weights, version) each worker holds
    local_step = [0] * world_size
    held: list[int] = []  # workers whose pull waits for the slowest (max_staleness)
    dc = None
    if compensation in ("dc", "dc-adaptive"):
        dc = DelayCompensation(compensation, dc_lambda, w.size, w.dtype)
    elif compensation != "none":
        raise ValueError(f"ps-async compensates with dc or dc-adaptive, not {compensation!r}")
    version = 0  # number of updates the server has applied
    for rank in arrival_order:
        if not 0 <= rank < world_size:
            raise ValueError(f"arrival_order names rank {rank}, outside 0..{world_size - 1}")
        if rank in held:
            raise ValueError(
                f"arrival_order has rank {rank} push while it is held back "
                f"(max_staleness {max_staleness})"
            )
        w_r, v_r = pulled[rank]
        loss, g = grad_fn(w_r, rank, local_step[rank])
        staleness.append(version - v_r)
        if dc is not None:
            g = dc.correct(g, w, w_r)
        update(w, g, lr_at(version), own=dc is not None)  # grad_fn's g: copied if need be
        version += 1
        local_step[rank] += 1
        if max_staleness is None:
            pulled[rank] = (w.copy(), version)
        else:  # every worker the bound now lets go gets its pull, in worker order
            held.append(rank)
            slowest = min(local_step)
            for r in sorted(held):
                if local_step[r] - slowest <= max_staleness:
                    held.remove(r)
                    pulled[r] = (w.copy(), version)
        out.losses.append(loss)
        if out.history is not None:  # record
            out.history.append(w.copy())
    return out


def ps_sync_sgd(
    grad_fn: GradFn, params0: np.ndarray, world_size: int, steps: int, lr: LR, **kwargs
) -> Trajectory:
    """Synchronous parameter server: the server averages all p gradients, then every worker
    pulls. Mathematically the same trajectory as `sync_sgd`."""
    return sync_sgd(grad_fn, params0, world_size, steps, lr, **kwargs)


def model_grad_fn(model, dataset, sampler, buffers: np.ndarray | None = None) -> GradFn:
    """grad_fn for a model on a dataset: worker `rank` at `step` uses sampler's minibatch.

    `buffers` (a model with batch norm: its init_buffers(), updated in place): the job's
    running statistics are worker 0's, as under DDP, which hands rank 0's buffers to every
    replica; so worker 0's forward passes update them, once per gradient it computes, in the
    order the oracle asks for them (the distributed worker 0 computes them in that order too)."""

    def grad_fn(params: np.ndarray, rank: int, step: int) -> tuple[float, np.ndarray]:
        X, y = sampler.batch(dataset, rank, step)
        grads = np.empty_like(params)
        stats = buffers if rank == 0 else None
        loss = model.loss_and_grad(params, X, y, grads, buffers=stats)
        return loss, grads

    return grad_fn


def round_robin(world_size: int, n_updates: int) -> list[int]:
    """The arrival order 0, 1, ..., p-1, 0, 1, ...: equal-speed workers (staleness p-1)."""
    return [u % world_size for u in range(n_updates)]
