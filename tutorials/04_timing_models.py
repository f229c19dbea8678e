# %% [markdown]
# # 04 · Timing models: an iteration's time, before you run it
#
# Takes about 15 s here, on 2 cores (about 10 s with `PIPESGD_TUTORIAL_SMALL=1`, the quick
# version CI runs): `python tutorials/04_timing_models.py`, or open it as a notebook.
#
# **A number to start with.** A 25 MB gradient (6.25 million float32 parameters) over a
# 1 Gbit/s link, 125 MB/s: **0.2 s** for one copy, before any latency. A parameter server with
# p = 8 workers pushes and pulls that copy through its one link for every worker: about
# **1.8 s** a round. A ring AllReduce sends 2(p−1)/p copies over every link at once:
# **0.35 s**. Its bandwidth term never passes 2M/B = 0.4 s however many workers join; only its
# latency term, 2(p−1)·α, grows with p (0.7 ms at p = 8 on a 50 µs LAN, 0.1 s at p = 1000).
# If a forward and backward pass takes 0.2 s, which method is fastest, and by how much, is
# arithmetic, not an experiment. `pipesgd_ref/timing/` does that arithmetic for every method
# of this package (the timing models of docs/paper.md, section 3); this tutorial builds it up
# for synchronous SGD and the parameter servers and checks it against measured runs.
#
# You will:
# 1. measure this machine's α (a ping-pong) and B (a stream) with
#    `timing.network.measure_p2p`, and read off where a message stops being latency-bound;
# 2. compare the ring AllReduce with the parameter server as p grows, and what synchronous
#    SGD, ps-sync and ps-async pay per iteration (`timing.ring_allreduce_time`,
#    `timing.predict`);
# 3. calibrate the models on this machine (`timing.calibrate.calibrate`) and check their
#    predictions against measured sync, ps-sync and ps-async runs over an emulated link.
#
# Tutorial 05 builds the model of the pipelined method, Pipe-SGD, on the same pieces
# (t_comp, t_u and the ring's T_ar), and runs it.

# %%
import os
import statistics
import time
from pathlib import Path

from pipesgd_ref import timing
from pipesgd_ref.comm.netem import LinkSpec
from pipesgd_ref.commands.train import run_training
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.exercises import check
from pipesgd_ref.plots import pyplot, save_figure
from pipesgd_ref.timing.calibrate import calibrate
from pipesgd_ref.timing.network import measure_p2p
from pipesgd_ref.units import format_bandwidth, format_bytes, format_seconds, parse_bandwidth

SMALL = os.environ.get("PIPESGD_TUTORIAL_SMALL") == "1"  # CI: fewer sizes and steps
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
# M = 25 MB, B = 1 Gbit/s, α = 50 µs (a LAN), p = 8. The ring's cost is
# `timing.ring_allreduce_time`, equation (1) of docs/paper.md (γ, the cost of the additions,
# left out here): 2(p−1) hops, each a latency α plus a chunk of M/p bytes. The parameter
# server's link carries p pulls out and, overlapped with them, the pushes in: (p + 1)·M/B
# (tutorial 03). The table splits the ring's cost into its two terms as p grows.

# %%
M_big, p_big, alpha_lan = 25e6, 8, 50e-6
B_1g = parse_bandwidth("1Gbit")
one_copy = M_big / B_1g
ring_big = timing.ring_allreduce_time(p_big, M_big, alpha_lan, B_1g)
ps_big = 2 * alpha_lan + (p_big + 1) * M_big / B_1g
print(f"M = {format_bytes(M_big)} over {format_bandwidth(B_1g)}: {format_seconds(one_copy)}")
print(f"ring AllReduce, p = {p_big}: {format_seconds(ring_big)}; "
      f"parameter server round: {format_seconds(ps_big)}")  # fmt: skip
