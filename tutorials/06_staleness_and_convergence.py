# %% [markdown]
# # 06 · Staleness and convergence: what the delay costs
#
# **A number to start with: staleness one halves the largest stable step size.** On a quadratic
# with curvature λ, plain gradient descent is stable for lr·λ < 2; apply each gradient one step
# late, as Pipe-SGD of width two does, and it is stable only for lr·λ < 1 (docs/paper.md,
# section 4). Pipe-SGD (Li et al., NeurIPS 2018) buys its overlap of compute and communication
# with exactly this delay, so this tutorial measures the price: first exactly, on a quadratic,
# then on a real network, and last how fast a stale run converges when it does.
#
# You will:
# 1. write the delayed iteration on f(w) = ½λw² as a linear recurrence;
# 2. derive its stability bound lr·λ < 2 sin(π / (2(2τ+1))) from the characteristic polynomial,
#    and find the same bound numerically from the roots;
# 3. run the oracle `reference.delayed_sgd` just below and just above the bound;
# 4. see that on a many-dimensional quadratic the largest curvature λmax decides;
# 5. compare synchronous and staleness-one SGD on digits, at a comfortable learning rate and at
#    the edge;
# 6. measure the convergence rate of staleness-one SGD at a small learning rate: the same
#    O(1/√(pT)) as synchronous SGD.
#
# Run it with `python tutorials/06_staleness_and_convergence.py`. Takes about 7 s here on two
# cores (about 4 s with `PIPESGD_TUTORIAL_SMALL=1`, the quick version CI runs).

# %%
import os
from pathlib import Path

import numpy as np

from pipesgd_ref.config import TrainConfig
from pipesgd_ref.data import MinibatchSampler, load_dataset
from pipesgd_ref.exercises import check
from pipesgd_ref.methods import reference
from pipesgd_ref.methods.optimizer import SGD, heavy_ball_bound
from pipesgd_ref.models import build_model
from pipesgd_ref.plots import pyplot, save_figure

SMALL = os.environ.get("PIPESGD_TUTORIAL_SMALL") == "1"  # CI: fewer steps, same lessons
# As a script, beside this file; as a notebook (Jupyter, VS Code, nbconvert), in the
# notebook's own folder, which is where a notebook runs.
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
OUT = HERE / "out"  # figures go here (git-ignored)

plt = pyplot()  # None without matplotlib: the lessons are in the printed numbers and asserts


def save(fig, name: str) -> None:
    save_figure(fig, OUT / name)


def stability_bound(tau: int) -> float:
    """The largest stable lr*lambda of w_{t+1} = w_t - lr*lambda*w_{t-tau} (docs/paper.md,
    section 4)."""
    return 2 * np.sin(np.pi / (2 * (2 * tau + 1)))


for tau in range(4):
    print(f"staleness tau = {tau}: stable iff lr*lambda < {stability_bound(tau):.4f}")

# %% [markdown]
# ## 1. One gradient step late, on the simplest problem
#
# Take f(w) = ½λw², whose gradient is λw. Gradient descent with the gradient of τ steps ago is
#
#     w_{t+1} = w_t − lr · λ · w_{t−τ}
#
# Only the product a = lr·λ appears: a learning rate is "large" or "small" only relative to
# the curvature. For τ = 0 this is w_{t+1} = (1 − a)·w_t, which shrinks iff |1 − a| < 1, that is
# 0 < a < 2: the classic bound.
#
# ## 2. The characteristic polynomial
#
# A linear recurrence is solved by powers: try w_t = z^t. Dividing by z^(t−τ) gives
#
#     z^(τ+1) − z^τ + a = 0
#
# and every solution is a combination of z_k^t over its τ+1 roots z_k. So the iteration
# converges for every start iff all roots lie inside the unit circle: the **spectral radius**
# ρ(a) = max_k |z_k| must be < 1.
#
# - For τ = 1: z² − z + a = 0. The product of the two roots is a. For a > ¼ they are complex
#   conjugates of equal modulus, so |z|² = a: they leave the unit circle exactly at **a = 1**.
# - In general: at a = 0 the roots are 1 and 0 (τ times); for small a > 0 the root near 1 moves
#   inside, to about 1 − a. Stability is lost at the smallest a for which a root reaches the
#   circle, z = e^(iθ). Then e^(iθτ)(e^(iθ) − 1) = −a. Since e^(iθ) − 1 = 2i·sin(θ/2)·e^(iθ/2),
#   the modulus gives a = 2 sin(θ/2), and the phase gives θ(τ + ½) + π/2 = π, so the first
#   crossing is θ = π/(2τ+1) and
#
#     a* = 2 sin(π / (2(2τ+1)))        # τ = 0: 2;  τ = 1: 1;  τ = 2: 0.618
#
# Now check it without any algebra: compute the roots with `np.roots`, scan a, and bisect for
# the first a where ρ(a) reaches 1.

