# %% [markdown]
# # 02 · Ring AllReduce: the schedule, the sockets, the cost
#
# **A number to start with.** A 100 MB gradient, p = 8 workers, 10 Gbit/s links (1.25 GB/s).
# The obvious way to sum it is to gather every gradient on one rank, add, and broadcast the sum
# back: the root's link carries (p−1)·M = 700 MB in and 700 MB out, 2(p−1)·M = 1.4 GB, which
# takes **1.12 s**. The ring AllReduce sends 2(p−1)/p · M = 175 MB through *every* link instead
# of 1.4 GB through one, and all links work at once: **0.14 s**, p = 8 times faster. The ring's
# cost hardly depends on p at all (it tends to 2M/B), the root's grows linearly with p. This is
# why NCCL, Gloo and Horovod implement a ring AllReduce for large tensors, why Pipe-SGD
# (Li et al., NeurIPS 2018) reduces its gradients with one, and why this project's timing
# models charge its communication with the ring formula (equation (1) of docs/paper.md):
#
#     T_ring = 2(p−1)·α + 2(p−1)/p · M/B   (+ (p−1)/p · M·γ for the additions)
#
# You will:
# 1. compute those two numbers, and how they grow with p;
# 2. walk the ring schedule for p = 4 by hand, with the package's index functions, and watch
#    the chunks accumulate; then check `simulate_allreduce` against `np.sum`;
# 3. run the real `allreduce` over sockets in 4 processes and check exact, bitwise-identical
#    results on every rank;
# 4. time it on loopback and on an emulated 1 ms, 100 MB/s link, compare with the formula, and
#    read the results as nccl-tests does (algbw and busbw);
# 5. set the ring beside recursive doubling and Rabenseifner (and, on one host, the
#    shared-memory group's oneshot and twoshot), find where their costs cross, time them all,
#    and see why the ring still carries Pipe-SGD's gradients.
#
# Run it with `python tutorials/02_ring_allreduce.py`. Takes about 10 s here on two cores
# (about 6 s with `PIPESGD_TUTORIAL_SMALL=1`, the quick version CI runs).

# %%
import os
import time
from pathlib import Path

import numpy as np

from pipesgd_ref.comm import algorithms, choose
from pipesgd_ref.comm.collectives import allreduce, barrier
from pipesgd_ref.comm.netem import LinkSpec
from pipesgd_ref.comm.schedule import (
    SEGMENT_BYTES,
    all_gather_chunks,
    chunk_bounds,
    reduce_scatter_chunks,
    segments,
    simulate_allreduce,
)
from pipesgd_ref.comm.wire import HEADER
from pipesgd_ref.commands.bench_algorithms import fit_one, write_fit
from pipesgd_ref.exercises import check
from pipesgd_ref.plots import pyplot, save_figure
from pipesgd_ref.runtime.launch import launch_local
from pipesgd_ref.timing import ring_allreduce_time
from pipesgd_ref.units import format_bandwidth, format_bytes, format_seconds

SMALL = os.environ.get("PIPESGD_TUTORIAL_SMALL") == "1"  # CI: fewer sizes, same lessons
# As a script, beside this file; as a notebook (Jupyter, VS Code, nbconvert), in the
# notebook's own folder, which is where a notebook runs.
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
OUT = HERE / "out"  # figures go here (git-ignored)

plt = pyplot()  # None without matplotlib: the lessons are in the printed numbers and asserts

# %% [markdown]
# ## 0. The back-of-envelope, in code
#
# Both schemes in the alpha-beta model (α: per-message latency, B: bandwidth per direction of a
# full-duplex link). Gather-and-broadcast: the root receives p−1 gradients (the messages
# pipeline on its link: α + (p−1)·M/B), adds, then sends p−1 copies (the same again). The ring:
# 2(p−1) steps, each moving one chunk of M/p bytes over every link at once:
#
#     T_ring = 2(p−1)·α + 2(p−1)/p · M/B
#
# which is `pipesgd_ref.timing.ring_allreduce_time(p, M, α, B)`, the function the timing
# models of tutorial 04 build on (its optional reduction and codec terms stay zero here).
# α = 50 µs is an assumed LAN latency, as in tutorial 01. The reduction cost γ is left out of
# both.

# %%


def naive_seconds(n_bytes: float, p: int, alpha: float, bandwidth: float) -> float:
    """Gather to the root, add, broadcast: 2*alpha + 2(p-1) * M/B through the root's link."""
    return 2 * alpha + 2 * (p - 1) * n_bytes / bandwidth


M_big, p_big, B_10g, alpha_lan = 100e6, 8, 10e9 / 8, 50e-6
print(f"{format_bytes(M_big)} gradient, p = {p_big}, {format_bandwidth(B_10g)}, alpha 50 us:")
print(f"  gather + broadcast: {format_bytes(2 * (p_big - 1) * M_big)} through the root's link, "
      f"{naive_seconds(M_big, p_big, alpha_lan, B_10g):.3f} s")  # fmt: skip
print(f"  ring:               {format_bytes(2 * (p_big - 1) / p_big * M_big)} through each link, "
      f"{ring_allreduce_time(p_big, M_big, alpha_lan, B_10g):.3f} s")  # fmt: skip
print("   p | gather+broadcast |   ring")
for p_ in (2, 4, 8, 16, 64):
    naive_s = naive_seconds(M_big, p_, alpha_lan, B_10g)
    print(
        f"{p_:4d} | {naive_s:14.3f} s | {ring_allreduce_time(p_, M_big, alpha_lan, B_10g):6.3f} s"
    )

# %% [markdown]
# The ring tends to 2M/B = 0.16 s however many workers join (until the latency term 2(p−1)·α
# catches up: at p = 64 it is 6 ms). The root's link is a bottleneck that grows with p. Even a
# root that overlapped its inbound and outbound traffic perfectly would need (p−1)·M/B, p/2
# times the ring.
#
# ## 1. The schedule by hand, in one process
#
# The flat gradient of n elements is cut into p chunks (`chunk_bounds(n, p)`: sizes differ by at
# most one). Rank r only ever sends to rank r+1 and receives from rank r−1:
#
# - **reduce-scatter**, steps s = 0 … p−2: rank r sends chunk (r − s) mod p to the right, and
#   adds the chunk (r − s − 1) mod p that arrives from the left into its own copy. After p−1
#   steps, rank r holds the complete sum of chunk (r + 1) mod p.
# - **all-gather**, steps s = 0 … p−2: rank r sends chunk (r + 1 − s) mod p, complete, to the
#   right, and overwrites its copy of the chunk (r − s) mod p that arrives from the left.
#
# Those index formulas live once, in `reduce_scatter_chunks(rank, step, p)` and
# `all_gather_chunks(rank, step, p)`, which return (chunk sent, chunk received); the real ring,
# its one-process simulation and the tests all call them. Here is the whole schedule for p = 4.
# Every step, every rank sends exactly one chunk, so all four links are busy at once.

# %%
P = 4
schedule = {"reduce-scatter": reduce_scatter_chunks, "all-gather": all_gather_chunks}
print("cN -> r: sends chunk N to rank r;  cN <- r: receives chunk N from rank r")
print("phase           step | " + " | ".join(f"rank {r}".ljust(16) for r in range(P)))
for phase, chunks_of in schedule.items():
    for step in range(P - 1):
        cells = []
        for r in range(P):
            send, recv = chunks_of(r, step, P)
            # what rank r receives is what its left neighbour sends: the two must agree
            assert recv == chunks_of((r - 1) % P, step, P)[0], (
                f"{phase} step {step}: rank {r} expects chunk {recv}, but rank {(r - 1) % P} "
                f"sends chunk {chunks_of((r - 1) % P, step, P)[0]}"
            )
            cells.append(f"c{send} -> {(r + 1) % P}, c{recv} <- {(r - 1) % P}")
        print(f"{phase:14s}  {step:4d} | " + " | ".join(cells))

# %% [markdown]
# Now watch the data. Give rank r the value 10^r in every element, so that a sum *spells out who
# contributed*: read the digits from the right, the units digit is rank 0's term, the thousands
# digit rank 3's. With n = p = 4 each chunk is one element. The loop below plays the schedule
# with the index functions above: at each step all ranks send at once (a copy of the outgoing
# chunk, as if it were on the wire), then all receive. `simulate_allreduce` is this same loop,
# kept in the package; we check that they agree at the end. A complete chunk (1111) is starred.

