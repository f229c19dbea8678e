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
# 2. walk the ring schedule for p = 4 by hand (which rank sends which chunk at each step),
#    watch the chunks accumulate, and check it against the lesson core's `simulate`;
# 3. read the core's `ring_allreduce` (about 25 lines of pipesgd_ref/core/ring.py) and run it
#    in 4 processes over TCP: exact sums, the same bits on every rank, bitwise `simulate`, and
#    the bytes each rank sent, to the byte;
# 4. kill one rank in the middle of a job and read what every other rank reports;
# 5. time it on loopback and on an emulated 1 ms, 100 MB/s link, compare with the formula, and
#    read the results as nccl-tests does (algbw and busbw).
#
# Small messages, where other algorithms beat the ring, and the shared-memory paths of one
# host are tutorial 13's. Run this one with `python tutorials/02_ring_allreduce.py`, or open
# it as a notebook. Takes about 4 s here on two cores (`PIPESGD_TUTORIAL_SMALL=1`, the quick
# version CI runs, about 3 s).

# %%
import inspect
import multiprocessing as mp
import os
import re
import signal
import socket
import time
import traceback
from pathlib import Path

import numpy as np

from pipesgd_ref.core import chunk_bounds, ring_allreduce, simulate
from pipesgd_ref.core.wire import HEADER, Link
from pipesgd_ref.exercises import check
from pipesgd_ref.plots import pyplot, save_figure
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
# most one, the larger first). Rank r only ever sends to rank r+1 and receives from rank r−1:
#
# - **reduce-scatter**, ring steps s = 0 … p−2: rank r sends chunk (r − s) mod p to the right,
#   and adds the chunk (r − s − 1) mod p that arrives from the left into its own copy. After
#   p−1 steps, rank r holds the complete sum of chunk (r + 1) mod p.
# - **all-gather**, ring steps s = 0 … p−2: rank r sends chunk (r + 1 − s) mod p, complete, to
#   the right, and overwrites its copy of the chunk (r − s) mod p that arrives from the left.
#
# (A *ring step* is one of these 2(p−1) exchanges; a *step* of training, in later tutorials,
# is one iteration t.) The core's `ring_allreduce` computes these formulas inline, two per
# loop; below they are two small functions, (chunk sent, chunk received), so that we can print
# the whole schedule for p = 4 and check that what rank r receives is what its left neighbour
# sends. Every ring step, every rank sends exactly one chunk: all four links are busy at once.

# %%
P = 4


def reduce_scatter_chunks(rank: int, step: int, p: int) -> tuple[int, int]:
    """(chunk sent to the right, chunk received from the left and added) at ring step `step`."""
    return (rank - step) % p, (rank - step - 1) % p


def all_gather_chunks(rank: int, step: int, p: int) -> tuple[int, int]:
    """(complete chunk sent to the right, chunk received from the left and copied in)."""
    return (rank + 1 - step) % p, (rank - step) % p


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
# with the index functions above: at each ring step all ranks send at once (a copy of the
# outgoing chunk, as if it were on the wire), then all receive. The core's `simulate(arrays,
# mean=False)` is this same loop (its sums; `mean=True`, the default, divides by p as
# training wants); we check that they agree at the end. A complete chunk (1111) is starred.

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
    np.array_equal(a, b) for a, b in zip(bufs, simulate(inputs, mean=False), strict=True)
)
print(f"the hand-played schedule equals the core's simulate: {by_hand_matches}")

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
int_ring = simulate(int_inputs, mean=False)
int_exact = np.sum(int_inputs, axis=0)
print(f"chunk_bounds(10, {P}) = {chunk_bounds(10, P)}")
print(f"integer-valued: np.sum   {int_exact}")
print(f"                simulate {int_ring[0]}")

