# %% [markdown]
# # 03 · The parameter server: one link for everyone
#
# **A number to start with.** A 25 MB model, p = 8 workers, a 10 Gbit/s link (1.25 GB/s) per
# machine. A parameter server (PS) keeps the weights; every round, each worker pushes its
# gradient to it and pulls the new weights back. All of that crosses the *server's* link:
# p·M = 200 MB in and p·M = 200 MB out per round. Written as two phases, all pushes in, then
# all pulls out (the usual textbook model; docs/paper.md, section 3), a round costs
# 2pM/B = **0.32 s** of wire time; this package's server overlaps a little better,
# (p+1)·M/B = **0.18 s** (section 5 says why). A ring AllReduce of the same gradient moves
# 2(p−1)/p · M through *every* link at once: **0.035 s** of wire time. Add workers and the PS
# gets slower, linearly, while the ring tends to 2M/B. That is the bottleneck the
# decentralized methods, and Pipe-SGD, are built to avoid (Li et al., NeurIPS 2018;
# docs/paper.md, section 1).
#
# You will:
# 1. compute those numbers, and how they grow with p, by hand and with the package's timing
#    models (`pipesgd_ref.timing`);
# 2. train with synchronous and asynchronous PS on digits (`run_training`);
# 3. check ps-sync against the oracle `reference.sync_sgd`, bitwise;
# 4. check ps-async against `reference.async_ps_sgd` replayed in the recorded arrival order,
#    and read its staleness histogram;
# 5. emulate a network and watch the server's link become the bottleneck as p grows, against
#    the ring, with the cost formulas beside the measurements.
#
# Run it with `python tutorials/03_parameter_server.py`. Takes about 10 s here on two cores
# (about 9 s with `PIPESGD_TUTORIAL_SMALL=1`, the quick version CI runs).

# %%
import os
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from pipesgd_ref.comm.netem import link_of
from pipesgd_ref.comm.wire import HEADER_BYTES
from pipesgd_ref.commands.train import run_training
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.exercises import check
from pipesgd_ref.methods import reference
from pipesgd_ref.methods.ps import ps_sync_worker
from pipesgd_ref.plots import pyplot, save_figure
from pipesgd_ref.runtime.launch import launch_local
from pipesgd_ref.runtime.worker import Worker
from pipesgd_ref.timing import Calibration, ps_async, ps_sync, ring_allreduce_time, sync
from pipesgd_ref.trace import median_duration
from pipesgd_ref.units import format_bandwidth, format_bytes, format_seconds

SMALL = os.environ.get("PIPESGD_TUTORIAL_SMALL") == "1"  # CI: fewer steps, same lessons
# As a script, beside this file; as a notebook (Jupyter, VS Code, nbconvert), in the
# notebook's own folder, which is where a notebook runs.
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
OUT = HERE / "out"  # figures go here (git-ignored)

plt = pyplot()  # None without matplotlib: the lessons are in the printed numbers and asserts


def save(fig, name: str) -> None:
    save_figure(fig, OUT / name)


def quiet(*_) -> None:
    """A `log` for run_training that prints nothing (the sweeps print their own tables)."""


# %% [markdown]
# ## 0. The back-of-envelope, in code
#
# The alpha-beta model (α: per-message latency, B: bandwidth per direction of a full-duplex
# link, M: gradient bytes), with the formulas of the docstring of
# `pipesgd_ref/methods/ps_server.py`:
#
#     ps-sync, two phases:       2α + 2p·M/B          the server's link, per round
#     ps-sync, this package:     2α + (p+1)·M/B       pulls sent one after another
#     ring AllReduce:            2(p−1)·α + 2(p−1)/p · M/B
#     ps-async, whole job:       min(p / (2α + 2M/B), B/M) updates per second: the workers'
#                                own cycles, or at most B/M, whatever p
#
# The compute time t_c and the reduction cost γ are left out here; they are the same for every
# scheme. α = 50 µs is an assumed LAN latency, as in tutorials 01 and 02.

# %%


def ps_sync_two_phase(n_bytes: float, p: int, alpha: float, bandwidth: float) -> float:
    """2 alpha + 2 p M / B: all p pushes in, then all p pulls out (the conventional model of
    docs/paper.md, section 3; the package's server with shared pulls pays it: Eq. 6)."""
    return 2 * alpha + 2 * p * n_bytes / bandwidth


def ps_sync_sequential(n_bytes: float, p: int, alpha: float, bandwidth: float) -> float:
    """2 alpha + (p + 1) M / B: the pulls leave one after another (docs/paper.md, Eq. 5)."""
    return 2 * alpha + (p + 1) * n_bytes / bandwidth


def ps_async_rate(n_bytes: float, p: int, alpha: float, bandwidth: float) -> float:
    """Updates per second of the whole job: p workers each pushing and pulling once per cycle
    of 2 alpha + 2 M / B, or the server's link, B / M pulls a second, whichever is less."""
    return min(p / (2 * alpha + 2 * n_bytes / bandwidth), bandwidth / n_bytes)


# The ring, for comparison: 2(p-1) alpha + 2(p-1)/p M/B (tutorial 02), from the timing models.
M_big, p_big, B_10g, alpha_lan = 25e6, 8, 10e9 / 8, 50e-6
print(f"{format_bytes(M_big)} model, p = {p_big}, {format_bandwidth(B_10g)}, alpha 50 us:")
print(f"  server link per round: {format_bytes(p_big * M_big)} in, "
      f"{format_bytes(p_big * M_big)} out")  # fmt: skip