# %%
n_demo = 4
bounds = chunk_bounds(n_demo, P)
bufs = [np.full(n_demo, 10.0**r) for r in range(P)]  # rank r contributes 10^r
inputs = [b.copy() for b in bufs]
COMPLETE = sum(10**r for r in range(P))  # 1111: one term from every rank


def show(title: str) -> None:
    print(f"{title}:")
    for r in range(P):
        cells = [f"{int(v):0{P}d}{'*' if v == COMPLETE else ' '}" for v in bufs[r]]
        print(f"  rank {r}: " + "  ".join(cells))


show(f"start (columns are chunks 0..{P - 1})")
for step in range(P - 1):  # reduce-scatter
    wire = [bufs[r][slice(*bounds[reduce_scatter_chunks(r, step, P)[0]])].copy() for r in range(P)]
    for r in range(P):
        dst = bufs[r][slice(*bounds[reduce_scatter_chunks(r, step, P)[1]])]
        dst += wire[(r - 1) % P]  # the running sum from the left, plus this rank's term
    show(f"after reduce-scatter step {step}")
after_reduce_scatter = [b.copy() for b in bufs]
for step in range(P - 1):  # all-gather
    wire = [bufs[r][slice(*bounds[all_gather_chunks(r, step, P)[0]])].copy() for r in range(P)]
    for r in range(P):
        bufs[r][slice(*bounds[all_gather_chunks(r, step, P)[1]])] = wire[(r - 1) % P]
    show(f"after all-gather step {step}")
by_hand_matches = all(
    np.array_equal(a, b) for a, b in zip(bufs, simulate_allreduce(inputs), strict=True)
)
print(f"the hand-played schedule equals simulate_allreduce: {by_hand_matches}")

# %% [markdown]
# Follow chunk 0 (the first column): rank 0 starts it (0001), rank 1 adds its term (0011), rank 2
# (0111), rank 3 (1111). It is complete on rank 3 = rank (0 − 1) mod 4, and the all-gather
# carries it on round the ring to ranks 0, 1 and 2. Each rank did p−1 = 3 additions of one
# chunk, (p−1)/p of the array: the γ term of the formula.
#
# That fixed route also fixes the **order of the additions**: chunk c is always summed as
# ((x_c + x_{c+1}) + x_{c+2}) + … around the ring, by one rank, and everyone else receives a copy
# of its bytes. So in floating point every rank gets *bitwise the same* result, whatever the
# timing, though not bitwise `np.sum`, which adds in rank order 0, 1, 2, 3 (for chunk 0, the two
# orders coincide). Next: random data, a length that p does not divide (n = 10: chunks of
# 3, 3, 2, 2), integer-valued floats (every order of addition is exact) and then random floats.

# %%
rng = np.random.default_rng(0)
int_inputs = [rng.integers(-1000, 1000, 10).astype(np.float32) for _ in range(P)]
int_ring = simulate_allreduce(int_inputs)
int_exact = np.sum(int_inputs, axis=0)
print(f"chunk_bounds(10, {P}) = {chunk_bounds(10, P)}")
print(f"integer-valued: np.sum            {int_exact}")
print(f"                simulate_allreduce {int_ring[0]}")

float_inputs = [rng.standard_normal(100_003, dtype=np.float32) for _ in range(P)]
float_ring = simulate_allreduce(float_inputs)
float_sum = np.sum(float_inputs, axis=0)
sim_ranks_identical = all(r.tobytes() == float_ring[0].tobytes() for r in float_ring)
float_bounds = chunk_bounds(float_sum.size, P)
ordered = np.empty_like(float_sum)  # chunk c summed the ring's way: x_c + x_{c+1} + ...
for c, (a, b) in enumerate(float_bounds):
    acc = float_inputs[c][a:b].copy()
    for k in range(1, P):
        acc += float_inputs[(c + k) % P][a:b]
    ordered[a:b] = acc
float_gap = np.abs(float_ring[0] - float_sum).max()
differ = [int((float_ring[0][a:b] != float_sum[a:b]).sum()) for a, b in float_bounds]
print(f"random float32, n = {float_sum.size}: max |ring - np.sum| = {float_gap:.1e}; "
      f"elements that differ, per chunk: {differ}")  # fmt: skip
print(
    f"  all {P} simulated ranks bitwise identical: {sim_ranks_identical}; "
    f"bitwise equal to the ring-ordered sum: {ordered.tobytes() == float_ring[0].tobytes()}"
)

# %% [markdown]
# ## 2. The same over sockets: 4 processes
#
# `launch_local(p, job, args, transport="tcp")` starts p worker processes, connects them into a
# ring of TCP links (each rank's right link is its left neighbour's left link) and returns the p
# values of `job(comm, *args)`. The job must be a module-level function, because the workers
# call it by name. We ask for `tcp` by name: it is the path between hosts that this section
# teaches, while `pipesgd train` defaults to `auto`, shared memory between ranks on one host
# (section 3b compares the two).
#
# **Why `start_method="fork"` here.** The package's default is spawn, a fresh interpreter per
# worker: a worker must never inherit a CUDA context or a half-started thread. But spawn finds
# the job by *re-importing the script that defined it*, and this script is a tutorial whose top
# level does all the work: each worker would re-run every cell above. fork copies the running
# process instead, jobs included, and re-runs nothing. Nothing here touches a GPU, so fork is
# safe; a training script launched with spawn keeps its top level under
# `if __name__ == "__main__":`.
#
# Each rank makes its own data from (seed, rank), so the parent can regenerate all p inputs for
# the oracle. n = 1 000 003 float32 (4 MB): p does not divide it, and `comm.bytes_sent` tells us
# how many bytes this rank put on the wire.

# %%


