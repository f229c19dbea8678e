# %% [markdown]
# # 07 · Compression inside the AllReduce: fewer bytes per hop, and what they cost
#
# **A number to start with.** A 25 MB gradient (6.25 million float32), p = 4 workers, 1 Gbit/s
# links (125 MB/s). The ring AllReduce sends 2(p−1)/p · M = 37.5 MB through every link: **300
# ms** per iteration on the wire. Keep only the high 16 bits of each float32 and it is 18.75 MB,
# **150 ms**; send 8-bit codes with one scale per chunk and it is about 9.4 MB, **75 ms**. Over
# 10 000 iterations 8-bit codes save 37 minutes of pure transfer. That is Pipe-SGD's second
# lever, light compression inside the AllReduce (Li et al., NeurIPS 2018; docs/paper.md,
# section 5): the ratio r divides the bandwidth term of the ring (equations (1) and (2) of
# docs/paper.md),
#
#     T_ring = 2(p−1)·α + 2(p−1)/p · M/(r·B)   (+ the codec's passes over the data)
#
# but nothing is free. Compressed codes cannot be added, so every hop of the reduce-scatter
# decodes, adds and re-encodes, and every re-encoding rounds once more: the error compounds
# over the p−1 hops.
#
# You will:
# 1. see what truncation (trunc16), rounding to bfloat16 (bf16) and 8-bit quantization (q8) do
#    to a real gradient of the digits MLP;
# 2. see why codes cannot be added in the ring, and hence decode-add-re-encode per hop;
# 3. follow the error hop by hop and measure its growth with p against the documented bound,
#    with `simulate_compressed_allreduce`;
# 4. run the compressed ring over sockets in 4 processes: bitwise the simulation, and
#    2(p−1)/p · M/r bytes per rank;
# 5. time it on an emulated 1 Gbit/s link;
# 6. train digits with Pipe-SGD under each codec, with and without error feedback, and
#    measure what error feedback changes.
#
# Run it with `python tutorials/07_compression.py`. Takes 10 to 30 s here on two cores, the
# more the busier the machine (10 to 20 s with `PIPESGD_TUTORIAL_SMALL=1`, the quick version
# CI runs).

# %%
import os
import time
from pathlib import Path

import numpy as np

from pipesgd_ref.codecs import get_codec
from pipesgd_ref.comm.collectives import allreduce, barrier
from pipesgd_ref.comm.netem import LinkSpec
from pipesgd_ref.comm.schedule import (
    SEGMENT_BYTES,
    all_gather_chunks,
    chunk_bounds,
    reduce_scatter_chunks,
    segments,
    simulate_compressed_allreduce,
)
from pipesgd_ref.comm.wire import HEADER
from pipesgd_ref.commands.train import run_training
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.exercises import check
from pipesgd_ref.plots import pyplot, save_figure
from pipesgd_ref.runtime.launch import launch_local
from pipesgd_ref.runtime.worker import Worker
from pipesgd_ref.timing import ring_allreduce_time
from pipesgd_ref.units import format_bandwidth, format_bytes, format_seconds

SMALL = os.environ.get("PIPESGD_TUTORIAL_SMALL") == "1"  # CI: smaller runs, same lessons
# As a script, beside this file; as a notebook (Jupyter, VS Code, nbconvert), in the
# notebook's own folder, which is where a notebook runs.
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
OUT = HERE / "out"  # figures go here (git-ignored)

plt = pyplot()  # None without matplotlib: the lessons are in the printed numbers and asserts


def quiet(*_) -> None:
    """A `log` for run_training that prints nothing (this tutorial prints its own tables)."""


# %% [markdown]
# ## 0. The back-of-envelope, in code
#
# `get_codec(name)` returns a codec object; its `ratio` is the nominal r of the timing model
# (q8's 4-byte scale per chunk segment makes its true ratio a hair under 4). α = 100 µs is an
# assumed LAN latency; the codec's own passes over the data are left out here and measured in
# section 5.

# %%
P = 4


# T_ring = 2(p-1)*alpha + 2(p-1)/p * M/(r B): `timing.ring_allreduce_time` with the codec's ratio
# r (its reduction and codec-pass terms stay zero here; section 5 measures those).
M_open, B_1g, alpha_lan = 25e6, 1e9 / 8, 100e-6
print(f"{format_bytes(M_open)} gradient, p = {P}, {format_bandwidth(B_1g)}, alpha 100 us:")
print("   codec | ratio | bytes per link | T_ring    | saved per iteration | per 10k iterations")
T_open = {}
for name in ("none", "trunc16", "q8"):
    r = get_codec(name).ratio
    T_open[name] = ring_allreduce_time(P, M_open, alpha_lan, B_1g, ratio=r)
    saved = T_open["none"] - T_open[name]
    print(f"{name:>8} | {r:5.1f} | {format_bytes(2 * (P - 1) / P * M_open / r):>14} | "
          f"{format_seconds(T_open[name]):>9} | {format_seconds(saved) if saved else '-':>19} | "
          f"{saved * 1e4 / 60:7.1f} min")  # fmt: skip

# %% [markdown]
# ## 1. What the codecs do to a real gradient
#
# The codecs of `pipesgd_ref/codecs/`, for n float32 values:
#
# - **trunc16** keeps the high 16 bits of each float32 (sign, 8-bit exponent, 7 mantissa bits)
#   and drops the rest: rounding *toward zero*, relative error in (−2^−7, 0] for normal numbers.
# - **bf16** rounds to the nearest bfloat16 instead (the same 16 bits, ties to even): relative
#   error within ±2^−8, and unbiased.
# - **q8** sends one float32 scale = max|x|/127 per call (per chunk segment, in the ring) and
#   one int8 code per value, rint(x/scale): absolute error within ±scale/2, the same for every
#   value of the chunk, however small the value.
#
# `encode(values, codes)` and `decode(codes, values)` work on caller-owned buffers of
# `wire_bytes(n)` bytes. Here is one real gradient: worker 0's first minibatch of the
# `laptop` preset (digits, MLP 64-64-10), from `Worker`, exactly what a worker computes.

