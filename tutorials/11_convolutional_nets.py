# %% [markdown]
# # 11 · Convolutional nets: more work per parameter, and what that does to pipelining
#
# **A number to start with: LeNet-5 does about six multiply-adds per parameter per image; an
# MLP does one.** The paper is about deep nets, whose hot path is the convolution. A
# convolution reuses each weight at every position of the image, so a CNN computes far more
# per parameter it must communicate than an MLP. Pipe-SGD hides communication under computation;
# how much there is to hide depends on exactly this ratio.
#
# You will:
# 1. build im2col by hand on a 4 x 4 image and see a convolution become one matrix product;
# 2. check that col2im is im2col's adjoint (which makes it the input gradient);
# 3. count the compute-to-parameter ratio of LeNet-5 against an MLP;
# 4. predict, with the timing models, at which link speed pipelining pays most for each;
# 5. train the CNN with Pipe-SGD on two worker processes and check it against the oracle.
#
# Run it with `python tutorials/11_convolutional_nets.py`. Takes about 4 s here on two cores
# (about 3 s with `PIPESGD_TUTORIAL_SMALL=1`, the quick version CI runs).

# %%
import math
import os
from pathlib import Path

import numpy as np

from pipesgd_ref import timing
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.exercises import check
from pipesgd_ref.methods.pipe import pipe_worker
from pipesgd_ref.methods.reference import delayed_sgd, model_grad_fn
from pipesgd_ref.models import CNN, MLP
from pipesgd_ref.ops import numpy_ops as ops
from pipesgd_ref.plots import pyplot, save_figure
from pipesgd_ref.runtime.launch import launch_local
from pipesgd_ref.runtime.worker import Worker
from pipesgd_ref.timing import ring_allreduce_time
from pipesgd_ref.timing.calibrate import cluster_calibration
from pipesgd_ref.units import format_bandwidth

SMALL = os.environ.get("PIPESGD_TUTORIAL_SMALL") == "1"  # CI: fewer steps, same lessons
# As a script, beside this file; as a notebook (Jupyter, VS Code, nbconvert), in the
# notebook's own folder, which is where a notebook runs.
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
OUT = HERE / "out"  # figures go here (git-ignored)

plt = pyplot()  # None without matplotlib: the lessons are in the printed numbers and asserts

# %% [markdown]
# ## 1. im2col by hand
#
# A 3 x 3 convolution with "same" padding 1 of a 4 x 4 single-channel image: every output pixel
# is the dot product of the 3 x 3 window around it with the filter. im2col copies each window
# into a row; the convolution is then `cols @ filter`. Maps are NHWC (batch, height, width,
# channels) inside the project, so a window's channels are contiguous.

# %%
image = np.arange(16, dtype=np.float64).reshape(1, 4, 4, 1)  # (B, H, W, C)
k, pad = 3, 1
cols = np.empty((16, k * k))  # (B*Ho*Wo, k*k*C): 16 windows of 9 pixels
ops.im2col(image, k, k, 1, pad, cols)
print("the window around pixel (1, 1), as row 5 of cols:", cols[5])
print("the window around the corner (0, 0), padded with zeros:", cols[0])

rng = np.random.default_rng(0)
filt = rng.standard_normal((k * k, 1))  # (k*k*Cin, Cout)
by_matmul = (cols @ filt).reshape(4, 4)

padded = np.pad(image[0, :, :, 0], pad)
by_loops = np.array([[np.sum(padded[i : i + k, j : j + k] * filt.reshape(k, k))
                      for j in range(4)] for i in range(4)])  # fmt: skip
print("the convolution by loops equals cols @ filter:", np.allclose(by_loops, by_matmul))

# %% [markdown]
# ## 2. col2im, the adjoint
#
# For the backward pass we need dL/dimage from dL/dcols. Each pixel was copied into every window
# that covers it (up to 9 here), so its gradient is the sum of those copies' gradients: col2im
# adds each entry of a cols-shaped array back where im2col took it from. That is exactly the
# adjoint: <im2col(x), r> = <x, col2im(r)> for any x and r.

# %%
x = rng.standard_normal((2, 5, 6, 3))
r = rng.standard_normal((2 * 5 * 6, k * k * 3))
c = np.empty_like(r)
ops.im2col(x, k, k, 1, pad, c)
back = np.empty_like(x)
ops.col2im(r, k, k, 1, pad, back)
lhs, rhs = float(np.sum(c * r)), float(np.sum(x * back))
print(f"<im2col(x), r> = {lhs:.6f}, <x, col2im(r)> = {rhs:.6f}")