def rank_inputs(seed: int, rank: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank `rank`'s two test vectors: integer-valued float32 (sums exact in any order, |sum| <
    2^24) and standard normal float32."""
    rng = np.random.default_rng([seed, rank])
    return rng.integers(-1000, 1000, n).astype(np.float32), rng.standard_normal(n, np.float32)


def allreduce_job(comm, n: int, seed: int) -> tuple[np.ndarray, np.ndarray, int]:
    """One rank: allreduce both vectors; return them and the bytes this rank sent for the first."""
    ints, floats = rank_inputs(seed, comm.rank, n)
    sent_before = comm.bytes_sent
    allreduce(comm, ints)  # in place: ints now holds the sum over all ranks
    wire_bytes = comm.bytes_sent - sent_before
    allreduce(comm, floats)
    return ints, floats, wire_bytes


n_sock, seed = 1_000_003, 7
t0 = time.perf_counter()
# fork, not the package's default spawn: see the paragraph above; tcp: the sockets taught here
sock_results = launch_local(P, allreduce_job, (n_sock, seed), start_method="fork",
                            transport="tcp")  # fmt: skip
print(f"launch_local({P}, allreduce_job, ...): {time.perf_counter() - t0:.2f} s to start "
      f"{P} processes, meet, and allreduce 2 x {format_bytes(4 * n_sock)}")  # fmt: skip

sock_ints, sock_floats, sock_wire = zip(*sock_results, strict=True)
oracle_ints, oracle_floats = zip(*(rank_inputs(seed, r, n_sock) for r in range(P)), strict=True)
exact_sum = np.sum(oracle_ints, axis=0)
sums_exact = [np.array_equal(x, exact_sum) for x in sock_ints]
ranks_identical = all(
    x.tobytes() == sock_ints[0].tobytes() and y.tobytes() == sock_floats[0].tobytes()
    for x, y in zip(sock_ints, sock_floats, strict=True)
)
sock_equals_sim = sock_floats[0].tobytes() == simulate_allreduce(list(oracle_floats))[0].tobytes()
print(f"integer-valued: rank r got exactly the sum, r = 0..{P - 1}: {sums_exact}")
print(f"every rank bitwise identical (both vectors): {ranks_identical}")
print(
    f"random floats: sockets == simulate_allreduce, bitwise: {sock_equals_sim}; "
    f"max |ring - np.sum| = {np.abs(sock_floats[0] - np.sum(oracle_floats, axis=0)).max():.1e}"
)

# What crossed the wire: 2(p-1) chunks of about M/p bytes, each chunk in frames of at most
# SEGMENT_BYTES of payload behind a 48-byte header.
M_sock = 4 * n_sock
frames_per_chunk = len(segments(*chunk_bounds(n_sock, P)[0], SEGMENT_BYTES // 4))
wire_model = 2 * (P - 1) / P * M_sock + 2 * (P - 1) * frames_per_chunk * HEADER.size
print(f"bytes sent per rank: {list(sock_wire)}; 2(p-1)/p*M + headers = {wire_model:.0f} "
      f"({frames_per_chunk} frame(s) of {HEADER.size}-byte header per chunk)")  # fmt: skip
wire_gap = max(abs(w - wire_model) for w in sock_wire) / wire_model

# %% [markdown]
# The integer sums are exact on every rank, the four results are the same bytes, and they are
# the bytes `simulate_allreduce` computes in one process: the simulation is an exact oracle for
# the distributed code, not an approximation of it. The bytes each rank sent are 2(p−1)/p · M =
# 1.5 · M, plus a few headers and the one-element differences between chunk sizes, as the
# formula says.
#
# ## 3. The cost, measured
#
# Timing a collective fairly takes three precautions (the ones nccl-tests takes):
# - a **warm-up** call per size, so the first touch of fresh buffers and growing socket buffers
#   are not billed to the ring;
# - a **barrier** before each timed call, so that all ranks start together and a late rank's
#   start is not counted as ring time;
# - per call, the **average over ranks** of each rank's time (nccl-tests' default, `-a 1`);
#   over repeats we take the median, which ignores the odd scheduler hiccup.
#
# And two ways of reading a time T for M bytes:
# - **algbw = M / T**, the "algorithm bandwidth": how fast the gradient got summed;
# - **busbw = algbw · 2(p−1)/p**, the "bus bandwidth": the rate at which each link actually
#   carried data, since the ring moves 2(p−1)/p · M per link. busbw does not depend on p, and
#   for large M it approaches the link bandwidth B. That makes it the number to compare with
#   the hardware, and across different p (nccl-tests, doc/PERFORMANCE.md).
#
# First on plain loopback: every "link" is a TCP connection inside this machine.

# %%


def timing_job(comm, sizes: list[int], repeats: int) -> dict[int, list[float]]:
    """One rank: for each size in bytes, `repeats` timed allreduces of that many float32 bytes."""
    times = {}
    for nbytes in sizes:
        x = np.zeros(nbytes // 4, np.float32)  # values do not matter for timing; zeros stay 0
        allreduce(comm, x)  # warm-up: first touch of the buffer, socket buffers grow
        times[nbytes] = []
        for _ in range(repeats):
            barrier(comm)  # all ranks start together
            start = time.perf_counter()
            allreduce(comm, x)
            times[nbytes].append(time.perf_counter() - start)
    return times


def measure(sizes: list[int], repeats: int, link: LinkSpec | None = None) -> dict[int, float]:
    """Median over repeats of the rank-averaged allreduce time, per size (P ranks), over TCP
    (the links whose costs this section measures; section 3b times the same-host ones)."""
    per_rank = launch_local(P, timing_job, (sizes, repeats), start_method="fork", link=link,
                            transport="tcp")  # fmt: skip
    return {s: float(np.median(np.mean([t[s] for t in per_rank], axis=0))) for s in sizes}


def bandwidths(n_bytes: float, seconds: float) -> tuple[float, float]:
    """(algbw, busbw) in bytes/s for a ring AllReduce of n_bytes over P ranks in `seconds`."""
    algbw = n_bytes / seconds
    return algbw, algbw * 2 * (P - 1) / P


# bytes; SMALL keeps 16 MB, the size where the formula check has the widest margin on a busy CI
sizes = [64_000, 256_000, 1_000_000, 4_000_000, 16_000_000]
if SMALL:
    sizes = [64_000, 1_000_000, 16_000_000]
repeats = 5 if SMALL else 10
t0 = time.perf_counter()
loopback = measure(sizes, repeats)
print(f"loopback, p = {P} processes on {os.cpu_count()} CPU cores "
      f"({time.perf_counter() - t0:.1f} s for the whole job):")  # fmt: skip
print("     size |      time |       algbw |       busbw")
for s, t in loopback.items():
    algbw, busbw = bandwidths(s, t)
    print(f"{format_bytes(s):>9} | {format_seconds(t):>9} | "
          f"{format_bytes(algbw) + '/s':>11} | {format_bytes(busbw) + '/s':>11}")  # fmt: skip

# the alpha-beta model fitted to loopback: T = a + b*M, with a = 2(p-1)*alpha, b = 2(p-1)/(p B)
slope, intercept = np.polyfit(list(loopback), list(loopback.values()), 1)
print(f"least-squares fit T = a + b*M: a = {format_seconds(intercept)} "
      f"(alpha = a / {2 * (P - 1)} = {format_seconds(intercept / (2 * (P - 1)))}), "
      f"effective B = 2(p-1)/(p b) = {format_bytes(2 * (P - 1) / P / slope)}/s")  # fmt: skip

# %% [markdown]
# Loopback is a poor stand-in for a cluster. Its "latency" is software overhead per ring step:
# Python, the kernel, a hand-off to the sending thread, and, when there are fewer cores than
# ranks, processes waiting for their turn on a core (on a 2-core machine the fit puts α at a few
# hundred microseconds). Its "bandwidth" is memory copies through the kernel, shared with the
# additions (the γ term) and with every other process on the same cores. To see the ring
# behave as on a network, `LinkSpec(latency, bandwidth)` makes every link of the job an
# emulated one: each frame is paced by the sender (a link carries B bytes/s, per direction) and
# delivered α after its last byte (pipesgd_ref/comm/netem.py). Here α = 1 ms and B = 100 MB/s
# (800 Mbit/s), slow enough that the emulated link, not this machine, sets the time.

# %%
link = LinkSpec(latency=1e-3, bandwidth=100e6)
emu_repeats = 3 if SMALL else 5
t0 = time.perf_counter()
emulated = measure(sizes, emu_repeats, link=link)
print(f"emulated link ({link}), p = {P} ({time.perf_counter() - t0:.1f} s for the whole job):")
print("     size |  measured |   formula | measured/formula | gather+bcast |       algbw |"
      "       busbw")  # fmt: skip
bandwidth_bound = []  # sizes where the bandwidth term is >= 4x the latency term
ratios = {}
for s, t in emulated.items():
    predicted = ring_allreduce_time(P, s, link.latency, link.bandwidth)
    naive = naive_seconds(s, P, link.latency, link.bandwidth)
    ratios[s] = t / predicted
    algbw, busbw = bandwidths(s, t)
    if 2 * (P - 1) / P * s / link.bandwidth >= 4 * 2 * (P - 1) * link.latency:
        bandwidth_bound.append(s)
    print(f"{format_bytes(s):>9} | {format_seconds(t):>9} | {format_seconds(predicted):>9} | "
          f"{ratios[s]:16.3f} | {format_seconds(naive):>12} | {format_bytes(algbw) + '/s':>11} | "
          f"{format_bytes(busbw) + '/s':>11}")  # fmt: skip
print(f"latency term 2(p-1)*alpha = {format_seconds(2 * (P - 1) * link.latency)}; the bandwidth "
      f"term is >= 4x that for {[format_bytes(s) for s in bandwidth_bound]}")  # fmt: skip

# %% [markdown]
# Where the bandwidth term dominates, the measurement lands on the formula, and busbw approaches
# the link's 100 MB/s while algbw stays at p/(2(p−1)) = 2/3 of it: busbw is the number that tells
# you the links are saturated. For small messages the 2(p−1) = 6 latencies dominate, and the
# measurement sits above the formula by about the loopback time of the same size: the formula
# has no term for the software overhead of each step, nor for the additions. For chunks larger
# than one segment (`SEGMENT_BYTES` = 2 MiB, so at 16 MB) the ring forwards each segment as
# soon as it is reduced, so a step's latency overlaps the transfer of the rest of the chunk and
# the measurement can come in slightly *under* the formula.
#
# Gather-and-broadcast takes p = 4 times as long once bandwidth dominates, but look at 64 KB:
# there its formula *beats* the ring, 2 latencies against 6. For small messages the step count
# matters more than the bytes, which is why collective libraries switch to trees or recursive
# doubling below some size (section 5, exercise 4), and why PyTorch DDP and Horovod fuse small
# gradients into large buckets before they AllReduce.

# %%
if plt is not None:
    fig, ax = plt.subplots(figsize=(6, 4))
    grid = np.geomspace(min(sizes), max(sizes), 100)
    ax.plot(grid, [ring_allreduce_time(P, s, link.latency, link.bandwidth) for s in grid],
            label="ring, alpha-beta formula")  # fmt: skip
    ax.plot(grid, [naive_seconds(s, P, link.latency, link.bandwidth) for s in grid], ls="--",
            label="gather + broadcast, formula")  # fmt: skip
    ax.plot(list(emulated), list(emulated.values()), "o", label="ring, measured (emulated link)")
    ax.plot(list(loopback), list(loopback.values()), "s", color="grey", ms=4,
            label="ring, measured (loopback)")  # fmt: skip
    ax.set(xscale="log", yscale="log", xlabel="gradient size M (bytes)", ylabel="time (s)")
    ax.set_title(f"AllReduce, p = {P}, emulated link 1 ms, 100 MB/s")
    ax.legend(fontsize=8)
    save_figure(fig, OUT / "02_ring_cost.png")
else:
    print("matplotlib is not installed: plots skipped")

# %% [markdown]
# ## 3b. One host: why the same-host transports are faster
#
# Every run above sent its frames over TCP, the path between hosts. Four ranks on one machine
# need no network: the project can link them with AF_UNIX sockets (`--transport unix`) or with
# shared memory (`--transport shm`, `comm/shm.py`). The count that decides is *copies per
# byte*: on a socket, tcp or unix, the kernel copies every payload byte twice (the sender's
# array into a socket buffer, the socket buffer into the receiver's array), and tcp adds the
# TCP/IP stack's work per 64 KB packet. On `shm` the sender writes the payload once into a slot
# that the receiver maps, and the receiver's `np.add` reads it where it lies: one copy. With 4
# ranks on 2 cores the copies are the CPU the ring spends, so we measure both the wall time and
# the CPU time of one AllReduce per rank.

# %%


def transport_job(comm, n: int, reps: int, seed: int):
    """One rank: the AllReduce of a normal vector (kept, for the check), then `reps` timed
    ones; the best wall time and the mean CPU time (this process, all threads)."""
    x = rank_inputs(seed, comm.rank, n)[1]
    allreduce(comm, x)
    work = np.ones(n, np.float32)
    best, cpu = float("inf"), 0.0
    for _ in range(reps):
        barrier(comm)
        wall0, cpu0 = time.perf_counter(), time.process_time()
        allreduce(comm, work)
        best = min(best, time.perf_counter() - wall0)
        cpu += time.process_time() - cpu0
    return x, best, cpu / reps, comm.transports["right"]


n_tr, tr_reps = (1_000_000, 3) if SMALL else (4_000_000, 8)  # 4 MB / 16 MB of float32
by_transport = {}
for transport in ("tcp", "unix", "shm"):
    got = launch_local(P, transport_job, (n_tr, tr_reps, seed), start_method="fork",
                       transport=transport)  # fmt: skip
    by_transport[transport] = got
    wall = max(r[1] for r in got)  # the slowest rank's best: when the AllReduce is done
    cpu = np.mean([r[2] for r in got])
    print(f"{transport:>5}: {format_bytes(4 * n_tr)} in {format_seconds(wall)}, "
          f"{format_seconds(cpu)} of CPU per rank, "
          f"{cpu / (2 * (P - 1) / P * 4 * n_tr) * 1e9:.2f} ns of CPU per byte sent")  # fmt: skip
want_tr = simulate_allreduce([rank_inputs(seed, r, n_tr)[1] for r in range(P)])[0]
transports_exact = {
    t: all(r[0].tobytes() == want_tr.tobytes() and r[3] == t for r in got)
    for t, got in by_transport.items()
}
print(f"every transport == simulate_allreduce, bitwise, on every rank: {transports_exact}")

# %% [markdown]
# Same frames, same order of additions, so the same bytes on all three; what changes is the
# price of moving them. unix skips the TCP/IP stack but still copies twice; shm copies once and
# hands the receiver's add the sender's bytes in place. On the development machine (2 cores)
# both same-host paths took about half of tcp's time; at 16 and 64 MB shm was the fastest
# (README's "Transports" table), while at 4 MB, where the per-frame header on the socket and
# the slot hand-off weigh as much as a copy, unix and shm came out close. `--transport auto`,
# the default of `pipesgd train` and `compare`, picks shm for ranks on one host and tcp across
# hosts, as MPI libraries and NCCL pick shared memory within a node.

# %% [markdown]
# ## 4. Check against the oracle

# %%
for r in range(P):
    complete = (r + 1) % P
    got = after_reduce_scatter[r][slice(*bounds[complete])]
    assert np.all(got == COMPLETE), (
        f"after reduce-scatter rank {r} should hold the complete sum of chunk {complete} "
        f"({COMPLETE}: one term from each rank); it holds {got}"
    )
    assert np.all(bufs[r] == COMPLETE), (
        f"after all-gather rank {r} should hold {COMPLETE} everywhere: {bufs[r]}"
    )
assert by_hand_matches, "the hand-played schedule and simulate_allreduce disagree"
assert all(np.array_equal(x, int_exact) for x in int_ring), (
    f"simulate_allreduce on integer-valued floats must equal np.sum exactly: expected "
    f"{int_exact}, got {int_ring[0]}"
)
assert sim_ranks_identical, "simulate_allreduce: ranks must end with bitwise identical results"
assert ordered.tobytes() == float_ring[0].tobytes(), (
    "simulate_allreduce should sum chunk c as x_c + x_{c+1} + ... around the ring, bitwise"
)
assert float_gap < 1e-5, f"ring vs np.sum on N(0,1) float32: gap {float_gap:.1e} > 1e-5"
for r, ok in enumerate(sums_exact):
    diff = np.abs(sock_ints[r] - exact_sum).max()
    assert ok, f"sockets: rank {r}'s sum of integer-valued floats is off by up to {diff}"
assert ranks_identical, "sockets: every rank must hold the same bytes after allreduce"
assert sock_equals_sim, "sockets: the real ring must reproduce simulate_allreduce bitwise"
assert wire_gap < 1e-3, (
    f"each rank should send 2(p-1)/p * M = {2 * (P - 1) / P * M_sock:.0f} bytes plus headers, "
    f"sent {list(sock_wire)}"
)
assert bandwidth_bound, "no size in the sweep is bandwidth-bound; the formula check needs one"
for s in bandwidth_bound:
    assert abs(ratios[s] - 1) < 0.2, (
        f"emulated link ({link}), {format_bytes(s)}: measured {format_seconds(emulated[s])}, "
        f"alpha-beta formula {format_seconds(emulated[s] / ratios[s])}"
        f" (ratio {ratios[s]:.2f}, allowed 0.8..1.2)"
    )
for transport, exact in transports_exact.items():
    assert exact, f"--transport {transport}: the ring must reproduce simulate_allreduce bitwise"
print("all checks passed")

# %% [markdown]
# ## 5. Small messages: the algorithm chosen by size
#
# Section 3 ended on a 64 KB message that gather-and-broadcast summed faster than the ring:
# below some size the ring's 2(p−1) latencies cost more than its bytes. So collective libraries
# keep several AllReduce algorithms and choose one per message, by its size (MPICH: Thakur,
# Rabenseifner and Gropp, 2005). The package has two beside the ring, written as schedules in
# `pipesgd_ref/comm/algorithms.py` and run over real links by `comm/mesh.py`:
#
# - **recursive doubling** ("rd"): log2 p steps; at step k rank v exchanges its *whole* array
#   with rank v xor 2^k and adds. The fewest latencies, but M bytes at every step.
# - **Rabenseifner** ("rab"): a reduce-scatter by recursive halving (log2 p steps; at each a rank
#   sends half of the range it still holds, M/2, M/4, …, and adds the half it receives), then
#   an all-gather by recursive doubling (the same sizes back): 2 log2 p steps, and the ring's
#   2(p−1)/p · M bytes.
#
# Both halve and double, so both want p a power of two. For any other p, with p2 the largest
# power of two below p and e = p − p2, the first 2e ranks **fold** first: the even one sends its
# array to the odd one, which adds it, and sits out; p2 ranks run the algorithm; at the end the
# odd one sends the result back. Two more steps, and 2M more bytes on the critical path. With
# q = log2 p2 and f = 1 when p is folded (else 0), in the alpha-beta model:
#
#     ring:  2(p−1)·α     +  2(p−1)/p · M/B
#     rd:    (q + 2f)·α   +  (q + 2f) · M/B
#     rab:   (2q + 2f)·α  +  (2(p2−1)/p2 + 2f) · M/B
#
# `algorithms.cost(algo, p, M, α, B)` evaluates these (its γ term, the additions, stays 0
# here, as in the ring formula), and `choose.steps(algo, p, M)` and `choose.volume(algo, p)`
# count the same latencies and bytes per byte of M for the `auto` choice. First the counts,
# taken from the schedules themselves, and the fold played out for p = 6.

# %%
LINK_ALGOS = ("ring", "rd", "rab")
print("   p | steps: ring   rd  rab | bytes per byte of M: ring    rd   rab")
for p_ in (4, 6, 8, 16):
    counts = {a: int(choose.steps(a, p_, 1_000_000)) for a in LINK_ALGOS}
    for a in ("rd", "rab"):  # every rank's schedule is that long (idle steps included)
        lengths = {len(algorithms.schedule(a, r, p_, 1000)) for r in range(p_)}
        assert lengths == {counts[a]}, f"{a}, p = {p_}: schedules of {lengths} steps"
    assert counts["ring"] == 2 * (p_ - 1)
    vols = [choose.volume(a, p_) for a in LINK_ALGOS]
    print(f"{p_:4d} | {counts['ring']:10d} {counts['rd']:4d} {counts['rab']:4d} | "
          f"{vols[0]:25.2f} {vols[1]:5.2f} {vols[2]:5.2f}")  # fmt: skip


def describe_hop(hop: algorithms.Hop | None) -> str:
    """One step of one rank: '<-> 3 +' exchanges with rank 3 and adds, '-> 1' only sends,
    '<- 1 =' receives and copies over; 'idle'."""
    if hop is None:
        return "idle"
    arrow = "<->" if hop.send and hop.recv else ("->" if hop.send else "<-")
    return f"{arrow} {hop.peer}" + ("" if not hop.recv else " +" if hop.add else " =")


p6 = 6
print(f"\nrecursive doubling, p = {p6} (p2, e = {algorithms.split(p6)}); "
      "+ adds what arrives, = copies it over")  # fmt: skip
for r in range(p6):
    cells = [describe_hop(h) for h in algorithms.schedule("rd", r, p6, 12)]
    v = algorithms.virtual_rank(r, p6)
    print(f"  rank {r} (virtual {'-' if v is None else v}): "
          + " | ".join(c.ljust(7) for c in cells))  # fmt: skip
fold_rng = np.random.default_rng(6)
fold_ints = [fold_rng.integers(-1000, 1000, 10).astype(np.float32) for _ in range(p6)]
for a in ("rd", "rab"):  # integer-valued: exact in any order; every rank gets the sum
    fold_sums = algorithms.simulate(a, fold_ints)
    assert all(np.array_equal(x, np.sum(fold_ints, axis=0)) for x in fold_sums), a

# %% [markdown]
# Ranks 0 and 2 hand their arrays to 1 and 3 and sit out, ranks 1, 3, 4, 5 run recursive
# doubling as virtual ranks 0..3 (two steps), and the result goes back: 4 steps instead of
# log2 6 ≈ 2.6. Now the time. On the LAN of section 0 (α = 50 µs, 10 Gbit/s) with p = 8, from
# 1 KB to 256 MB: the table marks the fastest, and the crossover sizes are where two curves
# meet, found by bisection on the models and checked against the formulas solved by hand. With
# r = 2(p−1)/p and p a power of two:
#
#     rd = rab   at  M = q·α·B / (q − r)
#     rd = ring  at  M = (2(p−1) − q)·α·B / (q − r)
#
# and rab never crosses the ring: the same bytes, 2q ≤ 2(p−1) latencies. For p = 6 the fold
# adds two steps and 2M/B to both: the ring overtakes rab at
# M = (2(p−1) − 2q − 2)·α·B / (2(p2−1)/p2 + 2 − r), and rd at
# M = (2(p−1) − q − 2)·α·B / (q + 2 − r).

# %%


def link_cost(algo: str, p: int, nbytes: float, alpha: float, bandwidth: float) -> float:
    """The alpha-beta time of a link algorithm (the ring's from tutorial 04's timing models)."""
    if algo == "ring":
        return ring_allreduce_time(p, nbytes, alpha, bandwidth)
    return algorithms.cost(algo, p, nbytes, alpha, bandwidth)


def crossing(f, g, lo: float = 100.0, hi: float = 1e10) -> float:
    """The M in [lo, hi] where f(M) = g(M), by bisection on log M (f - g changes sign once)."""
    below = f(lo) < g(lo)
    assert below != (f(hi) < g(hi)), "the two curves do not cross between lo and hi"
    for _ in range(100):
        mid = float(np.sqrt(lo * hi))
        lo, hi = (mid, hi) if (f(mid) < g(mid)) == below else (lo, mid)
    return float(np.sqrt(lo * hi))


def curve(algo: str, p: int):
    return lambda m: link_cost(algo, p, m, alpha_lan, B_10g)


p8, aB = 8, alpha_lan * B_10g  # alpha * B: the bytes one latency is worth (62.5 KB)
q8, r8 = np.log2(p8), 2 * (p8 - 1) / p8
p2_6, _ = algorithms.split(p6)
q6, r6 = np.log2(p2_6), 2 * (p6 - 1) / p6
crossovers = {  # name: (by bisection, by the formula)
    "p=8: rd = rab": (crossing(curve("rd", p8), curve("rab", p8)), q8 * aB / (q8 - r8)),
    "p=8: rd = ring": (
        crossing(curve("rd", p8), curve("ring", p8)),
        (2 * (p8 - 1) - q8) * aB / (q8 - r8),
    ),
    "p=6: rab = ring": (
        crossing(curve("rab", p6), curve("ring", p6)),
        (2 * (p6 - 1) - 2 * q6 - 2) * aB / (2 * (p2_6 - 1) / p2_6 + 2 - r6),
    ),
    "p=6: rd = ring": (
        crossing(curve("rd", p6), curve("ring", p6)),
        (2 * (p6 - 1) - q6 - 2) * aB / (q6 + 2 - r6),
    ),
}
for name, (numeric, formula) in crossovers.items():
    print(f"{name:16s} at M = {format_bytes(numeric):>9} (bisection), "
          f"{format_bytes(formula):>9} (formula)")  # fmt: skip
    assert abs(numeric - formula) <= 1e-9 * formula, f"{name}: {numeric} != {formula}"

lan_figures = {a: (alpha_lan, 1 / B_10g) for a in LINK_ALGOS}  # the same alpha, beta for all
grid = np.geomspace(1e3, 256e6, 2001)
costs, switches = {}, {}
for p_ in (p8, p6):
    costs[p_] = np.array([[link_cost(a, p_, m, alpha_lan, B_10g) for a in LINK_ALGOS]
                          for m in grid])  # fmt: skip
    fastest = [LINK_ALGOS[i] for i in costs[p_].argmin(axis=1)]
    # choose.pick (what `auto` runs), on choose's step and byte counts, picks the same
    assert fastest == [choose.pick(list(LINK_ALGOS), p_, m, lan_figures) for m in grid]
    switches[p_] = [(grid[i], fastest[i - 1], fastest[i]) for i in range(1, grid.size)
                    if fastest[i] != fastest[i - 1]]  # fmt: skip
    print(f"p = {p_}: fastest " + ", then ".join(
        [fastest[0]] + [f"{b} from {format_bytes(m)}" for m, _, b in switches[p_]]))  # fmt: skip
# the switches on the grid sit at the crossovers, within one grid step (0.5 %)
for p_, name in ((p8, "p=8: rd = rab"), (p6, "p=6: rd = ring")):
    (m, *_), *more = switches[p_]
    assert not more and abs(m / crossovers[name][1] - 1) < 0.01, (p_, switches[p_])
assert np.all(costs[p8][:, 2] <= costs[p8][:, 0]), "p = 8: rab is never slower than the ring"

print(f"\n     M | p = {p8}:      ring        rd       rab   (* fastest)")
for m in (1e3, 16e3, 256e3, 4e6, 64e6, 256e6):
    ts = [link_cost(a, p8, m, alpha_lan, B_10g) for a in LINK_ALGOS]
    cells = [f"{format_seconds(t)}{'*' if t == min(ts) else ' '}" for t in ts]
    print(f"{format_bytes(m):>9} | " + " ".join(c.rjust(10) for c in cells))

if plt is not None:
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, p_ in zip(axes, (p8, p6), strict=True):
        for i, a in enumerate(LINK_ALGOS):
            ax.plot(grid, costs[p_][:, i], ls=("-", "--", ":")[i], label=a)
        for m, _, b in switches[p_]:
            ax.axvline(m, color="grey", lw=0.8)
            ax.annotate(f" {b} from {format_bytes(m)}", (m, 1e-2), fontsize=8, rotation=90)
        ax.set(xscale="log", yscale="log", xlabel="message size M (bytes)",
               title=f"p = {p_}, alpha = 50 us, 10 Gbit/s")  # fmt: skip
        ax.legend(fontsize=8)
    axes[0].set_ylabel("alpha-beta time (s)")
    save_figure(fig, OUT / "02_algorithms_by_size.png")

# %% [markdown]
# At p = 8 recursive doubling wins below about 150 KB, where 3 latencies against the ring's 14
# matter more than sending M three times; above it Rabenseifner leads, with the ring's bytes
# and 6 latencies instead of 14, a gap of 8α = 0.4 ms that is lost in the bandwidth term for
# large messages. At p = 6 the fold costs Rabenseifner 2M/B: the ring overtakes it at about
# 136 KB and recursive doubling at about 160 KB, and Rabenseifner is never the fastest. The
# model is the same for all three and assumes every pair of ranks has a full-bandwidth link of
# its own; the ring only ever uses its neighbours, which suits any network (the butterflies of
# rd and rab send to ranks 2^k away, which on a hierarchy of switches share links).
#
# `choose.pick(names, p, M, figures)` makes this choice for `auto`: the fastest
# `steps·α + volume·M·β` among the algorithms the job can run, per message, from figures
# `pipesgd bench allreduce --fit` measured on this machine (one (α, β) per algorithm, since
# each pays its own software costs per step and per byte). No size threshold is written
# anywhere: the thresholds are where the fitted lines cross, as here.
#
# ## 5b. One host: synchronisations instead of hops
#
# Ranks on one host can skip the links altogether. They map one shared-memory region
# (`comm/shm_group.py`) in which every rank sees every other rank's array where it lies; a step
# is no longer a message but a **synchronisation** (wait until all p ranks have written), and
# bytes are memory traffic:
#
# - **oneshot**: each rank copies its array into its slot; once all p slots are full (1
#   synchronisation) each rank sums the whole array itself, reading all p slots: (1 + p)·M
#   bytes per rank.
# - **twoshot**: the same copy in; then each rank sums one p-th of the array from the p slots
#   into the shared sums (a reduce-scatter), and once all shares are there (the 2nd
#   synchronisation) copies the whole sum out (an all-gather): about 3M bytes, whatever p.
#
# A message longer than one slot (4 MB) goes in pieces, each with its synchronisations. Both
# add chunk c of the ring's `chunk_bounds` in the ring's order, x_c + x_{c+1} + …, so both
# give **the ring's bits**. With `--transport shm` (or auto) on one host and `--allreduce
# auto`, the job forms the group and `auto` chooses among the ring, oneshot and twoshot
# (`choose.candidates(grouped=True)`); over links it chooses among the ring, rd and rab.
#
# Below, 4 processes (3 with `PIPESGD_TUTORIAL_SMALL=1`: a folded p for rd and rab) time each
# algorithm on a few sizes over shared memory: every rank reports, per algorithm, the best of
# a few rounds of the median of a few calls, and the table shows the slowest rank's figure.
# One job asks for `auto` and gets the group (we time the ring, oneshot and twoshot by name),
# one asks for `rd` and gets the mesh links of rd and rab; from their rows each algorithm's
# (α, β) is fitted where the machine has no fitted figures, and a third job runs `auto`
# itself, which picks per message. Every result is checked against its oracle, bitwise.

# %%


def algorithms_job(comm, names, sizes, rounds, reps, seed):
    """One rank: per size, each algorithm's result on a normal vector (for the oracle), then
    its time, the best over `rounds` of the median of `reps` calls; and what auto picks."""
    out = {}
    for nbytes in sizes:
        x = rank_inputs(seed, comm.rank, nbytes // 4)[1]
        got = {a: allreduce(comm, x.copy(), algorithm=a) for a in names}  # also the warm-up
        work = np.zeros(nbytes // 4, np.float32)  # zeros stay zeros, however often summed
        medians = {a: [] for a in names}
        for _ in range(rounds):  # the algorithms take turns, so a slow moment hits them all
            for a in names:
                barrier(comm)
                calls = []
                for _ in range(reps):
                    start = time.perf_counter()
                    allreduce(comm, work, algorithm=a)
                    calls.append(time.perf_counter() - start)
                medians[a].append(float(np.median(calls)))
        picked = choose.algorithm_for(comm, nbytes)  # the job's own: "auto" picks by size
        out[nbytes] = (got, {a: min(m) for a, m in medians.items()}, picked)
    return out


def run_algorithms(names, asked, p, models_file=None):
    """launch_local over shm asking for `asked`; {size: {algo: slowest rank's time}}, the
    results per rank and the picks. `models_file`: the fitted figures `auto` reads."""
    saved = os.environ.get("PIPESGD_ALLREDUCE_MODELS")
    if models_file is not None:  # the workers inherit it (fork)
        os.environ["PIPESGD_ALLREDUCE_MODELS"] = str(models_file)
    try:
        per_rank = launch_local(p, algorithms_job, (names, one_sizes, rounds1, reps1, seed),
                                start_method="fork", transport="shm", allreduce=asked)  # fmt: skip
        figures = choose.fitted("shm")  # what the workers read, read here alike
    finally:
        if models_file is not None:
            os.environ.pop("PIPESGD_ALLREDUCE_MODELS")
            if saved is not None:
                os.environ["PIPESGD_ALLREDUCE_MODELS"] = saved
    times = {s: {a: max(r[s][1][a] for r in per_rank) for a in names} for s in one_sizes}
    picks = {s: {r[s][2] for r in per_rank} for s in one_sizes}
    return times, per_rank, picks, figures


P1 = 3 if SMALL else 4
one_sizes = [4_000, 1_000_000] if SMALL else [4_000, 64_000, 1_000_000]
rounds1, reps1 = (2, 5) if SMALL else (3, 10)
t0 = time.perf_counter()
group_t, group_ranks, _, _ = run_algorithms(["ring", "oneshot", "twoshot"], "auto", P1)
mesh_t, mesh_ranks, _, _ = run_algorithms(["rd", "rab"], "rd", P1)
measured = {s: group_t[s] | mesh_t[s] for s in one_sizes}
ALL5 = ("ring", "rd", "rab", "oneshot", "twoshot")

# The figures auto chooses by: `pipesgd bench allreduce --fit`'s (this machine's, else the
# package's from the reference machine) where they exist; with none, auto runs the ring. So
# that auto has something to choose by in any case, we fit each algorithm on the rows just
# measured, as --fit does, into a file of our own when the fitted ones lack any of the group's.
machine_figures = choose.fitted("shm")
fitted_here = {a: fit_one(a, P1, one_sizes, [measured[s][a] for s in one_sizes]) for a in ALL5}
group_algos = choose.candidates(grouped=True)  # ring, oneshot, twoshot
models_file = None
if not all(a in machine_figures for a in group_algos):
    models_file = OUT / "02_allreduce_models.json"
    fits = {"shm": {a: {"alpha": fitted_here[a][0], "beta": fitted_here[a][1]} for a in ALL5}}
    write_fit(fits, P1, models_file, "tutorials/02_ring_allreduce.py")
auto_t, auto_ranks, auto_picks, auto_figures = run_algorithms(["auto"], "auto", P1, models_file)
source = "the fitted file's" if models_file is None else f"fitted here ({models_file.name})"
print(f"{P1} ranks over shm, 3 jobs: {time.perf_counter() - t0:.1f} s; figures: {source}")

print("     size | " + " | ".join(f"{a:>17}" for a in ALL5) + " | auto ran (time)")
print("          | " + " | ".join(f"{'measured  model':>17}" for _ in ALL5) + " |")
model_figures = fitted_here | auto_figures  # the model: auto's figures where it has them
for s in one_sizes:
    models = {a: choose.model_time(a, P1, s, *model_figures[a]) for a in ALL5}
    cells = [f"{format_seconds(measured[s][a]):>8} {format_seconds(models[a]):>8}" for a in ALL5]
    ran = f"{'/'.join(sorted(auto_picks[s]))} ({format_seconds(auto_t[s]['auto'])})"
    print(f"{format_bytes(s):>9} | " + " | ".join(cells) + f" | {ran}")

# auto: every rank picks the same, the one the figures' models say is fastest
for s in one_sizes:
    assert auto_picks[s] == {choose.pick(group_algos, P1, s, auto_figures)}, (
        f"{format_bytes(s)}: the ranks ran {auto_picks[s]} under auto"
    )
# every result against its oracle, bitwise, on every rank
for s in one_sizes:
    arrays = [rank_inputs(seed, r, s // 4)[1] for r in range(P1)]
    want = simulate_allreduce(arrays)
    for a in ("ring", "oneshot", "twoshot"):
        for r, res in enumerate(group_ranks):
            assert res[s][0][a].tobytes() == want[r].tobytes(), (
                f"{a}, {format_bytes(s)}, rank {r}: not the ring's bits (simulate_allreduce)"
            )
    for r, res in enumerate(auto_ranks):
        assert res[s][0]["auto"].tobytes() == want[r].tobytes(), f"auto, rank {r}, {s} bytes"
    for a in ("rd", "rab"):
        oracle = algorithms.simulate(a, arrays)
        for r, res in enumerate(mesh_ranks):
            assert res[s][0][a].tobytes() == oracle[r].tobytes(), (
                f"{a}, {format_bytes(s)}, rank {r}: not algorithms.simulate's bits"
            )
        gap = np.abs(oracle[0] - want[0]).max()
        assert gap < 1e-5, f"{a} vs the ring, {format_bytes(s)}: {gap:.1e} apart"
differ = {a: int((mesh_ranks[0][one_sizes[-1]][0][a] != want[0]).sum()) for a in ("rd", "rab")}
print("bitwise, on every rank: ring, oneshot, twoshot and auto == simulate_allreduce; "
      "rd, rab == algorithms.simulate")  # fmt: skip
print(f"  at {format_bytes(one_sizes[-1])}, elements where rd and rab differ from the ring's "
      f"bits (rounding): {differ} of {one_sizes[-1] // 4}")  # fmt: skip

# %% [markdown]
# Read the table as a shape, not as a ranking: 4 processes on 2 shared cores time their
# synchronisations by who gets a core when, and another run can order the close ones
# differently (auto's column, a job of its own, included), so the tutorial asserts no
# ordering of measured times. What held on the development machine: up to 64 KB the group's
# algorithms took about 0.1 ms, the ring 0.3 to 0.8 ms for its 2(p−1) hand-offs between
# processes (each a wake-up of a waiting rank), rd and rab in between; at 1 MB memory traffic
# starts to count, and twoshot's 3M came out ahead of oneshot's (1 + p)M. The model columns
# are the fitted lines; where no fitted file exists they are fitted on these very rows, and
# follow them as closely as two figures can follow two or three sizes.
#
# What *is* asserted is the part a training run depends on: every rank of every algorithm
# holds the bits of its oracle, the ring's `simulate_allreduce` for the ring, oneshot, twoshot
# and auto, and `algorithms.simulate` for rd and rab (which add in another order, so their
# bits differ from the ring's by rounding); and every rank of the auto job ran the algorithm
# `choose.pick` names for its figures, the same on every rank, as it must be.
#
# ## 5c. Why the ring carries Pipe-SGD's gradients
#
# Pipe-SGD sends a whole model's gradient per iteration: megabytes, where the bandwidth term
# decides. There the question is how many bytes each rank moves, and 2(p−1)/p · M is the
# least an AllReduce can do (each rank must send out all but its 1/p share of its input for
# reduction, and receive all but 1/p of the result): the ring reaches it, and so do Rabenseifner
# and, on one host, twoshot's reduce-scatter; recursive doubling sends log2 p · M, and oneshot
# reads (1 + p)·M.

# %%
print(f"p = {p8}, alpha = 50 us, 10 Gbit/s; bytes each rank sends, and the model's time:")
print("        M | ring: bytes      time |   rd: bytes      time | rd/ring | rab - ring | "
      "rab/ring at p = 6")  # fmt: skip
for m in (4e6, 25e6, 100e6):
    t_ring, t_rd, t_rab = (link_cost(a, p8, m, alpha_lan, B_10g) for a in LINK_ALGOS)
    folded = link_cost("rab", p6, m, alpha_lan, B_10g) / link_cost("ring", p6, m, alpha_lan, B_10g)
    out_ring, out_rd = (format_bytes(choose.volume(a, p8) * m) for a in ("ring", "rd"))
    print(f"{format_bytes(m):>9} | {out_ring:>11} {format_seconds(t_ring):>9} | "
          f"{out_rd:>11} {format_seconds(t_rd):>9} | {t_rd / t_ring:7.2f} | "
          f"{(t_rab - t_ring) / t_ring:+10.1%} | {folded:17.2f}")  # fmt: skip
    assert choose.volume("rab", p8) == choose.volume("ring", p8)  # the same bytes
    assert np.isclose(t_ring - t_rab, (2 * (p8 - 1) - 2 * q8) * alpha_lan)  # 8 latencies
    assert t_rd / t_ring > 1.5 and folded > 1.9
vol_two, vol_one = choose.volume("twoshot", p8), choose.volume("oneshot", p8)
print(f"one host, p = {p8}: bytes per rank per byte of M: twoshot {vol_two:.0f}, "
      f"oneshot {vol_one:.0f}")  # fmt: skip

# %% [markdown]
# From 4 MB up, recursive doubling takes log2 p / (2(p−1)/p) ≈ 1.7 times the ring at p = 8,
# a ratio that grows with p. Rabenseifner moves the ring's bytes and saves it 2(p−1) − 2 log2 p
# latencies: 0.4 ms here, 6 % of a 4 MB AllReduce and under 1 % of a 100 MB one. That is what
# `auto` would weigh on this model, and it is small; at a p that is not a power of two the
# fold's 2M/B makes Rabenseifner about twice the ring at these sizes. The ring gets its optimum
# with two links per rank, to its neighbours, on any p, and pipelines each step in segments.
# On one host its twin is twoshot: the same reduce-scatter then all-gather, through shared
# memory, 3M of memory traffic per rank however large p, against oneshot's (1 + p)·M.
#
# And the bits. On one host `auto` chooses among the ring, oneshot and twoshot, which all add
# in the ring's order: a method's results are the same bits whichever of them auto took for a
# message, so the choice cannot change a training run, only its speed. Over links `auto` may
# take rd or rab for some messages, which round differently from the ring (in the last bit of
# some elements, as counted above); the choice depends only on (p, M, the fitted figures), so
# every rank takes the same one and a run repeats bit for bit on the same figures.

# %% [markdown]
# ## Summary
#
# - The ring AllReduce cuts the gradient into p chunks; p−1 reduce-scatter steps leave each rank
#   with one complete chunk, p−1 all-gather steps copy it round. Each rank sends and receives
#   2(p−1)/p · M bytes, independent of p, against 2(p−1)·M through the root's link for gather
#   and broadcast: T_ring = 2(p−1)·α + 2(p−1)/p · M/B.
# - The schedule is a pair of index functions, `reduce_scatter_chunks` and
#   `all_gather_chunks`; `simulate_allreduce` plays it in one process and reproduces the real,
#   multi-process `allreduce` bitwise.
# - Each chunk is summed in one fixed order by one rank and then copied, so every rank gets
#   bitwise identical results: exact on integer-valued floats, and within rounding of `np.sum`
#   otherwise.
# - On an emulated 1 ms, 100 MB/s link the measured time follows the alpha-beta formula where
#   bandwidth dominates. Report algbw = M/T and busbw = algbw · 2(p−1)/p; busbw is comparable
#   with the link bandwidth and across p.
# - On one host the copies per byte decide: a socket (tcp or unix) costs two kernel copies of
#   every payload byte, shared memory one; the results are the same bytes on every transport.
# - Small messages are latency-bound, and other algorithms take fewer steps: recursive
#   doubling log2 p steps of M bytes, Rabenseifner 2 log2 p steps and the ring's bytes (a p
#   that is not a power of two folds: two more steps, 2M more bytes). Their alpha-beta curves
#   cross at sizes the formulas give (p = 8, 50 µs, 10 Gbit/s: rd below 150 KB), and `auto`
#   (`choose.pick`) runs the fastest fitted model per message, with no threshold written down.
# - On one host the shared-memory group replaces hops by synchronisations: oneshot (1, reads
#   (1 + p)·M) and twoshot (2, about 3M); both add in the ring's order, so they, the ring and
#   `auto` among them give the same bits. Measured times on a loaded machine are a shape, not
#   a ranking; the bits are asserted.
# - Gradients are megabytes: bandwidth-bound, where the ring's 2(p−1)/p · M bytes are the
#   optimum on any p with neighbour links only; recursive doubling sends log2 p · M.
#
# ## Exercises
#
# Each exercise with a single answer has a cell that checks it: put your answer in place of
# `None` and run the cell.

# %% [markdown]
# **1.** Repeat the emulated sweep with p = 2 and p = 8 (change `P` and rerun from section 1).
# First predict: what algbw does the formula give for 16 MB at p = 8 on the emulated link
# (α = 1 ms, B = 100 MB/s)? Then measure. Does busbw at 16 MB change with p? Does algbw?
# Which term of the formula grows with p?
#
# <details><summary>Hint</summary>
#
# algbw = M / T with T = `ring_allreduce_time(8, 16e6, 1e-3, 100e6)`. The bandwidth term
# 2(p−1)/p · M/B hardly moves between p = 4 and 8 (1.5 and 1.75 times M/B), so busbw, which
# divides it out, stays near B; the latency term 2(p−1)·α grows linearly. On 2 cores, 8
# processes also queue for the CPU: expect the measurement to fall further behind the formula.
#
# </details>

# %%
answer = None  # your answer: the formula's algbw for 16 MB at p = 8, in bytes per second
check("02.1", answer)

# %% [markdown]
# **2.** With α = 1 ms and B = 100 MB/s, at what M are the latency and bandwidth terms of the
# ring formula equal for p = 4? Check it against the measured table: which sizes are
# latency-bound?
#
# <details><summary>Hint</summary>
#
# Set 2(p−1)·α = 2(p−1)/p · M/B. The 2(p−1) cancels, leaving M = p·α·B: the size at which
# each step's chunk M/p takes α to send.
#
# </details>

# %%
answer = None  # your answer: M in bytes
check("02.2", answer)

# %% [markdown]
# **3.** Pass `segment_bytes=64_000` to `allreduce` in `timing_job` and rerun the emulated
# 16 MB case. The formula charges α per step; what happens to the measurement, and why? What
# is the cost if segments get very small?
#
# <details><summary>Hint</summary>
#
# A step's chunk is cut into segments, and the ring forwards each segment as soon as it is
# reduced, so the α of the next hop overlaps the transfer of the rest of the chunk: the
# measurement can come in below the formula. Each segment is a frame with its own 48-byte
# header, send call and wake-up, so very small segments pay per-frame overhead many times
# over (try 4 KB).
#
# </details>

# %% [markdown]
# **4.** Gather-and-broadcast is not the only alternative to the ring. **Recursive doubling**,
# which MPI libraries use for small messages, takes log2(p) steps: at step k every rank
# exchanges its whole current M bytes with the rank whose number differs in bit k, and adds.
# Write its alpha-beta cost as a function `(p, M, alpha, bandwidth) -> seconds` (p a power of
# two), like `ring_allreduce_time`, and check it. (Section 5 used the package's,
# `algorithms.cost("rd", ...)`: write yours from the description before you look.)
#
# <details><summary>Hint</summary>
#
# Each of the log2(p) steps sends one message of M bytes over a full-duplex link while
# receiving one: α + M/B per step. Leave out the additions (γ), as the ring formula of this
# tutorial does.
#
# </details>

# %%
answer = None  # your answer: a function (p, M, alpha, bandwidth) -> seconds
check("02.4", answer)

# %% [markdown]
# **5.** With your function and `ring_allreduce_time`: below which size M does recursive
# doubling beat the ring, for p = 64, α = 50 µs and 10 Gbit/s links? What does that say about
# when a collective library should switch algorithms?
#
# <details><summary>Hint</summary>
#
# Recursive doubling pays 6 latencies against the ring's 126, but sends M per step instead of
# M/p: log2(p)·M/B against 2(p−1)/p·M/B. Set the two costs equal and solve for M, or bisect on
# their difference between 0 and 1 GB.
#
# </details>

# %%
answer = None  # your answer: the crossing size M, in bytes
check("02.5", answer)

# %% [markdown]
# **6.** In `timing_job`, remove the barrier and let rank 0 `time.sleep(0.01)` before each
# timed allreduce. What happens to each rank's time, and to their average? Why do benchmarks
# synchronise the ranks before they start the clock?
#
# <details><summary>Hint</summary>
#
# Every rank's ring waits for rank 0's first chunk, so the other ranks' clocks include rank
# 0's 10 ms nap, while rank 0's does not. The average over ranks then measures the skew
# between the ranks, not the AllReduce.
#
# </details>

# %% [markdown]
# **7.** In section 3b, run the transports at 1 MB and at 64 MB. Where does shm's lead over
# unix grow, and where does the per-frame header on the socket matter more than the copies?
#
# <details><summary>Hint</summary>
#
# Change `n_tr` to 250_000 and 16_000_000 floats. The copies grow with the bytes, the
# per-frame costs (header, system call, slot hand-off) with the number of frames: at 1 MB
# each chunk is a single segment, so the fixed costs weigh most there; at 64 MB the copy count,
# two against one, decides.
#
# </details>

# %% [markdown]
# **8.** On the LAN of section 0 (α = 50 µs, 10 Gbit/s), from which size M does Rabenseifner
# beat recursive doubling for p = 16? Predict first: does the crossover move up or down from
# p = 8's 150 KB, and why?
#
# <details><summary>Hint</summary>
#
# For p a power of two, q = log2 p: rd costs q·(α + M/B), rab 2q·α + 2(p−1)/p · M/B. They
# are equal at M = q·α·B / (q − 2(p−1)/p); or bisect on the difference of
# `algorithms.cost("rd", 16, M, ...)` and `algorithms.cost("rab", 16, M, ...)`, as `crossing`
# does in section 5. rd's bytes grow with log2 p, rab's hardly at all.
#
# </details>

# %%
answer = None  # your answer: M in bytes
check("02.8", answer)

# %% [markdown]
# **9.** How many steps do recursive doubling and Rabenseifner take for p = 12, the fold
# included? Answer with the pair (rd, rab), then check it against the schedules.
#
# <details><summary>Hint</summary>
#
# p2 = 8 and e = 4: ranks 0..7 pair up, the 4 odd ones and ranks 8..11 run the algorithm on
# p2 = 8 virtual ranks (log2 8 steps for rd, twice that for rab), and the fold adds one step
# before and one after. `len(algorithms.schedule("rd", 0, 12, n))` counts them, idle steps
# included.
#
# </details>

# %%
answer = None  # your answer: (steps of rd, steps of rab)
check("02.9", answer)

# %% [markdown]
# **10.** Still on the LAN: for p = 12, above which size M does the ring beat Rabenseifner?
# What does that say about running Rabenseifner on a number of workers that is not a power
# of two?
#
# <details><summary>Hint</summary>
#
# With p2 = 8 and the fold, rab costs (2·3 + 2)·α + (2·7/8 + 2)·M/B; the ring 22·α +
# 22/12 · M/B. Set them equal and solve for M, or bisect as in section 5. Above it the fold's
# extra 2M/B outweighs the 14 latencies rab saves, and it does so at every larger size.
#
# </details>

# %%
answer = None  # your answer: M in bytes
check("02.10", answer)
