"""Convergence of staleness-one SGD, as properties (docs/paper.md, section 4).

1. Quadratics f(w) = 1/2 w^T A w - b^T w: delayed gradient descent with staleness tau converges
   to the minimiser iff lr * lam_max < 2 sin(pi / (2 (2 tau + 1))): 2 for tau = 0, 1 for tau = 1,
   2 sin(pi/10) ~ 0.618 for tau = 2. Checked on both sides of each bound.
2. Strongly convex problems with noisy minibatch gradients (least squares; L2-regularised
   logistic regression): staleness-one SGD with a decaying learning rate reaches the optimum a
   direct solver finds, within a stated tolerance, for every seed drawn.
3. The digits MLP: staleness-one and synchronous SGD reach test accuracy within 1 point of each
   other after the same number of steps.
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipesgd_ref.data import MinibatchSampler, load_dataset
from pipesgd_ref.methods.reference import delayed_sgd, model_grad_fn
from pipesgd_ref.models import build_model
from strategies import seeds, spd_matrices


def stability_bound(staleness: int) -> float:
    """Largest stable lr * lam for w_{t+1} = w_t - lr lam w_{t - tau}."""
    return 2 * math.sin(math.pi / (2 * (2 * staleness + 1)))


def test_stability_bound_values():
    assert stability_bound(0) == pytest.approx(2.0)
    assert stability_bound(1) == pytest.approx(1.0)
    assert stability_bound(2) == pytest.approx(0.618, abs=1e-3)


def quadratic_run(A, b, lr, staleness, steps=3000):
    """Relative distance to the minimiser after `steps` delayed-GD steps from a start that has
    a unit component along the top eigenvector (so divergence, if due, must show)."""
    w_star = np.linalg.solve(A, b)
    top = np.linalg.eigh(A)[1][:, -1]
    w0 = w_star + top + 0.1 * np.cos(np.arange(len(b)))
    with np.errstate(over="ignore", invalid="ignore"):  # the diverging runs overflow to inf/NaN
        traj = delayed_sgd(lambda w, r, t: (0.0, A @ w - b), w0, 1, steps, lr, staleness=staleness)
        return np.linalg.norm(traj.params - w_star) / np.linalg.norm(w0 - w_star)


@pytest.mark.parametrize("staleness", [0, 1, 2])
@settings(max_examples=25)
@given(problem=spd_matrices(), fraction=st.floats(0.1, 0.95))
def test_quadratic_converges_below_the_bound(staleness, problem, fraction):
    A, b, lam_max = problem
    lr = fraction * stability_bound(staleness) / lam_max
    err = quadratic_run(A, b, lr, staleness)
    assert err < 1e-6, (
        f"staleness {staleness}, lr*lam_max = {lr * lam_max:.3f} (bound "
        f"{stability_bound(staleness):.3f}): still {err:.2e} of the initial distance away"
    )


@pytest.mark.parametrize("staleness", [0, 1, 2])
@settings(max_examples=25)
@given(problem=spd_matrices(), fraction=st.floats(1.02, 1.2))
def test_quadratic_diverges_just_past_the_bound(staleness, problem, fraction):
    A, b, lam_max = problem
    lr = fraction * stability_bound(staleness) / lam_max
    err = quadratic_run(A, b, lr, staleness)
    assert not err < 1e3, (  # NaN/inf count as diverged
        f"staleness {staleness}, lr*lam_max = {lr * lam_max:.3f} is past the bound "
        f"{stability_bound(staleness):.3f} but the distance shrank to {err:.2e}"
    )


# --- strongly convex problems with noisy minibatch gradients ---------------------------------


def least_squares(seed, n=400, d=5, mu=0.01):
    """f(w) = 1/(2n) |Xw - y|^2 + mu/2 |w|^2; optimum by a direct linear solve."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = X @ rng.normal(size=d) + 0.5 * rng.normal(size=n)
    H = X.T @ X / n + mu * np.eye(d)
    w_star = np.linalg.solve(H, X.T @ y / n)

    def f(w):
        return 0.5 * np.mean((X @ w - y) ** 2) + 0.5 * mu * w @ w

    def grad(w, idx):
        Xb = X[idx]
        return Xb.T @ (Xb @ w - y[idx]) / len(idx) + mu * w

    eig = np.linalg.eigvalsh(H)
    return f, grad, w_star, eig[-1], eig[0], n


