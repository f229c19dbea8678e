"""One-process oracles: each training method of the project, stated as plain NumPy.

These functions are the *definitions*. They run all p workers inside one process, in a fixed
order, with no threads and no sockets, so that each line reads as the math. The distributed
implementations (sync.py, pipe.py, ps.py) are tested against them.

Every oracle takes a gradient oracle

    grad_fn(params, rank, step) -> (loss, grad)

which returns worker `rank`'s loss and gradient on its own minibatch number `step`, evaluated at
`params` (see `model_grad_fn` for the data-backed one). The gradient average over p workers is

    g_t = (1/p) * sum_{r=0}^{p-1} grad f_r(w_t; minibatch (r, t))      # summed in rank order

The methods:
- `sync_sgd`: w_{t+1} = w_t - lr_t * g_t. Equal to large-batch SGD on the union of the p
  minibatches (batch p*B), because the mean of p means of B terms is the mean of the p*B terms.
  Synchronous AllReduce SGD and synchronous parameter-server SGD both compute exactly this.
- `delayed_sgd` (staleness s = K - 1 for Pipe-SGD of width K):
      w_{t+1} = w_t - lr_t * g_{t-s}    for t >= warmup + s
      w_{t+1} = w_t                     for warmup <= t < warmup + s   (the pipeline fills)
      w_{t+1} = w_t - lr_t * g_t        for t < warmup                 (synchronous warm-up)
  where g_t is computed at w_t. After the last step the s gradients still in flight are applied
  in order (the drain), so every computed gradient is applied exactly once.
- `async_ps_sgd`: a parameter server applies each worker's gradient the moment it arrives, in a
  given arrival order; a worker's gradient was computed on the weights it last pulled, so it is
  `staleness = (updates applied since that pull)` old. The staleness of every update is recorded.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

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


def sync_sgd(
    grad_fn: GradFn,
    params0: np.ndarray,
    world_size: int,
    steps: int,
    lr: LR,
    record: bool = False,
    callback: Callback | None = None,
) -> Trajectory:
    """Synchronous data-parallel SGD: w_{t+1} = w_t - lr_t * mean_r grad f_r(w_t)."""
    lr_at = _lr_fn(lr)
    w = params0.copy()
    out = Trajectory(params=w, history=[w.copy()] if record else None)
    for t in range(steps):
        loss, g = average_gradient(grad_fn, w, world_size, t)
        w -= w.dtype.type(lr_at(t)) * g
        out.losses.append(loss)
        if record:
            out.history.append(w.copy())
        if callback:
            callback(t, w, loss)
    return out


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
) -> Trajectory:
    """Delayed (pipelined) SGD: the update at step t applies the average gradient of step t-s.

    `staleness=0` is `sync_sgd`; `staleness=1` is Pipe-SGD of width 2. See the module docstring
    for the fill, warm-up and drain phases.
    """
    if staleness < 0 or warmup_steps < 0:
        raise ValueError(
            f"staleness and warmup_steps must be >= 0, got {staleness}, {warmup_steps}"
        )
    lr_at = _lr_fn(lr)
    w = params0.copy()
    out = Trajectory(params=w, history=[w.copy()] if record else None)
    in_flight: deque[np.ndarray] = deque()  # g_{t-s+1}, ..., g_t: the gradients "on the wire"
    for t in range(steps):
        loss, g = average_gradient(grad_fn, w, world_size, t)  # g_t, computed at w_t
        if t < warmup_steps:
            w -= w.dtype.type(lr_at(t)) * g  # warm-up: synchronous, fresh gradient
        else:
            in_flight.append(g)
            if len(in_flight) > staleness:  # steady state: g_{t-s} has arrived
                w -= w.dtype.type(lr_at(t)) * in_flight.popleft()
            # else: fill phase, no gradient has finished its trip yet; w_{t+1} = w_t
        out.losses.append(loss)
        if record:
            out.history.append(w.copy())
        if callback:
            callback(t, w, loss)
    t = steps
    while drain and in_flight:  # drain: apply what is still in flight, oldest first
        w -= w.dtype.type(lr_at(t)) * in_flight.popleft()
        t += 1
        if record:
            out.history.append(w.copy())
    return out


def async_ps_sgd(
    grad_fn: GradFn,
    params0: np.ndarray,
    world_size: int,
    arrival_order: Iterable[int],
    lr: LR,
    record: bool = False,
) -> Trajectory:
    """Asynchronous parameter-server SGD for a given arrival order of worker gradients.

    Every worker starts from w_0. When worker r's gradient arrives, the server applies it at
    once (w <- w - lr_u * g, u = number of updates so far), and r pulls the new weights and
    computes its next gradient (its own minibatch counter advances). `losses[u]` is the loss
    worker r saw when it computed the u-th applied gradient; `staleness[u]` its age.
    """
    lr_at = _lr_fn(lr)
    w = params0.copy()
    out = Trajectory(params=w, history=[w.copy()] if record else None, staleness=[])
    pulled = [(w.copy(), 0) for _ in range(world_size)]  # (weights, version) each worker holds
    local_step = [0] * world_size
    version = 0  # number of updates the server has applied
    for rank in arrival_order:
        if not 0 <= rank < world_size:
            raise ValueError(f"arrival_order names rank {rank}, outside 0..{world_size - 1}")
        w_r, v_r = pulled[rank]
        loss, g = grad_fn(w_r, rank, local_step[rank])
        out.staleness.append(version - v_r)
        w -= w.dtype.type(lr_at(version)) * g
        version += 1
        pulled[rank] = (w.copy(), version)
        local_step[rank] += 1
        out.losses.append(loss)
        if record:
            out.history.append(w.copy())
    return out


def ps_sync_sgd(
    grad_fn: GradFn, params0: np.ndarray, world_size: int, steps: int, lr: LR, **kwargs
) -> Trajectory:
    """Synchronous parameter server: the server averages all p gradients, then every worker
    pulls. Mathematically the same trajectory as `sync_sgd`."""
    return sync_sgd(grad_fn, params0, world_size, steps, lr, **kwargs)


def model_grad_fn(model, dataset, sampler) -> GradFn:
    """grad_fn for a model on a dataset: worker `rank` at `step` uses sampler's minibatch."""

    def grad_fn(params: np.ndarray, rank: int, step: int) -> tuple[float, np.ndarray]:
        X, y = sampler.batch(dataset, rank, step)
        grads = np.empty_like(params)
        loss = model.loss_and_grad(params, X, y, grads)
        return loss, grads

    return grad_fn


def round_robin(world_size: int, n_updates: int) -> list[int]:
    """The arrival order 0, 1, ..., p-1, 0, 1, ...: equal-speed workers (staleness p-1)."""
    return [u % world_size for u in range(n_updates)]