# %%
laptop = TrainConfig.preset("laptop")
worker = Worker.build(laptop, 0, laptop.world_size)
grad = np.empty_like(worker.params)
worker.loss_and_grad(0, grad)
print(f"{worker.model}: gradient of {grad.size} float32 ({format_bytes(4 * grad.size)}), "
      f"max |g| = {np.abs(grad).max():.3g}, median |g| = {np.median(np.abs(grad)):.3g}, "
      f"{int((grad == 0).sum())} exact zeros")  # fmt: skip


def roundtrip(name: str, x: np.ndarray) -> np.ndarray:
    """decode(encode(x)) with codec `name`: what the receiver of x's codes sees."""
    codec = get_codec(name)
    codes = np.empty(codec.wire_bytes(x.size), np.uint8)
    codec.encode(x, codes)
    out = np.empty_like(x)
    codec.decode(codes, out)
    return out


normal = np.abs(grad) >= np.finfo(np.float32).tiny  # the relative bounds hold for normal numbers
rel_err = {name: (roundtrip(name, grad)[normal] - grad[normal]) / grad[normal]
           for name in ("trunc16", "bf16")}  # fmt: skip
q8_codes = np.empty(get_codec("q8").wire_bytes(grad.size), np.uint8)
get_codec("q8").encode(grad, q8_codes)  # one call over the whole gradient: one scale
q8_scale = q8_codes[:4].view(np.float32)[0]  # the wire's first 4 bytes: max|g| / 127
q8_err = roundtrip("q8", grad).astype(np.float64) - grad
nonzero = grad != 0
q8_zeroed = (roundtrip("q8", grad) == 0) & nonzero
zeroed_share = q8_zeroed.sum() / nonzero.sum()
print("   codec | relative error: min       max        mean       | documented bound")
for name, bound in (("trunc16", "(-2^-7, 0]"), ("bf16", "[-2^-8, 2^-8]")):
    e = rel_err[name]
    print(f"{name:>8} | {e.min():+.3e} {e.max():+.3e} {e.mean():+.3e} | {bound} = "
          f"{'(-7.8e-3, 0]' if name == 'trunc16' else '[-3.9e-3, 3.9e-3]'}")  # fmt: skip
print(f"      q8 | absolute error / scale: min {q8_err.min() / q8_scale:+.3f}, max "
      f"{q8_err.max() / q8_scale:+.3f}, mean {q8_err.mean() / q8_scale:+.4f} | bound [-1/2, 1/2] "
      f"(scale = max|g| / 127 = {q8_scale:.3g})")  # fmt: skip
print(f"      q8 | {zeroed_share:.1%} of the nonzero entries decode to 0 (|g| < scale/2); "
      f"they hold {np.linalg.norm(grad[q8_zeroed]) / np.linalg.norm(grad):.1%} of the "
      f"gradient's norm")  # fmt: skip
q8_rel_norm = np.linalg.norm(q8_err) / np.linalg.norm(grad)
t16_rel_norm = np.linalg.norm(rel_err["trunc16"] * grad[normal]) / np.linalg.norm(grad)
print(f"relative error of the whole vector, |decoded - g| / |g|: trunc16 {t16_rel_norm:.1e}, "
      f"q8 {q8_rel_norm:.1e}")  # fmt: skip

if plt is not None:
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    bins = np.linspace(-(2.0**-7) * 1.1, 2.0**-8 * 1.6, 80)
    for name, colour in (("trunc16", "C0"), ("bf16", "C1")):
        axes[0].hist(rel_err[name], bins=bins, alpha=0.6, color=colour, label=name)
    for x, ls in ((-(2.0**-7), "-"), (-(2.0**-8), "--"), (2.0**-8, "--")):
        axes[0].axvline(x, color="k", ls=ls, lw=0.8)
    axes[0].set(xlabel="relative error (decoded - g) / g", ylabel="entries",
                title="16-bit codes: trunc16 (toward 0) vs bf16 (nearest)")  # fmt: skip
    axes[0].legend(fontsize=8)
    axes[1].hist(q8_err[nonzero] / q8_scale, bins=60, color="C2")  # exact zeros stay exact
    for x in (-0.5, 0.5):
        axes[1].axvline(x, color="k", ls="--", lw=0.8)
    axes[1].set(xlabel="absolute error / scale  (scale = max|g| / 127)", ylabel="entries",
                title=f"q8: {zeroed_share:.0%} of the nonzero entries decode to 0")  # fmt: skip
    save_figure(fig, OUT / "07_codec_errors.png")
else:
    print("matplotlib is not installed: plots skipped")

# %% [markdown]
# trunc16's errors all lie on one side: every value shrinks toward zero (by about 0.3% of
# itself on average, here), so truncation is **biased**. bf16's errors are half as large, of
# either sign, and average out. q8's absolute error fills ±scale/2 evenly, whatever the size of
# the value: a gradient's entries span orders of magnitude (the median is a twentieth of the
# largest here), so with one scale for the whole vector the smallest entries round to zero
# and the small ones keep one or two significant bits. Over the whole vector q8's error is
# several times that of the 16-bit codecs (printed above); it leans on one scale per chunk to
# keep the step small, and section 6 tries error feedback.
#
# ## 2. Why codes cannot be added
#
# A ring hop receives its left neighbour's partial sum and adds its own chunk. With plain
# float32 it adds and forwards. With codes, could it add the codes and forward the sum, never
# decoding? No, for three reasons, each shown below:
#
# 1. **Rounding does not commute with addition**: decode(encode(a)) + decode(encode(b)) is in
#    general not decode(encode(a + b)), and it need not even be representable as a code, so
#    it has to be encoded again before it can go on the wire.
# 2. **trunc16 codes are bit patterns, not numbers**: adding two as integers adds exponents
#    and mantissas as if they were one number. 1.0 is 0x3F80; 0x3F80 + 0x3F80 = 0x7F00, which
#    decodes to 1.7·10^38.
# 3. **q8 codes are in units of their own chunk's scale**: the codes of two chunks with
#    different scales are in different units, and their int8 sum overflows silently besides.