# %%


def spectral_radius(a: float, tau: int) -> float:
    """max |z| over the roots of z^(tau+1) - z^tau + a (coefficients from the highest power)."""
    coefficients = np.zeros(tau + 2)
    coefficients[0], coefficients[1] = 1.0, -1.0  # z^(tau+1) - z^tau
    coefficients[-1] += a  # + a (for tau = 0 this lands on the -1: z - 1 + a)
    return float(np.abs(np.roots(coefficients)).max())


def first_unstable(tau: int, a_max: float = 2.5) -> float:
    """The smallest a in (0, a_max] with spectral radius >= 1: a scan, then bisection."""
    grid = np.linspace(1e-3, a_max, 2500)
    stable = np.array([spectral_radius(a, tau) < 1 for a in grid])
    k = int(np.argmin(stable))  # the first unstable grid point
    lo, hi = grid[k - 1], grid[k]
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if spectral_radius(mid, tau) < 1 else (lo, mid)
    return hi


crossings = {}
for tau in range(4):
    crossings[tau] = first_unstable(tau)
    print(
        f"tau = {tau}: roots leave the unit circle at a = {crossings[tau]:.10f}; "
        f"formula 2 sin(pi/(2(2tau+1))) = {stability_bound(tau):.10f}"
    )

a_grid = np.linspace(0.01, 2.5, 500)
radius = {tau: np.array([spectral_radius(a, tau) for a in a_grid]) for tau in range(3)}
if plt is not None:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for tau, rho in radius.items():
        (line,) = ax.plot(a_grid, rho, label=f"tau = {tau}")
        ax.axvline(stability_bound(tau), color=line.get_color(), ls=":", lw=1)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set(xlabel="lr * lambda", ylabel="spectral radius", ylim=(0, 1.6))
    ax.set_title("roots of z^(tau+1) - z^tau + lr*lambda")
    ax.legend()
    save(fig, "06_spectral_radius.png")
else:
    print("matplotlib is not installed: plots skipped")

# %% [markdown]
# The plot says more than the bound. Without staleness the fastest rate is at lr·λ = 1 (one step
# lands on the minimum); with staleness one it is at lr·λ = ¼, where the two roots meet at ½.
# The delay halves the largest stable step and quarters the fastest one.
#
# ## 3. The oracle on the quadratic
#
# `reference.delayed_sgd(grad_fn, w0, world_size, steps, lr, staleness=τ)` is the one-process
# definition of pipelined SGD. Its `grad_fn(params, rank, step)` here returns the same
# (loss, gradient) = (½λ‖w‖², λw) for every rank, so the average over p workers is just λw.
# We take λ = 4 to make the point that only lr·λ matters: lr = a/λ.
#
# With staleness one, step 0 makes no update (the pipeline fills: w_1 = w_0), and from then on
# w_{t+1} = w_t − a·w_{t−1}. So the oracle's trajectory must be the closed form
# w_t = c₁z₁^t + c₂z₂^t, with the two roots of z² − z + a and c fixed by w_0 = w_1 = 1.

# %%
lam = 4.0
p = 4
quad_steps = 400


def quadratic_grad_fn(params: np.ndarray, rank: int, step: int) -> tuple[float, np.ndarray]:
    """f(w) = 1/2 lam |w|^2 on every rank: loss and gradient lam * w."""
    return 0.5 * lam * float(params @ params), lam * params


runs = {}  # (tau, a) -> |w_t|, t = 0..quad_steps
for tau, a_values in [(0, (0.9, 1.1, 2.1)), (1, (0.9, 1.1)), (2, (0.58, 0.66))]:
    for a in a_values:
        trajectory = reference.delayed_sgd(
            quadratic_grad_fn, np.array([1.0]), p, quad_steps, a / lam, staleness=tau, record=True
        )
        # history holds w_0..w_steps, then the drain's extra updates: keep the steps only
        w = np.array(trajectory.history[: quad_steps + 1])[:, 0]
        runs[tau, a] = np.abs(w)
        verdict = "converges" if runs[tau, a][-1] < 1 else "DIVERGES"
        print(
            f"tau = {tau}, lr*lambda = {a:.2f} (bound {stability_bound(tau):.3f}): "
            f"|w_{quad_steps}| = {runs[tau, a][-1]:.2e}  {verdict}; "
            f"spectral radius {spectral_radius(a, tau):.4f}"
        )

