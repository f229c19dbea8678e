# %% [markdown]
# # 10 · Paying back staleness: delay compensation and weight prediction
#
# **A number to start with: predicting the weights gives Pipe-SGD back synchronous SGD's whole
# stable range.** Tutorial 06 measured the price of the one-step delay: on a quadratic the
# largest stable step halves, lr·λ < 1 instead of < 2 (λ: a curvature, an eigenvalue of the
# Hessian). Two remedies from the work around the paper (Li et al., NeurIPS 2018; docs/paper.md,
# section 6) pay it back. Delay compensation (DC-ASGD, ICML 2017, a year before Pipe-SGD)
# corrects the stale gradient with a cheap curvature estimate; weight prediction (SAPipe,
# NeurIPS 2022, four years after it) computes each gradient at the weights it will be applied
# to. This tutorial writes both out, derives what each one buys on the quadratic,
# checks it on a real network, and ends by checking the distributed runs against the
# one-process oracles.
#
# You will:
# 1. write out the DC-ASGD and prediction updates, and check the formulas against the package;
# 2. run every variant on a quadratic just inside and just outside its derived bound;
# 3. see why dc with g⊙g, the diagonal estimate, cannot move the bound, and what the exact
#    curvature would do;
# 4. run the staleness study on digits: final accuracy against the learning rate for sync,
#    pipe, pipe+dc, pipe+dc-adaptive and pipe+predict, with the theory's marks;
# 5. check that real worker processes with each compensation end bitwise at their oracle.
#
# Run it with `python tutorials/10_staleness_compensation.py`. Takes about 10 s here on two
# cores (about 3 s with `PIPESGD_TUTORIAL_SMALL=1`, the quick version CI runs); the study of
# section 3 is most of it.

# %%
import os
from pathlib import Path

import numpy as np

from pipesgd_ref.commands.study import format_table, run_staleness_study
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.exercises import check
from pipesgd_ref.methods.compensation import DelayCompensation, stability_bound
from pipesgd_ref.methods.pipe import pipe_worker
from pipesgd_ref.methods.reference import delayed_sgd, model_grad_fn
from pipesgd_ref.plots import pyplot, save_figure
from pipesgd_ref.runtime.launch import launch_local
from pipesgd_ref.runtime.worker import Worker

SMALL = os.environ.get("PIPESGD_TUTORIAL_SMALL") == "1"  # CI: a smaller network, fewer rates
# As a script, beside this file; as a notebook (Jupyter, VS Code, nbconvert), in the
# notebook's own folder, which is where a notebook runs.
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
OUT = HERE / "out"  # figures go here (git-ignored)

plt = pyplot()  # None without matplotlib: the lessons are in the printed numbers and asserts

# %% [markdown]
# ## 1. The two remedies, written out
#
# Notation. Pipe-SGD of width K applies at step t the averaged gradient g = g_{t−s} of s = K − 1
# steps ago (s = 1 here), computed at the weights w_{t−s}, to the weights w_t:
#
#     plain        w_{t+1} = w_t − lr_t · g_{t−s}
#
# Two different things are called lambda in this field, so they get two names here: **λ** is a
# curvature (an eigenvalue of the Hessian, λmax the largest), and **λ_dc** is the weight of
# delay compensation (`dc_lambda` in the package's config, `--dc-lambda` on the command line).
# ⊙ is the elementwise product.
#
# **Delay compensation** (DC-ASGD, Zheng et al., ICML 2017). The gradient we want is the one at
# w_t; we have the one at w_{t−s}. A first-order Taylor step between the two is
# ∇f(w_t) ≈ g + H·(w_t − w_{t−s}), with H the Hessian, which is too dear to form. DC-ASGD
# replaces it by λ_dc · g ⊙ g, a diagonal estimate (the diagonal of g gᵀ, scaled), and applies
#
#     dc           g~ = g + λ_dc · g ⊙ g ⊙ (w_t − w_{t−s})                λ_dc = 0.04 by default
#
# instead of g. The adaptive form rescales λ_dc elementwise by a moving root mean square of
# the gradient, so that the correction does not depend on the gradient's scale:
#
#     dc-adaptive  MS_t = m · MS_{t−1} + (1 − m) · g ⊙ g          m = 0.95, from MS = 0
#                  g~ = g + (λ_dc / √(MS_t + ε)) ⊙ g ⊙ g ⊙ (w_t − w_{t−s})      ε = 1e-7
#
# The theory below also uses the variant with the *exact* Hessian, which no one can afford on
# a network but which shows what the Taylor step could do at best (λ_dc = 1 is the full step):
#
#     dc-exact     g~ = g + λ_dc · H · (w_t − w_{t−s})
#
# **Weight prediction** (SAPipe, Chen et al., NeurIPS 2022). Instead of correcting the gradient
# after the fact, compute it where it will be applied. A worker knows its own newest gradient
# g_local_{t−1} (before the AllReduce averages it), and the update of step t will subtract
# lr_t times the average of those gradients; so it computes g_t at
#
#     predict      ŵ_t = w_t − lr_t · g_local_{t−1},   g_t = ∇f(ŵ_t)      (s = 1)
#
# while the update still applies the stale averaged gradient to the true weights,
# w_{t+1} = w_t − lr_t · g_{t−1}.
#
# The cell below writes dc and dc-adaptive out in NumPy, exactly as above, and checks them
# against the package's `DelayCompensation.correct` (methods/compensation.py), which the
# workers and the oracles both call.