ring_terms = {}  # p -> (latency term, bandwidth term) of the ring, seconds
print("     p | latency 2(p-1)α | bandwidth 2(p-1)/p·M/B |      T_ar")
for p in (2, 8, 64, 1000):
    latency_term = timing.ring_allreduce_time(p, M_big, alpha_lan, float("inf"))  # B = ∞
    bandwidth_term = timing.ring_allreduce_time(p, M_big, 0.0, B_1g)  # α = 0
    ring_terms[p] = (latency_term, bandwidth_term)
    print(f"{p:6d} | {format_seconds(latency_term):>15} | {format_seconds(bandwidth_term):>22} | "
          f"{format_seconds(latency_term + bandwidth_term):>9}")  # fmt: skip

# %% [markdown]
# ## 1. The alpha-beta model, from a ping-pong up
#
# A link is two numbers: α, the seconds every message costs whatever its size (wire latency,
# plus the software that frames, sends and wakes the receiver), and B, the bytes per second
# it moves once a message flows. One message of n bytes takes
#
#     t(n) = α + n / B
#
# `measure_p2p(nbytes, reps)` (timing/network.py) runs two local processes joined by TCP (no
# emulation) and measures both ends of that line: a 1-byte **ping-pong** (half its round trip is α:
# the bytes are nothing) and a **stream** of `reps` messages of `nbytes` back to back (throughput:
# the latency of one message overlaps the next, so the stream sees B, less a per-message cost).

# %%
p2p_sizes = [(4 << 10, 100), (256 << 10, 20), (4 << 20, 4)]  # (bytes, messages per stream)
if not SMALL:
    p2p_sizes = [(4 << 10, 200), (64 << 10, 100), (1 << 20, 20), (16 << 20, 4)]
p2p = []
for nbytes, reps in p2p_sizes:
    bandwidth, one_way = measure_p2p(nbytes=nbytes, reps=reps)
    p2p.append((nbytes, bandwidth, one_way))
alpha_lo = statistics.median(one_way for _, _, one_way in p2p)  # one ping-pong per call
B_lo = p2p[-1][1]  # the largest messages: per-message costs amortised
print("  message |      streamed throughput | ping-pong one-way")
for nbytes, bandwidth, one_way in p2p:
    print(f"{format_bytes(nbytes):>9} | {format_bandwidth(bandwidth):>24} | "
          f"{format_seconds(one_way):>17}")  # fmt: skip
loopback = LinkSpec(latency=alpha_lo, bandwidth=B_lo)
lan = LinkSpec(latency=alpha_lan, bandwidth=B_1g)
print(f"loopback: alpha = {format_seconds(alpha_lo)}, B = {format_bandwidth(B_lo)}; "
      f"n_1/2 = alpha B = {format_bytes(alpha_lo * B_lo)}")  # fmt: skip
print(f"1 Gbit LAN: alpha = {format_seconds(alpha_lan)}, B = {format_bandwidth(B_1g)}; "
      f"n_1/2 = {format_bytes(alpha_lan * B_1g)}")  # fmt: skip
print("  message | loopback t(n) | latency share | 1 Gbit t(n) | latency share")
for nbytes in (1, 1 << 10, 64 << 10, 1 << 20, 25_000_000):
    lo, la = loopback.message_time(nbytes), lan.message_time(nbytes)
    print(f"{format_bytes(nbytes):>9} | {format_seconds(lo):>13} | {alpha_lo / lo:13.0%} | "
          f"{format_seconds(la):>11} | {alpha_lan / la:13.0%}")  # fmt: skip