print(f"  ps-sync, two phases:   {ps_sync_two_phase(M_big, p_big, alpha_lan, B_10g):.4f} s")
print(f"  ps-sync, this package: {ps_sync_sequential(M_big, p_big, alpha_lan, B_10g):.4f} s")
print(f"  ring AllReduce:        {ring_allreduce_time(p_big, M_big, alpha_lan, B_10g):.4f} s")
print(f"  ps-async: {ps_async_rate(M_big, p_big, alpha_lan, B_10g):.0f} updates/s for the whole "
      f"job, at most B/M = {B_10g / M_big:.0f} whatever p")  # fmt: skip
print("   p | ps-sync 2pM/B | ps-sync (p+1)M/B |    ring | ps (2 phases) / ring | async upd/s")
for p_ in (1, 2, 4, 8, 16, 64):
    two_phase = ps_sync_two_phase(M_big, p_, alpha_lan, B_10g)
    ring_s = ring_allreduce_time(p_, M_big, alpha_lan, B_10g)
    sequential = ps_sync_sequential(M_big, p_, alpha_lan, B_10g)
    ratio = f"{two_phase / ring_s:20.1f}" if p_ > 1 else f"{'(no ring)':>20}"
    print(f"{p_:4d} | {two_phase:11.3f} s | {sequential:14.3f} s | {ring_s:5.3f} s | {ratio} | "
          f"{ps_async_rate(M_big, p_, alpha_lan, B_10g):11.0f}")  # fmt: skip

# %% [markdown]
# ### The same formulas in the package's timing models
#
# `pipesgd_ref.timing` holds these formulas, derived and numbered in the docstring of
# `pipesgd_ref/timing/iteration.py` and in docs/paper.md, section 3: Eq. (1) is the ring's
# T_ar, (3) synchronous SGD around it, (5) ps-sync with this package's pulls one after another,
# (6) ps-sync with all pulls sent at once (the two-phase round: p pulls out together, then p
# pushes queue on the way in), (7) ps-async. Tutorial 04 builds on them. They read the
# machine from a `Calibration`. Describe the cluster of the opening with it: n = M/4 float32
# parameters, α and B as above, t_c = t_u = γ = 0 as in the formulas above, and a machine
# per process (`cores` far above p: no two processes share a core). Then the package must
# give the hand-built numbers, to rounding. ps-async's prediction is an iteration of one
# worker, T; the whole job makes p updates per T.

# %%
cluster = Calibration(n_params=int(M_big) // 4, t_comp=0.0, t_update=0.0, alpha=alpha_lan,
                      bandwidth=B_10g, gamma=0.0, cores=10**9)  # fmt: skip
package_gaps = {}  # (formula, p) -> relative gap between the package and the hand-built one
for p_ in (1, 2, 4, 8, 16, 64):
    pairs = {  # formula -> (package, by hand)
        "Eq. (5), ps-sync": (ps_sync(p_, cluster).iter_time_s,
                             ps_sync_sequential(M_big, p_, alpha_lan, B_10g)),
        "Eq. (6), ps-sync shared": (ps_sync(p_, cluster, ps_pulls="shared").iter_time_s,
                                    ps_sync_two_phase(M_big, p_, alpha_lan, B_10g)),
        "Eq. (3), sync (ring)": (sync(p_, cluster).iter_time_s,
                                 ring_allreduce_time(p_, M_big, alpha_lan, B_10g)),
        "Eq. (7), ps-async": (p_ / ps_async(p_, cluster).iter_time_s,
                              ps_async_rate(M_big, p_, alpha_lan, B_10g)),
    }  # fmt: skip
    for name, (package, hand) in pairs.items():
        package_gaps[name, p_] = abs(package - hand) / max(hand, 1e-300)
worst = max(package_gaps, key=package_gaps.get)
print(f"package vs hand-built, {len(package_gaps)} comparisons (4 formulas x 6 values of p): "
      f"largest relative gap {package_gaps[worst]:.1e} ({worst[0]}, p = {worst[1]})")  # fmt: skip
for name, (package, hand) in pairs.items():
    print(f"  p = {p_}: {name:24s} package {package:.6g}, by hand {hand:.6g}")
assert package_gaps[worst] < 1e-12, (
    f"{worst[0]} at p = {worst[1]}: the package and the formula by hand differ by "
    f"{package_gaps[worst]:.1e} (relative); with t_c = t_u = gamma = 0 they must agree"
)

# %% [markdown]
# What the package adds. Give the calibration a compute time, an update and a reduction cost
# (γ: seconds per byte added), and it charges terms the opening left out: the server adds the
# p gradients (p·M·γ) and updates the weights (t_u) once a round; the ring adds (p−1)/p·M·γ
# per rank and every worker updates (t_u); in ps-async a worker's cycle holds its update on
# the server. On one machine with fewer cores than processes it also charges the sharing
# of cores (Eqs. 8 to 11), which no alpha-beta formula sees; tutorial 04 calibrates that.

# %%
# plausible figures for a 25 MB model: t_c and t_u in s, gamma in s per byte added
t_c_demo, t_u_demo, gamma_demo = 0.05, 0.005, 0.2e-9
busy = replace(cluster, t_comp=t_c_demo, t_update=t_u_demo, gamma=gamma_demo)
added = {  # formula -> (the package's prediction minus t_c and the hand-built wire time, the
    #                     terms the text names)
    "ps-sync": (ps_sync(p_big, busy).iter_time_s - t_c_demo
                - ps_sync_sequential(M_big, p_big, alpha_lan, B_10g),
                p_big * M_big * gamma_demo + t_u_demo),
    "sync (ring)": (sync(p_big, busy).iter_time_s - t_c_demo
                    - ring_allreduce_time(p_big, M_big, alpha_lan, B_10g),
                    (p_big - 1) / p_big * M_big * gamma_demo + t_u_demo),
}  # fmt: skip
print(f"t_c = {format_seconds(t_c_demo)}, t_u = {format_seconds(t_u_demo)}, gamma = "
      f"{gamma_demo * 1e9} ns/B, "
      f"p = {p_big}: what the package adds to t_c + the wire time")  # fmt: skip