# %%
demo_rng = np.random.default_rng(1)
n_demo = 1000
g = demo_rng.standard_normal(n_demo).astype(np.float32)
w_then = demo_rng.standard_normal(n_demo).astype(np.float32)
w_now = w_then - np.float32(0.1) * demo_rng.standard_normal(n_demo).astype(np.float32)
lam_dc, m, eps = np.float32(0.04), np.float32(0.95), np.float32(1e-7)

by_hand = g + lam_dc * g * g * (w_now - w_then)  # dc
mean_square = (1 - m) * g * g  # MS_0, from MS = 0
by_hand_adaptive = g + lam_dc / np.sqrt(mean_square + eps) * g * g * (w_now - w_then)

package = DelayCompensation("dc", float(lam_dc), n_demo).correct(g, w_now, w_then)
package_adaptive = DelayCompensation("dc-adaptive", float(lam_dc), n_demo).correct(g, w_now, w_then)
dc_gap = float(np.abs(by_hand - package).max())
dc_adaptive_gap = float(np.abs(by_hand_adaptive - package_adaptive).max())
print(f"dc by hand vs DelayCompensation: max gap {dc_gap:.1e}; dc-adaptive: {dc_adaptive_gap:.1e}")
print(f"mean size of the correction: dc {np.abs(package - g).mean():.1e}, dc-adaptive "
      f"{np.abs(package_adaptive - g).mean():.1e}; mean |g| {np.abs(g).mean():.2f}")  # fmt: skip

# %% [markdown]
# The hand-written formulas and the package agree to float32 rounding (the package computes
# the same products in another order, in place). Note how small the dc correction is with the
# default λ_dc = 0.04 and weights that moved by 0.1: a few tenths of a percent of g.
#
# ## 2. The variants on a quadratic
#
# Take f(w) = ½ (w − w*)ᵀA(w − w*) with largest curvature λmax. Along an eigenvector of A with
# curvature λ each variant is a short linear recurrence in x = lr·λ (the derivations are in the
# docstring of `pipesgd_ref/methods/compensation.py`; tutorial 06 derives the first two):
#
#     sync             w_{t+1} = (1 − x) w_t                               stable iff x < 2
#     pipe             w_{t+1} = w_t − x w_{t−1}                           stable iff x < 1
#     dc-exact         w_{t+1} = (1 − λ_dc x) w_t − (1 − λ_dc) x w_{t−1}
#                                              stable iff x < min(1/(1 − λ_dc), 2/(2λ_dc − 1))
#     predict          ŵ_t = w_t − lr g_{t−1} = w_{t+1}: sync's recurrence, x < 2
#
# (w measured from w*; in the dc-exact bound a term whose denominator is not positive sets no
# bound.) With the exact Hessian and λ_dc = 1 the compensated gradient *is* the fresh one.
# Prediction, on a quadratic with identical workers, computes the gradient at exactly the next
# weights. `stability_bound(variant, c)` returns these bounds (its c is λ_dc).

# %%
rng = np.random.default_rng(0)
dim = 6
q, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
lams = np.array([2.0, 1.5, 1.0, 0.6, 0.3, 0.1])  # the curvatures: lambda_max = 2
A = (q * lams) @ q.T
w_star = rng.standard_normal(dim)


