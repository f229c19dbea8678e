"""Tutorial 05's checkable exercises (Pipe-SGD: the worker, its schedule, its timing)."""

from __future__ import annotations

import numpy as np

from pipesgd_ref.comm.schedule import simulate_allreduce
from pipesgd_ref.exercises import close, equal, exercise, same_function
from pipesgd_ref.methods.reference import delayed_sgd
from pipesgd_ref.models import build_model
from pipesgd_ref.timing import ring_allreduce_time
from pipesgd_ref.units import parse_bandwidth

GBIT = parse_bandwidth("1Gbit")  # bytes/s in one Gbit/s


def _ring_order(grad_fn, p: int):
    """One "worker" whose gradient is the p workers' mean summed in the ring's order."""

    def mean(w, _rank, step):
        losses, grads = zip(*(grad_fn(w, r, step) for r in range(p)), strict=True)
        return sum(losses) / p, simulate_allreduce(list(grads), "mean")[0]

    return mean


def _pipe_with_warmup(grad_fn, w0, p, steps, lr, K, warmup):
    """The oracle: delayed_sgd with staleness K - 1 and `warmup` synchronous steps, the mean
    summed in the ring's order (bitwise what a ring of p workers computes)."""
    return delayed_sgd(_ring_order(grad_fn, p), w0, 1, steps, lr, staleness=K - 1,
                       warmup_steps=warmup).params  # fmt: skip


def _least_squares(p: int, n: int = 5, seed: int = 0):
    """(grad_fn, w0): worker r's loss 1/2 |A_r w - b_r|^2 on its own data, a new minibatch
    (a row scaling) each step, float32."""
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((p, 8, n)).astype(np.float32) / 3
    b = rng.standard_normal((p, 8)).astype(np.float32)

    def grad_fn(w, rank, step):
        rows = A[rank] * np.float32(1 + step % 3)  # another minibatch each step
        residual = rows @ w - b[rank]
        return 0.5 * float(residual @ residual), (rows.T @ residual).astype(np.float32)

    return grad_fn, rng.standard_normal(n).astype(np.float32)


def _warmup_cases() -> list[tuple]:
    cases = []
    for p, K, warmup, steps in ((1, 2, 1, 6), (2, 2, 2, 7), (3, 2, 1, 6), (4, 3, 2, 8),
                                (2, 3, 0, 6), (4, 2, 3, 5), (3, 1, 2, 5)):  # fmt: skip
        grad_fn, w0 = _least_squares(p, seed=p * 10 + K + warmup)
        cases.append((grad_fn, w0, p, steps, 0.1, K, warmup))
    return cases


def _no_warmup(grad_fn, w0, p, steps, lr, K, warmup):  # the pipeline from step 0: wrong
    return _pipe_with_warmup(grad_fn, w0, p, steps, lr, K, 0)


@exercise(
    "05.1",
    "pipe_sgd_warmup(grad_fn, w0, p, steps, lr, K, warmup): section 1's worker with a warm-up",
    "at t < warmup apply the fresh g_t (take it off `done` at once); from warmup + s on apply "
    "g_{t-s}; drain the steps max(warmup, steps - s) .. steps - 1; average with "
    "simulate_allreduce and apply with w.dtype.type(lr)",
    judge=same_function(_warmup_cases),
    wrong=lambda: _no_warmup,
)
def pipe_sgd_warmup():
    return _pipe_with_warmup


def _bench_bytes() -> float:
    """Section 0's M: the benchmark MLP 256-2048-1024-10's gradient, float32."""
    return 4.0 * build_model("mlp", 256, 10, (2048, 1024)).n_params


@exercise(
    "05.2",
    "the bandwidth in Gbit/s at which T_ar = 60 ms for the benchmark MLP, p = 4, alpha 100 us",
    "2(p-1) alpha + 2(p-1)/p M/B = t_c gives B = 2(p-1)/p M / (t_c - 2(p-1) alpha) bytes/s; "
    "1 Gbit/s is 1.25e8 bytes/s",
    judge=close(rel=0.01),
)
def balance_bandwidth() -> float:
    p, alpha, t_c, M = 4, 100e-6, 0.060, _bench_bytes()
    bandwidth = 2 * (p - 1) / p * M / (t_c - 2 * (p - 1) * alpha)
    assert abs(ring_allreduce_time(p, M, alpha, bandwidth) - t_c) < 1e-9  # T_ar = t_c there
    return bandwidth / GBIT


@exercise(
    "05.3",
    "with K = 3 and a warm-up of 2 steps, the index of the gradient step 5's update applies",
    "s = K - 1 = 2; warm-up steps 0 and 1, fill steps 2 and 3, then step t applies g_{t-s}",
    judge=equal,
    wrong=lambda: 4,
)
def applied_at_step_five() -> int:
    K, warmup, steps, step = 3, 2, 7, 5

    def unit_grad(w, rank, t):  # g_t = e_t: the update that subtracts it names it
        g = np.zeros_like(w)
        g[t] = 1.0
        return 0.0, g

    traj = delayed_sgd(unit_grad, np.zeros(steps), 1, steps, 1.0, staleness=K - 1,
                       warmup_steps=warmup, record=True)  # fmt: skip
    moved = np.flatnonzero(traj.history[step + 1] != traj.history[step])
    return int(moved[0])


@exercise(
    "05.4",
    "the gain T(1) / T(2) the model predicts at 300 Mbit/s with t_c = 65 ms (section 5, full)",
    "T_ar = ring_allreduce_time(4, M, 100e-6, B at 300 Mbit/s); the gain is "
    "(t_c + T_ar) / max(t_c, T_ar)",
    judge=close(rel=0.01),
)
def gain_at_300mbit() -> float:
    t_c = 0.065
    t_ar = ring_allreduce_time(4, _bench_bytes(), 100e-6, parse_bandwidth("300Mbit"))
    return (t_c + t_ar) / max(t_c, t_ar)