for name, (extra, named) in added.items():
    print(f"  {name:12s} {format_seconds(extra):>9} = {format_seconds(named)} (the named terms)")
    assert abs(extra - named) < 1e-12, f"{name}: the package adds {extra} s, not {named} s"

# %% [markdown]
# The ratio grows like p: the PS's cost is linear in the number of workers, the ring's is
# bounded by 2M/B. Real systems shard the weights over several servers to spread that load
# (exercise 3); a single server is the textbook baseline, and the one the paper compares with.
#
# ## 1. Roles and wire protocol
#
# A job of p workers runs on **p + 1 processes**: rank 0 is the server (authoritative weights,
# never a gradient) and rank i + 1 is worker i, which draws minibatch (i, step) exactly as the
# oracles' rank i. `launch_local(p + 1, ..., star=True)` links every worker to rank 0 (the star
# of `comm.server` and `comm.clients`); no ring is used. Every rank builds w_0 from the seed,
# so nothing is broadcast first.
#
#     ps-sync, step t:  worker i: g_i = grad f(w_t; minibatch (i, t)); push(g_i); pull(w_{t+1})
#                       server:   receive the p pushes in worker order, sum, divide by p,
#                                 w_{t+1} = w_t − lr_t · avg, send p pulls
#     ps-async:         worker i: g = grad f(w_v; its next minibatch); push(g); pull(newer w)
#                       server:   whichever push arrives first: w ← w − lr_u · g, u ← u + 1,
#                                 pull back to that worker only; staleness of g = u − v
#
# A push is one frame: the gradient, then the worker's minibatch loss in one more float (the
# server can report a loss for every update without a second message). A pull is the weights.
# Each frame has a 48-byte header (`HEADER_BYTES`) that the receiver checks (kind, version,
# dtype, length) before it reads the payload, so a worker out of step gets an error naming it.
#
# ## 2. Train on digits
#
# The `laptop` preset: digits, MLP(64), p = 4 workers, B = 32, lr = 0.1. `run_training` runs
# cfg.algo in processes (5 here: the server and 4 workers) and returns the summary dict of
# `summary.json` and every rank's `WorkerResult`; rank 0's is the server's. Both methods
# compute the same number of gradients, `steps` per worker, but ps-sync makes `steps` updates
# with the average of p of them (an effective batch of p·B) while ps-async makes p·steps
# updates of one gradient each (batch B), most of them stale.

# %%
digits_steps = 150 if SMALL else 400
runs = {}  # algo -> (summary, results)
for algo in ("ps-sync", "ps-async"):
    cfg_algo = TrainConfig.preset("laptop").replace(algo=algo, steps=digits_steps)
    runs[algo] = run_training(cfg_algo, progress=False, log=print)
cfg = TrainConfig.preset("laptop").replace(steps=digits_steps)  # shared by both runs
p = cfg.world_size
print(" algo     | updates | test accuracy | wall time | server sent | server received")
for algo, (summary, results) in runs.items():
    server = results[0]
    print(f"{algo:9s} | {len(server.losses):7d} | {summary['test_accuracy']:13.3f} | "
          f"{summary['wall_time_s']:7.2f} s | {format_bytes(server.bytes_sent):>11} | "
          f"{format_bytes(server.extra['bytes_received']):>15}")  # fmt: skip

# %% [markdown]
# Both learn digits. The byte counts are the opening's p·M each way, per round: the next cell
# recomputes them from the frame sizes.

# %%
sync_server, *sync_workers = runs["ps-sync"][1]
n_params = sync_server.params.size
M = 4 * n_params  # float32 bytes
push_bytes, pull_bytes = HEADER_BYTES + M + 4, HEADER_BYTES + M  # frames: + loss, + header
expected_sent = p * digits_steps * pull_bytes
expected_received = p * digits_steps * push_bytes
print(f"M = {n_params} params x 4 = {format_bytes(M)}; a push frame is {push_bytes} bytes, a "
      f"pull frame {pull_bytes}")  # fmt: skip
print(f"ps-sync server: sent {sync_server.bytes_sent} bytes = p * steps * pull "
      f"({expected_sent}); received {sync_server.extra['bytes_received']} = p * steps * push "
      f"({expected_received})")  # fmt: skip
print(f"each ps-sync worker sent {[w.bytes_sent for w in sync_workers]} = steps * push "
      f"({digits_steps * push_bytes})")  # fmt: skip

# %% [markdown]
# ## 3. ps-sync is synchronous SGD, bitwise
#
# The server sums the p gradients **in worker order** 0, 1, …, p−1, then divides by p, then
# applies w ← w − lr·avg: the very additions, in the very order, of `reference.sync_sgd` (via
# `reference.average_gradient`). Same inputs, same floating-point operations: the result must be
# the same bits, not merely close. We launch `ps_sync_worker` directly for several p (each job
# has p + 1 ranks) and compare every rank's final weights with the oracle. Workers hold the
# weights they pulled last, which must be the server's.
#
# **Why `start_method="fork"`.** The package's default is spawn, a fresh interpreter per
# worker, which would re-import this script and re-run every cell above in each worker (see
# tutorial 02). fork copies the running process and re-runs nothing; nothing here touches a
# GPU, so fork is safe. It also hands the workers the data set already loaded.