def grad_fn(w, rank, step):
    return 0.5 * float((w - w_star) @ A @ (w - w_star)), A @ (w - w_star)


def distance(variant: str, x: float, steps: int = 400, lam_dc: float = 1.0) -> np.ndarray:
    """||w_t - w*|| of `variant` at lr = x / lambda_max, from a start near the optimum."""
    kwargs = {"staleness": 0 if variant == "sync" else 1}
    if variant not in ("sync", "pipe"):
        kwargs["compensation"] = variant
    if variant == "dc-exact":
        kwargs |= {"curvature": lambda v: A @ v, "dc_lambda": lam_dc}
    seen = []
    w0 = w_star + 1e-6 * rng.standard_normal(dim)
    delayed_sgd(grad_fn, w0, 1, steps, x / lams.max(), drain=False,
                callback=lambda t, w, loss: seen.append(np.linalg.norm(w - w_star)),
                **kwargs)  # fmt: skip
    return np.array(seen) / np.linalg.norm(w0 - w_star)


rows = []  # (variant, lambda_dc, bound, |w - w*| at the end inside, largest |w - w*| outside)
for variant, lam_dc_q in [("sync", 1.0), ("pipe", 1.0), ("dc", 1.0), ("dc-exact", 1.0),
                          ("dc-exact", 0.75), ("predict", 1.0)]:  # fmt: skip
    bound = stability_bound(variant, lam_dc_q)
    inside = distance(variant, 0.9 * bound, lam_dc=lam_dc_q)
    outside = distance(variant, 1.1 * bound, lam_dc=lam_dc_q)
    rows.append((variant, lam_dc_q, bound, inside[-1], outside.max()))
    name = f"{variant} (lam_dc = {lam_dc_q:g})" if variant == "dc-exact" else variant
    print(f"{name:<24} bound x < {bound:.2f}: at 0.9x bound |w - w*| ends at {inside[-1]:.1e} of "
          f"the start, at 1.1x it reaches {outside.max():.1e}")  # fmt: skip

# %% [markdown]
# Two things to notice. First, **dc as implemented has plain pipe's bound**. Its curvature
# estimate is λ_dc·g⊙g, and near the optimum g is small, so the correction
# λ_dc·g⊙g⊙(w_t − w_{t−1}) is of third order in the distance to the optimum: linearised there,
# dc is plain staleness one. It can help far from the optimum, where g is large, but it
# cannot move the edge. (dc-adaptive divides λ_dc by √MS, about |g|, leaving a correction of
# second order: still nothing in the linearisation, the same edge.) Second, with the exact
# curvature the edge moves: to 2 at λ_dc = 1, and to 4 at λ_dc = 3/4, where the two
# constraints meet. Prediction reaches sync's 2 without any curvature at all.

# %%
if plt is not None:
    fig, ax = plt.subplots(figsize=(7, 4))
    for variant in ("sync", "pipe", "dc", "predict"):
        b = stability_bound(variant)
        ax.semilogy(distance(variant, 0.95), label=f"{variant} at x = 0.95 (bound {b:g})")
        if b > 1:
            ax.semilogy(distance(variant, 1.5), linestyle="--", label=f"{variant} at x = 1.5")
    ax.semilogy(distance("pipe", 1.5), linestyle="--", label="pipe at x = 1.5")
    ax.set_ylim(1e-12, 1e6)
    ax.set_xlabel("step")
    ax.set_ylabel("|w - w*| / |w_0 - w*|")
    ax.legend(fontsize=7)
    save_figure(fig, OUT / "10_quadratic_variants.png")

# %% [markdown]
# ## 3. On a network: the staleness study
#
# `run_staleness_study` (what `pipesgd compare --study staleness --model mlp` runs) trains the
# same problem at several learning rates with each method, for the same number of steps, using
# the one-process oracles (the distributed runs equal them; section 4 checks that). Each method's
# measured **edge** is the largest learning rate before a run that diverges or ends below half
# the study's best accuracy. The theory's marks are printed too: 1/λmax and 2/λmax with λmax
# of the Hessian at w_0. They sit far to the left of where the network actually diverges: its
# curvature falls fast once training starts (see tutorial 06, exercise 4). The *ratio* of the
# edges is what carries over, roughly.
#
# The problem is the compare preset's (digits, 4 workers of batch 352, 40 steps) with a
# smaller network, two hidden layers of 256 instead of 1024 (at the small size, two of 64 and
# 30 steps): the study of its own network, `pipesgd compare --study staleness --model mlp`,
# takes several minutes here and tells the same story. Without `--model`, the study trains a
# ResNet with momentum instead, where the delay costs far more (tutorial 14).

