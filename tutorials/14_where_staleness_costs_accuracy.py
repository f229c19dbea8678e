# %% [markdown]
# # 14 · Where staleness costs accuracy: momentum on a deep net
#
# **A number to start with: 38.** With heavy-ball momentum M = 0.9, synchronous SGD is stable
# on a quadratic for lr·λ < 2(1 + M) = 3.8; a one-step-old gradient shrinks that to
# lr·λ < 1 − M = 0.1, 38 times less (tutorial 06 derived both bounds). Without momentum the
# delay costs a factor of 2. SAPipe (Chen et al., NeurIPS 2022) reimplemented Pipe-SGD and
# trained CIFAR-10 with momentum SGD: staleness one cost a ResNet-50 3.9 points of test
# accuracy and a VGG-16 1.9, and weight prediction won them back. Tutorials 06 and 10 trained
# MLPs with plain SGD, where the delay's cost is small. This one trains a residual network with
# batch norm (`--model resnet`) with momentum, and finds where the cost appears, and why.
#
# You will:
# 1. meet the effective step lr/(1 − M), and see that in effective steps pipe's edge does not
#    move with the momentum while sync's moves out 19 times;
# 2. watch both bounds at work on a quadratic, just inside and just outside;
# 3. train the ResNet with momentum 0 and 0.9: sync, pipe (staleness one), pipe+dc and
#    pipe+predict at a few effective steps, with `run_momentum_study`, the code of
#    `pipesgd compare --study staleness`;
# 4. put our numbers in SAPipe's table, beside theirs.
#
# Run it with `python tutorials/14_where_staleness_costs_accuracy.py`. Takes about 40 s here on
# two idle cores, five minutes when others share them (about 15 s with
# `PIPESGD_TUTORIAL_SMALL=1`, the quick version CI runs); the training of section 3 is nearly
# all of it.

# %%
import os
from pathlib import Path

import numpy as np

from pipesgd_ref.commands.study_momentum import (
    METHODS,
    format_momentum_table,
    format_sapipe,
    plot_momentum_study,
    run_momentum_study,
    study_config,
)
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.exercises import check
from pipesgd_ref.methods.optimizer import SGD, heavy_ball_bound
from pipesgd_ref.methods.reference import delayed_sgd
from pipesgd_ref.plots import pyplot

SMALL = os.environ.get("PIPESGD_TUTORIAL_SMALL") == "1"  # CI: a narrower net, fewer steps
# As a script, beside this file; as a notebook (Jupyter, VS Code, nbconvert), in the
# notebook's own folder, which is where a notebook runs.
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
OUT = HERE / "out"  # figures go here (git-ignored)

plt = pyplot()  # None without matplotlib: the lessons are in the printed numbers and asserts

# %% [markdown]
# ## 1. The effective step
#
# Heavy ball keeps a velocity, v ← M·v + g, and steps w ← w − lr·v. Under a steady gradient g
# the velocity grows to g·(1 + M + M² + ...) = g/(1 − M), so each step moves the weights by
#
#     η = lr / (1 − M)          the effective step: lr 0.1 at M = 0.9 moves as lr 1 at M = 0
#
# This is why a momentum run's learning rate is ten times smaller than a plain one's: the same
# speed. Measure the stable ranges of tutorial 06 in effective steps, on a quadratic of
# curvature λ (optimizer.py's docstring derives them with Jury's conditions):
#
#     fresh gradient  (sync)        lr·λ < 2(1 + M)     η·λ < 2(1 + M)/(1 − M)
#     staleness one   (pipe)        lr·λ < 1 − M        η·λ < 1
#
# In effective steps **pipe's edge does not depend on the momentum**: η·λ < 1 at every M.
# Sync's grows from 2 (M = 0) to 38 (M = 0.9). Momentum lets a synchronous run go 19 times
# faster before it diverges, and gives the pipeline nothing. Practitioners tune the learning
# rate for the synchronous run; with momentum, that rate can be far past pipe's edge.

# %%
print(f"{'M':>5} {'sync: lr*lam <':>15} {'pipe: lr*lam <':>15} {'sync: eta*lam <':>16} "
      f"{'pipe: eta*lam <':>16} {'ratio':>6}")  # fmt: skip