# %%
def oracle(cfg: TrainConfig, n_workers: int):
    """(grad_fn, w_0) of the one-process oracles for `n_workers` workers of `cfg`."""
    worker = Worker.build(cfg, 0, n_workers)
    return reference.model_grad_fn(worker.model, worker.data, worker.sampler), worker.params


check_steps = 30 if SMALL else 100
check_cfg = TrainConfig.preset("laptop").replace(steps=check_steps)
ps_sync_gaps = {}  # (workers, rank) -> max |params - oracle|
for n in (1, 2, 3, 4):
    grad_fn, w0 = oracle(check_cfg, n)
    want = reference.sync_sgd(grad_fn, w0, n, check_steps, check_cfg.lr_at)
    # fork, not the package's default spawn: see the paragraph above
    results = launch_local(n + 1, ps_sync_worker, (check_cfg,), start_method="fork", star=True)
    for r, result in enumerate(results):
        ps_sync_gaps[n, r] = float(np.abs(result.params - want.params).max())
    bitwise = all(r.params.tobytes() == want.params.tobytes() for r in results)
    print(f"{n} worker(s), {check_steps} steps: all {n + 1} ranks bitwise equal to "
          f"reference.sync_sgd: {bitwise}")  # fmt: skip

# The digits run of section 2 too: run_training's ps-sync against the oracle.
grad_fn, w0 = oracle(cfg, p)
digits_sync_oracle = reference.sync_sgd(grad_fn, w0, p, digits_steps, cfg.lr_at)
digits_sync_bitwise = all(
    r.params.tobytes() == digits_sync_oracle.params.tobytes() for r in runs["ps-sync"][1]
)
print(f"run_training ps-sync ({p} workers, {digits_steps} steps) bitwise equal to "
      f"reference.sync_sgd on every rank: {digits_sync_bitwise}")  # fmt: skip

# %% [markdown]
# ## 4. ps-async: the oracle needs the arrival order
#
# Asynchronous SGD has no single trajectory: what the server computes depends on *which push
# arrives first*, a matter of timing. The server therefore records it:
# `results[0].extra["arrival_order"]` (the worker of each applied update) and
# `extra["staleness"]` (how many updates were applied between that worker's pull and its
# push). Given the order, the run is deterministic: `reference.async_ps_sgd(grad_fn, w0, p,
# arrival_order, lr)` replays it in one process (worker r computes its next gradient on the
# weights it pulled last) and must give the same weights, bit for bit, and the same staleness.

# %%
async_summary, async_results = runs["ps-async"]
async_server = async_results[0]
order = async_server.extra["arrival_order"]
staleness = async_server.extra["staleness"]
replay = reference.async_ps_sgd(grad_fn, w0, p, order, cfg.lr_at)
async_bitwise = async_server.params.tobytes() == replay.params.tobytes()
async_gap = float(np.abs(async_server.params - replay.params).max())
print(f"first 24 arrivals: {order[:24]}")
print(f"ps-async server weights bitwise equal to the replay: {async_bitwise}; "
      f"staleness lists equal: {staleness == replay.staleness}")  # fmt: skip

# %% [markdown]
# The staleness histogram. With p workers of equal speed taking turns (`round_robin`), every
# gradient after the first round is exactly p−1 updates old: the other p−1 workers each pushed
# once in between. Real arrivals are not that regular: a worker that is descheduled for a
# moment comes back to find several updates from each of the others, and a worker that gets
# two turns in a row has staleness 0. But the **mean** cannot exceed p−1: each update ages
# the pending gradient of at most the p−1 *other* workers by one.

# %%
counts = np.bincount(staleness)
rr_staleness = reference.async_ps_sgd(
    grad_fn, w0, p, reference.round_robin(p, len(order)), cfg.lr_at
).staleness
print("staleness |  ps-async | round robin")
rr_counts = np.bincount(rr_staleness, minlength=len(counts))
for s in range(max(len(counts), len(rr_counts))):
    got = counts[s] if s < len(counts) else 0
    print(f"{s:9d} | {got:9d} | {rr_counts[s]:11d}")
mean_staleness = float(np.mean(staleness))
print(f"mean staleness {mean_staleness:.2f} (at most p - 1 = {p - 1}), max {max(staleness)}; "
      f"summary.json's histogram: {async_summary['staleness_histogram']}")  # fmt: skip

if plt is not None:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(np.arange(len(counts)), counts, label="ps-async, measured")
    ax.bar(np.arange(len(rr_counts)), rr_counts, width=0.3, color="grey",
           label="equal speeds (round robin)")  # fmt: skip
    ax.axvline(mean_staleness, color="k", ls="--", lw=1, label=f"mean {mean_staleness:.2f}")
    ax.set(xlabel="staleness (updates between pull and push)", ylabel="applied gradients")
    ax.set_yscale("log")  # the rare, very stale gradients are the point: keep them visible
    ax.set_title(f"ps-async, p = {p} workers, digits")
    ax.legend()
    save(fig, "03_staleness.png")
else:
    print("matplotlib is not installed: plots skipped")