# %% [markdown]
# n_1/2 = α·B is the message size at which latency and bandwidth cost the same: below it a
# message is latency-bound (send fewer, larger ones), above it bandwidth-bound (send fewer
# bytes: compression, tutorial 07). Two things stand out on this machine:
#
# - Loopback moves gigabytes per second, yet its α is all software (Python, sockets, waking a
#   process), comparable to a real LAN's 50 µs or larger (printed above). That is why
#   `calibrate` models an emulated link as α = emulated latency + `timing.network.measure_hop`
#   (the software cost of one ring hop, measured) and B = min(emulated, streamed).
# - Small messages stream far below B: every message pays a software cost that the stream
#   cannot overlap. The ring cuts M into p chunks, so at large p its messages shrink toward
#   this regime, and its 2(p−1)·α term grows (section 0's table).
#
# ## 2. Ring against parameter server as p grows
#
# A `timing.Calibration` holds every figure the models read. For a cluster we can write one
# by hand: the 25 MB model, t_comp = 0.2 s, t_u = 5 ms, α = 50 µs, B = 1 Gbit/s, γ = 0, and
# `cores=10**9`: each worker on its own machine, no sharing of cores (section 3 measures all
# of these on this machine instead). `timing.predict(algo, p, cal)` then gives each method's
# iteration, and its `comm_s` the communication in it (equations (1), (3), (5) and (7) of
# docs/paper.md, written beside their code in timing/iteration.py):
#
#     ring AllReduce:  T_ar = 2(p−1)·α + 2(p−1)/p · M/B
#     sync:            t_comp + T_ar + t_u        (compute, then communicate, then update)
#     ps-sync:         t_comp + 2α + p·M/B + M/B + t_u    (p pulls out, the last push in)
#     ps-async:        max(t_comp + 2α + 2M/B + t_u,  p·M/B)   per worker iteration

# %%
cluster = timing.Calibration(n_params=int(M_big / 4), t_comp=0.2, t_update=0.005,
                             alpha=alpha_lan, bandwidth=B_1g, gamma=0.0, cores=10**9)  # fmt: skip
methods = (("ps-sync", "none"), ("ps-async", "none"), ("sync", "none"))
world_sizes = (2, 4, 8, 16, 32, 64)
by_p = {p: timing.predict_all(p, cluster, runs=methods) for p in world_sizes}
print("   p | T_ar ring | PS comm | sync it | ps-sync it | ps-async it (bound) | PS/ring")
for p, preds in by_p.items():
    t_ar = timing.ring_allreduce_time(p, cluster.grad_bytes, cluster.alpha, cluster.bandwidth)
    ps_comm = preds["ps-sync"].comm_s
    its = " | ".join(f"{preds[k].iter_time_s:{w}.3f}" for k, w in
                     (("sync", 7), ("ps-sync", 10), ("ps-async", 11)))  # fmt: skip
    print(f"{p:4d} | {t_ar:9.3f} | {ps_comm:7.3f} | {its} {preds['ps-async'].bound:>7} | "
          f"{ps_comm / t_ar:7.1f}")  # fmt: skip

if plt is not None:
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for label in ("ps-sync", "ps-async", "sync"):
        ax.plot(world_sizes, [by_p[p][label].iter_time_s for p in world_sizes], "o-",
                label=label)  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("workers p")
    ax.set_ylabel("iteration time, s (predicted)")
    ax.set_title("25 MB gradient, 1 Gbit/s, t_comp = 0.2 s", fontsize=9)
    ax.legend(fontsize=8)
    save_figure(fig, OUT / "04_ring_vs_ps.png")
else:
    print("matplotlib is not installed: plots skipped")

# %% [markdown]
# The ring's communication tends to 2M/B (0.4 s) plus 2(p−1)·α: the bandwidth term is flat in
# p, only the latency term grows. The server's grows linearly: every added worker adds M/B to
# its link. ps-async hides none of it either: once p·M/B exceeds a worker's own cycle (the
# `bound` column turns from `worker` to `server`), the server's link sets the pace of every
# worker.
#
# Synchronous SGD pays t_comp + T_ar + t_u, one after the other: while the ring runs the
# processor idles, and while the worker computes the network idles. Tutorial 05 overlaps the
# two (Pipe-SGD) and derives its iteration time from these same three terms.
#
# ## 3. Calibrated on this machine, checked against runs
#
# Now the models meet real workers. `calibrate(cfg)` measures, for cfg's model and
# batch size: t_comp (alone, and with k = 1..p workers computing at once on this machine's
# cores: `t_comp_shared`), t_u, γ, the codecs' costs, the hop cost and the stream bandwidth;
# α and B come from cfg's emulated link plus those measurements. We take a small MLP on
# digits, p = 2, batch 128, and a 1 Gbit/s, 50 µs link: a regime where communication
# outweighs computation (the predictions below print both), so that the ring and the server
# differ clearly.
#
# Each method runs a few times and we keep the **fastest** run (as `timeit` does): this
# machine may be shared, and the model describes an undisturbed one. Every run's own
# iteration time is the median over its steady-state steps (`summary["iter_time_s"]`). The
# calibration is a measurement as well, which a burst of other work can inflate: we
# calibrate twice and keep the calibration that predicts the faster iteration.