bounds = {}
for M in (0.0, 0.5, 0.9):
    fresh, stale = heavy_ball_bound(M, 0), heavy_ball_bound(M, 1)
    bounds[M] = (fresh, stale)
    print(f"{M:>5g} {fresh:>15.3g} {stale:>15.3g} {fresh / (1 - M):>16.3g} "
          f"{stale / (1 - M):>16.3g} {fresh / stale:>6.3g}")  # fmt: skip

# %% [markdown]
# ## 2. Both bounds at work on a quadratic
#
# One coordinate, f(w) = ½ λ w² with λ = 1, so x = lr·λ = lr. Run heavy ball fresh (staleness
# 0) and stale (staleness 1) with the oracle `delayed_sgd` and the optimiser every method uses
# (`SGD(momentum)`), at 0.8 and 1.25 times each bound, and watch |w| after 1,000 steps.
# (Just past 1 − M the stale run grows slowly, by √(M + x) a step: 1,000 steps show it.)


# %%
def final_distance(x: float, momentum: float, staleness: int, steps: int = 1000) -> float:
    """|w_T| / |w_0| of heavy ball on f = w^2 / 2 at lr = x, gradients `staleness` steps old."""

    def grad_fn(w, rank, step):
        return 0.5 * float(w @ w), w.copy()

    with np.errstate(over="ignore", invalid="ignore"):
        traj = delayed_sgd(grad_fn, np.ones(1), 1, steps, x, staleness=staleness, drain=False,
                           optimizer=SGD(momentum))  # fmt: skip
    w = float(abs(traj.params[0]))
    return w if np.isfinite(w) else np.inf  # overflowed: grown past any float


quadratic = {}  # (M, staleness, factor of the bound) -> |w_T|
for M in (0.0, 0.9):
    for s, bound in ((0, heavy_ball_bound(M, 0)), (1, heavy_ball_bound(M, 1))):
        for factor in (0.8, 1.25):
            quadratic[M, s, factor] = final_distance(factor * bound, M, s)
        print(f"M {M:g}, staleness {s}: bound lr*lam < {bound:.3g} (eta*lam < "
              f"{bound / (1 - M):.3g}); at 0.8x |w| = {quadratic[M, s, 0.8]:.1e}, at 1.25x "
              f"|w| = {quadratic[M, s, 1.25]:.1e}")  # fmt: skip

# %% [markdown]
# Inside each bound the run decays, outside it grows, at both momenta: the bounds are sharp.
# With M = 0.9, lr = 0.08 decays with a stale gradient and lr = 0.125 grows, while the fresh
# run is still stable at lr = 3. A network has many curvatures and they change as it trains,
# so these bounds will not predict the exact learning rate at which a net stops training; the
# ratios are what carries over. Next, the network.
#
# ## 3. The ResNet with momentum
#
# `run_momentum_study` trains one problem with each method at each effective step η, at
# lr = η(1 − M) for each momentum M, for the same number of steps, with the one-process
# oracles (the distributed runs equal them bitwise). Batch norm's running statistics come from
# worker 0's forward passes, and the test accuracy is measured with them. The problem: digits,
# 4 workers of batch 32, a ResNet-8 of widths 8, 16, 32, 120 steps with a cosine schedule (at
# the small size: widths 4, 8, 16, batch 16, 40 steps); `pipesgd compare --study staleness`
# runs a ResNet-20 for 200 steps over six effective steps, with ddp beside sync. ddp is
# sync's update summed in another order; it is left out here.

# %%
cfg = study_config(TrainConfig.preset("compare"), set(), quick=True)  # ResNet-8, 4,8,16
if SMALL:
    etas = (0.6, 4.8)
else:
    cfg = cfg.replace(channels=(8, 16, 32), batch_size=32, steps=120, eval_every=20,
                      target_accuracy=0.9)  # fmt: skip
    etas = (0.6, 2.4, 9.6)
methods = tuple(m for m in METHODS if m[0] != "ddp")
report = run_momentum_study(cfg, etas, momenta=(0.0, 0.9), methods=methods, out=None,
                            log=lambda line: None)  # fmt: skip
print(format_momentum_table(report).split("test accuracy (%)")[0])
if plt is not None:
    plot_momentum_study(report, OUT / "14_momentum_study.png")

