# %% [markdown]
# # 05 · Pipe-SGD: two threads, one step of staleness, no idle network
#
# **A number to start with.** The benchmark model of this package, an MLP 256-2048-1024-10,
# has 2.6 million parameters: a 10.5 MB gradient. A ring AllReduce of it over p = 4 workers on
# a 1 Gbit/s link with 100 µs latency takes T_ring = 2(p−1)·α + 2(p−1)/p · M/B = **127 ms**
# (computed below). If a forward and backward pass takes about as long, a synchronous worker
# spends every iteration t_c + T_ring computing *then* communicating, and each resource idles
# half the time. Pipe-SGD (PAPER.md section 2) gives each worker a compute thread and a
# communication thread and lets the AllReduce of g_t run while g_{t+1} is computed: the
# iteration becomes max(t_c, T_ring), up to **2× faster**, for the price of applying every
# gradient one step late.
#
# You will:
# 1. see how `pipe_worker` splits a worker into two threads and K buffers;
# 2. print the schedule, phase by phase (warm-up, fill, steady state, drain), for K = 2 and
#    K = 3: which gradient is computed, which is in flight, which is applied;
# 3. see why width K = 2 already reaches the best iteration time:
#    T(K) = max(t_c, t_comm, (t_c + t_comm)/K);
# 4. run sync and pipe over an emulated link where T_ring ≈ t_comp, and compare iteration
#    times, overlap and timelines;
# 5. check the real workers against the oracle `reference.delayed_sgd(staleness=K−1)`.
#
# Run it with `python tutorials/05_pipe_sgd.py` (set `PIPESGD_TUTORIAL_SMALL=1` for the quick
# version CI runs).

# %%
import os
import time
from pathlib import Path

import numpy as np

from pipesgd_ref.comm.netem import link_of
from pipesgd_ref.commands.train import run_training
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.methods import reference
from pipesgd_ref.methods.pipe import pipe_worker
from pipesgd_ref.models import build_model
from pipesgd_ref.plots import pyplot, save_figure
from pipesgd_ref.runtime.launch import launch_local
from pipesgd_ref.runtime.worker import Worker
from pipesgd_ref.timing import ring_allreduce_time
from pipesgd_ref.trace import median_duration
from pipesgd_ref.units import format_bandwidth, format_bytes, format_seconds

SMALL = os.environ.get("PIPESGD_TUTORIAL_SMALL") == "1"  # CI: a lighter run, same lessons
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
# The problem of `benchmarks/pipeline_speedup.py` (synthetic data with 256 features and 10
# classes, the MLP 256-2048-1024-10, p = 4 workers, links at α = 100 µs), with half its batch
# (256 per worker instead of 512, so that a run here takes half the time), 8 steps instead of
# its 16, and one of its bandwidths, B = 1 Gbit/s. The ring's cost is the alpha-beta formula
# of PAPER.md section 3 (γ left out):
# `timing.ring_allreduce_time`, derived in tutorial 02.

# %%
bench = TrainConfig(
    dataset="synthetic:samples=8192,features=256,classes=10", model="mlp", hidden=(2048, 1024),
    world_size=4, batch_size=256, lr=0.05, steps=8, latency="100us", bandwidth="1Gbit",
    eval_every=0,
)  # fmt: skip
bench_model = build_model(bench.model, 256, 10, bench.hidden)
M_bench = 4 * bench_model.n_params
bench_link = link_of(bench)


T_ring_bench = ring_allreduce_time(4, M_bench, bench_link.latency, bench_link.bandwidth)
print(f"{bench_model}: M = 4 bytes x params = {format_bytes(M_bench)}")
print(f"T_ring over p = 4, {bench_link}: {format_seconds(T_ring_bench)}")
print(f"if t_c = T_ring: sync {format_seconds(2 * T_ring_bench)} per iteration, "
      f"pipe {format_seconds(T_ring_bench)}")  # fmt: skip