# %%
base = TrainConfig.preset("compare")
if SMALL:  # smaller hidden layers, fewer steps and a coarser grid; still two layers, whose
    # edges lie apart as the full size's do (one layer of 64 put all three at one grid point)
    study_cfg = base.replace(hidden=(64, 64), steps=30, eval_every=5)
    lrs = (0.5, 1.2, 1.7, 2.4)
else:
    study_cfg = base.replace(hidden=(256, 256))
    lrs = (0.3, 0.8, 1.0, 1.2, 1.4, 1.7, 2.0)
report = run_staleness_study(study_cfg, lrs=lrs, out=None, log=lambda line: None)
print(format_table(report))
edge = report["edges"]

if plt is not None:
    fig, ax = plt.subplots(figsize=(7, 4))
    for method in report["methods"]:
        mine = [r for r in report["rows"] if r["method"] == method]
        accuracy = [np.nan if r["diverged"] else r["test_accuracy"] for r in mine]
        ax.plot([r["lr"] for r in mine], accuracy, marker="o", label=method)
    if edge["sync"]:
        ax.axvline(edge["sync"] / 2, color="gray", ls="-.", lw=1, label="sync's edge / 2")
    ax.set(xlabel="learning rate", ylabel="final test accuracy (missing: diverged)")
    ax.set_title(f"staleness study: {study_cfg.world_size} workers, digits, "
                 f"MLP {study_cfg.hidden}, {study_cfg.steps} steps")  # fmt: skip
    ax.legend(fontsize=8)
    save_figure(fig, OUT / "10_staleness_study.png")

# %% [markdown]
# Read the table by columns. Plain pipe stops training at a smaller learning rate than sync.
# dc and dc-adaptive stop where plain pipe does: below the edge they move the accuracy either
# way (the lines under the table give, at each learning rate where pipe falls a point or more
# behind sync, the share of that gap each compensation recovers; a negative share is worse
# than plain pipe), but they do not move the edge, as the quadratic predicted. predict trains
# at least as far as sync; on the full-size run one rate further, since on a network
# prediction is close to synchronous SGD, not the same algorithm.
#
# ## 4. The distributed runs equal their oracles
#
# Every compensation runs on every replica in the same order of operations as the oracle
# (`reference.delayed_sgd(..., compensation=...)`), so two worker processes over TCP end with
# bitwise the oracle's weights.

# %%
oracle_cfg = TrainConfig.preset("tiny").replace(model="mlp", hidden=(8,), steps=20,
                                                world_size=2, lr=0.3)  # fmt: skip
setup = Worker.build(oracle_cfg, 0, 2)
oracle_grad = model_grad_fn(setup.model, setup.data, setup.sampler)
bitwise = {}
for kind in ("dc", "dc-adaptive", "predict"):
    cfg = oracle_cfg.replace(compensation=kind, dc_lambda=2.0 if kind == "dc" else 0.04)
    # fork, not the package's default spawn: a spawned worker would re-run this script
    results = launch_local(2, pipe_worker, (cfg,), start_method="fork", timeout=30)
    want = delayed_sgd(oracle_grad, setup.params, 2, 20, cfg.lr_at, staleness=1,
                       compensation=kind, dc_lambda=cfg.dc_lambda)  # fmt: skip
    bitwise[kind] = all(np.array_equal(r.params, want.params) for r in results)
    print(f"pipe+{kind}: both workers bitwise the oracle: {bitwise[kind]}")

# %% [markdown]
# ## 5. Check the lessons

# %%
assert dc_gap < 1e-6 and dc_adaptive_gap < 1e-5, (
    f"section 1: the formulas by hand and DelayCompensation differ by {dc_gap:.1e} (dc), "
    f"{dc_adaptive_gap:.1e} (dc-adaptive)"
)
by = {variant: (bound, inside, outside) for variant, c, bound, inside, outside in rows if c == 1}
for variant, (_, inside, outside) in by.items():
    assert inside < 1e-3 and outside > 1e2, f"{variant}: not stable inside / unstable outside"
