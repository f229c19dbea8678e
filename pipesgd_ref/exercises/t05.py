"""Tutorial 05's checkable exercises (Pipe-SGD: the worker, its schedule, its timing)."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import replace

import numpy as np

from pipesgd_ref.core import Problem, blobs, oracle
from pipesgd_ref.core.methods import Rank, pipe_worker
from pipesgd_ref.core.wire import Link
from pipesgd_ref.exercises import close, equal, exercise
from pipesgd_ref.methods.reference import delayed_sgd
from pipesgd_ref.models import build_model
from pipesgd_ref.timing import ring_allreduce_time
from pipesgd_ref.units import parse_bandwidth

GBIT = parse_bandwidth("1Gbit")  # bytes/s in one Gbit/s


def _in_threads(prob: Problem, worker, timeout: float = 10.0) -> list | None:
    """worker(me) on every ring rank of prob, each a thread, linked by socketpairs with a
    timeout; each rank's result, or None if any rank failed or hung."""
    p = prob.world_size
    pairs = [socket.socketpair() for _ in range(p)]  # pair r: rank r -> rank r + 1
    results: list = [None] * p

    def body(r: int) -> None:
        left = Link(pairs[(r - 1) % p][1], r, (r - 1) % p, timeout)
        right = Link(pairs[r][0], r, (r + 1) % p, timeout)
        try:
            results[r] = worker(Rank(r, prob, left=left, right=right))
        except Exception:  # noqa: BLE001 - a learner's worker that raises is a wrong answer
            results[r] = None
        finally:
            left.shut()
            right.shut()

    ranks = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(p)]
    for thread in ranks:
        thread.start()
    deadline = time.monotonic() + 2 * timeout
    for thread in ranks:
        thread.join(max(0.0, deadline - time.monotonic()))
    for pair in pairs:
        for sock in pair:
            sock.close()
    if any(thread.is_alive() for thread in ranks) or not all(
        isinstance(res, dict) and "params" in res for res in results
    ):
        return None
    return results


def _warmup_problems() -> list[Problem]:
    """(p, K, W, steps): warm-ups of 0 to 3 steps at widths 1 to 3, on a small MLP."""
    X, y = blobs(240, 8, 3, seed=5)
    return [
        Problem(X, y, 3, hidden=(8,), world_size=p, width=K, warmup=W, batch_size=8, steps=T)
        for p, K, W, T in ((2, 2, 2, 8), (3, 2, 1, 7), (4, 3, 2, 9), (3, 3, 3, 6), (2, 1, 2, 5))
    ]


def _same_weights_as_the_oracle(answer, _reference) -> bool:
    """The answer is a worker: on every problem, every rank ends bitwise at the oracle."""
    if not callable(answer):
        return False
    for prob in _warmup_problems():
        results = _in_threads(prob, answer)
        want = oracle(prob, "pipe")
        if results is None or not all(np.array_equal(r["params"], want) for r in results):
            return False
    return True


def _no_warmup(me: Rank) -> dict:  # the pipeline from step 0, the warm-up ignored: wrong
    return pipe_worker(replace(me, problem=replace(me.problem, warmup=0)))


@exercise(
    "05.1",
    "my_pipe_worker_warmup(me): section 1's worker with the synchronous warm-up (prob.warmup)",
    "at t < W apply the fresh g_t (take it off `done` at once); from W + s on apply g_(t-s); "
    "drain the steps max(W, steps - s) .. steps - 1 with prob.sgd_step(w, avg, steps + j)",
    judge=_same_weights_as_the_oracle,
    wrong=lambda: _no_warmup,
)
def pipe_worker_with_warmup():
    return pipe_worker  # the core's worker has the warm-up


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
    assert traj.history is not None  # record=True
    moved = np.flatnonzero(traj.history[step + 1] != traj.history[step])
    return int(moved[0])


@exercise(
    "05.4",
    "the gain T(1) / T(2) the model predicts at 300 Mbit/s with t_c = 65 ms (section 6, full)",
    "T_ar = ring_allreduce_time(4, M, 100e-6, B at 300 Mbit/s); the gain is "
    "(t_c + T_ar) / max(t_c, T_ar)",
    judge=close(rel=0.01),
)
def gain_at_300mbit() -> float:
    t_c = 0.065
    t_ar = ring_allreduce_time(4, _bench_bytes(), 100e-6, parse_bandwidth("300Mbit"))
    return (t_c + t_ar) / max(t_c, t_ar)