# %%
# By name: tcp, the links `calibrate` measures its hop and stream on (the default, auto, would
# link the workers through shared memory), and the ring, the AllReduce the models describe
# (auto may choose another algorithm for each message).
check_cfg = TrainConfig(dataset="digits", model="mlp", hidden=(256, 256), world_size=2,
                        batch_size=128, lr=0.05, steps=16 if SMALL else 40, eval_every=0,
                        latency="50us", bandwidth="1Gbit", transport="tcp",
                        allreduce="ring")  # fmt: skip
p_c = check_cfg.world_size
check_algos = ("sync", "ps-sync", "ps-async")
t0 = time.perf_counter()
calibrations = [calibrate(check_cfg) for _ in range(2)]  # a measurement too: keep the less
cal = min(calibrations, key=lambda c: timing.predict("sync", p_c, c).iter_time_s)  # disturbed
print(f"calibrated twice in {time.perf_counter() - t0:.1f} s; kept: {timing.describe(cal)}")
predicted = {algo: timing.predict(algo, p_c, cal) for algo in check_algos}
for algo, pred in predicted.items():
    print(f"  {algo:8s} predicted {format_seconds(pred.iter_time_s):>9} (compute "
          f"{format_seconds(pred.compute_s)}, communication {format_seconds(pred.comm_s)}, "
          f"bound {pred.bound})")  # fmt: skip

repeats = 3 if SMALL else 5
measured = {}  # algo -> list of summaries
t0 = time.perf_counter()
for _ in range(repeats):
    for algo in check_algos:  # interleaved: a burst of load hits all alike
        summary, _ = run_training(check_cfg.replace(algo=algo), progress=False, log=quiet)
        measured.setdefault(algo, []).append(summary)
print(f"{repeats} runs each of {check_cfg.steps} steps: {time.perf_counter() - t0:.1f} s")
best = {algo: min(runs, key=lambda s: s["iter_time_s"]) for algo, runs in measured.items()}
errors = {}
print("     algo | runs (iteration)                     | fastest   | predicted | error")
for algo in check_algos:
    s, pred = best[algo], predicted[algo]
    errors[algo] = (pred.iter_time_s - s["iter_time_s"]) / s["iter_time_s"]
    runs = ", ".join(f"{r['iter_time_s'] * 1e3:.2f}" for r in measured[algo]) + " ms"
    print(f" {algo:>8} | {runs:36s} | {format_seconds(s['iter_time_s']):>9} | "
          f"{format_seconds(pred.iter_time_s):>9} | {errors[algo]:+6.0%}")  # fmt: skip
print(f"measured: ps-sync takes {best['ps-sync']['iter_time_s'] / best['sync']['iter_time_s']:.2f}x"
      f" sync's iteration; the models say "
      f"{predicted['ps-sync'].iter_time_s / predicted['sync'].iter_time_s:.2f}x")  # fmt: skip

# %% [markdown]
# Read the error column as the distance between an idle machine and this one. The models
# leave out what a shared machine adds: the ranks of a ring do not start a step at the same
# moment, and every AllReduce waits for the last of them; the parameter server's
# process shares the two cores with its workers; another program's work can land on any rank.
# All of these make a run slower than predicted, never faster (a negative error); the
# calibration's own noise goes either way. On a small busy machine the models land within tens
# of percent (benchmarks/timing_model_accuracy.py measures this over a grid of world sizes,
# networks, models and codecs). What they get right is the shape: which resource bounds the
# iteration, and the ranking of the methods: even at p = 2 the server's link carries three
# copies of the gradient per round, (p + 1)·M, where each ring link carries one, 2(p−1)/p·M.
#
# ## 4. Checks

