# %% [markdown]
# # 13 · AllReduce algorithms by message size
#
# **A number to start with.** Tutorial 02's ring sums a gradient in 2(p−1) steps, each paying
# a latency α. For a 100 MB gradient on p = 8 workers over 10 Gbit/s links that is 14 × 50 µs
# = 0.7 ms of latency in 0.14 s: nothing. For a 16 KB message the same 0.7 ms is almost all of
# the time, and recursive doubling, which needs log2 8 = 3 steps, sums it about four times
# faster. Collective libraries (MPICH, Open MPI, NCCL) therefore keep several AllReduce
# algorithms and pick one per message, by its size. This tutorial sets three of them side by
# side over links (the ring, recursive doubling, Rabenseifner), then the two that ranks on one
# host can run through shared memory (oneshot, twoshot), and shows how the package's `auto`
# chooses among them: from fitted models, with no size threshold written anywhere.
#
# You will:
# 1. count the steps and bytes of recursive doubling and Rabenseifner (and the fold that a p
#    which is not a power of two needs), and find where their alpha-beta costs cross the
#    ring's, by formula and by bisection;
# 2. on one host, measure why the same-host transports (AF_UNIX sockets, shared memory) beat
#    TCP: copies per byte;
# 3. time all five algorithms on one host, fit each one's (α, β), and watch `auto` pick per
#    message; check every result against its oracle, bitwise;
# 4. see why, for all that, the ring carries Pipe-SGD's gradients.
#
# Everything here runs the product's collectives (pipesgd_ref/comm/): tutorial 02 taught the
# ring on the lesson core, whose bits the product's ring reproduces. Run it with
# `python tutorials/13_allreduce_algorithms.py`, or open it as a notebook. Takes about 4 s
# here on two cores (`PIPESGD_TUTORIAL_SMALL=1`, the quick version CI runs, about 3 s).

# %%
import os
import time
from pathlib import Path

import numpy as np

from pipesgd_ref.comm import algorithms, choose
from pipesgd_ref.comm.collectives import allreduce, barrier
from pipesgd_ref.comm.schedule import simulate_allreduce
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
OUT = HERE / "out"  # figures and fitted figures go here (git-ignored)

plt = pyplot()  # None without matplotlib: the lessons are in the printed numbers and asserts

# %% [markdown]
# ## 0. The setting
#
# The LAN of tutorial 02's back-of-envelope: α = 50 µs per message and B = 10 Gbit/s per
# direction of a full-duplex link, between every pair of ranks. The ring's time is
# `timing.ring_allreduce_time(p, M, α, B)` = 2(p−1)·α + 2(p−1)/p · M/B (tutorial 02 derives
# it and measures it).
#
# The measurements run the product's `allreduce` in worker processes started by
# `launch_local(p, job, args, transport=..., allreduce=...)`, which returns the p values of
# `job(comm, *args)`. **Why `start_method="fork"`:** the package's default, spawn, finds the
# job by re-importing the script that defined it, and this script is a tutorial whose top
# level does all the work: each worker would re-run every cell above. fork copies the running
# process and re-runs nothing; nothing here touches a GPU, so fork is safe. Each rank makes
# its own data from (seed, rank), so this process can regenerate every input for the oracles.

# %%
B_10g, alpha_lan = 10e9 / 8, 50e-6
P, seed = 4, 7
print(f"LAN: alpha {format_seconds(alpha_lan)}, {format_bandwidth(B_10g)}; p = 8:")
for m in (16e3, 100e6):
    t = ring_allreduce_time(8, m, alpha_lan, B_10g)
    print(f"  ring, {format_bytes(m):>8}: {format_seconds(t):>9}, of which its 14 latencies "
          f"{format_seconds(14 * alpha_lan)} ({14 * alpha_lan / t:.0%})")  # fmt: skip