closed_form_gap = {}
for a in (0.9, 1.1):
    z = np.roots([1.0, -1.0, a])  # the two roots of z^2 - z + a (complex: a > 1/4)
    c = np.linalg.solve(np.array([[1.0, 1.0], z]), np.array([1.0, 1.0]))  # w_0 = w_1 = 1
    t = np.arange(quad_steps + 1)
    predicted = np.abs((c[0] * z[0] ** t + c[1] * z[1] ** t).real)
    closed_form_gap[a] = np.abs(predicted - runs[1, a]).max() / runs[1, a].max()
    print(f"tau = 1, a = {a}: oracle vs closed form from the roots, max relative gap "
          f"{closed_form_gap[a]:.1e}")  # fmt: skip

if plt is not None:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    styles = {0: "-", 1: "--", 2: ":"}  # line style by staleness
    for (tau, a), absw in runs.items():
        ax.plot(absw, ls=styles[tau], lw=1.2, label=f"tau={tau}, lr*lambda={a}")
    # sync at 0.9 and 1.1 shrinks by 0.1 per step (the two lines coincide) and leaves the
    # frame within a few steps; the limits keep the slow stale runs readable
    ax.set(xlabel="step t", ylabel="|w_t|", yscale="log", ylim=(1e-12, 1e18))
    ax.set_title("f(w) = lambda w^2 / 2, delayed gradient descent")
    ax.legend(fontsize=8, ncol=2)
    save(fig, "06_quadratic_iterates.png")

# %% [markdown]
# At lr·λ = 1.1 the synchronous run converges (1.1 < 2) while the staleness-one run
# oscillates with growing amplitude, by a factor √1.1 ≈ 1.049 per step. At lr·λ = 0.9 both
# converge, the stale one much more slowly (√0.9 ≈ 0.949 per step, against |1 − 0.9| = 0.1).
# Synchronous SGD has its own edge at 2: at lr·λ = 2.1 each step multiplies w by 1 − 2.1 =
# −1.1. Staleness two is unstable already at 0.66 (bound 0.618).
#
# ### With momentum the delay costs more than half
#
# Practitioners train with heavy-ball momentum (`--momentum M`: v ← M·v + g, w ← w − lr·v).
# Without delay, momentum *widens* the stable range to lr·λ < 2(1 + M). With a one-step-old
# gradient, v_{t+1} = M·v_t + λ·w_{t−1} and lr·v_t = w_{t−1} − w_t give
# w_{t+1} = (1 + M)·w_t − M·w_{t−1} − lr·λ·w_{t−1}, whose polynomial z² − (1 + M)z + (M + lr·λ)
# has both roots inside the unit circle iff 0 < lr·λ < 1 − M (Jury: |M + lr·λ| < 1). The delay
# and the momentum add up: the range is not halved but divided by 2(1 + M)/(1 − M), 38 times
# for M = 0.9. `methods.optimizer.heavy_ball_bound` gives the bound (from τ = 2 on, from the
# roots), and the oracle, handed the optimiser, crosses it where the algebra says.

# %%
for M in (0.0, 0.5, 0.9):
    fresh, stale = heavy_ball_bound(M, 0), heavy_ball_bound(M, 1)
    print(f"momentum {M}: stable iff lr*lambda < {fresh:.2f} fresh, < {stale:.2f} with "
          f"staleness one ({fresh / stale:.0f} times smaller)")  # fmt: skip


def heavy_ball_final(a: float, momentum: float, tau: int) -> float:
    """|w| after quad_steps of the oracle with heavy ball at lr*lambda = a, staleness tau."""
    rule = SGD(momentum)  # the optimiser every update of the oracle applies
    with np.errstate(over="ignore", invalid="ignore"):
        run = reference.delayed_sgd(quadratic_grad_fn, np.array([1.0]), p, quad_steps, a / lam,
                                    staleness=tau, drain=False, optimizer=rule)  # fmt: skip
    return abs(float(run.params[0]))


heavy_ball = {(a, tau): heavy_ball_final(a, 0.9, tau) for a, tau in
              [(0.08, 1), (0.12, 1), (3.5, 0)]}  # fmt: skip
for (a, tau), w_end in heavy_ball.items():
    print(f"momentum 0.9, tau = {tau}, lr*lambda = {a}: |w_{quad_steps}| = {w_end:.2e}")
assert heavy_ball[0.08, 1] < 1 < heavy_ball[0.12, 1], "heavy ball's stale edge is 1 - M = 0.1"
assert heavy_ball[3.5, 0] < 1, "without delay momentum 0.9 is stable up to 2 (1 + M) = 3.8"

# %% [markdown]
# ## 4. Many curvatures: the largest one decides
#
# On f(w) = ½ wᵀAw with A symmetric positive definite, the gradient is Aw. In the eigenbasis
# A = Q diag(λ_i) Qᵀ the coordinates u = Qᵀw decouple: each one follows the scalar recurrence
# with its own λ_i. The iteration is stable iff it is stable for every λ_i, that is iff
# lr·λmax < a*(τ). The sharpest direction sets the step size; the flat ones set the speed.