# %% [markdown]
# ## 1. Two threads, K buffers
#
# `pipe_worker` (pipesgd_ref/methods/pipe.py) runs in every worker process:
#
#     compute thread (the worker's main thread)        comm thread (CommThread)
#     for t in range(steps):                            loop:
#         g_t = grad f(w_t) into buffers[t % K]             (step, buf) = todo.get()
#         todo.put((t, buffers[t % K]))   ------------>     allreduce(comm, buf, "mean")
#         avg = done.get()  # g_{t-s}, s = K-1   <-----     done.put((step, buf))
#         w_{t+1} = w_t - lr_t * avg
#
# Two FIFO queues connect them: `todo` carries gradients to be averaged, `done` carries them
# back averaged, in the same order. The compute thread never touches the network and the
# comm thread never computes; they overlap because NumPy's matrix products and the socket
# calls release the GIL. The AllReduce averages *in place*, so the gradient of step t lives in
# one buffer from its computation to its update: with staleness s = K−1, at most K−1
# gradients are in flight while the next is computed, so **K buffers** suffice, allocated
# once. The tables below check that buffer t mod K is always free when g_t is written.
#
# ## 2. The schedule, phase by phase
#
# Which gradient does step t apply? Rather than re-derive it, we ask the oracle. Give
# `reference.delayed_sgd` a gradient oracle that returns the unit vector e_t at step t (and
# lr = 1, w_0 = 0): then w_{t+1} − w_t = −e_j says the update of step t applied g_j, and
# nothing else. Every row below is read off the oracle's recorded weights. The phases are
# named after what happens (pipe.py's docstring gives them as conditions on t):
#
# - **warm-up** (t < W): synchronous, the update applies the fresh g_t. Off by default
#   (`warmup_steps=0`); one step here to show it.
# - **fill** (W ≤ t < W + s): the pipeline fills, nothing has come back yet: w_{t+1} = w_t.
# - **steady state** (t ≥ W + s): the update applies g_{t−s}, whose AllReduce ran during the
#   compute of the gradients after it.
# - **drain** (after the last step): the s gradients still in flight are applied, oldest
#   first, so that every computed gradient is applied exactly once.


# %%
def schedule(width: int, steps: int, warmup: int) -> list[dict]:
    """One row per step (then per drain update), read off reference.delayed_sgd's history."""

    def unit_grad(params: np.ndarray, rank: int, step: int) -> tuple[float, np.ndarray]:
        g = np.zeros_like(params)
        g[step] = 1.0  # g_step = e_step: the update that subtracts it names it
        return 0.0, g

    traj = reference.delayed_sgd(unit_grad, np.zeros(steps), 1, steps, 1.0,
                                 staleness=width - 1, warmup_steps=warmup, record=True)  # fmt: skip
    applied = []  # applied[u] = the gradient index applied by update u, or None
    for before, after in zip(traj.history, traj.history[1:], strict=False):
        moved = np.flatnonzero(after != before)
        assert len(moved) <= 1, f"one update applied {len(moved)} gradients"
        applied.append(int(moved[0]) if len(moved) else None)
    rows, in_flight = [], []  # handed to the comm thread, not yet applied
    for u, j in enumerate(applied):
        t = u if u < steps else None  # drain updates compute nothing
        running = list(in_flight)  # AllReduced by the comm thread during this compute
        if t is not None:
            in_flight.append(t)
        if j is not None:
            in_flight.remove(j)
        if t is None:
            phase = "drain"
        elif j == t:
            phase = "warm-up"
        elif j is None:
            phase = "fill"
        else:
            phase = "steady state"
        buffer = None if t is None else t % width  # pipe.py writes g_t into buffers[t % K]
        rows.append({"u": u, "t": t, "phase": phase, "running": running, "applied": j,
                     "buffer": buffer, "after": list(in_flight)})  # fmt: skip
    return rows


def gs(indices: list[int]) -> str:
    return ", ".join(f"g{i}" for i in indices) or "-"


table_steps, table_warmup = 7, 1
tables = {K: schedule(K, table_steps, table_warmup) for K in (2, 3)}
for K, rows in tables.items():
    print(f"K = {K} (staleness {K - 1}), warm-up {table_warmup} step, {table_steps} steps:")
    print(" step | phase        | compute thread  | comm thread, meanwhile | update applies | "
          "in flight after")  # fmt: skip
    for row in rows:
        t = "" if row["t"] is None else row["t"]
        compute = "-" if row["t"] is None else f"g{row['t']} -> buf {row['buffer']}"
        applied = "-" if row["applied"] is None else f"g{row['applied']}"
        print(f" {t!s:>4} | {row['phase']:12s} | {compute:15s} | {gs(row['running']):22s} | "
              f"{applied:14s} | {gs(row['after'])}")  # fmt: skip