# %% [markdown]
# Read each block from the top row down, then compare the two blocks row by row (a row is one
# effective step at both momenta).
#
# - **Pipe stops at about the same effective step at both momenta**, as section 1 predicts:
#   at the top row plain pipe ends far below sync with momentum 0.9 *and* without momentum.
#   In η, the delay's edge is where it was.
# - **Sync goes further with momentum.** Without momentum the top row is near sync's own edge
#   (at the full size it has started to lose accuracy there); with momentum 0.9 it trains as
#   well at the top row as at the bottom one. Momentum widens sync's range, not pipe's, so the
#   rates at which sync trains well reach further past pipe's edge with momentum than without.
# - **Prediction wins the loss back with momentum, much less without.** pipe+predict computes
#   each gradient at the weights its pending update will give, previewing the optimiser's own
#   update with this worker's gradient in place of the average (tutorial 10). With momentum
#   that update is lr·(M·v + g): the velocity part is known exactly, the same on every worker,
#   and the error, lr·(g_local − g_avg), is (1 − M) = 10 times smaller than without momentum
#   at the same effective step, because the learning rate is. (Without momentum the top row is
#   also close to sync's own edge, where any error costs more.)
# - pipe+dc corrects the stale gradient with λ_dc·g⊙g⊙(w_t − w_{t−1}), a correction that
#   vanishes where the gradient is small; it does not move the edge (tutorial 10 shows why).
#
# The figure (tutorials/out/14_momentum_study.png) draws the same numbers against η, one panel
# per momentum.

# %%
recovered_at_top = {}
for b in report["blocks"]:
    M = b["momentum"]
    for e in b["recovered"]:  # the rows where pipe ends a point or more below sync
        print(f"momentum {M:g}, lr {e['lr']:.3g} (eta {e['lr'] / (1 - M):.3g}): pipe "
              f"{100 * (e['sync'] - (e['pipe'] or 0)):.1f} points below sync; prediction "
              f"recovers {e['pipe+predict']:.0%} of it, dc {e['pipe+dc']:.0%}")  # fmt: skip
        if e["lr"] == max(r["lr"] for r in b["rows"]):
            recovered_at_top[M] = e["pipe+predict"]

# %% [markdown]
# ## 4. SAPipe's table in miniature
#
# SAPipe reports sync | staleness one | staleness one + prediction at one setting, the usual
# CIFAR-10 recipe tuned for synchronous SGD (lr 0.1, momentum 0.9: η = 1). Ours, from the same
# runs: each method at sync's best learning rate of the grid (the smallest, on a tie), each
# at its own best rate (what retuning the pipeline's rate would buy), and, at momentum 0.9,
# at the grid's rate nearest SAPipe's 0.1. The last two rows are SAPipe's own figures for
# CIFAR-10, printed beside ours and not computed here.

# %%
print(format_sapipe(report))

# %% [markdown]
# Our net is small and digits easy (360 test images: one image is 0.28 points), so the
# absolute numbers are not CIFAR-10's, and the rows depend on which rate counts as "tuned for
# sync". On digits sync reaches its best accuracy over a wide range of rates, and the smallest
# of them can lie inside pipe's range: there, staleness costs little. The cost is at the top
# of sync's range (section 3's rows): with momentum 0.9, where sync still trains at its best,
# pipe loses tens of points and prediction wins most of them back, SAPipe's shape. The row
# "each at its own best lr" is the practical way out: a pipeline whose learning rate is
# retuned below its edge loses little, at the price of the speed the larger rate would have
# bought. `pipesgd compare --study staleness` runs the same on a ResNet-20, where the edge
# comes earlier, over six effective steps with ddp beside sync; the ddp column shows how far
# two runs of the *same* update end apart from float rounding alone, the noise floor under
# any one-point difference.
#
# ## 5. Check the lessons

# %%
for M, (fresh, stale) in bounds.items():
    assert abs(fresh - 2 * (1 + M)) < 1e-12 and abs(stale - (1 - M)) < 1e-12
    assert abs(stale / (1 - M) - 1) < 1e-12, "pipe's edge in effective steps is 1 at every M"
assert abs(bounds[0.9][0] / bounds[0.9][1] - 38) < 1e-9, "M = 0.9: sync's range is 38x pipe's"
for key, w in quadratic.items():
    inside = key[2] < 1
    assert (w < 1e-2) if inside else (w > 1e2), f"section 2: {key}: |w_T| = {w:.2e}"