# %% [markdown]
# So async buys freedom from the barrier with gradients that are, on average, up to p−1
# updates old and, now and then, much older; how old depends on timing nobody controls.
# Pipe-SGD's staleness is exactly K−1 on every update, whatever the timing (tutorial 05).
#
# ## 5. The server's link under emulation
#
# Now the cost. `cfg.replace(latency="100us", bandwidth="100MB")` makes every link of the job an
# emulated one (α = 100 µs, B = 100 MB/s per direction; pipesgd_ref/comm/netem.py). For the
# parameter server that is not enough: p emulated client links would give the server p NICs.
# `ServerNIC` (comm/netem.py) makes its pulls share one outgoing wire and re-times its pushes
# through one incoming wire, as one network card would.
#
# The model is made larger (one hidden layer of 1024) so that M/B is a few milliseconds and
# dominates the software overheads. For p = 1, 2, 4 we measure the ps-sync iteration, the
# synchronous ring (`algo="sync"`) and the ps-async update rate, and print the formulas of
# methods/ps_server.py's docstring next to them, with t_c the median compute span measured in
# the same run and the exact frame sizes (header included):
#
#     ps-sync:   T_it = t_c + 2α + (p+1)·M/B     (two phases, Eq. (6): t_c + 2α + 2p·M/B)
#     ring:      T_it = t_c + 2(p−1)·α + 2(p−1)/p · M/B
#     ps-async:  rate = min(p / (t_c + 2α + 2M/B), B/M) updates/s
#
# Why (p+1)·M/B and not 2p·M/B: the server sends the pulls one after another, so worker 0 has
# its weights after M/B and computes and pushes while the other pulls are still leaving; the
# full-duplex link takes that push in meanwhile. Only the last worker's pull, its compute and
# its push are on the critical path: p·M/B of pulls, then t_c, then one push. The update t_u
# (one pass over the weights, measured below) and the γ term (the server's p additions, p
# passes of the same size) are left out.

# %%
sweep_steps = 20 if SMALL else 30  # start-up dominates a run: steps are cheap
# allreduce="ring": sync's AllReduce is the ring of the models below (the default, auto, may
# choose another algorithm for each message)
emu = TrainConfig.preset("laptop").replace(
    hidden=(1024,), steps=sweep_steps, eval_every=0, latency="100us", bandwidth="100MB",
    allreduce="ring",
)  # fmt: skip
link = link_of(emu)
alpha, bandwidth = link.latency, link.bandwidth
sweep = {}  # (algo, p) -> (summary, results)
t0 = time.perf_counter()
for p_ in (1, 2, 4):
    for algo in ("ps-sync", "sync", "ps-async"):
        sweep[algo, p_] = run_training(emu.replace(algo=algo, world_size=p_), False, quiet)
print(f"emulated link: {link}; {time.perf_counter() - t0:.1f} s for the 9 runs")

emu_params = sweep["sync", 1][1][0].params.size
M_emu = 4 * emu_params
push_emu, pull_emu = HEADER_BYTES + M_emu + 4, HEADER_BYTES + M_emu
print(f"MLP 64-1024-10: {emu_params} params, M = {format_bytes(M_emu)}, "
      f"M/B = {format_seconds(M_emu / bandwidth)}")  # fmt: skip


def ps_sync_model(p: int, t_c: float) -> float:
    """t_c + 2 alpha + (p + 1) M / B (methods/ps_server.py), with the exact frames (p pulls and
    a push)."""
    return t_c + 2 * alpha + (p * pull_emu + push_emu) / bandwidth


# A run a few tenths of a second long can fall into a slow stretch of a shared machine, and
# noise only ever adds time: a ps-sync point more than 30% off its model is run once more, and
# the faster of its two runs is kept (as `pipesgd compare` keeps the faster of its repeats).
for p_ in (1, 2, 4):
    s_ps = sweep["ps-sync", p_][0]
    if abs(s_ps["iter_time_s"] / ps_sync_model(p_, s_ps["t_comp_s"]) - 1) >= 0.3:
        again = run_training(emu.replace(algo="ps-sync", world_size=p_), False, quiet)
        if again[0]["iter_time_s"] < s_ps["iter_time_s"]:
            sweep["ps-sync", p_] = again
        print(f"ps-sync, p = {p_}: run again, {format_seconds(s_ps['iter_time_s'])} then "
              f"{format_seconds(again[0]['iter_time_s'])} per iteration")  # fmt: skip


def ps_sync_two_phase_model(p: int, t_c: float) -> float:
    """t_c + 2 alpha + 2 p M / B (all pulls, then all pushes: Eq. 6 of docs/paper.md)."""
    return t_c + 2 * alpha + p * (pull_emu + push_emu) / bandwidth


def ring_model(p: int, t_c: float) -> float:
    """t_c + 2(p-1) (alpha + chunk frame / B): 2(p-1) steps of one chunk of M/p each."""
    return t_c + 2 * (p - 1) * (alpha + (M_emu / p + HEADER_BYTES) / bandwidth)


def async_rate_model(p: int, t_c: float) -> float:
    """min(p / (t_c + 2 alpha + 2M/B), B/M) updates per second: workers or the server's link."""
    return min(p / (t_c + 2 * alpha + (push_emu + pull_emu) / bandwidth), bandwidth / push_emu)


def measured_rate(server_ends: list[float], skip: int) -> float:
    """Updates per second on the server, after the first `skip` updates (the start-up)."""
    ends = np.asarray(server_ends)[skip:]
    return (len(ends) - 1) / (ends[-1] - ends[0])


table = {}  # (what, p) -> (measured, model)
print("   p | ps-sync measured | (p+1)M/B model | 2pM/B model | ring measured | ring model "
      "| async upd/s | async model")  # fmt: skip