# %% [markdown]
# Read a steady-state row of K = 2: while the compute thread computes g_t, the comm thread
# AllReduces g_{t−1}; the update then applies g_{t−1}, and only g_t stays in flight. With K = 3
# two gradients are in flight, the update applies g_{t−2}, and the fill phase lasts two steps.
# In the warm-up step the comm thread's AllReduce of g_0 is waited for at once: a synchronous
# step, exactly as `algo="sync"` would take it.
#
# ## 3. Why width two is enough
#
# Per iteration a worker needs t_c of compute and t_comm of network. Three lower bounds hold
# for the steady-state iteration time T of a pipeline of width K:
#
# - T ≥ t_c: one compute thread, one gradient per iteration;
# - T ≥ t_comm: one comm thread, one AllReduce per iteration;
# - T ≥ (t_c + t_comm)/K: g_t needs w_t, which needs the AllReduce of g_{t−K} to have finished
#   (the update of step t−1 applies g_{t−1−s} = g_{t−K}). So each gradient's compute and
#   AllReduce are a chain of length t_c + t_comm that K iterations share.
#
#     T(K) = max(t_c, t_comm, (t_c + t_comm)/K)
#
# K = 1 is synchronous SGD, t_c + t_comm. Since max(a, b) ≥ (a + b)/2, the third term is
# already inactive at K = 2: a wider pipeline adds staleness (which costs stability, tutorial
# 06) and K−1 gradient buffers, never speed.


# %%
def pipe_iteration(t_c: float, t_comm: float, K: int) -> float:
    """T(K) = max(t_c, t_comm, (t_c + t_comm) / K) (PAPER.md section 2)."""
    return max(t_c, t_comm, (t_c + t_comm) / K)


print("t_comm/t_c |  K=1 (sync) |  K=2 |  K=3 |  K=4   (T / t_c)")
ratios = (0.25, 0.5, 1.0, 2.0, 4.0)
for r in ratios:
    cells = " | ".join(f"{pipe_iteration(1.0, r, K):4.2f}" for K in (2, 3, 4))
    print(f"{r:10.2f} | {pipe_iteration(1.0, r, 1):11.2f} | {cells}")

# %% [markdown]
# The gain K = 2 brings over sync is (t_c + t_comm)/max(t_c, t_comm): largest, 2×, when the
# two are equal, and small when either dominates. That is why the measurement below is set up
# with T_ring ≈ t_comp.
#
# ## 4. Measured: sync against pipe on an emulated link
#
# `run_training(cfg)` runs cfg.algo in 4 worker processes whose links are emulated (α, B per
# direction, pipesgd_ref/comm/netem.py) and returns the summary dict of `summary.json` and
# every rank's `WorkerResult` (its `.events` are the spans of its timeline). The summary's
# `iter_time_s` is the median iteration in steady state, `t_comp_s` and `t_comm_s` the median
# compute and AllReduce spans, and `comm_hidden_fraction` the share of AllReduce time that
# overlapped a compute span on the same rank.
#
# The full run is the configuration of section 0. With `PIPESGD_TUTORIAL_SMALL=1`
# the batch is halved (t_comp about halves) and the bandwidth doubled (T_ring about halves), so
# the balance T_ring ≈ t_comp is kept at about half the cost.

# %%
run_cfg = bench.replace(batch_size=128, bandwidth="2Gbit") if SMALL else bench
p = run_cfg.world_size
link = link_of(run_cfg)
T_ring = ring_allreduce_time(p, M_bench, link.latency, link.bandwidth)
runs = {}  # algo -> (summary, results)
t0 = time.perf_counter()
for algo in ("sync", "pipe"):
    runs[algo] = run_training(run_cfg.replace(algo=algo), progress=False, log=quiet)
print(f"{run_cfg.steps} steps of sync and of pipe (p = {p}, batch {run_cfg.batch_size}, "
      f"{format_bandwidth(link.bandwidth)}): {time.perf_counter() - t0:.1f} s")  # fmt: skip

measured = {}
for algo, (summary, results) in runs.items():
    events = [e for r in results for e in r.events]
    measured[algo] = {
        "iter": summary["iter_time_s"],
        "t_comp": summary["t_comp_s"],
        "t_comm": summary["t_comm_s"],
        "t_update": median_duration(events, ("update",)),
        "hidden": summary["comm_hidden_fraction"],
    }