# %%
n = 20
rng = np.random.default_rng(0)
Q, _ = np.linalg.qr(rng.standard_normal((n, n)))  # a random orthogonal basis
eigenvalues = np.logspace(0, 1, n)  # curvatures from 1 to 10
A = Q @ np.diag(eigenvalues) @ Q.T
lam_max = float(np.linalg.eigvalsh(A)[-1])  # measured from A, not taken from the construction
w0 = rng.standard_normal(n)
spd_steps = 400


def spd_grad_fn(params: np.ndarray, rank: int, step: int) -> tuple[float, np.ndarray]:
    """f(w) = 1/2 w^T A w on every rank: loss and gradient A w."""
    Aw = A @ params
    return 0.5 * float(params @ Aw), Aw


spd_final = {}
for tau, a in [(0, 1.05), (1, 0.95), (1, 1.05)]:
    lr = a / lam_max
    w_end = reference.delayed_sgd(spd_grad_fn, w0, p, spd_steps, lr, staleness=tau).params
    u = np.abs(Q.T @ w_end)  # |coordinates| in the eigenbasis, smallest lambda first
    spd_final[tau, a] = (np.linalg.norm(w_end), u)
    print(
        f"tau = {tau}, lr*lambda_max = {a:.2f} (lambda_max = {lam_max:.2f}): "
        f"|w_{spd_steps}| = {np.linalg.norm(w_end):.2e}; along the sharpest direction "
        f"{u[-1]:.1e}, largest along any other {u[:-1].max():.1e}"
    )

# %% [markdown]
# With staleness one at lr·λmax = 1.05, only the sharpest eigendirection blows up: every other
# λ_i gives lr·λ_i < 1, inside the bound, and its coordinate decays. The synchronous run at the
# same learning rate converges in every direction.
#
# ## 5. A real network: digits with the MLP
#
# A network's loss is not a quadratic, and its curvature changes as it trains, so the bound is
# a guide, not a prediction. We measure. p = 4 workers, B = 32 each, the same seed (so the same
# initial weights and the same minibatches), once synchronous (`staleness=0`, which is
# `sync_sgd`) and once with staleness one.
#
# First at a comfortable learning rate.

# %%
cfg = TrainConfig.preset("laptop")  # digits, MLP(64), p = 4, B = 32, seed 0
data = load_dataset(cfg.dataset)
model = build_model(cfg.model, data.n_features, data.n_classes, hidden=cfg.hidden)
sampler = MinibatchSampler(data.n_train, cfg.world_size, cfg.batch_size, seed=cfg.seed)
grad_fn = reference.model_grad_fn(model, data, sampler)
params0 = model.init_params(cfg.seed)
print(data, model)

good_lr, good_steps = 0.5, (200 if SMALL else 600)
accuracy = {}
for tau in (0, 1):
    run = reference.delayed_sgd(
        grad_fn, params0, cfg.world_size, good_steps, good_lr, staleness=tau
    )
    accuracy[tau] = model.accuracy(run.params, data.X_test, data.y_test)
    print(f"lr = {good_lr}, {good_steps} steps, staleness {tau}: test accuracy {accuracy[tau]:.3f}")

# %% [markdown]
# Close: at a learning rate well inside both stability regions, one step of delay costs little.
#
# Now the edge. For each learning rate on a grid, does the run *train* (every loss finite,
# test accuracy ≥ 0.9 at the end)? Diverging runs overflow to inf and nan on purpose here, so
# NumPy's overflow warnings are silenced for the sweep.

# %%
sweep_steps = 100 if SMALL else 200
lr_grid = np.arange(1.0, 3.51, 0.5) if SMALL else np.arange(0.5, 4.01, 0.25)
trains = {0: [], 1: []}
sweep_losses = {}
for lr in lr_grid:
    for tau in (0, 1):
        with np.errstate(over="ignore", invalid="ignore"):
            run = reference.delayed_sgd(
                grad_fn, params0, cfg.world_size, sweep_steps, lr, staleness=tau
            )
            acc = model.accuracy(run.params, data.X_test, data.y_test)
        ok = bool(np.all(np.isfinite(run.losses)) and np.isfinite(run.params).all() and acc >= 0.9)
        trains[tau].append(ok)
        sweep_losses[tau, float(lr)] = np.array(run.losses)
print("lr:          " + " ".join(f"{lr:4.2f}" for lr in lr_grid))
for tau in (0, 1):
    print(f"staleness {tau}: " + " ".join(" yes" if ok else "  no" for ok in trains[tau]))


def largest_training_lr(ok: list[bool]) -> float:
    """The largest grid lr such that it and every smaller one train (0 if even the first fails)."""
    k = ok.index(False) if False in ok else len(ok)
    return float(lr_grid[k - 1]) if k > 0 else 0.0


