# %% [markdown]
# # 01 · Data-parallel SGD: p workers, one average gradient
#
# **A number to start with.** A model with 6.25 million float32 parameters has a 25 MB gradient.
# Over a 1 Gb/s link (125 MB/s) sending it once takes 25 / 125 = **0.2 s**; a ring AllReduce
# over p = 4 workers moves 2(p−1)/p = 1.5 times that through every link: **0.3 s per step**.
# If the forward and backward pass of that model took, say, 0.1 s, a synchronous worker would
# spend three quarters of every step waiting for the network. That idle time is what Pipe-SGD
# attacks (Li et al., NeurIPS 2018; docs/paper.md, section 1). Before any of that, this
# tutorial pins down *what* the p workers compute together, so that every faster version has
# something exact to be checked against.
#
# You will:
# 1. split the digits training set over p = 4 workers and draw each worker's minibatch;
# 2. check that the average of the p gradients is the gradient on the concatenated batch;
# 3. check that `reference.sync_sgd` with p workers *is* large-batch SGD with one worker;
# 4. train on digits and measure test accuracy;
# 5. preview the staleness-one oracle `reference.delayed_sgd(staleness=1)`.
#
# Run it with `python tutorials/01_data_parallel_sgd.py`. Takes about 4 s here on two cores
# (about 3 s with `PIPESGD_TUTORIAL_SMALL=1`, the quick version CI runs).

# %%
import os
import time
from pathlib import Path

import numpy as np

from pipesgd_ref.config import TrainConfig
from pipesgd_ref.data import MinibatchSampler, load_dataset, shard_indices
from pipesgd_ref.exercises import check
from pipesgd_ref.methods import reference
from pipesgd_ref.models import build_model
from pipesgd_ref.plots import pyplot, save_figure
from pipesgd_ref.timing import ring_allreduce_time

SMALL = os.environ.get("PIPESGD_TUTORIAL_SMALL") == "1"  # CI: fewer steps, same lessons
# As a script, beside this file; as a notebook (Jupyter, VS Code, nbconvert), in the
# notebook's own folder, which is where a notebook runs.
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
OUT = HERE / "out"  # figures go here (git-ignored)

plt = pyplot()  # None without matplotlib: the lessons are in the printed numbers and asserts

# %% [markdown]
# ## 0. The back-of-envelope, in code
#
# The alpha-beta model (equation (1) of docs/paper.md, less its reduction and codec terms): a
# ring AllReduce of M bytes over p workers costs 2(p−1)·α + 2(p−1)/p · M/B, with α the
# per-message latency and B the link bandwidth. We also *measure* one gradient of the small
# MLP this tutorial trains, and price its (much smaller) gradient the same way. α = 50 µs is
# an assumed LAN latency, not a measurement.

# %%
cfg = TrainConfig.preset("laptop")  # digits, MLP(64), p = 4, B = 32, lr = 0.1, 600 steps
if SMALL:
    cfg = cfg.replace(steps=150)
p, B = cfg.world_size, cfg.batch_size
bandwidth = 1e9 / 8  # 1 Gb/s in bytes/s
alpha = 50e-6  # s per message (assumed)


# The alpha-beta cost of one ring AllReduce, 2(p-1)*alpha + 2(p-1)/p * M/B: tutorial 02 derives
# it, and the timing models (tutorial 04) use this very function.
big_bytes = 25e6
print(f"25 MB gradient, one send over 1 Gb/s:   {big_bytes / bandwidth * 1e3:7.1f} ms")
ring_ms = ring_allreduce_time(p, big_bytes, alpha, bandwidth) * 1e3
print(f"25 MB gradient, ring AllReduce, p = {p}:  {ring_ms:7.1f} ms")

# %% [markdown]
# ## 1. Data: one shard per worker, one minibatch per (rank, step)
#
# `load_dataset("digits")` gives 1437 training and 360 test images of 8×8 pixels (64
# standardised features, 10 classes). Rank r of p owns the rows r, r+p, r+2p, ...
# (`shard_indices`), and `MinibatchSampler` draws rank r's minibatch number `step` from that
# shard alone, as a pure function of (seed, rank, step). That last property matters: a
# one-process oracle can replay exactly the batches that p separate processes would draw.

# %%
data = load_dataset(cfg.dataset)
print(data)
sampler = MinibatchSampler(data.n_train, p, B, seed=cfg.seed)
for rank in range(p):
    shard = shard_indices(data.n_train, rank, p)
    idx = sampler.batch_indices(rank, step=0)
    print(f"rank {rank}: shard of {len(shard)} rows {shard[:4]}...; step-0 batch rows {idx[:5]}...")