# %%
TOLERANCE = 0.40  # |predicted - measured| / measured on a noisy 2-core machine
for algo, err in errors.items():
    assert abs(err) <= TOLERANCE, (
        f"{algo}: predicted {format_seconds(predicted[algo].iter_time_s)}, measured "
        f"{format_seconds(best[algo]['iter_time_s'])} (fastest of {repeats}): error "
        f"{err:+.0%}, beyond {TOLERANCE:.0%}; calibration: {timing.describe(cal)}"
    )
assert predicted["ps-sync"].iter_time_s > predicted["sync"].iter_time_s, (
    f"communication-heavy at p = {p_c}: the server's (p + 1) M/B should outweigh the ring's "
    f"T_ar, yet ps-sync is predicted at {format_seconds(predicted['ps-sync'].iter_time_s)}, "
    f"sync at {format_seconds(predicted['sync'].iter_time_s)}"
)
assert best["ps-sync"]["iter_time_s"] > best["sync"]["iter_time_s"], (
    f"measured, ps-sync ({format_seconds(best['ps-sync']['iter_time_s'])}) should be slower "
    f"than sync ({format_seconds(best['sync']['iter_time_s'])}), as predicted"
)
for p, preds in by_p.items():
    t_ar = timing.ring_allreduce_time(p, cluster.grad_bytes, cluster.alpha, cluster.bandwidth)
    assert t_ar <= 2 * cluster.grad_bytes / cluster.bandwidth + 2 * (p - 1) * cluster.alpha, (
        f"p = {p}: the ring's T_ar {t_ar} exceeds its bound 2M/B + 2(p-1) alpha"
    )
    assert preds["ps-sync"].comm_s > t_ar, f"p = {p}: the PS should communicate longer"
    sync_sum = cluster.t_comp + t_ar + cluster.t_update
    assert abs(preds["sync"].iter_time_s - sync_sum) <= 1e-9 * sync_sum, (
        f"p = {p}: sync should be t_comp + T_ar + t_u = {sync_sum}, predicted "
        f"{preds['sync'].iter_time_s}"
    )
server_bound = [p for p, preds in by_p.items() if preds["ps-async"].bound == "server"]
assert server_bound and server_bound == list(world_sizes[-len(server_bound) :]), (
    f"ps-async should be bound by the server's link from some p on, and stay so: {server_bound}"
)
for p, (latency_term, bandwidth_term) in ring_terms.items():
    assert bandwidth_term < 2 * M_big / B_1g, f"p = {p}: bandwidth term {bandwidth_term} >= 2M/B"
    assert abs(latency_term - 2 * (p - 1) * alpha_lan) < 1e-12, (p, latency_term)
assert ring_terms[1000][0] + ring_terms[1000][1] > 2 * M_big / B_1g, (
    "at p = 1000 the latency term should push T_ar past 2M/B"
)
smallest, largest = p2p[0], p2p[-1]
assert largest[1] > 2 * smallest[1], (
    f"streams of {format_bytes(largest[0])} messages ({format_bandwidth(largest[1])}) should be "
    f"far faster than of {format_bytes(smallest[0])} ones ({format_bandwidth(smallest[1])}): "
    f"small messages pay a per-message cost"
)
assert abs(ring_big - 0.35) < 0.01 and abs(ps_big - 1.8) < 0.01, (ring_big, ps_big)
print("all checks passed")

# %% [markdown]
# ## Summary
#
# - The alpha-beta model prices a message at α + n/B; n_1/2 = α·B separates latency-bound
#   from bandwidth-bound messages. A ping-pong measures α, a stream measures B. On one
#   machine α is mostly software, which `calibrate` adds to an emulated link's latency.
# - A ring AllReduce costs 2(p−1)·α + 2(p−1)/p · M/B (+ γ and codec terms): its bandwidth
#   term stays below 2M/B at any p, its latency term grows with p. A parameter server's link
#   carries about (p+1)·M/B per round: linear in p, the bottleneck the decentralized methods
#   avoid.
# - Synchronous SGD pays t_comp + T_ar + t_u, its compute and its network taking turns;
#   ps-sync pays the server's round, ps-async the larger of a worker's cycle and the server's
#   p·M/B. Tutorial 05 builds Pipe-SGD's iteration time on these terms.
# - Calibrated on this machine, the models predict measured iterations within tens of
#   percent: contention for shared cores and waits for the slowest rank are not in them, and
#   make runs slower, not faster. They get the bound and the ranking of the methods right.
#
# ## Exercises
#
# Exercises with a checkable answer end with a `check("04.k", answer)` cell: put your answer
# in place of `None` and run the cell.