lr_sync, lr_stale = largest_training_lr(trains[0]), largest_training_lr(trains[1])
print(f"largest lr that trains ({sweep_steps} steps): sync {lr_sync:.2f}, "
      f"staleness one {lr_stale:.2f}; ratio {lr_stale / lr_sync:.2f}")  # fmt: skip

# the first grid lr where sync trains and the stale run does not: plot both
edge = [float(lr) for lr, s, d in zip(lr_grid, trains[0], trains[1], strict=True) if s and not d]
if plt is not None and edge:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for tau in (0, 1):
        ax.plot(sweep_losses[tau, edge[0]], lw=1, label=f"staleness {tau}")
    ax.set(xlabel="step", ylabel="mean worker loss", yscale="log")
    ax.set_title(f"digits, MLP, lr = {edge[0]}")
    ax.legend()
    save(fig, "06_digits_edge.png")

# %% [markdown]
# On this run the largest learning rate that still trains drops by about half with one step of
# staleness, the same factor the quadratic predicts, although a network is not a quadratic
# (exercise 4 shows how loosely the bound maps onto it). Below the edge the two methods reach
# similar accuracy; past the stale edge, the synchronous run still trains while the stale one
# blows up. In practice: when moving a synchronous recipe to Pipe-SGD, a learning rate tuned
# near sync's limit must come down; one tuned well inside it can stay.
#
# ## 6. How fast, when it converges: the rate
#
# Sections 1 to 5 asked *whether* a stale run converges. The other half of the theory asks
# *how fast*, at a learning rate well inside the bound. The answer comes from the analyses of
# delayed-gradient SGD that the paper's convergence argument follows (docs/paper.md,
# section 4). Assume f is L-smooth (its gradient changes by at most L·‖Δw‖; f need not be
# convex), each worker's stochastic gradient is unbiased with variance at most σ², and the
# learning rate is small relative to 1/L and to the delay. Then p workers running T steps of
# SGD with staleness τ, at a learning rate that shrinks like √(p/T), reach
#
#     (1/T) Σ_t E‖∇f(w_t)‖²  =  O(1/√(pT))  +  (a term that falls like 1/T and grows with τ)
#
# The first term is the rate of synchronous minibatch SGD with p workers: p workers average
# away the noise as a batch p times larger would. The delay appears only in the second term,
# which shrinks faster as T grows: for long runs, staleness one converges at synchronous SGD's
# rate. Four times the steps or four times the workers, half the average squared gradient.
#
# We measure it on a noisy quadratic (convex, though the rate does not need it; a quadratic
# lets us compute the true gradient ∇f(w_t) = A(w_t − w*) exactly): n = 10 curvatures from 0.1
# to L = 1, every worker's gradient the true one plus N(0, I) noise of its own, the same noise
# for the sync and the stale run, lr = 0.5·√(p/T) (lr·L at most 0.07 here: far inside the
# stability bound of 1), from w_0 = 0. For p = 1 and 4 workers and T from 250 steps up, we
# average ‖∇f(w_t)‖² over the run (and over two noise draws), and multiply by √(pT): if the
# rate is 1/√(pT), that product stays flat.

# %%
rate_dim = 10
rate_rng = np.random.default_rng(1)
Q_rate, _ = np.linalg.qr(rate_rng.standard_normal((rate_dim, rate_dim)))
A_rate = Q_rate @ np.diag(np.linspace(0.1, 1.0, rate_dim)) @ Q_rate.T  # L = 1
w_star_rate = rate_rng.standard_normal(rate_dim)


def mean_squared_gradient(p: int, T: int, tau: int, seed: int) -> float:
    """(1/T) sum_t |grad f(w_t)|^2 of `delayed_sgd` with staleness tau, p noisy workers, T
    steps at lr = 0.5 sqrt(p / T), from w_0 = 0."""
    noise = np.random.default_rng([seed, p, T]).standard_normal((T, p, rate_dim))

    def noisy_grad_fn(params: np.ndarray, rank: int, step: int) -> tuple[float, np.ndarray]:
        d = params - w_star_rate
        return 0.5 * float(d @ A_rate @ d), A_rate @ d + noise[step, rank]  # unbiased, var 1

    squares = []

    def record(step: int, params: np.ndarray, loss: float) -> None:
        g = A_rate @ (params - w_star_rate)  # the true gradient at w_t
        squares.append(float(g @ g))

    reference.delayed_sgd(noisy_grad_fn, np.zeros(rate_dim), p, T, 0.5 * np.sqrt(p / T),
                          staleness=tau, drain=False, callback=record)  # fmt: skip
    return float(np.mean(squares))


horizons = (250, 1000, 4000) if SMALL else (250, 1000, 4000, 16000)
rate = {}  # (p, T, tau) -> mean squared gradient, averaged over two noise draws
print("   p |     T |     lr |  sync: avg |g|^2 | stale: avg |g|^2 | stale/sync | "
      "sqrt(pT) x sync | sqrt(pT) x stale")  # fmt: skip