eta_top = max(etas)
for b in report["blocks"]:
    by = {(r["method"], r["effective_lr"]): r for r in b["rows"]}
    acc = {k: (0.0 if r["diverged"] else r["test_accuracy"]) for k, r in by.items()}
    loss = acc["sync", eta_top] - acc["pipe", eta_top]
    assert loss >= 0.01, (
        f"section 3: at the top effective step {eta_top}, momentum {b['momentum']:g}, pipe "
        f"should end at least a point below sync: sync {acc['sync', eta_top]:.4f}, pipe "
        f"{acc['pipe', eta_top]:.4f}"
    )
assert recovered_at_top.get(0.9, 0.0) >= 0.5, (
    f"section 3: with momentum 0.9 prediction should win back at least half of pipe's loss at "
    f"the top effective step: {recovered_at_top}"
)
assert recovered_at_top[0.9] > recovered_at_top.get(0.0, -np.inf), (
    f"section 3: prediction should win back more with momentum than without at the same "
    f"effective step: {recovered_at_top}"
)
print("all checks passed")

# %% [markdown]
# ## Summary
#
# - Momentum M makes each step move the weights by the effective step η = lr/(1 − M).
# - On a quadratic, sync is stable for η·λ < 2(1 + M)/(1 − M) and staleness one for η·λ < 1:
#   in effective steps pipe's edge does not move with the momentum, sync's moves out 19 times
#   at M = 0.9 (38 times in lr·λ, against plain SGD's 2).
# - On a ResNet with batch norm, pipe stops at about the same effective step with and without
#   momentum; sync, with momentum 0.9, trains well far past it. At those rates plain pipe
#   loses tens of points, weight prediction wins most of them back (its error is (1 − M)
#   times smaller at the same effective step), and dc does not move the edge. Without
#   momentum sync's range ends soon after pipe's, and prediction wins back much less.
# - SAPipe's table in miniature has their shape, sync ≈ prediction > staleness one, at the top
#   of sync's range. At the smallest of sync's best rates staleness costs little here; retune
#   the pipeline's rate below its edge and most of the loss goes, at a cost in speed.
#
# ## Exercises
#
# Each exercise with a single answer has a cell that checks it: put your answer in place of
# `None` and run the cell.

# %% [markdown]
# **1.** With momentum M = 0.9, by what factor is sync's largest stable lr·λ larger than
# staleness one's?
#
# <details><summary>Hint</summary>
#
# Section 1's table: 2(1 + M) against 1 − M.
#
# </details>

# %%
answer = None  # your answer: sync's stable range over pipe's, a factor, at M = 0.9
check("14.1", answer)

# %% [markdown]
# **2.** What is the largest stable *effective* step η·λ = lr·λ/(1 − M) at staleness one for
# M = 0.5? Then compute it for M = 0 and M = 0.9: what does the answer say about lowering the
# learning rate of a pipeline when you add momentum?
#
# <details><summary>Hint</summary>
#
# lr·λ < 1 − M at staleness one; divide by 1 − M.
#
# </details>

# %%
answer = None  # your answer: the largest stable lr * lambda / (1 - M) at staleness one, M = 0.5
check("14.2", answer)

# %% [markdown]
# **3.** Pipe-SGD of width 3 applies gradients two steps old. With momentum 0.9, what is the
# largest stable lr·λ? Compare it with staleness one's 0.1.
#
# <details><summary>Hint</summary>
#
# Write the recurrence with w_{t−2} in place of w_{t−1} in the gradient term, take its
# characteristic polynomial z³ − (1 + M)z² + Mz + x, and find the first x at which a root
# leaves the unit circle (`np.roots`, a scan of x, then bisection); or simulate
# `final_distance` with staleness 2 on a grid of x.
#
# </details>

# %%
answer = None  # your answer: the largest stable lr * lambda, M = 0.9, staleness two
check("14.3", answer)

# %% [markdown]
# **4.** Keep the effective step and change the momentum. Run pipe (and sync) at η = 2.4 with
# M = 0, 0.5 and 0.9 (lr = η(1 − M)): `run_momentum_study(cfg, (2.4,), momenta=(0.0, 0.5, 0.9),
# methods=...)`. Does pipe's final accuracy depend much on M at a fixed η? What does that say
# about "lower the momentum" as a fix for staleness?
#
# <details><summary>Hint</summary>
#
# Section 1 says pipe's edge in effective steps, η·λ < 1, is the same at every M. Compare the
# pipe column across the three blocks, and then sync's.
#
# </details>

# %% [markdown]
# Written solutions to every exercise above, with the reasoning: docs/solutions.md, section 14
# (on the site, the page "Solutions to the exercises").