assert by["dc"][0] == by["pipe"][0] == 1.0 and by["predict"][0] == by["sync"][0] == 2.0
assert rows[4][2] == 4.0 and rows[4][3] < 1e-3, "exact dc at lam_dc = 3/4: stable up to x = 4"
gaps = report["recovered"]  # the lrs where pipe ends a point or more below sync, or diverges
assert gaps, "expected a learning rate where plain pipe falls behind sync"
for gap in gaps:
    assert gap["pipe+predict"] >= 0.5, f"lr {gap['lr']}: predict recovered under half: {gap}"
    assert gap["pipe+predict"] > gap["pipe+dc"], f"lr {gap['lr']}: dc recovered more: {gap}"
assert edge["pipe"] is not None and edge["pipe"] <= 0.8 * edge["sync"], (
    f"section 3: the one-step delay should cost pipe its stable range on the network as on the "
    f"quadratic: pipe's edge {edge['pipe']} should lie clearly below sync's {edge['sync']}"
)
assert edge["pipe+dc"] <= edge["pipe"] and edge["pipe+dc-adaptive"] <= edge["pipe"], (
    f"section 3: dc's correction vanishes near the optimum, so it should not move the edge "
    f"past plain pipe's {edge['pipe']}: {edge}"
)
assert edge["pipe+predict"] >= edge["sync"], (
    f"section 3: prediction computes the gradient where it will be applied, so it should win "
    f"back the range pipe lost and reach sync's edge {edge['sync']}: {edge}"
)
for kind, same in bitwise.items():
    assert same, f"pipe+{kind}: a worker's weights differ from the oracle's"
print("all checks passed")

# %% [markdown]
# ## Summary
#
# - DC-ASGD applies g + λ_dc·g⊙g⊙(w_t − w_{t−s}) instead of the stale g (the adaptive form
#   divides λ_dc by a moving root mean square of g); prediction computes the gradient at
#   ŵ_t = w_t − lr_t·g_local_{t−1}, where the pipeline will be when it is applied.
# - On a quadratic, staleness one is stable for lr·λmax < 1, synchronous SGD for < 2.
#   Prediction recovers sync's < 2; delay compensation with the exact curvature moves the edge
#   to 2 (λ_dc = 1) or 4 (λ_dc = 3/4); with the diagonal estimate g⊙g, the form that DC-ASGD
#   and this project implement, the correction vanishes near the optimum and the edge stays
#   at 1.
# - On digits, the same picture: pipe diverges where sync still trains, dc does not help at
#   the edge, predict trains as far as sync. λmax at w_0 puts the quadratic bounds far too low
#   for a network; the ratio of the edges is what the theory gets roughly right.
# - Each compensation costs memory and passes per step: dc one weight copy per step in flight
#   and 6 elementwise passes (12 adaptive), predict a gradient copy per step in flight, the
#   predicted weights and 2 + 2s passes; the timing model charges them to the compute thread.
#
# ## Exercises
#
# Each exercise with a single answer has a cell that checks it: put your answer in place of
# `None` and run the cell.

# %% [markdown]
# **1.** Derive the exact-curvature dc bound with Jury's conditions for z² + a₁z + a₀ (both
# roots inside the unit circle iff |a₀| < 1, 1 + a₁ + a₀ > 0 and 1 − a₁ + a₀ > 0). What is
# the largest stable x = lr·λ for λ_dc = 0.25? Then check your formula against section 2's
# runs at λ_dc = 0.25 and 0.5 (`distance("dc-exact", x, lam_dc=...)`).
#
# <details><summary>Hint</summary>
#
# The recurrence w_{t+1} = (1 − λ_dc x) w_t − (1 − λ_dc) x w_{t−1} has the characteristic
# polynomial z² − (1 − λ_dc x) z + (1 − λ_dc) x, so a₁ = −(1 − λ_dc x) and
# a₀ = (1 − λ_dc) x. The second condition gives x > 0; the first x (1 − λ_dc) < 1; the third
# x (2λ_dc − 1) < 2, which sets no bound when λ_dc ≤ 1/2.
#
# </details>

# %%
answer = None  # your answer: the largest stable lr * lambda of exact dc with lambda_dc = 0.25
check("10.1", answer)