for p_rate in (1, 4):
    for T in horizons:
        for tau in (0, 1):
            draws = [mean_squared_gradient(p_rate, T, tau, seed) for seed in (0, 1)]
            rate[p_rate, T, tau] = float(np.mean(draws))
        sync_g, stale_g = rate[p_rate, T, 0], rate[p_rate, T, 1]
        scale = np.sqrt(p_rate * T)
        print(f"{p_rate:4d} | {T:5d} | {0.5 * np.sqrt(p_rate / T):.4f} | {sync_g:16.4f} | "
              f"{stale_g:16.4f} | {stale_g / sync_g:10.3f} | {scale * sync_g:15.2f} | "
              f"{scale * stale_g:16.2f}")  # fmt: skip

slopes = {}  # (p, tau) -> d log(avg |g|^2) / d log T, from the shortest to the longest run
for p_rate in (1, 4):
    for tau in (0, 1):
        first, last = rate[p_rate, horizons[0], tau], rate[p_rate, horizons[-1], tau]
        slopes[p_rate, tau] = float(np.log(last / first) / np.log(horizons[-1] / horizons[0]))
normalised = [np.sqrt(p_ * T) * v for (p_, T, tau), v in rate.items()]
print("log-log slope against T: " + ", ".join(
    f"p = {p_}, {'sync' if tau == 0 else 'stale'} {v:.2f}" for (p_, tau), v in slopes.items()
) + f"; sqrt(pT) x avg |g|^2 between {min(normalised):.2f} and {max(normalised):.2f}")  # fmt: skip

if plt is not None:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for p_rate, color in ((1, "C0"), (4, "C1")):
        for tau, style in ((0, "-o"), (1, "--s")):
            ax.plot(horizons, [rate[p_rate, T, tau] for T in horizons], style, color=color,
                    label=f"p = {p_rate}, staleness {tau}")  # fmt: skip
    c0 = np.sqrt(horizons[0]) * rate[1, horizons[0], 0]  # 1/sqrt(pT) through p = 1's first point
    for p_rate in (1, 4):
        ax.plot(horizons, [c0 / np.sqrt(p_rate * T) for T in horizons], ":", color="gray", lw=1)
    ax.set(xscale="log", yscale="log", xlabel="steps T",
           ylabel="(1/T) sum_t |grad f(w_t)|^2")  # fmt: skip
    ax.set_title("noisy quadratic, lr = 0.5 sqrt(p/T); dotted: c / sqrt(pT)")
    ax.legend(fontsize=8)
    save(fig, "06_rate.png")

# %% [markdown]
# Read the last two columns: √(pT) times the average squared gradient stays within a narrow
# band over a 16-fold (64-fold at full size) range of T and both p, and the log-log slopes
# sit near −½. That is the rate O(1/√(pT)): four times the steps, or four times the workers,
# halve it. The stale/sync column is above 1, the delay's price, but it heads to 1 as T grows:
# the delay's extra is the higher-order term, and a long run at a small learning rate pays
# almost nothing for staleness one.
#
# The two results answer different questions. The stability bound says how large a learning
# rate staleness tolerates (half of sync's, on a quadratic); the rate says that inside it, at
# the learning rates the convergence analysis prescribes, staleness one loses nothing to first
# order. Between the two lies the practical advice of section 5: a learning rate tuned near
# sync's edge must come down for Pipe-SGD; one tuned well inside can stay.
#
# ## 7. Check against the oracle

# %%
for tau in range(4):
    assert abs(crossings[tau] - stability_bound(tau)) < 1e-9, (
        f"tau = {tau}: the roots of z^(tau+1) - z^tau + a leave the unit circle at "
        f"a = {crossings[tau]:.12f}, but the formula says {stability_bound(tau):.12f}"
    )
for tau, rho in radius.items():
    near = np.abs(a_grid - stability_bound(tau)) < 1e-6  # too close to call in floating point
    agree = (rho < 1) == (a_grid < stability_bound(tau))
    assert agree[~near].all(), (
        f"tau = {tau}: spectral radius < 1 should hold exactly when lr*lambda < "
        f"{stability_bound(tau):.4f}; it fails at lr*lambda = {a_grid[~near & ~agree][:3]}"
    )
for a, gap in closed_form_gap.items():
    assert gap < 1e-9, (
        f"delayed_sgd(staleness=1) at lr*lambda = {a} should follow w_t = c1 z1^t + c2 z2^t "
        f"(roots of z^2 - z + a); max relative gap {gap:.1e}"
    )