# %%
rng = np.random.default_rng(0)
a, b = (rng.standard_normal(100_000).astype(np.float32) for _ in range(2))
for name in ("trunc16", "bf16", "q8"):
    separate = roundtrip(name, a) + roundtrip(name, b)
    together = roundtrip(name, a + b)
    differ = float(np.mean(separate != together))
    gap = np.abs(separate - together).max()
    print(f"{name:>8}: decode(encode(a)) + decode(encode(b)) != decode(encode(a + b)) for "
          f"{differ:.1%} of 100 000 N(0,1) pairs; max difference {gap:.2e}")  # fmt: skip

t16 = get_codec("trunc16")
one = np.ones(1, np.float32)
one_codes = np.empty(t16.wire_bytes(1), np.uint8)
t16.encode(one, one_codes)
summed_bits = one_codes.view(np.uint16) + one_codes.view(np.uint16)  # the codes, added as ints
bits_decoded = np.empty(1, np.float32)
t16.decode(summed_bits.view(np.uint8), bits_decoded)
print(f"trunc16: code(1.0) = 0x{int(one_codes.view(np.uint16)[0]):04X}; adding the codes as "
      f"integers gives 0x{int(summed_bits[0]):04X}, which decodes to "
      f"{bits_decoded[0]:.3g}")  # fmt: skip

q8 = get_codec("q8")
small = np.array([0.5, -1.0, 1.0], np.float32)  # scale 1/127
large = np.array([50.0, 100.0, 90.0], np.float32)  # scale 100/127
codes_small = np.empty(q8.wire_bytes(3), np.uint8)
codes_large = np.empty(q8.wire_bytes(3), np.uint8)
q8.encode(small, codes_small)
q8.encode(large, codes_large)
scale_small, scale_large = codes_small[:4].view(np.float32)[0], codes_large[:4].view(np.float32)[0]
raw_sum = codes_small[4:].view(np.int8) + codes_large[4:].view(np.int8)  # int8: wraps at 127
print(f"q8: codes {codes_small[4:].view(np.int8)} (scale {scale_small:.4f}) + codes "
      f"{codes_large[4:].view(np.int8)} (scale {scale_large:.4f}) = int8 {raw_sum}")  # fmt: skip
print(f"    decoded with either scale: {raw_sum * scale_small} or {raw_sum * scale_large}; "
      f"the true sum is {small + large}")  # fmt: skip
decode_add = small.copy()  # what a ring hop does: decode the arriving codes and add, in one pass
q8.add_decoded_into(codes_large, decode_add)
print(f"    decode-add (add_decoded_into): {decode_add}; re-encoded for the next hop: "
      f"{roundtrip('q8', decode_add)}")  # fmt: skip

# %% [markdown]
# Hence the compressed ring of `pipesgd_ref/comm/compressed_ring.py`: every reduce-scatter hop
# decodes what arrives, adds it to its own chunk (`add_decoded_into` fuses the two), and
# **encodes the partial sum again** for the next hop. The rank that completes a chunk encodes
# it one last time and keeps the *decoded* codes itself, and the all-gather forwards those final
# codes unchanged, so every rank decodes the same bytes: the results are still bitwise identical
# on all ranks. The cost: (p−1) decode-add and (p−1) encode passes over M/p bytes, plus (p−1)
# decodes in the all-gather.
#
# ## 3. The error, hop by hop, and its growth with p
#
# Take chunk 0 of a p-rank ring. Rank 0 encodes its term x_0 (the partial sum S_1 = x_0), rank
# 1 decodes, adds x_1 and encodes S_2, ..., rank p−1 adds the last term and encodes S_p: p
# encodings, each rounding the partial sum it encodes once. So the error of the result is at
# most the sum of the per-encoding errors (compressed_ring.py's docstring), per element:
#
#     trunc16:  |result − exact| ≤ 2^−7 · Σ_k |S_k|        bf16: 2^−8 · Σ_k |S_k|
#     q8:       |result − exact| ≤ Σ_k max_chunk |S_k| / 254   (half a step per encoding)
#
# The bound is first order: each encoding rounds the *computed* partial sum, which already
# carries the earlier errors (a factor at most (1 + 2^−7)^p ≤ 1.07 for p ≤ 8), and the float32
# additions round too (2^−24 relative); we allow a factor 1.1, plus p·2^−126 for values below
# float32's normal range. The data: the first-minibatch gradients of p digits workers.
#
# First, one chunk by hand with p = 8, hop by hop, using the codec exactly as a hop does; the
# result must be bitwise what `simulate_compressed_allreduce` gives for chunk 0.

# %%
SLACK = 1.1
TINY = float(np.finfo(np.float32).tiny)


def worker_gradients(p: int) -> list[np.ndarray]:
    """Each of p digits workers' gradient on its first minibatch (laptop preset, same w_0)."""
    cfg = laptop.replace(world_size=p)
    grads = []
    for r in range(p):
        worker = Worker.build(cfg, r, p)
        g = np.empty_like(worker.params)
        worker.loss_and_grad(0, g)
        grads.append(g)
    return grads


def decoded(codec, codes: np.ndarray, n: int) -> np.ndarray:
    """decode(codes) into a fresh array of n float32."""
    out = np.empty(n, np.float32)
    codec.decode(codes, out)
    return out


def hop_by_hop(terms: list[np.ndarray], name: str) -> list[np.ndarray]:
    """The decoded partial sums S_1..S_p of one chunk as the ring computes them: encode x_0;
    each hop k decodes, adds x_k and re-encodes. Returns decode(codes) after every encoding."""
    codec = get_codec(name)
    codes = np.empty(codec.wire_bytes(terms[0].size), np.uint8)
    codec.encode(terms[0], codes)
    seen = [decoded(codec, codes, terms[0].size)]
    for x in terms[1:]:
        partial = x.copy()
        codec.add_decoded_into(codes, partial)  # x_k + decode(partial sum so far)
        codec.encode(partial, codes)
        seen.append(decoded(codec, codes, x.size))
    return seen


def ring_bound(terms: list[np.ndarray], name: str) -> np.ndarray:
    """The documented per-element bound for one chunk summed in the order of `terms`."""
    partial_sums = np.cumsum(np.array(terms, np.float64), axis=0)  # S_1..S_p, exact enough
    if name == "q8":  # half a step per encoding; the step is chunk-wide (one segment)
        first_order = np.full(terms[0].size, np.abs(partial_sums).max(axis=1).sum() / 254)
    else:
        first_order = {"trunc16": 2.0**-7, "bf16": 2.0**-8}[name] * np.abs(partial_sums).sum(0)
    return SLACK * first_order + len(terms) * TINY