for p_ in (1, 2, 4):
    s_ps, s_ring = sweep["ps-sync", p_][0], sweep["sync", p_][0]
    s_async, r_async = sweep["ps-async", p_]
    table["ps-sync", p_] = (s_ps["iter_time_s"], ps_sync_model(p_, s_ps["t_comp_s"]))
    table["ring", p_] = (s_ring["iter_time_s"], ring_model(p_, s_ring["t_comp_s"]))
    table["ps-async", p_] = (
        measured_rate(r_async[0].step_end, skip=p_),
        async_rate_model(p_, s_async["t_comp_s"]),
    )
    two_phase = ps_sync_two_phase_model(p_, s_ps["t_comp_s"])
    (ps_got, ps_model), (ring_got, ring_want) = table["ps-sync", p_], table["ring", p_]
    print(f"{p_:4d} | {format_seconds(ps_got):>16} | {format_seconds(ps_model):>14} | "
          f"{format_seconds(two_phase):>11} | {format_seconds(ring_got):>13} | "
          f"{format_seconds(ring_want):>10} | {table['ps-async', p_][0]:11.0f} | "
          f"{table['ps-async', p_][1]:11.0f}")  # fmt: skip
t_c_all = [sweep[k][0]["t_comp_s"] for k in sweep]
t_u = median_duration([e for r in sweep["sync", 4][1] for e in r.events], ("update",))
print(f"t_c (median compute span) across the runs: {format_seconds(min(t_c_all))} .. "
      f"{format_seconds(max(t_c_all))}; t_u (median update span, ring, p = 4): "
      f"{format_seconds(t_u)}; the async bound B/M = {bandwidth / push_emu:.0f} "
      f"updates/s")  # fmt: skip

# %% [markdown]
# The hand-built models of this section against the package's, as in section 0: a
# `Calibration` of this model on the emulated link, with each run's measured t_c and t_u = γ =
# 0, one machine per process. One term differs, and on purpose: the package counts M bytes a
# message, the hand-built models the exact frames, M plus a 48-byte header (`HEADER_BYTES`),
# and a push 4 bytes more for the worker's loss. So ps-sync's model exceeds the package's by
# ((p+1)·48 + 4)/B (p pull headers, one push header and loss), the ring's by 2(p−1)·48/B (a
# header a step), and ps-async's rate differs by less than a push's extra bytes in M,
# (48 + 4)/M.

# %%
emu_cal = Calibration(n_params=emu_params, t_comp=0.0, t_update=0.0, alpha=alpha,
                      bandwidth=bandwidth, gamma=0.0, cores=10**9)  # fmt: skip
emu_gaps = {}  # (model, p) -> what is left after the headers: ~0 (seconds; relative for async)
for p_ in (1, 2, 4):
    t_ps, t_ring, t_async = (sweep[a, p_][0]["t_comp_s"] for a in ("ps-sync", "sync", "ps-async"))
    package_ps = ps_sync(p_, replace(emu_cal, t_comp=t_ps)).iter_time_s  # Eq. (5)
    package_ring = sync(p_, replace(emu_cal, t_comp=t_ring)).iter_time_s  # Eq. (3) with (1)
    package_rate = p_ / ps_async(p_, replace(emu_cal, t_comp=t_async)).iter_time_s  # Eq. (7)
    headers_ps = ((p_ + 1) * HEADER_BYTES + 4) / bandwidth
    headers_ring = 2 * (p_ - 1) * HEADER_BYTES / bandwidth
    emu_gaps["ps-sync", p_] = ps_sync_model(p_, t_ps) - package_ps - headers_ps
    emu_gaps["ring", p_] = ring_model(p_, t_ring) - package_ring - headers_ring
    emu_gaps["ps-async", p_] = abs(async_rate_model(p_, t_async) / package_rate - 1)
    print(f"p = {p_}: ps-sync model {format_seconds(ps_sync_model(p_, t_ps))} = package "
          f"{format_seconds(package_ps)} + headers {format_seconds(headers_ps)}; ring "
          f"{format_seconds(ring_model(p_, t_ring))} = {format_seconds(package_ring)} + "
          f"{format_seconds(headers_ring)}; ps-async {async_rate_model(p_, t_async):.1f} vs "
          f"{package_rate:.1f} updates/s")  # fmt: skip
for (model, p_), gap in emu_gaps.items():
    # ps-async: relative, a push's header and loss in M bytes; the others: seconds, rounding
    limit = (HEADER_BYTES + 4) / M_emu if model == "ps-async" else 1e-9
    assert abs(gap) < limit, (
        f"{model}, p = {p_}: the hand-built model and the package's differ by more than the "
        f"frame headers ({gap:.2e})"
    )

# %% [markdown]
# Read the table by columns. ps-sync grows by about M/B per added worker and follows the
# (p+1)·M/B model; the two-phase 2p·M/B overestimates this server (the two agree at
# p = 1). The ring pays nothing at p = 1 (there is no one to talk to), then M/B at p = 2 and
# 1.5·M/B at p = 4, on its way to a ceiling of 2M/B; its measurement sits above the formula by
# the software overhead of its 2(p−1) steps, which the formula does not count (tutorial 02),
# and more so when the p processes share fewer cores. ps-async has no barrier, so its rate
# grows with p, but never past the server's link, B/M updates per second: once it is there,
# more workers only make the gradients staler.
#
# The sweep as a figure, with the formulas continued to p = 8 and 16.