for tau, a, converges in [(0, 0.9, True), (0, 1.1, True), (0, 2.1, False), (1, 0.9, True),
                          (1, 1.1, False), (2, 0.58, True), (2, 0.66, False)]:  # fmt: skip
    final = runs[tau, a][-1]
    assert (final < 1e-2) if converges else (final > 1.0), (
        f"staleness {tau} at lr*lambda = {a} (bound {stability_bound(tau):.3f}) should "
        f"{'converge' if converges else 'diverge'}: |w_{quad_steps}| = {final:.2e} from |w_0| = 1"
    )
assert runs[1, 1.1][-1] > 1e6 and runs[0, 1.1][-1] < 1e-100, (
    f"at lr*lambda = 1.1, staleness one grows like 1.1^(t/2) while sync shrinks like 0.1^t; "
    f"after {quad_steps} steps |w| = {runs[1, 1.1][-1]:.2e} (stale), {runs[0, 1.1][-1]:.2e} (sync)"
)
norm_sync, _ = spd_final[0, 1.05]
norm_ok, _ = spd_final[1, 0.95]
norm_bad, u_bad = spd_final[1, 1.05]
assert norm_sync < 1e-6 and norm_ok < 1e-3, (
    f"on the SPD quadratic, sync at lr*lambda_max = 1.05 and staleness one at 0.95 should both "
    f"converge: |w| = {norm_sync:.1e} and {norm_ok:.1e}"
)
assert norm_bad > 1e2 and u_bad[-1] > 1e3 * u_bad[:-1].max(), (
    f"staleness one at lr*lambda_max = 1.05 should blow up along the sharpest eigenvector only: "
    f"|w| = {norm_bad:.1e}, sharpest coordinate {u_bad[-1]:.1e}, others <= {u_bad[:-1].max():.1e}"
)
assert abs(accuracy[0] - accuracy[1]) <= 0.02 and min(accuracy.values()) > 0.95, (
    f"digits at lr = {good_lr}: sync {accuracy[0]:.3f} and staleness one {accuracy[1]:.3f} "
    "should both exceed 0.95 and differ by at most 0.02"
)
assert 0 < lr_stale <= 0.75 * lr_sync, (
    f"digits: staleness one should train only up to a clearly smaller lr than sync; "
    f"largest lr that trains: sync {lr_sync}, staleness one {lr_stale}"
)
assert edge, "digits: expected a learning rate where sync trains and staleness one does not"
for (p_rate, tau), slope in slopes.items():
    assert -0.6 < slope < -0.4, (
        f"rate: with p = {p_rate}, staleness {tau}, the average squared gradient should fall like "
        f"T^(-1/2) at lr = 0.5 sqrt(p/T); measured slope {slope:.2f}"
    )
assert max(normalised) / min(normalised) < 1.35, (
    f"rate: sqrt(pT) x avg |g|^2 should stay nearly flat over p and T (the rate 1/sqrt(pT)); "
    f"it ranges from {min(normalised):.2f} to {max(normalised):.2f}"
)
for p_rate in (1, 4):
    first, last = (rate[p_rate, T, 1] / rate[p_rate, T, 0] for T in (horizons[0], horizons[-1]))
    assert last < first and last < 1.05, (
        f"rate, p = {p_rate}: staleness one's extra over sync should shrink as T grows (the "
        f"delay is a higher-order term): stale/sync {first:.3f} at T = {horizons[0]}, "
        f"{last:.3f} at T = {horizons[-1]}"
    )
print("all checks passed")

# %% [markdown]
# ## Summary
#
# - Gradient descent with a τ-step-old gradient on f(w) = ½λw² is the linear recurrence
#   w_{t+1} = w_t − lr·λ·w_{t−τ}; it converges iff every root of z^(τ+1) − z^τ + lr·λ lies
#   inside the unit circle, which holds iff lr·λ < 2 sin(π/(2(2τ+1))): 2, 1, 0.618 for
#   τ = 0, 1, 2. Staleness one halves the largest stable step.
# - With heavy-ball momentum M the delay and the momentum add up: lr·λ < 2(1 + M) fresh, only
#   lr·λ < 1 − M with staleness one (38 times smaller for M = 0.9).
# - The oracle `reference.delayed_sgd` follows the closed form from the roots to rounding, and
#   diverges just above lr·λ = 1 while synchronous SGD still converges.
# - On a quadratic with many curvatures the bound applies to λmax; only the sharpest direction
#   blows up.
# - On digits, at a moderate learning rate sync and staleness-one SGD reach similar accuracy;
#   the largest learning rate that trains is about halved by the delay.
# - Inside the bound, at a learning rate small relative to 1/L and the delay, staleness-one
#   SGD converges at synchronous SGD's rate, O(1/√(pT)) for the average squared gradient on
#   smooth problems, convex or not; the delay only adds a higher-order term. On a noisy
#   quadratic √(pT) times the average squared gradient stays nearly flat for p = 1 and 4 and
#   T from 250 to 16 000 (4000 in the small run), and the stale run's extra over sync shrinks
#   toward zero as T grows.
#
# ## Exercises
#
# Each exercise with a single answer has a cell that checks it: put your answer in place of
# `None` and run the cell.