p_demo = 8
grads8 = worker_gradients(p_demo)
c0 = slice(*chunk_bounds(grads8[0].size, p_demo)[0])
terms0 = [g[c0] for g in grads8]  # chunk 0 is summed x_0 + x_1 + ... + x_7 (tutorial 02)
exact_partials = np.cumsum(np.array(terms0, np.float64), axis=0)
hand_checks = []
for name in ("trunc16", "q8"):
    seen = hop_by_hop(terms0, name)
    sim = simulate_compressed_allreduce(grads8, get_codec(name))
    hand_checks.append((name, seen[-1].tobytes() == sim[0][c0].tobytes()))
    print(f"{name}, chunk 0 of p = {p_demo} ({terms0[0].size} values): after encoding k, "
          f"max |decoded S_k - S_k| vs the bound so far")  # fmt: skip
    for k in range(p_demo):
        err = np.abs(seen[k] - exact_partials[k]).max()
        bound = ring_bound(terms0[: k + 1], name).max()
        print(f"   k = {k + 1}: {err:.2e}  (bound {bound:.2e})")
    print(f"   by hand == simulate_compressed_allreduce, chunk 0, bitwise: {hand_checks[-1][1]}")

# %% [markdown]
# Now the whole AllReduce for p = 2 … 8 with `simulate_compressed_allreduce(arrays, codec)`,
# which plays the compressed ring in one process with the same segments, codes and order of
# operations as the real one. Each chunk c is summed in ring order x_c + x_{c+1} + …, so the
# bound is computed per chunk in that order. We compare with the exact sum (float64) and
# report the error relative to max |Σ g|, so that codecs and p compare on one scale.

