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
# Run it with `python tutorials/11_convolutional_nets.py` (set `PIPESGD_TUTORIAL_SMALL=1` for
# the quick version CI runs).

# %%
import os
from pathlib import Path

import numpy as np

from pipesgd_ref import timing
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.methods.pipe import pipe_worker
from pipesgd_ref.methods.reference import delayed_sgd, model_grad_fn
from pipesgd_ref.models import CNN, MLP
from pipesgd_ref.ops import numpy_ops as ops
from pipesgd_ref.plots import pyplot, save_figure
from pipesgd_ref.runtime.launch import launch_local
from pipesgd_ref.runtime.worker import Worker
from pipesgd_ref.timing.calibrate import cluster_calibration
from pipesgd_ref.units import parse_bandwidth

SMALL = os.environ.get("PIPESGD_TUTORIAL_SMALL") == "1"  # CI: fewer points, same lessons
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
# Pipe-SGD's iteration is max(t_comp, T_ar) where sync's is t_comp + T_ar (PAPER.md section 3):
# the gain is largest, 2x, where communication takes as long as computation, and fades on either
# side. t_comp grows with the work, T_ar with the parameters: the CNN, with more work per
# parameter, reaches that balance on a slower link than an MLP with as many parameters. Below,
# the timing models on a cluster (each worker its own machine), with t_comp timed here.


# %%
base = TrainConfig.preset("laptop").replace(batch_size=64, world_size=4, latency="50us",
                                            bandwidth="1Gbit")  # fmt: skip
setups = {
    "cnn (digits, 16-32 channels)": base.replace(
        model="cnn", channels=(16, 32), kernels=(3, 3), hidden=(64,)
    ),  # fmt: skip
    "mlp (digits, 512-512)": base.replace(model="mlp", hidden=(512, 512)),
}
bandwidths = [parse_bandwidth(b) for b in (
    ("10Mbit", "100Mbit", "1Gbit", "10Gbit") if SMALL else
    ("5Mbit", "10Mbit", "20Mbit", "50Mbit", "100Mbit", "200Mbit", "500Mbit", "1Gbit", "2Gbit",
     "5Gbit", "10Gbit"))]  # fmt: skip
curves = {}
for name, cfg in setups.items():
    cal = cluster_calibration(cfg)
    gains = []
    for bw in bandwidths:
        net = cal.with_network(bandwidth=bw)
        sync_t = timing.predict("sync", 4, net).iter_time_s
        pipe_t = timing.predict("pipe", 4, net).iter_time_s
        gains.append(sync_t / pipe_t)
    best = bandwidths[int(np.argmax(gains))]
    curves[name] = gains
    print(f"{name}: {cal.n_params:,} parameters, t_comp {cal.t_comp * 1e3:.2f} ms, "
          f"{cal.t_comp / cal.n_params * 1e9:.1f} ns of compute per parameter; pipe's gain "
          f"over sync peaks at {max(gains):.2f}x near {best * 8 / 1e6:,.0f} Mbit/s")  # fmt: skip

if plt is not None:
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, gains in curves.items():
        ax.semilogx([b * 8 for b in bandwidths], gains, marker="o", label=name)
    ax.set_xlabel("link bandwidth (bit/s)")
    ax.set_ylabel("predicted sync / pipe iteration time")
    ax.legend()
    save_figure(fig, OUT / "11_where_pipelining_pays.png")

# %% [markdown]
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
cnn_name, mlp_name = list(setups)
peak = {name: bandwidths[int(np.argmax(g))] for name, g in curves.items()}
assert peak[cnn_name] <= peak[mlp_name], f"the CNN's gain should peak on a slower link: {peak}"
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
# - Pipelining pays most where communication and computation take about as long. The CNN
#   reaches that point on a slower link than an MLP: per byte of gradient it has more work to
#   hide communication under.
#
# ## Exercises
#
# 1. Write im2col for stride 2 by hand for the 4 x 4 image and check it against `ops.im2col`.
# 2. Max-pooling's backward sends each gradient to one pixel. Which pixel gets it when a window
#    holds two equal maxima, and why must every backend agree on that?
# 3. cols holds k*k copies of the input. For LeNet-5's first layer at batch 32 on MNIST, how
#    many bytes is that, and how does it compare with the layer's weights?
# 4. Run `pipesgd compare --preset compare-cnn-compute --quick`: where does pipe's time go, and
#    why is its gain over sync small?
# 5. Make the CNN wider (`--channels 32,64`): does its compute per parameter rise or fall?