# %% [markdown]
# **1.** Add `warmup_steps=20` to the stale runs of section 3 above the bound (staleness one,
# lr·λ = 1.1). Does a synchronous warm-up change whether the run diverges? After the warm-up,
# by what factor does |w| grow per step in the long run?
#
# <details><summary>Hint</summary>
#
# During the warm-up w shrinks by |1 − 1.1| = 0.1 a step, so the stale phase starts from a
# tiny w; but from then on the iteration is the same recurrence w_{t+1} = w_t − a·w_{t−1},
# whose solutions grow like the largest |root| of z² − z + a to the power t. A smaller start
# only delays the blow-up. `spectral_radius(1.1, 1)` gives the factor.
#
# </details>

# %%
answer = None  # your answer: the long-run growth factor of |w| per step after the warm-up
check("06.1", answer)

# %% [markdown]
# **2.** Derive the τ = 1 bound without complex numbers. For which a are both roots of
# z² − z + a real? Give the largest such a. For those a, where is the larger root, and is it
# below 1? What happens to |z| beyond that a?
#
# <details><summary>Hint</summary>
#
# The roots are (1 ± √(1 − 4a))/2: real while the discriminant 1 − 4a ≥ 0. Then the larger
# root is below 1 for every a > 0. Beyond, the two roots are complex conjugates whose product
# is a, so |z|² = a: stable until a = 1.
#
# </details>

# %%
answer = None  # your answer: the largest a for which both roots of z^2 - z + a are real
check("06.2", answer)

# %% [markdown]
# **3.** What share of the synchronous step size does staleness two allow on a quadratic (its
# largest stable lr·λ over sync's)? Then repeat the digits sweep with `staleness=2` and
# compare the ratio of the largest learning rates that train with that share. Then try
# `warmup_steps`.
#
# <details><summary>Hint</summary>
#
# `stability_bound(2) / stability_bound(0)`, from 2 sin(π/(2(2τ + 1))). On digits, run
# `reference.delayed_sgd(..., staleness=2)` over `lr_grid` as section 5 does; expect the ratio
# to be near the quadratic's, not equal to it (section 5's caveat).
#
# </details>

# %%
answer = None  # your answer: the staleness-two bound as a share of the synchronous bound
check("06.3", answer)

# %% [markdown]
# **4.** Estimate λmax of the full-batch training loss on digits by power iteration on
# finite-difference Hessian-vector products, (∇f(w + εv) − ∇f(w − εv)) / 2ε, at the initial
# weights and at the end of a run. Is lr·λmax < 2 at w_0 for the largest synchronous lr that
# trains? What does that say about reading the quadratic bound literally on a network?
#
# <details><summary>Hint</summary>
#
# `pipesgd_ref.commands.study.hessian_lam_max(cfg)` does this on the workers' first
# minibatches; copy it and use `model.loss_and_grad` on all of `data.X_train`. Expect λmax at
# w_0 to be well above 2 / (the largest lr that trains): the curvature falls quickly once
# training starts, so the early steps at a large lr are not the quadratic's steady state.
# Compare λmax at the end of a run.
#
# </details>

# %% [markdown]
# **5.** A later reimplementation of Pipe-SGD lost 2 to 4 accuracy points on CIFAR-10 with
# staleness one (figures from the README of SAPipe's released code; docs/paper.md, section
# 5). Using this tutorial's picture, which learning-rate schedules would you expect to suffer
# most?
#
# <details><summary>Hint</summary>
#
# Staleness costs most near the stability edge (section 5), and little at small learning rates
# (section 6). A schedule that spends a long time at a large learning rate, close to what sync
# tolerates (a high constant rate, an aggressive warm-up to a large peak), sits where the stale
# edge lies; one that decays early spends most steps where the delay is a higher-order term.
#
# </details>

# %% [markdown]
# **6.** The rate of section 6 is O(1/√(pT)). At the same T, by what factor should the average
# squared gradient fall when p goes from 4 to 16 workers? Check it by adding p = 16 to the
# loop of section 6.
#
# <details><summary>Hint</summary>
#
# The bound depends on p and T only through pT: multiplying p by 4 is like running 4 times as
# long. With lr = 0.5·√(p/T), p = 16 at T = 250 has lr·L ≈ 0.13, still inside the bound.
#
# </details>

# %%
answer = None  # your answer: avg |grad|^2 with p = 4 over avg |grad|^2 with p = 16, same T
check("06.6", answer)

# %% [markdown]
# Written solutions to every exercise above, with the reasoning: docs/solutions.md, section 06
# (on the site, the page "Solutions to the exercises").