# Each run's model from its own measured compute + update (t_c) and the formula's T_ring:
# sync t_c + T_ring, pipe T(2) = max(t_c, T_ring). The two runs' t_c need not agree: see below.
t_c = {algo: m["t_comp"] + m["t_update"] for algo, m in measured.items()}
model = {"sync": t_c["sync"] + T_ring, "pipe": pipe_iteration(t_c["pipe"], T_ring, 2)}
print(f"T_ring (formula) = {format_seconds(T_ring)}; {p} ranks x 2 threads on "
      f"{os.cpu_count()} CPU cores")  # fmt: skip
print(" algo | iteration | t_comp    | t_comm    | update    | hidden | model iteration")
for algo, m in measured.items():
    print(f" {algo:4s} | {format_seconds(m['iter']):>9} | {format_seconds(m['t_comp']):>9} | "
          f"{format_seconds(m['t_comm']):>9} | {format_seconds(m['t_update']):>9} | "
          f"{m['hidden']:6.2f} | {format_seconds(model[algo]):>9}")  # fmt: skip
speedup = measured["sync"]["iter"] / measured["pipe"]["iter"]
print(f"pipe is {speedup:.2f}x faster per iteration than sync (model: "
      f"{model['sync'] / model['pipe']:.2f}x, from each run's own t_comp)")  # fmt: skip
print(f"final weights identical on all ranks: sync "
      f"{runs['sync'][0]['params_identical_on_all_ranks']}, pipe "
      f"{runs['pipe'][0]['params_identical_on_all_ranks']}")  # fmt: skip

# %% [markdown]
# In sync the AllReduce never overlaps compute (it runs on the same thread: hidden fraction 0).
# In pipe most of it is hidden behind the next gradient's computation, and the iteration
# approaches the larger of t_comp and t_comm instead of their sum. Two caveats when reading
# the numbers. The "model" column uses each run's *own* t_comp: with 4 ranks of 2 threads each
# on a machine with few cores (printed above), a compute span stretches when other ranks or
# threads want the same core, so t_comp differs between the runs and from run to run, and the
# speed-up can land on either side of the model's. And an AllReduce span includes the time its
# rank waits for the slowest peer to join, so t_comm measured is at least the formula's
# T_ring.
#
# The timeline makes it visible. Rank 0's spans for a few steady-state iterations, sync above
# and pipe below, on the same time scale: compute and update on the compute thread, the
# AllReduce on the comm thread (in sync that "thread" is the same one, taking turns).

# %%
window = range(3, 6)  # steady state (after the fill), before the last step


def spans(results, names: tuple[str, ...], steps: range) -> list[tuple[float, float, int]]:
    """(start s, duration s, step) of rank 0's spans called one of `names` in `steps`."""
    out = [(e["ts"] / 1e6, e["dur"] / 1e6, e["args"]["step"]) for e in results[0].events
           if e["name"] in names and e["args"]["step"] in steps]  # fmt: skip
    return sorted(out)


timeline = {}
for algo, (_, results) in runs.items():
    rows = {name: spans(results, (name,), window) for name in ("compute", "update", "allreduce")}
    origin = min(s for s, _, _ in rows["compute"])
    timeline[algo] = {k: [(s - origin, d, t) for s, d, t in v] for k, v in rows.items()}
    print(f"{algo}, rank 0, ms from the compute of step {window[0]}:")
    for name, items in timeline[algo].items():
        cells = "  ".join(f"[{t}] {1e3 * s:6.1f}-{1e3 * (s + d):6.1f}" for s, d, t in items)
        print(f"  {name:9s} {cells}")

if plt is not None:
    fig, axes = plt.subplots(2, 1, figsize=(8, 3.6), sharex=True)
    colours = {"compute": "C0", "update": "C1", "allreduce": "C2"}
    for ax, (algo, rows) in zip(axes, timeline.items(), strict=True):
        for name, items in rows.items():
            y = 10 if name == "allreduce" else 0  # comm thread row above the compute thread
            ax.broken_barh([(1e3 * s, 1e3 * d) for s, d, _ in items], (y, 8),
                           facecolors=colours[name], edgecolor="k", lw=0.5, label=name)  # fmt: skip
            for s, d, t in items if name != "update" else ():  # updates are too thin to label
                ax.text(1e3 * (s + d / 2), y + 4, f"g{t}", ha="center", va="center", fontsize=7)
        ax.set_yticks([4, 14], ["compute", "comm"])
        ax.set_ylim(-1, 27)  # room for the legend above the comm row
        ax.set_title(f"{algo}: iteration {format_seconds(measured[algo]['iter'])}, "
                     f"hidden {measured[algo]['hidden']:.2f}", fontsize=9)  # fmt: skip
    axes[0].legend(fontsize=7, loc="upper left", ncol=3)
    axes[-1].set_xlabel(f"ms (rank 0, steps {window[0]}..{window[-1]}; g_t: computed at step t, "
                        f"then AllReduced)")  # fmt: skip
    save_figure(fig, OUT / "05_timeline.png")