float_inputs = [rng.standard_normal(100_003, dtype=np.float32) for _ in range(P)]
float_ring = simulate(float_inputs, mean=False)
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
# ## 2. The code, then the same over sockets: 4 processes
#
# Here is the whole ring of the lesson core (pipesgd_ref/core/ring.py), the one Pipe-SGD's
# workers call in tutorial 05. Each loop is one phase; `exchange(right, left, step, (tag,
# array), (tag, out))` (core/wire.py) sends one frame to the right neighbour while it
# receives one from the left (the send runs on a helper thread: if every rank only sent
# first, each would wait for its neighbour to read, and none would). A frame is a 20-byte
# header (magic, ring step, tag = the chunk's index, payload bytes) and then the array's raw
# bytes; the receiver checks the header before it reads a byte more, so a frame from the
# wrong step or the wrong chunk is an error, never a wrong sum. In the reduce-scatter the
# chunk lands in a spare `inbox` and is added into place; in the all-gather it lands straight
# in place. With `mean=True` the chunk's owner divides the finished sum by p, once.

# %%
print(inspect.getsource(ring_allreduce))

# %% [markdown]
# To run it we need p processes joined in a ring of TCP links: every rank holds a `Link` to
# its right neighbour (dialled) and one to its left (accepted). The core's `launch` does this
# for its training methods (tutorial 05); for a ring job of our own, the same wiring is a few
# lines. `ring_processes(p, job, *args)` starts p processes, rank r dials rank r+1's listening
# socket and accepts rank r−1's dial, then runs `job(rank, p, left, right, *args)` and sends
# its value home through a pipe. A rank that raises sends its traceback instead; either way it
# then **shuts its links**, so a neighbour waiting on them fails at once, naming it (section
# 3). The listening sockets are made before any process starts, so a dial never finds no one
# listening.
#
# **Why `fork`.** A forked process is a copy of this one: it has the job functions, the data
# and the listening sockets already, and re-runs nothing. The alternative, spawn (a fresh
# interpreter per process), finds a job by re-importing the script that defined it, and this
# script is a tutorial whose top level does all the work: each process would re-run every
# cell above. (The product's launcher defaults to spawn, so that a worker never inherits a
# CUDA context or a half-started thread; nothing here touches a GPU.)

# %%


def ring_processes(p: int, job, *args, timeout: float = 30.0, link=Link) -> list:
    """job(rank, p, left, right, *args) in p forked processes joined in a ring of TCP links
    over loopback; each rank's value, rank 0 first. A rank that raises or dies: one
    RuntimeError naming every failed rank with its error (as the core's `launch` reports).
    `timeout`: how long a rank waits for a peer; `link`: the Link class (section 4 paces it)."""
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(p)]
    for sock in listeners:
        sock.settimeout(timeout)

    def rank_main(r: int, home) -> None:  # the body of rank r's process
        links = []
        try:
            right = socket.create_connection(listeners[(r + 1) % p].getsockname(), timeout)
            links.append(link(right, r, (r + 1) % p, timeout))  # we send on this one
            left, _ = listeners[r].accept()  # the one dial we get: our left neighbour's
            links.append(link(left, r, (r - 1) % p, timeout))  # we receive on this one
            for sock in listeners:
                sock.close()
            home.send(job(r, p, links[1], links[0], *args))
        except BaseException:
            home.send(f"rank {r} failed:\n{traceback.format_exc()}")
        finally:  # end our links: a neighbour waiting on them fails now, naming this rank
            for lk in links:
                lk.shut()

    fork = mp.get_context("fork")  # see above
    homes, procs = [], []
    for r in range(p):
        home, theirs = fork.Pipe(duplex=False)
        procs.append(fork.Process(target=rank_main, args=(r, theirs), daemon=True))
        procs[-1].start()
        theirs.close()  # only the child writes: its death closes the pipe (EOFError below)
        homes.append(home)
    for sock in listeners:
        sock.close()
    results = []
    for r, (home, proc) in enumerate(zip(homes, procs, strict=True)):
        try:
            results.append(home.recv())
        except EOFError:  # it died without a word: killed, or out of memory
            proc.join()
            results.append(f"rank {r} died (exit code {proc.exitcode})")
        proc.join()
    failed = [x for x in results if isinstance(x, str)]
    if failed:
        raise RuntimeError("\n".join(failed))
    return results