def logistic_regression(seed, n=400, d=5, mu=0.1):
    """f(w) = mean log(1 + exp(-y x.w)) + mu/2 |w|^2, y in {-1, 1}; optimum by Newton's method."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = np.where(X @ rng.normal(size=d) + rng.normal(size=n) > 0, 1.0, -1.0)

    def f(w):
        return np.mean(np.logaddexp(0, -y * (X @ w))) + 0.5 * mu * w @ w

    def grad(w, idx):
        Xb, yb = X[idx], y[idx]
        return -(Xb.T @ (yb / (1 + np.exp(yb * (Xb @ w))))) / len(idx) + mu * w

    w = np.zeros(d)
    for _ in range(30):  # Newton: quadratic convergence, far past float64 precision
        s = 1 / (1 + np.exp(-y * (X @ w)))
        H = (X.T * (s * (1 - s))) @ X / n + mu * np.eye(d)
        w -= np.linalg.solve(H, grad(w, np.arange(n)))
    L = np.linalg.eigvalsh(X.T @ X / n)[-1] / 4 + mu
    return f, grad, w, L, mu, n


@pytest.mark.parametrize("problem", [least_squares, logistic_regression])
@settings(max_examples=8)
@given(seed=seeds, world_size=st.integers(1, 4), batch_size=st.integers(4, 16))
def test_staleness_one_sgd_reaches_the_optimum(problem, seed, world_size, batch_size):
    """Tolerance: suboptimality below 1e-3 of the initial gap, and |w - w*| within 2% of |w*|.
    lr_t = lr0 / (1 + mu lr0 t / 2) with lr0 = 1/(2L): the classic O(1/t) schedule."""
    f, grad, w_star, L, mu, n = problem(seed)
    sampler = MinibatchSampler(n, world_size, batch_size, seed)
    lr0 = 0.5 / L
    w0 = np.zeros_like(w_star)
    traj = delayed_sgd(
        lambda w, rank, step: (0.0, grad(w, sampler.batch_indices(rank, step))),
        w0,
        world_size,
        steps=2000,
        lr=lambda t: lr0 / (1 + mu * lr0 * t / 2),
        staleness=1,
    )
    gap = (f(traj.params) - f(w_star)) / (f(w0) - f(w_star))
    dist = np.linalg.norm(traj.params - w_star) / np.linalg.norm(w_star)
    assert gap < 1e-3 and dist < 0.02, (
        f"{problem.__name__}, seed {seed}, p={world_size}, B={batch_size}: suboptimality "
        f"{gap:.2e} of the initial gap (want < 1e-3), distance {dist:.3f} of |w*| (want < 0.02)"
    )


# --- the digits MLP ----------------------------------------------------------------------------


@settings(max_examples=3)
@given(seed=st.integers(0, 1000))
def test_digits_staleness_one_matches_sync_accuracy(seed):
    data = load_dataset("digits")
    model = build_model("mlp", data.n_features, data.n_classes, (64,))
    sampler = MinibatchSampler(data.n_train, 4, 32, seed)
    grad_fn = model_grad_fn(model, data, sampler)
    acc = {}
    for staleness in (0, 1):
        traj = delayed_sgd(grad_fn, model.init_params(seed), 4, 300, 0.1, staleness=staleness)
        acc[staleness] = model.accuracy(traj.params, data.X_test, data.y_test)
    assert acc[0] > 0.93, f"sync SGD only reached {acc[0]:.3f} test accuracy on digits"
    assert abs(acc[1] - acc[0]) <= 0.01, (
        f"seed {seed}: staleness-one reached {acc[1]:.4f} test accuracy, sync {acc[0]:.4f}: "
        "more than 1 point apart"
    )