# %% [markdown]
# ## 3. Work per parameter
#
# A dense layer of n_in x n_out weights does n_in * n_out multiply-adds per sample: one per
# weight. A conv layer of k*k*Cin*Cout weights applies them at every one of H*W positions.

# %%
lenet = CNN((1, 28, 28), 10)  # LeNet-5: 6 and 16 channels of 5 x 5, a 120-84 head
mlp = MLP(784, 10, hidden=(120, 84))  # the same head, no convolutions
for model in (lenet, mlp):
    macs = model.flops_per_sample()
    print(f"{model}: {macs:,} multiply-adds per image, {macs / model.n_params:.1f} per "
          f"parameter")  # fmt: skip
ratio_cnn = lenet.flops_per_sample() / lenet.n_params

# %% [markdown]
# ## 4. Where pipelining pays, for each model
#
# Pipe-SGD's iteration is max(t_comp + t_u, T_ar) where sync's is t_comp + T_ar + t_u
# (equations (3) and (4) of docs/paper.md): the gain is largest, 2x, where communication takes
# as long as computation, and fades on either side. Where is that balance? With n parameters
# the ring sends 2(p−1)/p · 4n bytes, and computing the gradient takes n times the compute
# time per parameter, so, latency left aside,
#
#     T_ar = t_comp   at   B* ≈ 2(p−1)/p · 4 bytes / (compute time per parameter).
#
# **The number of parameters cancels.** What places the balance is how long a model computes
# per parameter it must send, and a CNN, reusing every filter weight at every position, computes
# far longer per parameter: it balances on a slower link. The two models below also differ in
# size (the MLP has over twenty times the CNN's parameters), but that is not what moves the
# balance; exercise 6 looks at an MLP as small as the CNN. Below, the timing models on a
# cluster (each worker its own machine, `cluster_calibration`), with t_comp timed here, swept
# from 1 Mbit/s to 100 Gbit/s, wide enough that each model's gain rises, peaks and falls
# inside the grid. B* is solved exactly from equation (1): the bandwidth at which
# T_ar = t_comp + t_u, with the latency and reduction terms kept.


# %%
base = TrainConfig.preset("laptop").replace(batch_size=64, world_size=4, latency="50us",
                                            bandwidth="1Gbit")  # fmt: skip
setups = {
    "cnn (digits, 16-32 channels)": base.replace(
        model="cnn", channels=(16, 32), kernels=(3, 3), hidden=(64,)
    ),  # fmt: skip
    "mlp (digits, 512-512)": base.replace(model="mlp", hidden=(512, 512)),
}
P_CLUSTER = base.world_size
# 1, 2, 5 x 10^k Mbit/s from 1 Mbit/s to 100 Gbit/s, in bytes/s
bandwidths = [m * 10**e * 1e6 / 8 for e in range(6) for m in (1, 2, 5) if m * 10**e <= 100_000]
curves, balance, peak_index, per_param = {}, {}, {}, {}
for name, cfg in setups.items():
    cal = cluster_calibration(cfg)
    gains = []
    for bw in bandwidths:
        net = cal.with_network(bandwidth=bw)
        sync_t = timing.predict("sync", P_CLUSTER, net).iter_time_s
        pipe_t = timing.predict("pipe", P_CLUSTER, net).iter_time_s
        gains.append(sync_t / pipe_t)
    curves[name] = gains
    peak_index[name] = int(np.argmax(gains))
    per_param[name] = cal.t_comp / cal.n_params  # seconds of compute per parameter
    # B*: T_ar(B*) = t_comp + t_u. Equation (1) at infinite bandwidth is its fixed part
    # (2(p-1) hops of latency, the reductions); the wire part 2(p-1)/p M/B fills the rest.
    M = 4 * cal.n_params
    fixed = ring_allreduce_time(P_CLUSTER, M, cal.alpha, math.inf, cal.gamma)
    balance[name] = 2 * (P_CLUSTER - 1) / P_CLUSTER * M / (cal.t_comp + cal.t_update - fixed)
    print(f"{name}: {cal.n_params:,} parameters, t_comp {cal.t_comp * 1e3:.2f} ms = "
          f"{cal.t_comp / cal.n_params * 1e9:.1f} ns of compute per parameter")  # fmt: skip
    print(f"    T_ar = t_comp + t_u at B* = {format_bandwidth(balance[name])}; on the grid "
          f"pipe's gain over sync peaks at {max(gains):.2f}x at "
          f"{format_bandwidth(bandwidths[peak_index[name]])} (grid ends: {gains[0]:.2f}x, "
          f"{gains[-1]:.2f}x)")  # fmt: skip