# %%
if plt is not None:
    ps_grid = np.arange(1, 17)
    t_c_mid = float(np.median(t_c_all))
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(ps_grid, [ps_sync_model(q, t_c_mid) * 1e3 for q in ps_grid],
            label="ps-sync, t_c + 2α + (p+1)M/B")  # fmt: skip
    ax.plot(ps_grid, [ps_sync_two_phase_model(q, t_c_mid) * 1e3 for q in ps_grid], ls=":",
            label="ps-sync, two phases: t_c + 2α + 2pM/B")  # fmt: skip
    ax.plot(ps_grid, [ring_model(q, t_c_mid) * 1e3 for q in ps_grid], ls="--",
            label="ring, t_c + 2(p−1)α + 2(p−1)/p M/B")  # fmt: skip
    sweep_ps = [1, 2, 4]
    ax.plot(sweep_ps, [table["ps-sync", q][0] * 1e3 for q in sweep_ps], "o", color="C0",
            label="ps-sync, measured")  # fmt: skip
    ax.plot(sweep_ps, [table["ring", q][0] * 1e3 for q in sweep_ps], "s", color="C2",
            label="ring (algo=sync), measured")  # fmt: skip
    ax.set(xlabel="workers p", ylabel="iteration time (ms)")
    ax.set_title(f"emulated link {format_seconds(alpha)}, {format_bytes(bandwidth)}/s; "
                 f"M = {format_bytes(M_emu)}")  # fmt: skip
    ax.legend(fontsize=8)
    save(fig, "03_server_link.png")

# %% [markdown]
# ## 6. Check against the oracle

# %%
for (n, r), gap in ps_sync_gaps.items():
    assert gap == 0, (
        f"ps-sync with {n} workers: rank {r}'s weights differ from reference.sync_sgd by up to "
        f"{gap:.2e}; the server sums in worker order, so they must be bitwise equal"
    )
assert digits_sync_bitwise, "run_training's ps-sync must equal reference.sync_sgd bitwise"
assert sync_server.bytes_sent == expected_sent, (
    f"ps-sync server should send p * steps pulls of {pull_bytes} bytes = {expected_sent}, "
    f"sent {sync_server.bytes_sent}"
)
assert sync_server.extra["bytes_received"] == expected_received, (
    f"ps-sync server should receive p * steps pushes of {push_bytes} bytes = "
    f"{expected_received}, received {sync_server.extra['bytes_received']}"
)
assert sorted(order) == sorted(list(range(p)) * digits_steps), (
    f"ps-async: every worker pushes {digits_steps} times; arrival counts "
    f"{np.bincount(order).tolist()}"
)
assert async_bitwise, (
    f"ps-async: the server's weights differ from reference.async_ps_sgd replayed in the "
    f"recorded arrival order by up to {async_gap:.2e}; the replay must be bitwise"
)
assert staleness == replay.staleness, "ps-async: recorded staleness != the replay's"
assert 0 <= mean_staleness <= p - 1, f"mean staleness {mean_staleness:.2f} is above p - 1"
assert rr_staleness[p:] == [p - 1] * (len(order) - p), "round robin: staleness p - 1 throughout"
for algo, (summary, _) in runs.items():
    assert summary["test_accuracy"] > 0.9, (
        f"{algo} on digits: test accuracy {summary['test_accuracy']:.3f} after {digits_steps} "
        f"steps, expected > 0.9"
    )
for p_ in (1, 2, 4):
    got, model = table["ps-sync", p_]
    assert abs(got / model - 1) < 0.3, (
        f"emulated ps-sync, p = {p_}: measured {format_seconds(got)} per iteration, model "
        f"t_c + 2 alpha + (p+1)M/B = {format_seconds(model)} (ratio {got / model:.2f}, "
        f"allowed 0.7..1.3)"
    )
    rate, bound = table["ps-async", p_]
    assert rate < 1.15 * bandwidth / push_emu, (
        f"ps-async, p = {p_}: {rate:.0f} updates/s beats the server link's B/M = "
        f"{bandwidth / push_emu:.0f}: the emulated NIC is not shared"
    )
ps_growth = table["ps-sync", 4][0] / table["ps-sync", 1][0]
assert ps_growth > 1.5, (
    f"ps-sync should slow down as p grows (p = 4 vs 1: model ratio "
    f"{table['ps-sync', 4][1] / table['ps-sync', 1][1]:.2f}); measured ratio {ps_growth:.2f}"
)
# The ring beats the server where the link sets both paces. Its 2(p-1) hops in a row each wait
# for a process to be scheduled, so on cores another program keeps busy the ring runs at the
# scheduler's pace instead (measured here with one core spinning: 20-23 ms at p = 4 against
# its model's 6 ms, while ps-sync, whose server sleeps on its link, kept to its formula).
(ring_got, ring_want), ps_got = table["ring", 4], table["ps-sync", 4][0]
if ring_got <= 2 * ring_want:
    assert ring_got < ps_got / 1.3, (
        f"p = 4: the ring ({format_seconds(ring_got)}) should clearly beat the parameter "
        f"server ({format_seconds(ps_got)}) on the same link"
    )
else:
    print(f"not compared: the ring took {format_seconds(ring_got)} at p = 4, over twice its "
          f"model's {format_seconds(ring_want)}: the cores, not the link, set its pace here "
          f"(is another program busy?)")  # fmt: skip
print("all checks passed")