else:
    print("matplotlib is not installed: plots skipped")

# %% [markdown]
# In the pipe row, the AllReduce of step t runs during the compute of step t+1, and the update
# that follows compute t+1 applies it: the schedule of section 2, measured. The same trace, for
# every rank, is what `pipesgd train --out=DIR` writes as DIR/trace.json (open it in
# https://ui.perfetto.dev).
#
# ## 5. Check against the oracle
#
# The distributed workers must compute exactly `reference.delayed_sgd(staleness=K−1)`: the
# oracle computes every g_t at w_t, averages in rank order, and applies g_{t−s} at step t.
# The ring sums each chunk in its own fixed order (tutorial 02), so:
#
# - every rank ends with **bitwise identical** weights: each rank applies the same averaged
#   bytes, in the same order;
# - with p ≤ 2 the ring adds two terms, and a + b = b + a in floating point: **bitwise** equal
#   to the oracle;
# - with p = 3, 4 the order of additions differs from the oracle's rank order: equal **within
#   1e−6** relative to the largest weight.
#
# `launch_local(p, pipe_worker, (cfg,), start_method="fork")` runs the workers directly on the
# `tiny` preset (digits, softmax regression). **Why `start_method="fork"`:** the package's
# default, spawn, would re-import this script in every worker and re-run each cell above;
# fork copies the running process and re-runs nothing. Nothing here touches a GPU, so fork is
# safe (tutorial 02 says more).

# %%
oracle_steps = 30
cases = [(p_, K, 0) for K in (2, 3) for p_ in (1, 2, 3, 4)] + [(2, 2, 2)]  # (p, K, warm-up)
checks = []
for p_, K, warmup in cases:
    cfg = TrainConfig.preset("tiny").replace(world_size=p_, width=K, warmup_steps=warmup,
                                             steps=oracle_steps)  # fmt: skip
    worker = Worker.build(cfg, 0, p_)  # also loads the data before the fork
    grad_fn = reference.model_grad_fn(worker.model, worker.data, worker.sampler)
    want = reference.delayed_sgd(grad_fn, worker.params, p_, oracle_steps, cfg.lr_at,
                                 staleness=K - 1, warmup_steps=warmup)  # fmt: skip
    # fork, not the package's default spawn: see the paragraph above
    results = launch_local(p_, pipe_worker, (cfg,), start_method="fork")
    got = results[0].params
    ranks_identical = all(r.params.tobytes() == got.tobytes() for r in results)
    worst = float(np.abs(got - want.params).max() / np.abs(want.params).max())
    loss_gap = float(np.abs(np.mean([r.losses for r in results], axis=0) - want.losses).max())
    checks.append((p_, K, warmup, ranks_identical, worst, loss_gap))
    print(
        f"p = {p_}, K = {K}, warm-up {warmup}: ranks identical {ranks_identical}; "
        f"max |w - oracle| / max |oracle| = {worst:.1e}; mean-loss gap {loss_gap:.1e}"
    )

# %% [markdown]
# The tables of section 2 against pipe.py's own conditions, then everything else.

# %%
for K, rows in tables.items():
    s = K - 1
    for row in rows:
        t, u = row["t"], row["u"]
        if t is None:  # pipe.py drains from max(warmup, steps - s), oldest first
            want_phase, want_applied = "drain", max(table_warmup, table_steps - s) + u - table_steps
        elif t < table_warmup:
            want_phase, want_applied = "warm-up", t
        elif t < table_warmup + s:
            want_phase, want_applied = "fill", None
        else:
            want_phase, want_applied = "steady state", t - s
        assert (row["phase"], row["applied"]) == (want_phase, want_applied), (
            f"K = {K}, update {u}: the oracle applied {row['applied']} ({row['phase']}); "
            f"pipe.py's conditions say {want_applied} ({want_phase})"
        )
        if t is not None:
            busy = [j % K for j in row["running"]]
            assert row["buffer"] not in busy, (
                f"K = {K}, step {t}: g{t} would overwrite buffer {row['buffer']}, which still "
                f"holds in-flight gradient(s) {gs(row['running'])}"
            )
    assert rows[-1]["after"] == [] and len(rows) == table_steps + s, (
        f"K = {K}: after the drain nothing may be in flight, and there must be {s} drain "
        f"updates; rows: {len(rows)}, left in flight: {rows[-1]['after']}"
    )