# %%
P_RANGE = range(2, 9)
growth = {name: [] for name in ("trunc16", "bf16", "q8")}  # per p: (max, mean, bound) / max|sum|
bound_ok = []  # (codec, p, worst error / bound)
for p_ in P_RANGE:
    grads = grads8 if p_ == p_demo else worker_gradients(p_)
    exact = np.sum(np.array(grads, np.float64), axis=0)
    bounds_p = chunk_bounds(exact.size, p_)
    assert all(e - s <= SEGMENT_BYTES // 4 for s, e in bounds_p), "one q8 scale per chunk here"
    for name in growth:
        result = simulate_compressed_allreduce(grads, get_codec(name))
        err = np.abs(result[0] - exact)
        bound = np.empty_like(exact)
        for c, (s, e) in enumerate(bounds_p):
            bound[s:e] = ring_bound([grads[(c + j) % p_][s:e] for j in range(p_)], name)
        top = np.abs(exact).max()
        growth[name].append((err.max() / top, err.mean() / top, bound.max() / top))
        bound_ok.append((name, p_, float((err / bound).max())))
print("relative to max|sum|:      max error (bound)              mean error")
for name, rows in growth.items():
    for p_, (mx, mean, bnd) in zip(P_RANGE, rows, strict=True):
        print(f"{name:>8}, p = {p_}: {mx:.2e} ({bnd:.2e})   {mean:.2e}")
print(
    "worst error / bound per codec, over every element and p: "
    + ", ".join(f"{n} {max(w for m, _, w in bound_ok if m == n):.2f}" for n in growth)
)
mean_growth = {name: rows[-1][1] / rows[0][1] for name, rows in growth.items()}
print(f"mean error, p = {P_RANGE[-1]} over p = {P_RANGE[0]} (p grows "
      f"{P_RANGE[-1] // P_RANGE[0]}x): "
      + ", ".join(f"{n} {g:.1f}x" for n, g in mean_growth.items()))  # fmt: skip

if plt is not None:
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for (name, rows), colour in zip(growth.items(), ("C0", "C1", "C2"), strict=True):
        mx, mean, bnd = zip(*rows, strict=True)
        ax.plot(P_RANGE, mx, "o-", color=colour, label=f"{name}: max error")
        ax.plot(P_RANGE, mean, "s:", color=colour, ms=4, label=f"{name}: mean error")
        ax.plot(P_RANGE, bnd, "--", color=colour, lw=1, label=f"{name}: bound (max)")
    ax.set(yscale="log", xlabel="workers p (p encodings per chunk)",
           ylabel="|compressed ring - exact sum| / max|sum|")  # fmt: skip
    ax.set_title("Error of the compressed ring AllReduce, digits gradients", fontsize=10)
    lowest = min(v for rows in growth.values() for row in rows for v in row)
    ax.set_ylim(lowest / 20, None)  # room for the legend below the curves
    ax.legend(fontsize=7, ncol=3, loc="lower right")
    save_figure(fig, OUT / "07_error_growth.png")

# %% [markdown]
# Every element stays under its bound, which grows with p: one more rounding per hop, of a
# partial sum that itself grows. The bound is nearly tight for some element (the worst error
# reaches 0.8 to 0.9 of its own bound, printed above), though the largest errors sit a factor
# of 2 to 5 below the largest bounds for the 16-bit codecs (the plot). q8's curves lie closest
# to their bound: its step is set by the chunk's largest partial sum and is the same for every
# element, so a rounding error near the full half step is likely somewhere. The *mean* error
# tells the two 16-bit codecs apart: truncation shrinks every magnitude, so its per-hop errors
# add up with one sign and its mean error grows about in proportion to p, while bf16's
# round-to-nearest errors have either sign, partly cancel, and grow more like √p (the line
# printed just above). Scaled by
# max|Σ g|, q8's mean error hardly moves with p: its absolute errors grow with the partial sums
# they are a fixed fraction of.
#
# ## 4. The same over sockets: 4 processes
#
# `allreduce(comm, x, op, codec=codec)` (op "sum" or "mean") with any codec but "none" runs
# the compressed ring. As in tutorial 13, `launch_local(p, job, args, transport="tcp")` starts
# p processes linked in a ring of TCP sockets (by name: the default of `pipesgd train`, auto,
# would take shared memory on one host) and returns each rank's result; each rank makes its
# data from (seed, rank) so the parent can regenerate the inputs for the oracle. **Why
# `start_method="fork"`:** the package's default, spawn, would re-import this script in every
# worker and re-run each cell above; fork copies the running process and re-runs nothing.
# Nothing here touches a GPU, so fork is safe (tutorial 13 says more).
#
# The oracle is `simulate_compressed_allreduce`: every rank must hold bitwise its result.
# n is chosen so that a chunk spans more than one segment of `SEGMENT_BYTES` (each segment
# is one codec call, so q8 sends a scale per segment).

# %%


def rank_gradient(seed: int, rank: int, n: int) -> np.ndarray:
    """Rank `rank`'s test vector: N(0, 1) float32 from (seed, rank)."""
    return np.random.default_rng([seed, rank]).standard_normal(n, np.float32)


def compressed_job(comm, n: int, seed: int, names: tuple[str, ...]) -> dict:
    """One rank: for each codec, allreduce (sum) its vector; return (result, bytes it sent)."""
    out = {}
    for name in names:
        x = rank_gradient(seed, comm.rank, n)
        sent_before = comm.bytes_sent
        allreduce(comm, x, codec=get_codec(name))  # in place: x now holds the (compressed) sum
        out[name] = (x, comm.bytes_sent - sent_before)
    return out


def expected_bytes_sent(rank: int, p: int, n: int, name: str) -> int:
    """What rank `rank` puts on the wire: the 2(p-1) chunks it sends (the same schedule as the
    uncompressed ring), each as segments of wire_bytes(len) bytes behind a frame header."""
    codec, bounds = get_codec(name), chunk_bounds(n, p)
    sent = [reduce_scatter_chunks(rank, s, p)[0] for s in range(p - 1)]
    sent += [all_gather_chunks(rank, s, p)[0] for s in range(p - 1)]
    return sum(codec.wire_bytes(e - s) + HEADER.size
               for c in sent for s, e in segments(*bounds[c], SEGMENT_BYTES // 4))  # fmt: skip


n_sock = 2_400_007 if SMALL else 4_800_007  # 9.6 / 19.2 MB: chunks of 1.1 / 2.3 segments
seed = 7
socket_codecs = ("none", "trunc16", "bf16", "q8")
t0 = time.perf_counter()
# fork, not the package's default spawn: see the paragraph above; tcp: the sockets taught here
sock = launch_local(P, compressed_job, (n_sock, seed, socket_codecs), start_method="fork",
                    transport="tcp")  # fmt: skip
print(f"launch_local({P}, compressed_job, ...): {time.perf_counter() - t0:.2f} s for "
      f"{len(socket_codecs)} allreduces of {format_bytes(4 * n_sock)}")  # fmt: skip
sock_inputs = [rank_gradient(seed, r, n_sock) for r in range(P)]
M_sock = 4 * n_sock
sock_checks = {}
print("   codec | ranks identical | == simulation | bytes sent per rank (min..max) | "
      "2(p-1)/p * M/r | = schedule's count (+ heartbeats)")  # fmt: skip
for name in socket_codecs:
    got = [sock[r][name][0] for r in range(P)]
    sent = [sock[r][name][1] for r in range(P)]
    sim = simulate_compressed_allreduce(sock_inputs, get_codec(name))
    identical = all(g.tobytes() == got[0].tobytes() for g in got)
    equals_sim = all(g.tobytes() == s.tobytes() for g, s in zip(got, sim, strict=True))
    model_bytes = 2 * (P - 1) / P * M_sock / get_codec(name).ratio
    exact_count = [expected_bytes_sent(r, P, n_sock, name) for r in range(P)]
    extra = [s - e for s, e in zip(sent, exact_count, strict=True)]  # heartbeats: headers alone
    counted = all(x >= 0 and x % HEADER.size == 0 for x in extra)
    sock_checks[name] = (identical, equals_sim, sent, exact_count, counted, model_bytes)
    print(f"{name:>8} | {identical!s:>15} | {equals_sim!s:>13} | "
          f"{min(sent):>14,}..{max(sent):<14,} | {model_bytes:>14,.0f} | "
          f"{counted} (+{sum(extra) // HEADER.size})")  # fmt: skip

# %% [markdown]
# Every rank holds the same bytes, and they are the simulation's bytes: as for the plain ring,
# the one-process simulation is an exact oracle for the distributed code. Each rank sends
# 2(p−1)/p · M/r: half the bytes for the 16-bit codecs, a quarter for q8, plus a 48-byte header
# per segment and q8's 4-byte scale per segment, which the last column adds up from the ring
# schedule. One more kind of frame may appear: a rank kept waiting by its left neighbour,
# with nothing of its own to send, sends its right one a **heartbeat** every 0.2 s, a header
# alone (48 bytes), so that only the rank next to a dead peer times out. On a busy machine a
# few of them slip in; the count allows whole headers beyond the schedule's bytes, and the
# number in brackets says how many there were (usually none).
#
# ## 5. Time saved on a slow link
#
# Now on an emulated link, α = 100 µs and B = 1 Gbit/s (125 MB/s) per direction
# (`LinkSpec`, passed as `link=` to `launch_local`). The timing precautions are those of
# tutorial 02: a warm-up call per codec, a barrier before each timed call, the average over
# ranks per call and the median over repeats. The data is re-copied before each call, outside
# the timed region (a sum in place would grow it).

# %%


def timing_job(comm, n: int, names: tuple[str, ...], repeats: int) -> dict[str, list[float]]:
    """One rank: `repeats` timed compressed allreduces of n float32 per codec."""
    x0 = rank_gradient(11, comm.rank, n)
    x = np.empty_like(x0)
    times = {}
    for name in names:
        codec = get_codec(name)
        x[:] = x0
        allreduce(comm, x, codec=codec)  # warm-up
        times[name] = []
        for _ in range(repeats):
            x[:] = x0
            barrier(comm)  # all ranks start together
            start = time.perf_counter()
            allreduce(comm, x, codec=codec)
            times[name].append(time.perf_counter() - start)
    return times


link = LinkSpec(latency=100e-6, bandwidth=125e6)
n_time = 500_000 if SMALL else 1_000_000  # 2 MB / 4 MB of float32
M_time = 4 * n_time
timed_codecs = ("none", "trunc16", "q8")
timings = {}  # "loopback" / "emulated" -> codec -> median seconds
t0 = time.perf_counter()
for where, wire in (("loopback", None), ("emulated", link)):
    per_rank = launch_local(P, timing_job, (n_time, timed_codecs, 3 if SMALL else 7),
                            start_method="fork", link=wire, transport="tcp")  # fmt: skip
    timings[where] = {name: float(np.median(np.mean([t[name] for t in per_rank], axis=0)))
                      for name in timed_codecs}  # fmt: skip
measured = timings["emulated"]
print(f"allreduce of {format_bytes(M_time)}, p = {P}, on loopback and on an emulated link "
      f"({link}), {os.cpu_count()} CPU cores: {time.perf_counter() - t0:.1f} s for both "
      f"jobs")  # fmt: skip
print("   codec |  loopback |  emulated | wire formula | formula + loopback | speed-up over none")
for name in timed_codecs:
    wire = ring_allreduce_time(P, M_time, link.latency, link.bandwidth, ratio=get_codec(name).ratio)
    print(f"{name:>8} | {format_seconds(timings['loopback'][name]):>9} | "
          f"{format_seconds(measured[name]):>9} | {format_seconds(wire):>12} | "
          f"{format_seconds(wire + timings['loopback'][name]):>18} | "
          f"{measured['none'] / measured[name]:17.2f}x")  # fmt: skip

# %% [markdown]
# On the emulated link the wire time halves with the 16-bit codec and quarters with q8, and
# the AllReduce gets faster by a good part of that, but not all. The loopback column says why:
# with no bandwidth limit the compressed ring can be *slower* than the plain one. That is the
# price of compression, the codec's passes on every hop (encode, decode-add, decode) on top of
# the per-step software overhead of tutorial 02, with 4 ranks sharing this machine's cores.
# On the emulated link the measurement typically lands between the wire formula and the
# formula plus the loopback time: part of the codec's work overlaps transfers of other
# segments and ranks, part sits on the critical path of each hop. Compression pays when the
# wire time it saves, (1 − 1/r) · 2(p−1)/p · M/B, exceeds what the codec adds: on a slow
# link, not on a fast one (exercise 2).
#
# ## 6. Accuracy: does training notice?
#
# `run_training(cfg)` runs Pipe-SGD (K = 2) on 4 worker processes; `cfg.codec` compresses
# every hop of every AllReduce. `error_feedback=True` makes each worker add to its next
# gradient what encoding its last one dropped (the residual of the worker's *whole* gradient
# as one code: the ring re-encodes partial sums that no worker owns, so the feedback is local,
# as with 1-bit SGD). We compare test accuracies on digits (360 test images: one image is
# 0.28 percentage points).

# %%
train_steps = 150 if SMALL else 600
variants = [("none", False), ("trunc16", False), ("q8", False), ("q8", True)]
trained, final_params = {}, {}
t0 = time.perf_counter()
for name, feedback in variants:
    cfg = laptop.replace(algo="pipe", codec=name, error_feedback=feedback, steps=train_steps)
    summary, results = run_training(cfg, progress=False, log=quiet)
    label = name + (" + error feedback" if feedback else "")
    trained[label] = summary
    final_params[label] = results[0].params
print(f"digits, {laptop.model} {laptop.hidden}, p = {laptop.world_size}, pipe, {train_steps} "
      f"steps each: {time.perf_counter() - t0:.1f} s")  # fmt: skip
print("                codec | test accuracy | final train loss | max|w - w_none| / max|w_none| | "
      "ranks identical")  # fmt: skip
w_none = final_params["none"]
for label, s in trained.items():
    drift = np.abs(final_params[label] - w_none).max() / np.abs(w_none).max()
    print(f"{label:>21} | {s['test_accuracy']:13.4f} | {s['final_train_loss']:16.4f} | "
          f"{drift:29.1e} | {s['params_identical_on_all_ranks']}")  # fmt: skip

# %% [markdown]
# Every variant, with error feedback or without, lands within a few test images of the
# uncompressed run (the check below allows two percentage points). Two measurements say why,
# and what error feedback does change.
#
# **Compression error against SGD's own noise.** A minibatch gradient is itself a noisy
# estimate of the full-batch gradient ∇f. Below, along one worker's run, we compare how far a
# minibatch gradient g is from ∇f with how far q8's decode(encode(g)) is from g, both as a
# share of |∇f|.
#
# **What error feedback guarantees.** The weights move by −lr · Σ_t (what was sent at step t).
# Without feedback, what every step's encoding dropped stays dropped, and the sum is off by all
# those errors together. With feedback each step sends its gradient *plus* what the previous
# step dropped, so the sum telescopes:
#
#     Σ_t sent_t = Σ_t g_t − r_T       (r_T: the residual still held after the last step)
#
# and only one step's rounding is ever missing, however long the run. We follow one worker of
# the `laptop` preset through `train_steps` plain SGD steps (the trajectory itself is not
# compressed: only the bookkeeping differs) and keep both sums, with `Worker.feed_back`, the
# very method the training run above calls, coding the worker's whole gradient as one q8 code
# as it does.

# %%
ef_cfg = laptop.replace(codec="q8", error_feedback=True)
ef_worker = Worker.build(ef_cfg, 0, ef_cfg.world_size)
q8_codec = get_codec("q8")
g = np.empty_like(ef_worker.params)
full = np.empty_like(ef_worker.params)
sum_g, sum_plain, sum_fed = (np.zeros(g.size) for _ in range(3))  # float64 running sums
noise_share, q8_share = [], []  # |g - grad f| / |grad f| and |q8(g) - g| / |grad f|
sum_error = []  # per step: (without feedback, with feedback), |sum sent - sum g| / |sum g|
for t in range(train_steps):
    ef_worker.loss_and_grad(t, g)
    if t % 25 == 0:  # the full-batch gradient at the same weights, now and then
        ef_worker.model.loss_and_grad(ef_worker.params, ef_worker.data.X_train,
                                      ef_worker.data.y_train, full)  # fmt: skip
        noise_share.append(np.linalg.norm(g - full) / np.linalg.norm(full))
        q8_share.append(np.linalg.norm(roundtrip("q8", g) - g) / np.linalg.norm(full))
    sum_g += g
    sum_plain += roundtrip("q8", g)  # without feedback: g's own codes
    fed = g.copy()
    ef_worker.feed_back(fed, q8_codec)  # fed = g + last residual; residual = fed - q8(fed)
    sent = roundtrip("q8", fed)
    sum_fed += sent
    ef_worker.sgd_step(g, t)
    size = np.linalg.norm(sum_g)
    sum_error.append((np.linalg.norm(sum_plain - sum_g) / size,
                      np.linalg.norm(sum_fed - sum_g) / size))  # fmt: skip
last_residual = fed - sent  # r_T: what feed_back holds for the next step
telescope_gap = np.abs(sum_fed - (sum_g - last_residual)).max() / np.abs(sum_g).max()
plain_error, fed_error = sum_error[-1]
noise_ratio = np.mean(noise_share) / np.mean(q8_share)
print(f"one worker, {train_steps} steps: minibatch noise |g - grad f| / |grad f| = "
      f"{np.mean(noise_share):.2f} on average; q8's error |q8(g) - g| / |grad f| = "
      f"{np.mean(q8_share):.3f} ({noise_ratio:.0f}x smaller)")  # fmt: skip
print("error of the sum of what was sent, |sum sent - sum g| / |sum g|:")
for t in sorted({1, 10, 30, 100, train_steps}):
    print(f"   after {t:4d} steps: without feedback {sum_error[t - 1][0]:.1e}, "
          f"with feedback {sum_error[t - 1][1]:.1e}")  # fmt: skip
print(f"with feedback, sum sent = sum g - r_T to {telescope_gap:.1e} (relative; float rounding)")

if plt is not None:
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    steps_axis = np.arange(1, train_steps + 1)
    ax.loglog(steps_axis, [e[0] for e in sum_error], label="q8, no error feedback")
    ax.loglog(steps_axis, [e[1] for e in sum_error], label="q8 + error feedback")
    ax.loglog(steps_axis, sum_error[0][1] / steps_axis, "k:", lw=1, label="1 / T")
    ax.set(xlabel="steps T", ylabel="|Σ sent − Σ g| / |Σ g|",
           title="Error feedback: the compression errors stop adding up")  # fmt: skip
    ax.legend(fontsize=8)
    save_figure(fig, OUT / "07_error_feedback.png")

# %% [markdown]
# q8's error is a small fraction of the noise every minibatch gradient already carries, and
# SGD is built to average that noise out over many steps: one more, smaller source of noise
# disappears in it. That is why no variant's accuracy moves on this problem.
#
# Error feedback's effect is in the sums. Without it, the error of the summed updates falls
# only slowly with the number of steps (the blue curve; the table above). With it the error
# falls like 1/T (the dotted line): the sum is exact but for one residual, as the telescoping
# identity says, and the run prints it holding to float rounding. Here even the
# error without feedback is under a percent of the summed gradient, so the weights hardly
# notice. With a coarse codec (1-bit signs, top-k sparsification) one step's error is of the
# size of the gradient itself; without feedback the summed updates would be off by about as
# much, and that is where error feedback becomes necessary rather than optional. Larger p
# (section 3's error grows with every hop) and training to high precision push the same way.
# (The feedback here is local: it restores what encoding the worker's *own* gradient drops,
# not the roundings of the partial sums that the ring re-encodes at every hop.)
#
# ## 7. Check against the oracle

# %%
ACC_MARGIN = 0.02  # two percentage points, about 7 test images
for name, p_, worst in bound_ok:
    assert worst <= 1, (
        f"{name}, p = {p_}: an element's error is {worst:.2f} x its documented bound "
        f"(2^-7 / 2^-8 sum_k |S_k| for trunc16 / bf16, sum_k max|S_k| / 254 for q8, x {SLACK})"
    )
for name, ok in hand_checks:
    assert ok, f"{name}: the hop-by-hop chunk 0 differs from simulate_compressed_allreduce"
for name in ("trunc16", "bf16"):
    lo, hi = (-(2.0**-7), 0.0) if name == "trunc16" else (-(2.0**-8), 2.0**-8)
    e = rel_err[name]
    assert lo < e.min() and e.max() <= hi, (
        f"{name}: relative error of the digits gradient in [{e.min():.3e}, {e.max():.3e}], "
        f"outside the documented ({lo:.3e}, {hi:.3e}]"
    )
assert np.abs(q8_err).max() <= q8_scale / 2, (
    f"q8: max |error| {np.abs(q8_err).max():.3e} above scale/2 = {q8_scale / 2:.3e}"
)
assert bits_decoded[0] > 1e38, "adding trunc16 codes as integers should not give 2.0"
for name, (identical, equals_sim, sent, exact_count, counted, model_bytes) in sock_checks.items():
    assert identical, f"{name}: the {P} ranks' results differ; the ring must give bitwise equal"
    assert equals_sim, f"{name}: the socket ring differs from simulate_compressed_allreduce"
    assert counted, (
        f"{name}: bytes sent per rank {sent}, expected {exact_count} from the schedule, plus "
        f"whole {HEADER.size}-byte heartbeat frames at most"
    )
    assert all(abs(s - model_bytes) / model_bytes < 0.01 for s in sent), (
        f"{name}: bytes sent per rank {sent} should be within 1% of 2(p-1)/p * M/r = "
        f"{model_bytes:.0f}"
    )
for name in ("trunc16", "q8"):
    assert measured[name] < 0.9 * measured["none"], (
        f"on a {format_bandwidth(link.bandwidth)} link {name} should be clearly faster than none: "
        f"{format_seconds(measured[name])} vs {format_seconds(measured['none'])} for "
        f"{format_bytes(M_time)}"
    )
assert np.mean(q8_share) < np.mean(noise_share) / 10, (
    f"q8's error ({np.mean(q8_share):.3f} of |grad f|) should be far below the minibatch noise "
    f"({np.mean(noise_share):.2f} of |grad f|): that is why training does not notice it"
)
assert telescope_gap < 1e-5, (
    f"with error feedback the sum of what was sent must be the sum of the gradients minus the "
    f"last residual; they differ by {telescope_gap:.1e} (relative)"
)
assert fed_error < plain_error / 10, (
    f"after {train_steps} steps error feedback should leave the summed updates far closer to "
    f"the summed gradients: {fed_error:.1e} with feedback, {plain_error:.1e} without"
)
acc_none = trained["none"]["test_accuracy"]
for label, s in trained.items():
    assert s["params_identical_on_all_ranks"], f"{label}: the ranks' final weights differ"
    assert abs(s["test_accuracy"] - acc_none) <= ACC_MARGIN, (
        f"{label}: test accuracy {s['test_accuracy']:.4f}, more than {ACC_MARGIN} from the "
        f"uncompressed run's {acc_none:.4f}"
    )
print("all checks passed")

# %% [markdown]
# ## Summary
#
# - Compression divides the ring's bandwidth term by r: 2(p−1)/p · M/(r·B), r = 2 for the
#   16-bit codecs (trunc16, bf16) and about 4 for q8 (int8 codes, one scale per segment).
# - trunc16 rounds toward zero (relative error in (−2^−7, 0], biased), bf16 to nearest (±2^−8),
#   q8 to a chunk-wide step of max|x|/127 (absolute error ≤ scale/2, small entries become 0).
# - Codes cannot be added, so each reduce-scatter hop decodes, adds and re-encodes: p roundings
#   per chunk, and an error bounded by the sum of one rounding per partial sum, growing with p.
# - The real compressed ring over sockets is bitwise `simulate_compressed_allreduce` on every
#   rank, and sends 2(p−1)/p · M/r bytes (plus headers and q8's scales).
# - On an emulated 1 Gbit/s link it is faster, though by less than r: the codec's passes and
#   the per-step overhead (the loopback column) eat part of the saving, and on a fast link
#   all of it. On digits, Pipe-SGD with any codec reaches the uncompressed run's accuracy:
#   q8's error is far smaller than the minibatch noise SGD already lives with.
# - Error feedback makes the compression errors stop adding up: the sum of what a worker sent
#   is the sum of its gradients but for one residual, so its error falls like 1/T. It matters
#   where one step's error is large (coarse codecs), not for q8 on digits.
#
# ## Exercises
#
# Each exercise with a single answer has a cell that checks it: put your answer in place of
# `None` and run the cell.

# %% [markdown]
# **1.** In section 3, replace trunc16 by bf16 in the hop-by-hop table. Why does truncation's
# error grow about linearly in the number of hops while rounding to nearest grows more slowly?
# To see it, compute the mean *signed* error after p = 8: with S the exact sum of `grads8`
# (float64) and R what `simulate_compressed_allreduce(grads8, get_codec(name))[0]` returns,
# mean(sign(S) · (R − S)) / max|S|. Check trunc16's; compare with bf16's.
#
# <details><summary>Hint</summary>
#
# sign(S) · (R − S) is negative where the result is smaller in magnitude than the exact sum.
# Truncation only ever shrinks magnitudes, so every hop adds an error of the same sign and
# the mean grows with the number of hops; bf16's errors have either sign and their mean stays
# near zero (two orders of magnitude smaller here).
#
# </details>

# %%
answer = None  # your answer: trunc16's mean(sign(S) * (R - S)) / max|S| at p = 8 (a number)
check("07.1", answer)

# %% [markdown]
# **2.** Section 5 shows that the codec adds work on every hop; the loopback column measures
# it. Suppose q8's passes add c = 5 ms to an AllReduce of 4 MB at p = 4. Above which link
# bandwidth does q8 stop saving time, that is, where does the wire time it saves,
# (1 − 1/r) · 2(p−1)/p · M/B, fall to c? Then read c off your own run and repeat with
# `get_codec(name, "numba")` in `timing_job`.
#
# <details><summary>Hint</summary>
#
# Solve (1 − 1/r) · 2(p−1)/p · M/B = c for B, with r = `get_codec("q8").ratio` and
# M = 4 · 10^6 bytes: B = (1 − 1/r) · 1.5 · M / c, in bytes/s; multiply by 8 for bit/s.
#
# </details>

# %%
answer = None  # your answer: the bandwidth in Mbit/s above which q8 no longer saves time
check("07.2", answer)

# %% [markdown]
# **3.** q8 with `stochastic=True` (`get_codec("q8", stochastic=True)`) rounds up or down at
# random, unbiased. Rerun section 1 and section 3 with it: what happens to the entries that
# decoded to zero, and to the mean error as p grows?
#
# <details><summary>Hint</summary>
#
# A value x between two codes is rounded up with probability equal to its distance from the
# lower one, in steps: small entries now decode to zero only *most* of the time, and to ±scale
# otherwise, so their expected value is right. Each rounding gets noisier (up to a whole step
# instead of half), but the errors no longer lean one way, so over p hops (and over many
# steps) they cancel rather than add up.
#
# </details>

# %% [markdown]
# **4.** Give q8 one scale per *layer* instead of one for the whole gradient: encode each of
# the model's tensors on its own (`worker.model.layout.slots` gives each one's `offset` and
# `size`). How many nonzero entries of section 1's digits gradient `grad` still decode to
# zero?
#
# <details><summary>Hint</summary>
#
# `roundtrip("q8", grad[s.offset : s.offset + s.size])` for each slot s, written into one
# array, then count `(decoded == 0) & (grad != 0)`. A layer whose gradients are all small gets
# a small scale of its own and keeps them, so the count drops well below section 1's.
#
# </details>

# %%
answer = None  # your answer: how many nonzero entries decode to 0 with one scale per layer
check("07.4", answer)

# %% [markdown]
# **5.** Raise `lr` in section 6 toward the stability edge that tutorial 06 found for
# staleness one. Does compression change where Pipe-SGD diverges? Does error feedback help q8
# there?
#
# <details><summary>Hint</summary>
#
# Tutorial 06's bound depends on the curvature and the delay, not on small perturbations of
# the gradient: expect the edge to stay where it is for every codec. Near the edge, look at
# the final train loss rather than the accuracy, and run each setting twice (or with two
# seeds) before you read a difference into it.
#
# </details>

# %% [markdown]
# Written solutions to every exercise above, with the reasoning: docs/solutions.md, section 07
# (on the site, the page "Solutions to the exercises").