# %% [markdown]
# ## Summary
#
# - A parameter server keeps the weights on rank 0; workers push gradients and pull weights.
#   Its one link carries p·M in and p·M out per round, so a synchronous round costs about
#   t_c + 2α + (p+1)·M/B with this package's sequential pulls (2p·M/B when all pulls finish
#   together): linear in p, where the ring's communication is bounded by 2M/B.
# - The package's timing models (`pipesgd_ref.timing`: `ps_sync`, `ps_async`, `sync`,
#   `ring_allreduce_time`; Eqs. (1) to (7) of docs/paper.md) give the same numbers as the
#   formulas by hand, plus the terms those leave out: the reductions (γ), the update (t_u) and,
#   on shared cores, the sharing of the cores. They count M bytes a message, not the frames'
#   headers.
# - ps-sync sums the p gradients in worker order: it is `reference.sync_sgd`, bitwise.
# - ps-async applies each push on arrival. Its result depends on the arrival order, which the
#   server records; replayed by `reference.async_ps_sgd`, that order reproduces the weights
#   bitwise and the staleness exactly. The mean staleness is at most p−1, the maximum is not
#   bounded by anything but timing.
# - On an emulated link, ps-sync follows its formula and slows down as p grows, the ring stays
#   below it, and ps-async's update rate is capped by the server's link at B/M.
#
# ## Exercises
#
# Each exercise with a single answer has a cell that checks it: put your answer in place of
# `None` and run the cell.

# %% [markdown]
# **1.** Rerun section 5 with `bandwidth="20MB"`. Before you do, predict ps-sync's iteration
# at p = 4 on that link with the (p+1)·M/B model, taking t_c = 1 ms, α = 100 µs and section
# 5's M = 307,240 bytes (no headers). Then compare with the measurement: which column of the
# table changes most, and does the model still hold? At what p would ps-async reach B/M on
# that link?
#
# <details><summary>Hint</summary>
#
# T_it = t_c + 2α + (p+1)·M/B, with B = 20e6 bytes/s: M/B is now about 15 ms, so the wire
# dwarfs t_c. The same figure comes from `ps_sync(4, Calibration(n_params=M // 4, t_comp=...,
# t_update=0.0, alpha=..., bandwidth=..., gamma=0.0, cores=10**9))`. For ps-async, find the
# smallest p with p·M/B above a worker's cycle t_c + 2α + 2M/B.
#
# </details>

# %%
answer = None  # your answer: ps-sync's predicted iteration at p = 4 on 20 MB/s, in seconds
check("03.1", answer)

# %% [markdown]
# **2.** Rerun section 5's ps-sync with `ps_pulls="shared"`: the server then sends the p pulls
# at once, sharing its wire (`ParameterServer.run_sync` in methods/ps_server.py), so every
# worker has its weights only when all p pulls are done. Which formula should the iteration
# follow then? For p = 4, α = 0 and t_c = M/B, how many times longer is a round with shared
# pulls than with sequential ones? Why is that slower even though it is fairer to the
# workers?
#
# <details><summary>Hint</summary>
#
# Draw the round on a time line in units of M/B. Sequential: worker i has its weights at
# i + 1 and pushes at i + 2; only the last push, at p + 2, ends the round. Shared: all
# have their weights at p, all compute at once and finish at p + 1, and then their p pushes
# queue on the server's one incoming wire. That is Eq. (6) of docs/paper.md, and
# `ps_sync(..., ps_pulls="shared")`.
#
# </details>

# %%
answer = None  # your answer: the shared round's time over the sequential one's (a ratio)
check("03.2", answer)

# %% [markdown]
# **3.** Shard the weights over S servers, each holding n/S of them: every worker pushes each
# server its slice of the gradient and pulls its slice of the weights. With p = 8 workers,
# S = 4 servers and the 25 MB model of section 0, how many bytes reach one server's link per
# round? Then write the ps-sync cost for S = p and compare it with the ring's.
#
# <details><summary>Hint</summary>
#
# A server receives one slice of M/S bytes from each of the p workers (and sends as many
# back). With S = p servers, one on each worker's machine, a machine's link carries in each
# direction the p−1 remote slices of its worker's push or pull and the p−1 remote slices its
# server receives or sends: 2(p−1)/p·M, exactly the ring's load, in 2 messages' latency
# instead of 2(p−1).
#
# </details>

# %%
answer = None  # your answer: bytes into one server's link per round, p = 8, S = 4, M = 25 MB
check("03.3", answer)

# %% [markdown]
# **4.** Make worker 0 slower (sleep 2 ms in `Worker.loss_and_grad` when `self.worker == 0`,
# as tests/test_ps.py does) and rerun ps-async on digits. What happens to the staleness
# histogram, and to worker 0's share of the arrival order? What would ps-sync's iteration
# time be?
#
# <details><summary>Hint</summary>
#
# `np.bincount(order)` counts each worker's updates. The slow worker pushes less often, and
# each of its gradients waits while the others push several times: its staleness grows, the
# others' shrinks. ps-sync waits for the slowest worker every round, so every round pays the
# 2 ms.
#
# </details>

# %% [markdown]
# **5.** ps-async with p workers makes p updates of batch B where ps-sync makes one of batch
# p·B. Compare their test accuracy after the same number of gradients at lr = 0.1 and lr = 0.4.
# Which one tolerates the larger learning rate, and how does tutorial 06 explain it?
#
# <details><summary>Hint</summary>
#
# `TrainConfig.preset("laptop").replace(algo=..., lr=...)` with `run_training`, as in section
# 2. ps-async applies p small steps per round, each computed on weights up to p−1 updates old:
# a gradient delayed by τ steps is stable only for a smaller lr·λ (tutorial 06), and
# ps-async's τ is about p−1, more now and then.
#
# </details>

# %% [markdown]
# Written solutions to every exercise above, with the reasoning: docs/solutions.md, section 03
# (on the site, the page "Solutions to the exercises").