def rank_inputs(seed: int, rank: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank `rank`'s two test vectors: integer-valued float32 (sums exact in any order, |sum| <
    2^24) and standard normal float32."""
    rng = np.random.default_rng([seed, rank])
    return rng.integers(-1000, 1000, n).astype(np.float32), rng.standard_normal(n, np.float32)


# %% [markdown]
# ## 1. Small messages: the algorithm chosen by size
#
# Tutorial 02 ended on a 64 KB message that gather-and-broadcast summed faster than the ring:
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
    save_figure(fig, OUT / "13_algorithms_by_size.png")

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

# %% [markdown]
# ## 2. One host: why the same-host transports are faster
#
# Tutorial 02's runs sent their frames over TCP, the path between hosts. Four ranks on one machine
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
# ## 3. One host: synchronisations instead of hops
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
    models_file = OUT / "13_allreduce_models.json"
    fits = {"shm": {a: {"alpha": fitted_here[a][0], "beta": fitted_here[a][1]} for a in ALL5}}
    write_fit(fits, P1, models_file, "tutorials/13_allreduce_algorithms.py")
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
# ## 4. Why the ring carries Pipe-SGD's gradients
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
# ## 5. Checks
#
# The crossovers, `auto`'s picks and every algorithm's bits were asserted where they were
# computed (sections 1 and 3); what remains is section 2's transports.

# %%
for transport, exact in transports_exact.items():
    assert exact, f"--transport {transport}: the ring must reproduce simulate_allreduce bitwise"
print("all checks passed")

# %% [markdown]
# ## Summary
#
# - Small messages are latency-bound, and other algorithms take fewer steps: recursive
#   doubling log2 p steps of M bytes, Rabenseifner 2 log2 p steps and the ring's bytes (a p
#   that is not a power of two folds: two more steps, 2M more bytes). Their alpha-beta curves
#   cross at sizes the formulas give (p = 8, 50 µs, 10 Gbit/s: rd below 150 KB), and `auto`
#   (`choose.pick`) runs the fastest fitted model per message, with no threshold written down.
# - On one host the copies per byte decide: a socket (tcp or unix) costs two kernel copies of
#   every payload byte, shared memory one; the results are the same bytes on every transport.
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
# **1.** Gather-and-broadcast is not the only alternative to the ring. **Recursive doubling**,
# which MPI libraries use for small messages, takes log2(p) steps: at step k every rank
# exchanges its whole current M bytes with the rank whose number differs in bit k, and adds.
# Write its alpha-beta cost as a function `(p, M, alpha, bandwidth) -> seconds` (p a power of
# two), like `ring_allreduce_time`, and check it. (Section 1 used the package's,
# `algorithms.cost("rd", ...)`: write yours from the description before you look.)
#
# <details><summary>Hint</summary>
#
# Each of the log2(p) steps sends one message of M bytes over a full-duplex link while
# receiving one: α + M/B per step. Leave out the additions (γ), as the ring formula does.
#
# </details>

# %%
answer = None  # your answer: a function (p, M, alpha, bandwidth) -> seconds
check("13.1", answer)

# %% [markdown]
# **2.** With your function and `ring_allreduce_time`: below which size M does recursive
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
check("13.2", answer)

# %% [markdown]
# **3.** On the LAN of section 0 (α = 50 µs, 10 Gbit/s), from which size M does Rabenseifner
# beat recursive doubling for p = 16? Predict first: does the crossover move up or down from
# p = 8's 150 KB, and why?
#
# <details><summary>Hint</summary>
#
# For p a power of two, q = log2 p: rd costs q·(α + M/B), rab 2q·α + 2(p−1)/p · M/B. They
# are equal at M = q·α·B / (q − 2(p−1)/p); or bisect on the difference of
# `algorithms.cost("rd", 16, M, ...)` and `algorithms.cost("rab", 16, M, ...)`, as `crossing`
# does in section 1. rd's bytes grow with log2 p, rab's hardly at all.
#
# </details>

# %%
answer = None  # your answer: M in bytes
check("13.3", answer)

# %% [markdown]
# **4.** How many steps do recursive doubling and Rabenseifner take for p = 12, the fold
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
check("13.4", answer)

# %% [markdown]
# **5.** Still on the LAN: for p = 12, above which size M does the ring beat Rabenseifner?
# What does that say about running Rabenseifner on a number of workers that is not a power
# of two?
#
# <details><summary>Hint</summary>
#
# With p2 = 8 and the fold, rab costs (2·3 + 2)·α + (2·7/8 + 2)·M/B; the ring 22·α +
# 22/12 · M/B. Set them equal and solve for M, or bisect as in section 1. Above it the fold's
# extra 2M/B outweighs the 14 latencies rab saves, and it does so at every larger size.
#
# </details>

# %%
answer = None  # your answer: M in bytes
check("13.5", answer)

# %% [markdown]
# **6.** In section 2, run the transports at 1 MB and at 64 MB. Where does shm's lead over
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
# **7.** Large messages: segments. The lesson core's ring sends each ring step's chunk as one
# frame; the product's ring (pipesgd_ref/comm/ring.py) cuts it into segments of
# `SEGMENT_BYTES` (2 MiB) and forwards each one as soon as it is reduced. Time the product's
# ring on 16 MB over an emulated 1 ms, 100 MB/s link, as tutorial 02 timed the core's: a job
# that calls `allreduce(comm, x, algorithm="ring")` after a `barrier(comm)`, run by
# `launch_local(4, job, args, start_method="fork", transport="tcp", link=LinkSpec(1e-3,
# 100e6))` (`LinkSpec` from pipesgd_ref.comm.netem). Then pass `segment_bytes=64_000`. The
# formula charges α per step; what happens to the measurement, and why? What is the cost if
# segments get very small?
#
# <details><summary>Hint</summary>
#
# A step's chunk is cut into segments, and the ring forwards each segment as soon as it is
# reduced, so the α of the next hop overlaps the transfer of the rest of the chunk (the
# product's link emulation lets the latency of one frame overlap the bytes of the next): the
# measurement can come in below the formula. Each segment is a frame with its own 48-byte
# header, send call and wake-up, so very small segments pay per-frame overhead many times
# over (try 4 KB).
#
# </details>

# %% [markdown]
# Written solutions to every exercise above, with the reasoning: docs/solutions.md, section 13
# (on the site, the page "Solutions to the exercises").