cnn_name, mlp_name = list(setups)
b_ratio = balance[mlp_name] / balance[cnn_name]
t_ratio = per_param[cnn_name] / per_param[mlp_name]
print(f"B* of the MLP / B* of the CNN = {b_ratio:.1f}; compute time per parameter, CNN / MLP "
      f"= {t_ratio:.1f}")  # fmt: skip

if plt is not None:
    fig, ax = plt.subplots(figsize=(7, 4))
    for (name, gains), colour in zip(curves.items(), ("C0", "C1"), strict=True):
        ax.semilogx([b * 8 for b in bandwidths], gains, marker="o", color=colour, label=name)
        ax.axvline(balance[name] * 8, color=colour, ls=":", lw=1)  # B*: T_ar = t_comp + t_u
    ax.set_xlabel("link bandwidth (bit/s); dotted: B*, where T_ar = t_comp + t_u")
    ax.set_ylabel("predicted sync / pipe iteration time")
    ax.legend()
    save_figure(fig, OUT / "11_where_pipelining_pays.png")

# %% [markdown]
# Each curve peaks near its B* (the grid is coarse: 1, 2, 5 per decade) and falls on both
# sides: below it the network is the bottleneck and pipelining hides only the compute, above
# it the compute is and pipelining hides only the (shrinking) communication. The ratio of the
# two B* is close to the ratio of the two compute times per parameter, as the formula says,
# whatever the two parameter counts.
#
# `pipesgd compare --model cnn` runs the whole comparison on LeNet-5 and 5,000 MNIST images
# (the `compare-cnn` preset: a link on which the CNN is communication-heavy on this machine's
# shared cores) and `--preset compare-cnn-compute` the compute-bound case.
#
# ## 5. Pipe-SGD trains the CNN, bitwise its oracle

# %%
small_cnn = dict(model="cnn", channels=(3, 4), kernels=(3, 3), hidden=(8,))
cfg = TrainConfig.preset("tiny").replace(steps=10 if SMALL else 40, lr=0.05, **small_cnn)
results = launch_local(2, pipe_worker, (cfg,), start_method="fork", timeout=30)
setup = Worker.build(cfg, 0, 2)
oracle = delayed_sgd(model_grad_fn(setup.model, setup.data, setup.sampler), setup.params, 2,
                     cfg.steps, cfg.lr_at, staleness=1)  # fmt: skip
same = all(np.array_equal(r.params, oracle.params) for r in results)
print(f"pipe on 2 workers, {cfg.steps} steps of the CNN: bitwise the oracle: {same}")

# %%
assert np.allclose(by_loops, by_matmul), "im2col + matmul is the convolution"
assert abs(lhs - rhs) < 1e-9 * max(1.0, abs(lhs)), "col2im is im2col's adjoint"
assert ratio_cnn > 5, f"LeNet-5 should do several multiply-adds per parameter: {ratio_cnn:.1f}"
for name, i in peak_index.items():
    assert 0 < i < len(bandwidths) - 1, (
        f"{name}: pipe's gain peaks at the edge of the grid ({format_bandwidth(bandwidths[i])}), "
        f"so the grid does not show where it peaks; widen it"
    )
    assert balance[name] / 2.5 <= bandwidths[i] <= balance[name] * 2.5, (
        f"{name}: the gain should peak within one grid step of B*, where T_ar = t_comp + t_u "
        f"({format_bandwidth(balance[name])}); it peaks at {format_bandwidth(bandwidths[i])}"
    )
assert balance[cnn_name] < balance[mlp_name] / 3, (
    f"the CNN computes far longer per parameter, so it should balance on a much slower link: "
    f"B* {format_bandwidth(balance[cnn_name])} against the MLP's "
    f"{format_bandwidth(balance[mlp_name])}"
)
assert abs(b_ratio / t_ratio - 1) < 0.3, (
    f"B* should scale with 1 / (compute time per parameter) up to the latency terms: the B* "
    f"ratio {b_ratio:.1f} is far from the per-parameter time ratio {t_ratio:.1f}"
)
assert same, "the distributed CNN run differs from the oracle"
print("all checks passed")

# %% [markdown]
# ## Summary
#
# - im2col turns a convolution into one matrix product (`cols @ filters`), so the CNN runs on
#   the same dense kernels as the MLP, at the price of k*k copies of every pixel; col2im, its
#   adjoint, gives the input gradient.
# - A conv layer reuses each weight at every position: LeNet-5 does about six multiply-adds per
#   parameter per image, an MLP one.
# - Pipelining pays most where communication and computation take about as long, at
#   B* ≈ 2(p−1)/p · 4 bytes / (compute time per parameter): the parameter count cancels. The
#   CNN reaches that point on a much slower link than the MLP: per byte of gradient it has more
#   work to hide communication under.
#
# ## Exercises
#
# Each exercise with a single answer has a cell that checks it: put your answer in place of
# `None` and run the cell.