# %% [markdown]
# **2.** dc helps where g is large. Start the quadratic of section 2 farther from the
# optimum, at a distance of 1 and then of 1e3 instead of 1e-6, run plain pipe and dc
# (λ_dc = 0.04, then 1) at x = 1.05, just past pipe's edge, and compare |w − w*| over 400
# steps. Does dc delay the blow-up? Does it ever make things worse?
#
# <details><summary>Hint</summary>
#
# Copy `distance` and change the start to `w_star + r * rng.standard_normal(dim)` with
# `compensation="dc"` and `dc_lambda` passed to `delayed_sgd` (silence overflow warnings with
# `np.errstate(all="ignore")`). At a distance of about 1 the cubic correction is large enough
# to damp the growth for hundreds of steps; at 1e3 it is so large that the very first
# corrections overshoot and the run blows up within a few steps, faster than plain pipe. A
# first-order Taylor step is only good for small moves.
#
# </details>

# %% [markdown]
# **3.** Run the study of section 3 with `world_size=8` (more workers, each with its own
# minibatch noise). Does predict's local estimate of the averaged gradient get worse, and does
# its edge move?
#
# <details><summary>Hint</summary>
#
# `study_cfg.replace(world_size=8, batch_size=176)` (eight shards of digits' 1,437 rows hold
# 179 each, fewer than a batch of 352; 176 keeps the effective batch) and three or four
# learning rates around the edges keep it short. With p workers a worker's own gradient is one
# of the p terms of the average, so its prediction of the update is off by the spread between
# workers' gradients; on a quadratic with identical workers it is exact. Compare predict's
# column with sync's.
#
# </details>

# %% [markdown]
# **4.** `--algo ps-async --max-staleness 0` makes every worker wait for every other each
# step: all p workers compute on the same weights, and the server then applies their p pushes
# one at a time. It equals `reference.sync_sgd`, but not at the same learning rate. With
# p = 4 workers and lr = 0.1, at which learning rate does `sync_sgd` give the same weights?
#
# <details><summary>Hint</summary>
#
# Each push is applied as w ← w − lr · g_r, with every g_r computed at the same w (the round's
# weights). Add the p updates of a round and compare with w ← w − lr' · (1/p) Σ_r g_r. Check
# it with `reference.async_ps_sgd(..., max_staleness=0)` and `reference.round_robin` on the
# quadratic of section 2.
#
# </details>

# %%
answer = None  # your answer: the learning rate of sync_sgd, for p = 4 and lr = 0.1
check("10.4", answer)

# %% [markdown]
# **5.** Prediction extrapolates with lr·g_local. With a learning-rate schedule, which lr
# belongs in the prediction, that of the step that computes the gradient, or that of the step
# that applies the gradient in flight? Write ŵ_t for s = 1 as a function
# `predict(w, g_local, lr_at, t)` of the weights w_t, this worker's own gradient of step t − 1,
# the schedule `lr_at(step)` and the step t, and check it. Then find the line in
# `PipeCompensation.weights_for` (methods/compensation.py) that decides.
#
# <details><summary>Hint</summary>
#
# The gradient in flight, g_{t−1}, is applied by the update of step t: w_{t+1} = w_t −
# lr_t · g_{t−1}. The prediction wants w_{t+1}, so it subtracts that very step's lr times the
# local stand-in for g_{t−1}. In the code, a gradient of step u is applied at step u + s.
#
# </details>

# %%
answer = None  # your answer: a function predict(w, g_local, lr_at, t) -> the predicted weights
check("10.5", answer)

# %% [markdown]
# **6.** The timing model charges each compensation its elementwise passes over the n
# weights, on the compute thread. How many passes a step does predict add at width K = 3
# (staleness two)? Which of them grow with the staleness, and why?
#
# <details><summary>Hint</summary>
#
# Predict copies the weights and this worker's gradient, then makes one product and one
# subtraction per step in flight; with width K there are s = K − 1 of them (module docstring
# of methods/compensation.py; `timing.compensation_passes`).
#
# </details>

# %%
answer = None  # your answer: elementwise passes per step of predict at width 3
check("10.6", answer)

# %% [markdown]
# Written solutions to every exercise above, with the reasoning: docs/solutions.md, section 10
# (on the site, the page "Solutions to the exercises").