step0 = [sampler.batch_indices(r, 0) for r in range(p)]
assert len(np.unique(np.concatenate(step0))) == p * B, "the p minibatches of a step are disjoint"

# %% [markdown]
# ## 2. The average of p gradients is the gradient of one batch of p·B
#
# Worker r computes g_r = ∇ (1/B) Σ_{i ∈ batch r} ℓ_i(w): the gradient of the *mean* loss on
# its own B samples. The collective then averages:
#
#     (1/p) Σ_r g_r = (1/p) Σ_r (1/B) Σ_{i ∈ batch r} ∇ℓ_i = (1/(pB)) Σ_{i ∈ all p batches} ∇ℓ_i
#
# which is the gradient of the mean loss over the concatenation of the p batches. A mean of
# means is the overall mean **because every batch has the same size B**: with unequal sizes the
# small batches would be over-weighted (exercise 1). This is why `MinibatchSampler` gives every
# rank the same batch size and the same number of steps per epoch.
#
# `reference.model_grad_fn(model, data, sampler)` is the gradient oracle every algorithm uses:
# `grad_fn(params, rank, step) -> (loss, grad)` for worker `rank`'s minibatch `step`.
# `reference.average_gradient` sums the p of them in rank order and divides by p. We compare it
# with one call of `model.loss_and_grad` on the concatenated batch, first in float64.

# %%
model = build_model(cfg.model, data.n_features, data.n_classes, hidden=cfg.hidden)
print(model, f"= {model.n_params * 4} bytes of float32 gradient")
grad_fn = reference.model_grad_fn(model, data, sampler)


def concatenated_batch(step: int) -> tuple[np.ndarray, np.ndarray]:
    """The p workers' minibatches of `step`, stacked in rank order: (p*B, n_features), (p*B,)."""
    Xs, ys = zip(*(sampler.batch(data, rank, step) for rank in range(p)), strict=True)
    return np.concatenate(Xs), np.concatenate(ys)


def large_batch_grad_fn(params: np.ndarray, rank: int, step: int) -> tuple[float, np.ndarray]:
    """One worker (rank 0) that sees all p batches of `step` at once: batch size p*B."""
    X, y = concatenated_batch(step)
    grad = np.empty_like(params)
    loss = model.loss_and_grad(params, X, y, grad)
    return loss, grad


gaps = {}
for dtype in (np.float64, np.float32):
    w0 = model.init_params(cfg.seed, dtype=dtype)
    loss_avg, g_avg = reference.average_gradient(grad_fn, w0, p, step=0)
    loss_big, g_big = large_batch_grad_fn(w0, rank=0, step=0)
    gaps[dtype] = np.abs(g_avg - g_big).max()
    print(
        f"{np.dtype(dtype).name}: max |avg of {p} grads - grad of batch {p * B}| = "
        f"{gaps[dtype]:.2e} (largest gradient entry {np.abs(g_big).max():.2f}); "
        f"loss gap {abs(loss_avg - loss_big):.1e}"
    )

# %% [markdown]
# The two agree to the last few bits: in float64 the gap is a few units of 1e-16, in float32 a
# few units of 1e-8. They are not bitwise equal, because the sums are done in a different order
# (p partial sums of B terms, then their mean, against one sum of pB terms) and floating-point
# addition is not associative. The tolerance to expect is a few ulps of the largest entry:
# float32 machine epsilon is 1.2e-7, so 1e-6 for gradients of size ~1 is generous.
#
# ## 3. Synchronous data-parallel SGD is large-batch SGD
#
# `reference.sync_sgd(grad_fn, w0, world_size=p, ...)` runs w_{t+1} = w_t − lr·(1/p)Σ_r g_r(w_t).
# By section 2, each step equals one step of single-worker SGD on the concatenated batch, so
# the whole trajectories must agree. We run both with `record=True` (every w_t kept) and
# compare step by step.

# %%
check_steps = 50 if SMALL else 200
trajectory_gap = {}
for dtype in (np.float64, np.float32):
    w0 = model.init_params(cfg.seed, dtype=dtype)
    parallel = reference.sync_sgd(grad_fn, w0, p, check_steps, cfg.lr, record=True)
    single = reference.sync_sgd(large_batch_grad_fn, w0, 1, check_steps, cfg.lr, record=True)
    per_step = np.abs(np.array(parallel.history) - np.array(single.history)).max(axis=1)
    trajectory_gap[dtype] = per_step.max()
    print(
        f"{np.dtype(dtype).name}: {check_steps} steps, max |w_t(p={p}) - w_t(large batch)| = "
        f"{per_step.max():.2e} (at step 1: {per_step[1]:.1e}, at the end: {per_step[-1]:.1e})"
    )