# %% [markdown]
# **1.** Write im2col for stride 2 by hand: a function of an NHWC image X (B, H, W, C) that
# returns cols for a 3 x 3 window, padding 1, stride 2. Check it on the 4 x 4 image of
# section 1 against `ops.im2col(X, 3, 3, 2, 1, cols)`.
#
# <details><summary>Hint</summary>
#
# With stride s the output has Ho = (H + 2·pad − k) // s + 1 rows (2 for the 4 x 4 image), and
# output pixel (i, j) reads the window whose top-left corner is (i·s − pad, j·s − pad). Pad
# the image with zeros (`np.pad`), then copy each window into one row, its pixels in (u, v, c)
# order.
#
# </details>

# %%
answer = None  # your answer: a function X (B, H, W, C) -> cols (B*Ho*Wo, 9*C)
check("11.1", answer)

# %% [markdown]
# **2.** Max-pooling's backward sends each gradient to one pixel. A 2 x 2 window holds
# [[3, 7], [7, 1]]: two equal maxima. Which position u·2 + v (0 to 3, row-major) does
# `ops.maxpool_forward` record, and so receive the gradient? Why must every backend (NumPy,
# Numba, CUDA) agree on that?
#
# <details><summary>Hint</summary>
#
# Read `maxpool_forward`'s docstring, or run it on a (1, 2, 2, 1) array with
# `Y = np.empty((1, 1, 1, 1))` and `argmax = np.empty((1, 1, 1, 1), np.int32)`. As for the
# why: a different choice sends the gradient to another pixel, so the weights, and with them
# the bitwise checks between backends and against the oracle, would differ.
#
# </details>

# %%
answer = None  # your answer: the position u*2 + v that receives the gradient (an int)
check("11.2", answer)

# %% [markdown]
# **3.** cols holds k*k copies of the input. For LeNet-5's first layer (section 3) at batch 32
# on MNIST, in float32, how many bytes is that? How does it compare with the layer's weights?
#
# <details><summary>Hint</summary>
#
# cols has B·Ho·Wo rows of k·k·Cin entries; "same" padding keeps Ho = Wo = 28, k = 5 and
# Cin = 1 (`lenet.maps[0]` and `lenet.kernels[0]`). The layer's weights are k·k·Cin·Cout
# filters plus Cout biases.
#
# </details>

# %%
answer = None  # your answer: bytes of cols for LeNet-5's first layer, batch 32, float32
check("11.3", answer)

# %% [markdown]
# **4.** Run `pipesgd compare --preset compare-cnn-compute --quick`: where does pipe's time go,
# and why is its gain over sync small?
#
# <details><summary>Hint</summary>
#
# Look at the time breakdown figure and the "bound" column of the predictions: when t_comp
# is far above T_ar, the link is well to the right of B* in section 4's figure, and pipelining
# can hide at most T_ar, a small part of sync's t_comp + T_ar.
#
# </details>

# %% [markdown]
# **5.** Make LeNet-5 wider, `CNN((1, 28, 28), 10, channels=(32, 64))` (`--channels 32,64`).
# How many multiply-adds per parameter does it do per image: more or fewer than LeNet-5's?
#
# <details><summary>Hint</summary>
#
# `flops_per_sample() / n_params`. Widening multiplies a conv layer's weights and its work by
# the same factor, but the dense head's first layer grows with the channels of the last map
# too, and it does one multiply-add per weight.
#
# </details>

# %%
answer = None  # your answer: multiply-adds per parameter of the wider LeNet-5, per image
check("11.5", answer)

# %% [markdown]
# **6.** Add to `setups` in section 4 an MLP as small as the CNN: one hidden layer of 182
# (about 13,700 parameters). Where does pipe's gain over sync peak, and why does the assert on
# the grid's edges fail for it?
#
# <details><summary>Hint</summary>
#
# Compare its t_comp with the ring's fixed cost, 2(p−1)·α = 0.3 ms at α = 50 µs. If computing
# the gradient takes less than the hops' latency, T_ar stays above t_comp at any bandwidth:
# there is no B*, and the gain only creeps up towards 1 + t_comp / (2(p−1)·α) as the link gets
# faster. Few parameters do not make a model easy to pipeline; much compute per parameter does.
#
# </details>

# %% [markdown]
# Written solutions to every exercise above, with the reasoning: docs/solutions.md, section 11
# (on the site, the page "Solutions to the exercises").