for r in ratios:
    assert pipe_iteration(1.0, r, 2) == pipe_iteration(1.0, r, 4) == max(1.0, r), (
        f"t_comm/t_c = {r}: K = 2 should already reach max(t_c, t_comm)"
    )
for p_, K, warmup, ranks_identical, worst, loss_gap in checks:
    where = f"p = {p_}, K = {K}, warm-up {warmup}"
    assert ranks_identical, f"{where}: the ranks' final weights differ; they must be bitwise equal"
    if p_ <= 2:
        assert worst == 0, f"{where}: expected bitwise equality with delayed_sgd, got {worst:.1e}"
    assert worst <= 1e-6, f"{where}: relative difference {worst:.1e} from delayed_sgd (max 1e-6)"
    assert loss_gap <= 1e-5, f"{where}: mean worker loss differs from the oracle's by {loss_gap}"
for algo in ("sync", "pipe"):
    assert runs[algo][0]["params_identical_on_all_ranks"], f"{algo}: ranks ended different"
assert measured["sync"]["hidden"] < 0.05, (
    f"sync runs the AllReduce on the compute thread: nothing can be hidden, yet "
    f"comm_hidden_fraction = {measured['sync']['hidden']:.2f}"
)
assert measured["pipe"]["hidden"] > 0.3, (
    f"pipe should hide much of its AllReduce behind compute: comm_hidden_fraction = "
    f"{measured['pipe']['hidden']:.2f}"
)
assert speedup > 1.15, (
    f"with T_ring ({format_seconds(T_ring)}) close to t_c ({format_seconds(t_c['sync'])}), pipe "
    f"should be clearly faster than sync: iterations {format_seconds(measured['sync']['iter'])} "
    f"(sync) vs {format_seconds(measured['pipe']['iter'])} (pipe); the model says "
    f"{model['sync'] / model['pipe']:.2f}x"
)
print("all checks passed")

# %% [markdown]
# ## Summary
#
# - A Pipe-SGD worker has a compute thread (gradient, update) and a comm thread (ring
#   AllReduce), joined by two FIFO queues and K preallocated buffers.
# - Width K means staleness s = K−1: after a warm-up (optional, synchronous) and a fill of s
#   steps without updates, step t applies g_{t−s}; a drain applies the last s gradients.
#   While g_t is computed, the comm thread averages the gradients of the steps before.
# - The iteration time is T(K) = max(t_c, t_comm, (t_c + t_comm)/K); K = 2 already reaches
#   max(t_c, t_comm), so wider pipelines only add staleness and memory.
# - Measured over an emulated link with T_ring ≈ t_comp, pipe hides most of its AllReduce
#   behind compute and iterates faster than sync, below the 2× limit on a machine where the
#   threads share cores.
# - The workers compute `reference.delayed_sgd(staleness=K−1)` exactly: all ranks bitwise
#   identical, bitwise the oracle for p ≤ 2, within 1e−6 for p = 3, 4.
#
# ## Exercises
#
# 1. Run section 4 with `bandwidth="300Mbit"` and with `"10Gbit"`. Where do sync, pipe and the
#    model T(2) = max(t_c, T_ring) land, and how does comm_hidden_fraction change?
# 2. Run section 4 with `width=3`. By section 3 it cannot be faster than K = 2: is it? What
#    does the timeline show?
# 3. In the table of section 2 set `table_warmup = 3`. Which phases change length? Why does a
#    synchronous warm-up help a run whose learning rate is near the stability edge of
#    tutorial 06?
# 4. `CommThread.wait` asserts that gradients come back in order. Why does the ring
#    guarantee it, and what would break if two AllReduces could run at once on one ring?
# 5. Replace `np.empty_like` buffers by one buffer reused every step (K = 1 buffer with
#    K = 2 in flight). Which check of section 5 fails first, and why?
