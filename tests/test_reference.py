"""The one-process oracles do what their docstrings define."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipesgd_ref.data import MinibatchSampler, make_synthetic
from pipesgd_ref.methods.reference import (
    async_ps_sgd,
    average_gradient,
    delayed_sgd,
    model_grad_fn,
    ps_sync_sgd,
    round_robin,
    sync_sgd,
)
from pipesgd_ref.models import MLP
from strategies import seeds


def half_square(w, rank, step):
    """f(w) = 1/2 |w|^2 on every worker: grad = w, so the trajectory is a linear recurrence."""
    return 0.5 * float(w @ w), w.copy()


@settings(max_examples=15)
@given(st.integers(1, 4), st.integers(1, 5), seeds)
def test_sync_sgd_equals_large_batch_sgd(world_size, batch_size, seed):
    data = make_synthetic(samples=64, features=5, classes=3, seed=seed % 100)
    model = MLP(5, 3, (4,))
    sampler = MinibatchSampler(data.n_train, world_size, batch_size, seed)
    params0 = model.init_params(seed, dtype=np.float64)
    distributed = sync_sgd(model_grad_fn(model, data, sampler), params0, world_size, 6, 0.3)

    def large_batch(params, rank, step):  # one worker, the p minibatches concatenated
        idx = np.concatenate([sampler.batch_indices(r, step) for r in range(world_size)])
        grads = np.empty_like(params)
        loss = model.loss_and_grad(params, data.X_train[idx], data.y_train[idx], grads)
        return loss, grads

    single = sync_sgd(large_batch, params0, 1, 6, 0.3)
    np.testing.assert_allclose(distributed.params, single.params, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(distributed.losses, single.losses, rtol=1e-9)


@given(st.integers(1, 5), st.integers(0, 12))
def test_staleness_zero_is_sync_bitwise(world_size, steps):
    w0 = np.arange(1.0, 4.0)
    lr = lambda t: 0.1 / (1 + t)  # noqa: E731
    a = sync_sgd(half_square, w0, world_size, steps, lr, record=True)
    b = delayed_sgd(half_square, w0, world_size, steps, lr, staleness=0, record=True)
    np.testing.assert_array_equal(a.params, b.params)
    assert a.losses == b.losses and len(a.history) == len(b.history) == steps + 1


@given(st.integers(0, 4), st.integers(0, 4), st.integers(0, 15), st.floats(0.01, 0.9))
def test_delayed_sgd_follows_the_delayed_recurrence(staleness, warmup, steps, lr):
    """With grad = w: w_{t+1} = w_t - lr w_t during warm-up, then w_{t+1} = w_t - lr w_{t-s}
    once t >= warmup + s (w_{t+1} = w_t while the pipeline fills), then the drain."""
    traj = delayed_sgd(
        half_square,
        np.array([1.0]),
        1,
        steps,
        lr,
        staleness=staleness,
        warmup_steps=warmup,
        record=True,
    )
    w = [1.0]
    for t in range(steps):
        if t < warmup:
            w.append(w[t] - lr * w[t])
        elif t >= warmup + staleness:
            w.append(w[t] - lr * w[t - staleness])
        else:
            w.append(w[t])
    pending = list(range(max(warmup, steps - staleness), steps))  # computed, not yet applied
    for t_grad in pending:
        w.append(w[-1] - lr * w[t_grad])
    np.testing.assert_allclose([h[0] for h in traj.history], w, rtol=1e-12)


def test_drain_applies_every_gradient_exactly_once():
    """Gradients that do not depend on w: the final weights are w0 minus all of them."""
    grads = np.eye(6)  # g_t = e_t

    def gf(w, rank, step):
        return 0.0, grads[step].copy()

    for s in range(4):
        drained = delayed_sgd(gf, np.zeros(6), 1, 6, 1.0, staleness=s)
        np.testing.assert_array_equal(drained.params, -np.ones(6))
        undrained = delayed_sgd(gf, np.zeros(6), 1, 6, 1.0, staleness=s, drain=False)
        np.testing.assert_array_equal(undrained.params, -np.r_[np.ones(6 - s), np.zeros(s)])


def test_average_gradient_is_the_rank_mean():
    def gf(w, rank, step):
        return float(rank), np.full(2, rank + 10.0 * step)

    loss, g = average_gradient(gf, np.zeros(2), 4, step=1)
    assert loss == 1.5
    np.testing.assert_array_equal(g, [11.5, 11.5])


@given(st.integers(1, 6), st.integers(0, 30))
def test_async_round_robin_staleness_is_p_minus_one(world_size, n_updates):
    traj = async_ps_sgd(
        half_square, np.ones(2), world_size, round_robin(world_size, n_updates), 0.1
    )
    want = [min(u, world_size - 1) for u in range(n_updates)]
    assert traj.staleness == want


def test_async_given_order_and_the_weights_each_worker_saw():
    seen = []

    def gf(w, rank, step):
        seen.append((rank, step, float(w[0])))
        return 0.0, np.ones(1)

    traj = async_ps_sgd(gf, np.zeros(1), 2, [0, 0, 1, 1], lr=1.0)
    # Worker 1 pulled w0 = 0 and computes on it while worker 0 pushes twice: staleness 2.
    assert traj.staleness == [0, 0, 2, 0]
    assert seen == [(0, 0, 0.0), (0, 1, -1.0), (1, 0, 0.0), (1, 1, -3.0)]
    assert traj.params[0] == -4.0
    with pytest.raises(ValueError, match="outside 0..1"):
        async_ps_sgd(gf, np.zeros(1), 2, [2], lr=1.0)


def test_async_with_one_worker_is_sequential_sgd():
    a = async_ps_sgd(half_square, np.ones(3), 1, [0] * 7, 0.2)
    b = sync_sgd(half_square, np.ones(3), 1, 7, 0.2)
    np.testing.assert_array_equal(a.params, b.params)
    assert a.staleness == [0] * 7


def test_ps_sync_is_sync_sgd():
    a = ps_sync_sgd(half_square, np.ones(3), 3, 5, 0.2)
    b = sync_sgd(half_square, np.ones(3), 3, 5, 0.2)
    np.testing.assert_array_equal(a.params, b.params)


def test_float32_training_stays_float32():
    traj = delayed_sgd(half_square, np.ones(3, np.float32), 2, 5, 0.1, staleness=1)
    assert traj.params.dtype == np.float32