# %% [markdown]
# The rounding gaps of single steps add up slowly (each step's weights feed the next), but
# after hundreds of steps they are still near float precision: nothing diverges, because the
# two methods are the same algorithm.
#
# ## 4. Train on digits
#
# Now a real run: the `laptop` preset (p = 4 workers, B = 32 each, so an effective batch of
# 128; lr = 0.1) in float32. The callback evaluates test accuracy along the way.

# %%
w0 = model.init_params(cfg.seed)  # float32, as in training
curve = []  # (step, test accuracy)
eval_every = max(cfg.steps // 6, 1)


def evaluate(step: int, params: np.ndarray, loss: float) -> None:
    if (step + 1) % eval_every == 0:
        acc = model.accuracy(params, data.X_test, data.y_test)
        curve.append((step + 1, acc))
        print(f"step {step + 1:4d} | train loss {loss:.4f} | test accuracy {acc:.3f}")


t0 = time.perf_counter()
sync_run = reference.sync_sgd(grad_fn, w0, p, cfg.steps, cfg.lr, callback=evaluate)
seconds = time.perf_counter() - t0
sync_acc = model.accuracy(sync_run.params, data.X_test, data.y_test)
print(f"sync SGD, p = {p}: test accuracy {sync_acc:.3f} after {cfg.steps} steps ({seconds:.1f} s)")

# %% [markdown]
# How much would the network cost for *this* model? Time one worker's gradient and price an
# AllReduce of its gradient with the same model as above.

# %%
repeats = 50 if SMALL else 200
t0 = time.perf_counter()
for step in range(repeats):
    grad_fn(w0, 0, step)
t_grad = (time.perf_counter() - t0) / repeats
t_comm = ring_allreduce_time(p, model.n_params * 4, alpha, bandwidth)
print(f"one worker's gradient (B = {B}), measured here: {t_grad * 1e3:.2f} ms")
print(f"ring AllReduce of {model.n_params * 4} bytes over 1 Gb/s, modelled: {t_comm * 1e3:.2f} ms")

# %% [markdown]
# For a gradient this small the model's AllReduce is mostly latency (2(p−1)·α = 0.3 ms), and
# it comes out of the same order as the measured gradient: neither resource can be ignored, and
# a synchronous step pays for both, one after the other.
#
# This one-process `sync_sgd` is **the oracle**: every later tutorial and test checks the
# distributed implementations (ring AllReduce in worker processes, the parameter server,
# Pipe-SGD's two threads) against a run of these few lines of NumPy.
#
# ## 5. Preview: staleness one
#
# Pipe-SGD overlaps the AllReduce of g_t with the computation of g_{t+1}, so the update at step
# t can only use the average of g_{t−1}:
#
#     w_{t+1} = w_t − lr · avg(g_{t−1}),      w_1 = w_0 (the pipeline fills),
#
# and after the last step the gradient still in flight is applied (the drain). The oracle is
# `reference.delayed_sgd(..., staleness=1)`; `staleness=0` is `sync_sgd` again. Tutorial 06
# works out what the delay costs.

# %%
stale_run = reference.delayed_sgd(grad_fn, w0, p, cfg.steps, cfg.lr, staleness=1, record=True)
hist = stale_run.history
_, g0 = reference.average_gradient(grad_fn, hist[0], p, step=0)
w2 = hist[1] - np.float32(cfg.lr) * g0  # step 1 applies g_0, computed at w_0 = w_1
print(f"fill: |w_1 - w_0| = {np.abs(hist[1] - hist[0]).max():.1e} (no gradient has arrived yet)")
print(f"step 1 applies g_0: max |w_2 - (w_1 - lr*g_0)| = {np.abs(hist[2] - w2).max():.1e}")
stale_acc = model.accuracy(stale_run.params, data.X_test, data.y_test)
print(f"staleness-one SGD: test accuracy {stale_acc:.3f} (sync: {sync_acc:.3f})")

# %% [markdown]
# The two runs draw the same minibatch at every step (the sampler is a function of the step),
# so their losses can be compared step by step: at step t both are the loss of batch t, at
# the weights each run has reached. Plotted on top of each other the two curves hide each
# other, so the figure's right panel plots their **gap**, staleness-one loss minus sync loss,
# and both panels put the steps on a log axis so that the first few, where the runs differ
# most, get room.

# %%
sync_losses, stale_losses = np.array(sync_run.losses), np.array(stale_run.losses)
gap = stale_losses - sync_losses  # > 0: the stale run is behind on that step's batch
early = slice(0, 10)
late = slice(cfg.steps // 2, cfg.steps)
early_gap = gap[early].mean()
late_gap = np.abs(gap[late]).mean() / sync_losses[late].mean()  # relative to the loss itself
print(f"loss gap, staleness one - sync, steps 1-10: mean {early_gap:+.3f} "
      f"(the loss itself: {sync_losses[early].mean():.3f})")  # fmt: skip
print(f"loss gap, steps {late.start + 1}-{cfg.steps}: mean |gap| = {late_gap:.2%} of the loss")

if plt is not None:
    steps_axis = np.arange(1, cfg.steps + 1)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    left.plot(steps_axis, sync_losses, lw=1.2, label=f"sync SGD, p={p}")
    left.plot(steps_axis, stale_losses, lw=1.2, ls="--", label="staleness one")
    left.set(xscale="log", yscale="log", xlabel="step (log scale)", ylabel="mean worker loss",
             title="the two losses, step by step")  # fmt: skip
    left.legend()
    window = 10  # a running mean shows the trend through the minibatch noise
    smooth = np.convolve(gap, np.ones(window) / window, mode="valid")
    right.plot(steps_axis, gap, lw=0.6, color="0.6", label="gap at each step")
    right.plot(steps_axis[window - 1 :], smooth, lw=1.5, color="C3",
               label=f"running mean of {window} steps")  # fmt: skip
    right.axhline(0, color="k", lw=0.8)
    right.set(xscale="log", xlabel="step (log scale)", ylabel="staleness-one loss - sync loss",
              title="the gap: the stale run lags at first, then catches up")  # fmt: skip
    right.legend()
    save_figure(fig, OUT / "01_sync_vs_stale_loss.png")
else:
    print("matplotlib is not installed: plots skipped")

# %% [markdown]
# The gap is what one step of delay costs. While the loss falls fast (the first tens of
# steps) a gradient one step old points downhill from where the weights *were*, and the stale
# run trails the synchronous one by a visible margin. Once the loss changes slowly from one
# step to the next, last step's gradient is nearly today's, and the gap shrinks to the size of
# the minibatch noise: after half the run it is a fraction of a percent of the loss (printed
# above). Tutorial 06 shows where this stops being true: at a large learning rate.
#
# ## 6. Check against the oracle

# %%
assert gaps[np.float64] < 1e-12, (
    f"float64: the mean of {p} equal-size minibatch gradients should equal the gradient of "
    f"their concatenation up to rounding; max difference {gaps[np.float64]:.2e} > 1e-12"
)
assert gaps[np.float32] < 1e-6, (
    f"float32: mean of {p} gradients vs. gradient of batch {p * B} differ by "
    f"{gaps[np.float32]:.2e} > 1e-6, more than summation order can explain"
)
assert trajectory_gap[np.float64] < 1e-10, (
    f"float64: sync_sgd with p={p} drifted {trajectory_gap[np.float64]:.2e} from large-batch "
    f"SGD in {check_steps} steps; they are the same algorithm"
)
assert trajectory_gap[np.float32] < 1e-5, (
    f"float32: sync_sgd with p={p} drifted {trajectory_gap[np.float32]:.2e} from large-batch "
    f"SGD in {check_steps} steps (expected rounding-size gaps < 1e-5)"
)
assert np.array_equal(hist[1], hist[0]), "staleness one: step 0 must not move the weights"
assert np.abs(hist[2] - w2).max() == 0, (
    f"staleness one: step 1 must apply avg(g_0), the OLDEST gradient in flight; "
    f"max |w_2 - (w_1 - lr*g_0)| = {np.abs(hist[2] - w2).max():.1e} (a fresh g_1 would be sync)"
)
same = reference.delayed_sgd(grad_fn, w0, p, 20, cfg.lr, staleness=0).params
assert np.array_equal(same, reference.sync_sgd(grad_fn, w0, p, 20, cfg.lr).params), (
    "delayed_sgd with staleness=0 must be bitwise sync_sgd"
)
min_acc = 0.9 if SMALL else 0.95
assert sync_acc > min_acc, f"sync SGD reached test accuracy {sync_acc:.3f}, expected > {min_acc}"
assert early_gap > 0, (
    f"staleness one should trail sync in the first 10 steps (its first update is a step late): "
    f"mean loss gap {early_gap:+.4f}"
)
assert late_gap < 0.02, (
    f"after half the run the stale and sync losses should be within 2% of each other on "
    f"average: {late_gap:.2%}"
)
assert abs(stale_acc - sync_acc) < 0.03, (
    f"at lr={cfg.lr}, staleness one should cost little on digits: "
    f"{stale_acc:.3f} vs sync {sync_acc:.3f}"
)
print("all checks passed")

# %% [markdown]
# ## Summary
#
# - Each of p workers computes the gradient of the mean loss on its own minibatch of B
#   samples; their average is the gradient on the concatenated batch of p·B samples (a mean of
#   equal-size means), equal up to the order of floating-point sums.
# - So synchronous data-parallel SGD with p workers *is* large-batch SGD: `sync_sgd` with p
#   workers and with one worker on the concatenated batch trace the same weights.
# - `reference.sync_sgd` and `reference.delayed_sgd` are one-process oracles; the distributed
#   implementations are tested against them.
# - Communication is not small: a 25 MB gradient costs ~0.3 s per ring AllReduce at 1 Gb/s.
#   Staleness one hides it behind compute. On digits at lr = 0.1 it trails synchronous SGD for
#   the first tens of steps, then their losses agree to a fraction of a percent, and it costs
#   little accuracy.
#
# ## Exercises
#
# Each exercise with a single answer has a cell that checks it: put your answer in place of
# `None` and run the cell.

# %% [markdown]
# **1.** Give rank 0 a batch of 8 and the others 32 (p = 4), average the p gradients, and
# compare with the gradient of the concatenation: they differ. The fix is a *weighted* average,
# Σ_r c_r · g_r. What weight c_0 must rank 0's gradient get so that the two are equal again?
#
# <details><summary>Hint</summary>
#
# Write the gradient of the concatenated batch as (1/N) Σ over all N samples, split the sum by
# rank, and recognise each rank's part as B_r times its mean gradient g_r. The weights are
# B_r / N, with N = 8 + 3 · 32.
#
# </details>

# %%
answer = None  # your answer: the weight c_0 of rank 0's gradient, a number between 0 and 1
check("01.1", answer)

# %% [markdown]
# **2.** Repeat section 3 with `world_size=8` and `batch_size=16`. Is the trajectory the same
# as with p = 4, B = 32, even though both have an effective batch of 128? To see why not, count
# the training rows that the 128 samples of step 0 of the two set-ups have in common.
#
# <details><summary>Hint</summary>
#
# Build `MinibatchSampler(data.n_train, 8, 16, seed=cfg.seed)`, concatenate its 8 batches of
# step 0 with `batch_indices(rank, 0)`, and intersect with `np.concatenate(step0)` above
# (`np.intersect1d`). The shards change with p (rank r owns rows r, r+p, ...), and each rank
# shuffles its own shard, so the batches are different samples: the same algorithm, on other
# data.
#
# </details>

# %%
answer = None  # your answer: how many rows the two step-0 batches of 128 share (a count)
check("01.2", answer)

# %% [markdown]
# **3.** With the alpha-beta model of section 0 (p = 4, α = 50 µs, 1 Gb/s), at what gradient
# size M does the latency term 2(p−1)·α equal the bandwidth term 2(p−1)/p · M/B? What does
# that say about very small models, such as the 19 KB MLP of this tutorial?
#
# <details><summary>Hint</summary>
#
# The 2(p−1) cancels: α = M/(p·B). `ring_allreduce_time(p, 0, alpha, bandwidth)` is the
# latency term alone, `ring_allreduce_time(p, M, 0, bandwidth)` the bandwidth term alone: try
# your M in both. A gradient much smaller than that is all latency, and sending fewer bytes
# (tutorial 07) would not help it.
#
# </details>

# %%
answer = None  # your answer: M in bytes
check("01.3", answer)

# %% [markdown]
# **4.** Make `large_batch_grad_fn` stack the batches in reverse rank order. Which checks
# still pass, and what changes in the float32 gap?
#
# <details><summary>Hint</summary>
#
# The mean loss over a batch does not depend on the order of its rows, so in exact arithmetic
# nothing changes. In floating point the sums are taken in another order: expect the gaps to
# move by a few ulps, not more, and the bitwise checks of the staleness-one oracle (which do
# not use `large_batch_grad_fn`) not to move at all.
#
# </details>

# %% [markdown]
# Written solutions to every exercise above, with the reasoning: docs/solutions.md, section 01
# (on the site, the page "Solutions to the exercises").