# %% [markdown]
# Each rank makes its own data from (seed, rank), so this process can regenerate all p inputs
# for the oracle. n = 1 000 003 float32 (4 MB): p does not divide it. Two AllReduces per rank:
# integer-valued floats summed (`mean=False`: the sum is exact in any order), then normal
# floats averaged (`mean=True`, what training does). `right.bytes_sent` counts what this rank
# put on the wire, headers included.

# %%


def rank_inputs(seed: int, rank: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank `rank`'s two test vectors: integer-valued float32 (sums exact in any order, |sum| <
    2^24) and standard normal float32."""
    rng = np.random.default_rng([seed, rank])
    return rng.integers(-1000, 1000, n).astype(np.float32), rng.standard_normal(n, np.float32)


def allreduce_job(rank: int, p: int, left: Link, right: Link, n: int, seed: int):
    """One rank: sum the integer-valued vector, average the normal one (both in place); return
    them and the bytes this rank sent for the first."""
    ints, floats = rank_inputs(seed, rank, n)
    ring_allreduce(rank, p, left, right, ints, mean=False)  # ints now holds the sum
    wire_bytes = right.bytes_sent
    ring_allreduce(rank, p, left, right, floats)  # floats now holds the mean
    return ints, floats, wire_bytes


n_sock, seed = 1_000_003, 7
t0 = time.perf_counter()
sock_results = ring_processes(P, allreduce_job, n_sock, seed)
print(f"ring_processes({P}, allreduce_job, ...): {time.perf_counter() - t0:.2f} s to start "
      f"{P} processes, connect, and allreduce 2 x {format_bytes(4 * n_sock)}")  # fmt: skip

sock_ints, sock_floats, sock_wire = zip(*sock_results, strict=True)
oracle_ints, oracle_floats = zip(*(rank_inputs(seed, r, n_sock) for r in range(P)), strict=True)
exact_sum = np.sum(oracle_ints, axis=0)
sums_exact = [np.array_equal(x, exact_sum) for x in sock_ints]
ranks_identical = all(
    x.tobytes() == sock_ints[0].tobytes() and y.tobytes() == sock_floats[0].tobytes()
    for x, y in zip(sock_ints, sock_floats, strict=True)
)
sock_equals_sim = sock_floats[0].tobytes() == simulate(list(oracle_floats))[0].tobytes()
print(f"integer-valued: rank r got exactly the sum, r = 0..{P - 1}: {sums_exact}")
print(f"every rank bitwise identical (both vectors): {ranks_identical}")
print(
    f"random floats: sockets == simulate, bitwise: {sock_equals_sim}; max |ring - np.mean| = "
    f"{np.abs(sock_floats[0] - np.mean(oracle_floats, axis=0)).max():.1e}"
)

# What crossed the wire: rank r sent the p-1 chunks of its reduce-scatter and the p-1 of its
# all-gather, each as one frame behind a 20-byte header.
chunk_bytes = [4 * (b - a) for a, b in chunk_bounds(n_sock, P)]
wire_exact = [
    sum(chunk_bytes[reduce_scatter_chunks(r, s, P)[0]] for s in range(P - 1))
    + sum(chunk_bytes[all_gather_chunks(r, s, P)[0]] for s in range(P - 1))
    + 2 * (P - 1) * HEADER.size
    for r in range(P)
]
M_sock = 4 * n_sock
print(f"bytes sent per rank: {list(sock_wire)}")
print(f"  its chunks + 2(p-1) headers: {wire_exact}; 2(p-1)/p * M = {1.5 * M_sock:.0f}")

# %% [markdown]
# The integer sums are exact on every rank, the four results are the same bytes, and they are
# the bytes `simulate` computes in one process: the simulation is an exact oracle for the
# distributed code, not an approximation of it. (The product's ring, pipesgd_ref/comm/ring.py,
# computes these very bits too: tests/test_core.py checks its simulation against the core's.)
# Each rank sent 2(p−1)/p · M = 1.5 · M, to the byte once the chunk sizes (p does not divide
# n: 250 001 and 250 000 elements) and the six headers are counted.
#
# ## 3. When a rank dies
#
# A job of p processes fails when any one of them does, and the useful question is then:
# *which one, and why?* Here every rank runs five AllReduces (five "training steps"); at step
# 2, rank 2 kills itself with SIGKILL, as the kernel's out-of-memory killer or a pulled plug
# would: no exception, no traceback, its sockets closed by the kernel. Its neighbours see that
# at once: rank 3 was waiting to receive from it, rank 1 may have been sending to it. Each
# fails with an error naming the rank it lost, ends its own links, and so the failure goes
# round the ring in milliseconds, however long the timeout (20 s here).

# %%


def dying_job(rank: int, p: int, left: Link, right: Link, dead: int, at: int, n: int):
    """Five AllReduces; rank `dead` kills itself before the one of step `at`."""
    x = np.ones(n, np.float32)
    for step in range(5):
        if rank == dead and step == at:
            os.kill(os.getpid(), signal.SIGKILL)  # no exception, no goodbye
        ring_allreduce(rank, p, left, right, x)
    return x


DEAD, timeout_kill = 2, 20.0
t0 = time.perf_counter()
try:
    ring_processes(P, dying_job, DEAD, 2, 100_000, timeout=timeout_kill)
    report = ""
except RuntimeError as err:
    report = str(err)
failed_after = time.perf_counter() - t0
died = [(int(r), int(code)) for r, code in re.findall(r"^rank (\d+) died \(exit code (-?\d+)\)",
                                                      report, flags=re.M)]  # fmt: skip
# each survivor's last line: "ConnectionError: rank r: ... rank q ...": q is the rank it lost
errors = {int(r): line for line, r in re.findall(r"^(\w+Error: rank (\d+): .*)$", report, re.M)}
blamed = {r: int(re.search(r"^\w+: rank \d+: .*?rank (\d+)", line)[1]) for r, line in
          errors.items()}  # fmt: skip
print(f"the job failed after {failed_after:.2f} s (timeout {timeout_kill:.0f} s); each rank's "
      f"report, in one line:")  # fmt: skip
for r in range(P):
    print(f"  rank {r}: " + ("died (SIGKILL)" if r in dict(died) else errors.get(r, "?")))


def chain(r: int) -> list[int]:
    """Follow 'its own error says why' from rank r: the ranks each error names, in turn."""
    out = [r]
    while out[-1] in blamed and len(out) <= P:
        out.append(blamed[out[-1]])
    return out


for r in sorted(errors):
    print(f"  rank {r}'s error leads to: " + " -> ".join(map(str, chain(r))))

# %% [markdown]
# Read it as you would a failed job's log. One rank *died*: its process left no message, and
# the launcher reports only its exit code, −9 (killed by signal 9, SIGKILL). Every other rank
# *failed*, and its error names the one peer whose link broke under it, ending in "its own
# error says why". Which neighbour each survivor names depends on the timing (whether its
# receive from the left or its send to the right broke first), but following the names always
# leads to the rank that died: that is where to look. (The "step" in these messages is the
# frame's ring step, 0 to 2(p−1) − 1, not the job's step.) The whole report is in `report`
# (every rank's traceback; `print(report)`), and it is what the core's `launch` raises for a
# training job (tutorial 05).
#
# ## 4. The cost, measured
#
# Timing a collective fairly takes three precautions (the ones nccl-tests takes):
# - a **warm-up** call per size, so the first touch of fresh buffers and growing socket buffers
#   are not billed to the ring;
# - a **barrier** before each timed call, so that all ranks start together and a late rank's
#   start is not counted as ring time. The core has no barrier, but an AllReduce of one number
#   is one: no rank can finish it before every rank has begun it;
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


def timing_job(rank, p, left, right, sizes: list[int], repeats: int) -> dict[int, list[float]]:
    """One rank: for each size in bytes, `repeats` timed AllReduces of that many float32 bytes."""
    one = np.zeros(1, np.float32)
    times = {}
    for nbytes in sizes:
        x = np.zeros(nbytes // 4, np.float32)  # values do not matter for timing; zeros stay 0
        ring_allreduce(rank, p, left, right, x)  # warm-up: first touch, socket buffers grow
        times[nbytes] = []
        for _ in range(repeats):
            ring_allreduce(rank, p, left, right, one)  # the barrier: all ranks start together
            start = time.perf_counter()
            ring_allreduce(rank, p, left, right, x)
            times[nbytes].append(time.perf_counter() - start)
    return times


def measure(sizes: list[int], repeats: int, link=Link) -> dict[int, float]:
    """Median over repeats of the rank-averaged AllReduce time, per size (P ranks)."""
    per_rank = ring_processes(P, timing_job, sizes, repeats, link=link)
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
# ranks, processes waiting for their turn on a core. Its "bandwidth" is memory copies through
# the kernel, shared with the additions (the γ term) and with every other process on the same
# cores.
#
# To see the ring behave as on a network we slow every link down. `paced_link(α, B)` is a
# `Link` whose `send` holds its thread until α + bytes/B have passed since the send began: the
# link is busy that long, whatever loopback could do. In the ring every rank sends one frame
# per ring step and waits for its send and its receive, so each ring step lasts α + (M/p)/B
# (plus the additions), exactly the alpha-beta step. (The product's emulation, `--latency` and
# `--bandwidth`, delays each frame's delivery instead and lets the latency of one frame overlap
# the bytes of the next; with one frame per link per ring step the two agree.) Here α = 1 ms
# and B = 100 MB/s (800 Mbit/s), slow enough that the link, not this machine, sets the time.

# %%


def paced_link(latency: float, bandwidth: float) -> type:
    """A Link class whose every send occupies the link for latency + bytes / bandwidth."""

    class PacedLink(Link):
        def send(self, step: int, tag: int, array: np.ndarray) -> None:
            busy = latency + (HEADER.size + array.nbytes) / bandwidth
            until = time.perf_counter() + busy
            super().send(step, tag, array)  # the real bytes go at once (loopback is fast)
            time.sleep(max(0.0, until - time.perf_counter()))  # the link is busy till then

    return PacedLink


alpha_emu, B_emu = 1e-3, 100e6
emu_repeats = 3 if SMALL else 5
t0 = time.perf_counter()
emulated = measure(sizes, emu_repeats, link=paced_link(alpha_emu, B_emu))
print(f"emulated link (alpha {format_seconds(alpha_emu)}, {format_bandwidth(B_emu)}), p = {P} "
      f"({time.perf_counter() - t0:.1f} s for the whole job):")  # fmt: skip
print("     size |  measured |   formula | measured/formula | gather+bcast |       algbw |"
      "       busbw")  # fmt: skip
bandwidth_bound = []  # sizes where the bandwidth term is >= 4x the latency term
ratios = {}
for s, t in emulated.items():
    predicted = ring_allreduce_time(P, s, alpha_emu, B_emu)
    naive = naive_seconds(s, P, alpha_emu, B_emu)
    ratios[s] = t / predicted
    algbw, busbw = bandwidths(s, t)
    if 2 * (P - 1) / P * s / B_emu >= 4 * 2 * (P - 1) * alpha_emu:
        bandwidth_bound.append(s)
    print(f"{format_bytes(s):>9} | {format_seconds(t):>9} | {format_seconds(predicted):>9} | "
          f"{ratios[s]:16.3f} | {format_seconds(naive):>12} | {format_bytes(algbw) + '/s':>11} | "
          f"{format_bytes(busbw) + '/s':>11}")  # fmt: skip
print(f"latency term 2(p-1)*alpha = {format_seconds(2 * (P - 1) * alpha_emu)}; the bandwidth "
      f"term is >= 4x that for {[format_bytes(s) for s in bandwidth_bound]}")  # fmt: skip

# %% [markdown]
# Where the bandwidth term dominates, the measurement lands on the formula, and busbw approaches
# the link's 100 MB/s while algbw stays at p/(2(p−1)) = 2/3 of it: busbw is the number that tells
# you the links are saturated. For small messages the 2(p−1) = 6 latencies dominate, and the
# measurement sits above the formula by about the loopback time of the same size: the formula
# has no term for the software overhead of each step, nor for the additions.
#
# Gather-and-broadcast takes p = 4 times as long once bandwidth dominates, but look at 64 KB:
# there its formula *beats* the ring, 2 latencies against 6. For small messages the step count
# matters more than the bytes, which is why collective libraries switch to trees or recursive
# doubling below some size (tutorial 13), and why PyTorch DDP and Horovod fuse small gradients
# into large buckets before they AllReduce (tutorial 12).

# %%
if plt is not None:
    fig, ax = plt.subplots(figsize=(6, 4))
    grid = np.geomspace(min(sizes), max(sizes), 100)
    ax.plot(grid, [ring_allreduce_time(P, s, alpha_emu, B_emu) for s in grid],
            label="ring, alpha-beta formula")  # fmt: skip
    ax.plot(grid, [naive_seconds(s, P, alpha_emu, B_emu) for s in grid], ls="--",
            label="gather + broadcast, formula")  # fmt: skip
    ax.plot(list(emulated), list(emulated.values()), "o", label="ring, measured (emulated link)")
    ax.plot(list(loopback), list(loopback.values()), "s", color="grey", ms=4,
            label="ring, measured (loopback)")  # fmt: skip
    ax.set(xscale="log", yscale="log", xlabel="gradient size M (bytes)", ylabel="time (s)")
    ax.set_title(f"The core's ring AllReduce, p = {P}, emulated link 1 ms, 100 MB/s")
    ax.legend(fontsize=8)
    save_figure(fig, OUT / "02_ring_cost.png")
else:
    print("matplotlib is not installed: plots skipped")

# %% [markdown]
# ## 5. Check against the oracle

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
assert by_hand_matches, "the hand-played schedule and the core's simulate disagree"
assert all(np.array_equal(x, int_exact) for x in int_ring), (
    f"simulate on integer-valued floats must equal np.sum exactly: expected {int_exact}, got "
    f"{int_ring[0]}"
)
assert sim_ranks_identical, "simulate: ranks must end with bitwise identical results"
assert ordered.tobytes() == float_ring[0].tobytes(), (
    "simulate should sum chunk c as x_c + x_{c+1} + ... around the ring, bitwise"
)
assert float_gap < 1e-5, f"ring vs np.sum on N(0,1) float32: gap {float_gap:.1e} > 1e-5"
for r, ok in enumerate(sums_exact):
    diff = np.abs(sock_ints[r] - exact_sum).max()
    assert ok, f"sockets: rank {r}'s sum of integer-valued floats is off by up to {diff}"
assert ranks_identical, "sockets: every rank must hold the same bytes after the AllReduce"
assert sock_equals_sim, "sockets: the real ring must reproduce simulate bitwise"
assert list(sock_wire) == wire_exact, (
    f"each rank should send its 2(p-1) chunks and headers, {wire_exact} bytes; sent "
    f"{list(sock_wire)}"
)
assert died == [(DEAD, -signal.SIGKILL)], f"expected rank {DEAD} to die by SIGKILL: {died}"
assert sorted(errors) == [r for r in range(P) if r != DEAD], (
    f"every other rank must fail with an error naming a peer; got errors from {sorted(errors)}"
    f":\n{report}"
)
for r, q in blamed.items():
    assert q in ((r - 1) % P, (r + 1) % P), f"rank {r} names rank {q}, not a neighbour"
    assert chain(r)[-1] == DEAD, f"rank {r}'s errors lead to {chain(r)}, not to rank {DEAD}"
assert blamed[(DEAD + 1) % P] == DEAD, f"rank {DEAD + 1} receives from rank {DEAD}: {report}"
assert failed_after < timeout_kill / 2, (
    f"the failure should go round the ring at once, not wait out the {timeout_kill} s timeout: "
    f"{failed_after:.1f} s"
)
assert bandwidth_bound, "no size in the sweep is bandwidth-bound; the formula check needs one"
for s in bandwidth_bound:
    assert abs(ratios[s] - 1) < 0.2, (
        f"emulated link (alpha {alpha_emu} s, {B_emu} B/s), {format_bytes(s)}: measured "
        f"{format_seconds(emulated[s])}, alpha-beta formula "
        f"{format_seconds(emulated[s] / ratios[s])} (ratio {ratios[s]:.2f}, allowed 0.8..1.2)"
    )
print("all checks passed")

# %% [markdown]
# ## Summary
#
# - The ring AllReduce cuts the gradient into p chunks; p−1 reduce-scatter steps leave each rank
#   with one complete chunk, p−1 all-gather steps copy it round. Each rank sends and receives
#   2(p−1)/p · M bytes, independent of p, against 2(p−1)·M through the root's link for gather
#   and broadcast: T_ring = 2(p−1)·α + 2(p−1)/p · M/B.
# - At ring step s rank r sends chunk (r − s) mod p in the reduce-scatter and (r + 1 − s) mod p
#   in the all-gather. The core's `ring_allreduce` is those two loops over two links, about 25
#   lines; `simulate` plays the same schedule in one process and reproduces the real,
#   multi-process ring bitwise.
# - Each chunk is summed in one fixed order by one rank and then copied, so every rank gets
#   bitwise identical results: exact on integer-valued floats, and within rounding of `np.sum`
#   otherwise.
# - A rank that dies takes the job down in milliseconds, not after a timeout: each neighbour's
#   link breaks, it fails naming that neighbour and ends its own links. The names lead back to
#   the rank that died; the launcher reports that one by its exit code.
# - On an emulated 1 ms, 100 MB/s link the measured time follows the alpha-beta formula where
#   bandwidth dominates. Report algbw = M/T and busbw = algbw · 2(p−1)/p; busbw is comparable
#   with the link bandwidth and across p. Small messages are latency-bound: tutorial 13 takes
#   the algorithms that take fewer steps there.
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
# **3.** A ring of p = 6 ranks; every rank waits in the first ring step of an AllReduce when
# rank 4 is killed. Which rank's error is *certain* to name rank 4, whatever the timing?
# Check it with `ring_processes(6, dying_job, 4, 0, 100_000)`.
#
# <details><summary>Hint</summary>
#
# Rank 4 sends to its right and receives from its left. The rank that receives from rank 4
# cannot complete its receive without it; the one that sends to it may already have handed
# its frame to the kernel and be waiting on another link.
#
# </details>

# %%
answer = None  # your answer: the rank whose error must name rank 4
check("02.3", answer)

# %% [markdown]
# **4.** Two other ways to fail. (a) Replace the `os.kill` in `dying_job` by `raise
# ValueError("rank 2 gave up")`: what does the report show now for rank 2, and for the
# others? (b) Replace it by `time.sleep(10)` and pass `timeout=2.0`: a rank that hangs, as one
# stopped in a debugger does. Which ranks report what, and why does the report come only
# after 10 s, and name rank 2 as failed too?
#
# <details><summary>Hint</summary>
#
# (a) A rank that raises sends its own traceback home ("rank 2 failed: ... ValueError") and
# shuts its links, so the others fail at once as before. (b) Nobody's link breaks: rank 3
# waits for a frame from rank 2 until its timeout ("TimeoutError: rank 3: nothing from rank 2
# for 2.0 s ... is rank 2 alive?"), then shuts its links, and the failure goes round from
# there. Rank 2 wakes up after 10 s to find its right link shut ("could not send ... to rank
# 3"), and only then does the launcher have every rank's word. Tutorial 05 shows why ranks run
# as *threads* wait without a timeout: a debugger may hold one as long as it likes.
#
# </details>

# %% [markdown]
# **5.** In `timing_job`, remove the barrier and let rank 0 `time.sleep(0.01)` before each
# timed AllReduce. What happens to each rank's time, and to their average? Why do benchmarks
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
# Written solutions to every exercise above, with the reasoning: docs/solutions.md, section 02
# (on the site, the page "Solutions to the exercises").