# %% [markdown]
# **1.** For which p are the ring's two terms equal, its latency term 2(p−1)·α and its
# bandwidth term 2(p−1)/p·M/B, on the LAN of section 0 (α = 50 µs, B = 1 Gbit/s, γ = 0)?
# Answer for the 25 MB gradient and for a 250 KB one (a pair of numbers of workers). What has
# n_1/2 of section 1 to do with it?
#
# <details><summary>Hint</summary>
#
# Set the two terms equal and cancel 2(p−1): α = M/(pB), so p = M/(αB). Each hop carries a
# chunk of M/p bytes, and the latency term wins once that chunk is smaller than n_1/2 = α·B.
#
# </details>

# %%
answer = None  # your answer: (p for 25 MB, p for 250 KB), numbers of workers
check("04.1", answer)

# %% [markdown]
# **2.** In section 2's cluster, from which p on does the server's link set ps-async's pace
# (the `bound` column reads `server`)? Derive it from equation (7), then read it off the
# table or `timing.predict("ps-async", p, cluster).bound`.
#
# <details><summary>Hint</summary>
#
# A worker's own cycle is t_comp + 2α + 2M/B + t_u (about 0.6 s here); the server's link
# needs p·M/B = p × 0.2 s to send p pulls. Find the smallest whole p for which the second is
# larger.
#
# </details>

# %%
answer = None  # your answer: the smallest p (an integer) at which ps-async is server-bound
check("04.2", answer)

# %% [markdown]
# **3.** A data-centre link: α = 5 µs and B = 10 Gbit/s. What is its n_1/2, in bytes? Is a
# ring hop of the 25 MB gradient over p = 64 workers latency-bound or bandwidth-bound on it?
#
# <details><summary>Hint</summary>
#
# n_1/2 = α·B with B in bytes per second (10 Gbit/s = 1.25e9 B/s). A ring hop carries
# M/p bytes: compare that with n_1/2.
#
# </details>

# %%
answer = None  # your answer: n_1/2 of the link, in bytes
check("04.3", answer)

# %% [markdown]
# **4.** Rerun section 3 with `world_size=4` on this machine. How does `t_comp_shared` grow
# with k (the workers computing at once), and how well does `timing.predict` follow the
# measured iterations now?
#
# <details><summary>Hint</summary>
#
# Four workers on two cores: from k = 3 on two computations share a core, so expect
# t_comp_shared to roughly double between k = 2 and k = 4. The ring now has 2(p−1) = 6 hops,
# and the server's link carries five copies per round instead of three.
#
# </details>

# %% [markdown]
# **5.** Rerun section 3 with `bandwidth="10Gbit"`. Which term dominates sync's predicted
# iteration now, and does the parameter server still lose to the ring, in the prediction and
# in the runs?
#
# <details><summary>Hint</summary>
#
# Compare the printed compute and communication of each prediction. At 10 Gbit/s M/B is ten
# times smaller, while the software part of α (the measured hop) does not shrink: look at
# which of the ring's two terms is left.
#
# </details>

# %% [markdown]
# **6.** Add `codec="q8"` to the sync runs of section 3 and compare with
# `timing.predict("sync", p_c, cal, "q8")`. Is the measured gain of 8-bit compression as large
# as the predicted one? Why might the codec's passes cost more inside a run than in
# `timing.measure.time_codecs`?
#
# <details><summary>Hint</summary>
#
# Equation (2) of docs/paper.md adds encode and decode passes to T_ar. Inside a run they share
# the cores and the caches with the other worker's computation; the calibration timed them
# alone, on data already in cache.
#
# </details>

# %% [markdown]
# Written solutions to every exercise above, with the reasoning: docs/solutions.md, section 04
# (on the site, the page "Solutions to the exercises").
