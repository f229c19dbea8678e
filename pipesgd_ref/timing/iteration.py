"""How long one iteration takes: the timing models of docs/paper.md, section 3, method by method.

Every prediction below applies the alpha-beta ("latency-bandwidth") cost of a link to the
schedule each method runs; `predict` hands a method to its function (`sync`, `pipe`, `ddp`,
`ps_sync`, `ps_async`), each written beside its equation. Symbols: p = world_size workers; M = 4n
gradient bytes (n float32 parameters); alpha = seconds per message; B = bandwidth, bytes/s per
link and direction (full duplex); gamma = seconds per byte of reduction (dst += src); t_comp =
forward and backward of one minibatch; t_u = one update by the run's optimiser (methods/
optimizer.py: one pass over the weights for plain SGD, three with momentum, five with weight
decay and Nesterov too; measured so: timing/measure.py `time_update`); r = compression ratio
(wire bytes M/r); e, d = encode and decode seconds per float32 byte of the codec. The figures
come from a `Calibration` (timing/figures.py; timing/calibrate.py measures them); the terms the
methods share (T_ar, compute under core sharing, the CPU bounds) are timing/terms.py, each
beside its equation number.

Ring AllReduce (comm/ring.py). 2(p-1) steps; at each a rank sends one chunk of M/p bytes to its
right neighbour while receiving one from its left (full duplex: the two overlap). A step costs
alpha + M/(pB); the p-1 reduce-scatter steps also add the received chunk into the local one,
(M/p) gamma each:

    T_ar = 2(p-1) alpha + 2(p-1)/p * M/(rB) + (p-1)/p * M gamma  + codec    (1)

With a codec (comm/compressed_ring.py) the wire carries M/r, and every reduce-scatter hop decodes,
adds and re-encodes its chunk, each all-gather hop decodes the chunk it forwards, and the owner
of a chunk encodes and decodes it once more: (p-1)/p M (d + e) + (p-1)/p M d + 1/p M (e + d),

    codec = M (d + e) + (p-1)/p * M d                                        (2)

Synchronous AllReduce SGD (methods/sync.py): compute, then communicate, then update; nothing
overlaps:

    T_sync = t_comp + T_ar + t_u      (on shared cores: at least the cpu bound (9), too)  (3)

Pipe-SGD of width K (methods/pipe.py). Two resources per worker, the compute thread (needs
t_comp + t_u per iteration) and the communication thread (needs T_ar). With K iterations in
flight the steady-state cycle is bounded by each resource, and by the K-deep dependency chain
(a gradient must be computed, reduced and applied before the iteration K later can start):

    T_pipe(K) = max(t_comp + t_u, T_ar, (t_comp + t_u + T_ar) / K)                      (4)

Since max(a, b) >= (a + b)/2, K = 2 already reaches max(t_comp + t_u, T_ar): wider pipelines
add staleness, never speed. The hidden share of communication is min(T_ar, t_comp + t_u) / T_ar.

Parameter server, synchronous (methods/ps.py). The server's single link carries
every push in and every pull out. It sends the p pulls one after another, so worker i has its
weights (i+1) M/B after the update; the last worker computes and pushes while the earlier pushes
already cross the (full-duplex) ingress wire; its push arrives M/(rB) later, and the server
averages p gradients (p M gamma, plus p decodes with a codec) and updates:

    T_ps-sync = t_comp + 2 alpha + p M/B + M/(rB) + p M gamma + t_u   (+ p M d with a codec)  (5)

(The conventional model, docs/paper.md section 3, writes 2pM/B: all pulls sent at once sharing
the link; methods/ps_server.py explains why this server pays (p+1) M/B.) With
--ps-pulls=shared the server does send them at once: all workers have their weights after
p M/B, compute together (k = p), and their p pushes queue on the ingress wire:

    T_ps-sync(shared) = t_comp + 2 alpha + p M/B + p M/(rB) + p M gamma + t_u          (6)

Parameter server, asynchronous. Each worker loops compute, push, pull on its own; the server
applies each push on arrival. A worker's cycle is t_comp + 2 alpha + M/(rB) + M/B (+ t_u of the
server); the server's links bound the rate at B/M pulls per second, so each worker's iteration
(one of its own gradients applied) takes

    T_ps-async = max(t_comp + 2 alpha + M/(rB) + M/B + t_u,  p M/B)                     (7)

One machine, many workers. On a single machine the p worker processes share C cores: when k of
them compute at once each runs at min(1, C/k) of a core (`compute_time`: measured per k where
calibrated). Ring methods compute in lock step (k = p). In ps-sync the pulls arrive M/B apart,
so about 1 + t_comp/(M/B) computations overlap; ps-async workers compute a t_comp/cycle share f
of the time, each on its own schedule; the timed worker (worker 0, pinned like all ranks to core
rank mod C) shares its core with the m - 1 other workers pinned there, so on average
1 + (m - 1) f computations share that core, whatever the load elsewhere:

    t_comp(ps-async) = t_comp(one per core) * (1 + (m - 1) f)                            (8)

Both are fixed points, solved by iteration. Pipe-SGD on shared cores has a third bound besides
compute and network: every byte a rank sends or receives costs CPU time too (copies and
reductions), which the communication thread takes from the same cores. No schedule beats that
CPU work divided by the cores, so the cpu bound holds for synchronous SGD as well (the sum (3)
assumes every worker has its own core for its copies, reductions and update; on C < p cores
they queue like the computations do):

    T >= t_comp(p shared) + p (t_u + cpu_comm) / C,                                     (9)
    cpu_comm = 2 * 2(p-1)/p * M/r * copy + (p-1)/p M gamma + codec

The parameter server's p + 1 processes have the same kind of bound, core by core
(`ps_sync_cpu_bound`, `ps_async_cpu_bound`). ps-sync moves in lock step, so its busiest core
bounds it: with p = 4 on 2 cores, core 0 holds the server and workers 1 and 3,

    T_ps-sync >= 2 (t_cpu + (M/r + M) copy + M e) + p ((M/r + M) copy + M (d + gamma)) + t_u  (10)

where t_cpu is the CPU time one step costs its core with the p workers sharing the cores
(`step_cpu`: measured, t_comp_cpu; two processes taking turns on a core make each step cost
more CPU than one process a core does, and finish at different times, so their median wall
time is no measure of it). That work cannot start at the round's start, though, nor end it: a
core's workers start when the first of them has its weights, and the round ends when that
core's last push has crossed the wire and been added. The chain through core c, holding the
workers of ranks R_c, whose first pull (rank k_c = min R_c; with shared pulls k_c = p) arrives
at alpha + k_c M/B (`ps_sync_core_bound`):

    T_c = alpha + k_c M/B + |R_c| (t_cpu + (M/r + M) copy + M e) + [c = 0] (server's work then)
          + alpha + M/(rB) + (M/r) copy + M (d + gamma) + t_u                            (11)

and T_ps-sync = max((5), (10), max_c T_c): the sum and the cpu bound alone count neither the
wait for the first pull nor the last push, and fall short of runs on shared cores
(benchmarks/RESULTS.md, the accuracy grid).

ps-async's workers do not wait for each other and its iteration is worker 0's, so the bound is
worker 0's core: the m workers pinned there, m (t_cpu + (M/r + M) copy + M e), plus the
server's p ((M/r + M) copy + M (d + gamma) + t_u) only where it shares that core (C = 1).

DDP-style synchronous SGD (methods/ddp.py). The backward hands the gradient to the ring in
buckets j = 1..J, last layer first, each b_j bytes (models/layout.py `buckets`: units until a
bucket holds --bucket-size), ready when the backward has written its last unit, f_j of the way
through t_comp (f_j: Calibration.backward_units, measured; timing/buckets.py says what is
assumed where it was not). The ring all-reduces them one at a time, in order, each as soon as
it is ready and the one before is done, and the update waits for the last:

    s_j = max(f_j t_comp + D_(j-1), e_(j-1)),   e_j = s_j + T_ar(b_j) + x_j,   e_0 = D_0 = 0
    x_j = k cpu(b_j) min(1, (t_comp + D_(j-1) - s_j) / T_ar(b_j)),   D_j = D_(j-1) + x_j
    T_ddp = max(t_comp + D_J, e_J) + t_u     (on shared cores: at least the cpu bound (9))  (12)

t_comp is sync's, the slowest rank's under core sharing (t_comp_lockstep, below), and f_j is
taken to be the same share of it as measured alone. T_ar(b) is (1) and (2) for b bytes: every
bucket pays the ring's 2(p-1) alpha (alpha_busy,
where measured, for a bucket that starts while the backward runs). A bucket beside the
backward shares the cores with it: its CPU work cpu(b), Eq. (9)'s cpu_comm for b bytes (the
copies of the bytes moved, the reductions, the codec), times k = max(1, p/C) workers per core,
delays both, for the share of the bucket that overlaps the backward (x_j; 0 for a bucket that
starts after it): D_j is the backward's delay so far, which also makes the later buckets
ready later. The communication hidden is what of [s_j, e_j] lies before t_comp + D_J. A bucket
can hide only behind the backward left after it is ready, (1 - f_j) t_comp: the bucket holding
the bottom layer is ready at the end (f_J near 1) and is never hidden; one bucket of
everything is sync (3). ddp moves sync's bytes, so its cpu bound is sync's (9). Pipe-SGD
hides T_ar behind the whole next step instead, so pipe beats ddp by about
T_ddp / max(t_comp + t_u, T_ar): most where the big layers are ready late.

What (12) leaves out, seen in the traces of runs on shared cores: the ranks start a step a few
ms apart (their updates and wake-ups queue for the cores), and a bucket's ring waits for the
last of them; and a communication thread costs the computation beside it more CPU than the
copies and reductions of its bytes (wake-ups, the emulated link's pacing). Both make a run
slower than (12), never faster; sync's (3) misses the first too.

Every step of a ring method waits for its slowest rank. On shared cores the ranks' steps differ
(time slices, caches): the per-step maximum over ranks is above the median (by how much:
benchmarks/RESULTS.md). So sync and pipe read t_comp_lockstep, the median over steps of the
slowest rank; the parameter server reads t_comp_shared, the median over ranks, and its core
bounds t_comp_cpu. Pipe-SGD's busy figure is its compute thread's cycle in a run of its
schedule without the optimizer (sharing.time_busy_compute): width two gives the ranks a step
of slack, so the slowest rank of each step overstates it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from pipesgd_ref.timing.buckets import bucket_ready, schedule, units_of
from pipesgd_ref.timing.figures import Calibration
from pipesgd_ref.timing.terms import (
    compensation_passes,
    compute_time,
    fixed_point,
    ps_async_cpu_bound,
    ps_sync_core_bound,
    ps_sync_cpu_bound,
    ring_cpu,
    ring_terms,
    ring_time,
    shared_compute,
    workers_on_timed_core,
)

# The runs of `pipesgd compare`, in its table's order: (algo, codec).
COMPARE_RUNS = (
    ("ps-sync", "none"),
    ("ps-async", "none"),
    ("sync", "none"),
    ("ddp", "none"),
    ("pipe", "none"),
    ("pipe", "trunc16"),
    ("pipe", "q8"),
)


@dataclass(frozen=True)
class Prediction:
    """One method's predicted iteration time and its parts (seconds)."""

    algo: str
    codec: str
    world_size: int
    width: int
    iter_time_s: float  # the cycle: time between two consecutive steps of one worker
    compute_s: float  # t_comp (under core sharing) + t_u on the worker's critical path
    comm_s: float  # communication time of one iteration (T_ar, or the PS round's share)
    hidden_s: float  # communication that overlaps computation
    bound: str  # which resource sets the cycle (compute, network, cpu, server, chain)

    @property
    def label(self) -> str:
        return run_label(self.algo, self.codec)

    def to_dict(self) -> dict:
        return {**asdict(self), "label": self.label}


def run_label(algo: str, codec: str = "none") -> str:
    return algo if codec == "none" else f"{algo}+{codec}"


# --- one function per method ------------------------------------------------------------------


def sync(world_size: int, cal: Calibration, codec: str = "none") -> Prediction:
    """Synchronous AllReduce SGD: T_sync = t_comp + T_ar + t_u (Eq. 3), nothing overlapping;
    on shared cores the p updates and AllReduces queue for the cores too, and no schedule
    beats the cpu bound (Eq. 9)."""
    tc, t_ar, cpu = ring_terms(world_size, cal, codec, cal.alpha)
    tu = cal.t_update
    total = tc + t_ar + tu  # Eq. (3)
    it, bound = (total, "sum") if total >= cpu else (cpu, "cpu")
    return Prediction("sync", codec, world_size, 1, it, tc + tu, t_ar, 0.0, bound)


def pipe(
    world_size: int,
    cal: Calibration,
    codec: str = "none",
    width: int = 2,
    compensation: str = "none",
) -> Prediction:
    """Pipe-SGD of width K: T_pipe(K) = max(t_comp + t_u, T_ar, (t_comp + t_u + T_ar) / K)
    (Eq. 4), and on shared cores the cpu bound (Eq. 9). Where the calibration measured the
    compute thread next to its communication (t_comp_busy), that figure holds the cpu bound's
    extra CPU work, and more (wake-ups), and replaces both. Width 1 is synchronous SGD.
    compensation: its passes (`compensation_passes`), each costed as the reduction's gamma
    per byte, join the update t_u on the compute thread."""
    if width == 1:  # nothing overlaps: Eq. (3) under pipe's name
        return replace(sync(world_size, cal, codec), algo="pipe")
    alpha = cal.alpha
    if cal.alpha_busy is not None:
        alpha = max(alpha, cal.alpha_busy)  # its AllReduces run while the workers compute
    tc, t_ar, cpu = ring_terms(world_size, cal, codec, alpha)
    tu = cal.t_update + compensation_passes(compensation, width) * cal.gamma * cal.grad_bytes
    bounds = {
        "compute": tc + tu,  # Eq. (4): the compute thread
        "network": t_ar,  # Eq. (4): the communication thread
        "chain": (tc + tu + t_ar) / width,  # Eq. (4): K iterations in flight
        "cpu": cpu,  # Eq. (9)
    }
    busy = cal.t_comp_busy.get(codec)
    if busy is not None:  # measured with the communication running: it holds the cpu
        bounds["compute"] = busy + tu  # bound's extra CPU work, and more (wake-ups)
        del bounds["cpu"]
    bound = max(bounds, key=bounds.__getitem__)
    it = bounds[bound]
    hidden = min(t_ar, tc + tu)
    return Prediction("pipe", codec, world_size, width, it, tc + tu, t_ar, hidden, bound)


DEFAULT_BUCKET_BYTES = 32_000  # --bucket-size's default, 32KB (config.py)


def ddp(
    world_size: int, cal: Calibration, codec: str = "none", bucket_size: int = DEFAULT_BUCKET_BYTES
) -> Prediction:
    """DDP-style synchronous SGD: the buckets of the backward's units (at least `bucket_size`
    bytes each) all-reduced one at a time as each is ready, those beside the backward taking
    their CPU work from it, the update after the last (Eq. 12); on shared cores at least the
    cpu bound (Eq. 9)."""
    p = world_size
    tc, _, cpu = ring_terms(p, cal, codec, cal.alpha)
    tu = cal.t_update
    plan = bucket_ready(units_of(cal), bucket_size)
    busy = max(cal.alpha, cal.alpha_busy) if cal.alpha_busy is not None else cal.alpha
    share = max(1.0, p / cal.cores)  # workers per core: each one's CPU work slows them all

    def allreduce_s(j: int, beside: bool) -> float:  # T_ar(b_j): alpha_busy beside compute
        return ring_time(p, cal, codec, plan[j][0], busy if beside else cal.alpha)

    def cpu_s(j: int) -> float:  # a bucket's CPU work, taken from the backward's cores
        return share * ring_cpu(p, cal, codec, plan[j][0])

    spans, backward = schedule([f for _, f in plan], tc, allreduce_s, cpu_s)  # Eq. (12)
    comm = sum(e - s for s, e in spans)
    hidden = sum(max(0.0, min(e, backward) - s) for s, e in spans)
    last_start, end = spans[-1]
    if end <= backward:
        bound = "compute"  # every bucket done within the backward
    elif last_start > backward:
        bound = "network"  # the ring still busy when the backward ended: the buckets queued
    else:
        bound = "tail"  # the ring free when the backward ended: the last bucket's T_ar after it
    it = max(backward, end) + tu  # Eq. (12)
    if cpu > it:
        it, bound = cpu, "cpu"  # Eq. (9)
    return Prediction("ddp", codec, p, 1, it, backward + tu, comm, hidden, bound)


def ps_sync(
    world_size: int, cal: Calibration, codec: str = "none", ps_pulls: str = "sequential"
) -> Prediction:
    """The synchronous parameter server: the round of Eq. (5) (pulls sent one after another)
    or Eq. (6) (`ps_pulls` "shared": all at once), and on shared cores the busiest core's CPU
    work (Eq. 10, `ps_sync_cpu_bound`) and the chain through a core (Eq. 11,
    `ps_sync_core_bound`)."""
    p, M, a = world_size, cal.grad_bytes, cal.alpha
    r, e, d = cal.codec(codec)
    B = min(cal.bandwidth, cal.loop_bandwidth)  # the server streams alone
    if ps_pulls == "shared":
        tc = compute_time(cal, p)  # every worker has its weights at once: all p compute
        comm = 2 * a + p * M / B + p * M / (r * B)  # Eq. (6): p pulls out together, p pushes in
    else:
        pull = M / B
        tc = shared_compute(cal, lambda t: min(p, 1 + t / max(pull, 1e-12)))
        comm = 2 * a + p * M / B + M / (r * B)  # Eq. (5): p pulls out, the last push in
    server = p * M * (cal.gamma + d) + cal.t_update  # Eq. (5): average p gradients, update
    it, bound = max(
        (tc + comm + server, "server"),  # Eq. (5) or (6)
        (ps_sync_cpu_bound(p, cal, codec), "cpu"),  # Eq. (10)
        (ps_sync_core_bound(p, cal, codec, ps_pulls), "core"),  # Eq. (11)
    )
    return Prediction("ps-sync", codec, p, 1, it, tc, comm, 0.0, bound)


def ps_async(world_size: int, cal: Calibration, codec: str = "none") -> Prediction:
    """The asynchronous parameter server: worker 0's cycle or the server's link (Eq. 7), its
    computation shared with the workers on its core (Eq. 8), and on shared cores that core's
    CPU work (`ps_async_cpu_bound`)."""
    p, M, a, C = world_size, cal.grad_bytes, cal.alpha, cal.cores
    r, e, d = cal.codec(codec)
    B = min(cal.bandwidth, cal.loop_bandwidth)  # the server streams alone
    tu = cal.t_update
    comm = 2 * a + M / (r * B) + M / B  # Eq. (7): push and pull
    m = workers_on_timed_core(p, C)

    def own_core(t: float) -> float:
        # Eq. (8). Each worker computes a share f of its cycle, on its own schedule. The timed
        # worker (worker 0) shares its core with m - 1 others: on average 1 + (m - 1) f
        # computing there, each at that fraction of the core; a core to itself runs at the
        # speed of one process per core while the others' p f computations load the rest.
        f = t / (t + comm + tu)
        return compute_time(cal, min(max(1.0, p * f), C)) * (1 + (m - 1) * f)

    tc = fixed_point(own_core, cal.t_comp)
    cycle = tc + comm + tu + M * d  # Eq. (7): worker 0's cycle
    server = p * M / B  # Eq. (7): the server's link, B/M pulls per second for p workers
    it, bound = max(
        (cycle, "worker"),
        (server, "server"),
        (ps_async_cpu_bound(p, cal, codec), "cpu"),  # worker 0's core
    )
    return Prediction("ps-async", codec, p, 1, it, tc, comm, 0.0, bound)


# Method name -> its function, and the options of `predict` it takes.
PREDICTORS = {
    "ps-sync": (ps_sync, ("ps_pulls",)),
    "ps-async": (ps_async, ()),
    "sync": (sync, ()),
    "pipe": (pipe, ("width", "compensation")),
    "ddp": (ddp, ("bucket_size",)),
}
ALGOS = tuple(PREDICTORS)


def predict(
    algo: str,
    world_size: int,
    cal: Calibration,
    codec: str = "none",
    width: int = 2,
    ps_pulls: str = "sequential",
    compensation: str = "none",
    bucket_size: int = DEFAULT_BUCKET_BYTES,
) -> Prediction:
    """The predicted iteration time of `algo` on p = world_size workers (a Prediction), from
    its method's function. `width`: Pipe-SGD's K; `ps_pulls`: how ps-sync's server sends its
    pulls (methods/ps.py): "sequential" or "shared"; `compensation`: Pipe-SGD's;
    `bucket_size`: ddp's, in bytes."""
    if algo not in PREDICTORS:
        raise ValueError(f"unknown algo {algo!r}; choose one of {', '.join(ALGOS)}")
    function, takes = PREDICTORS[algo]
    options = {
        "width": width,
        "ps_pulls": ps_pulls,
        "compensation": compensation,
        "bucket_size": bucket_size,
    }
    return function(world_size, cal, codec, **{name: options[name] for name in takes})


def predict_all(
    world_size: int,
    cal: Calibration,
    runs=COMPARE_RUNS,
    width: int = 2,
    ps_pulls: str = "sequential",
    compensation: str = "none",
    bucket_size: int = DEFAULT_BUCKET_BYTES,
):
    """Predictions for every (algo, codec) of `runs`, keyed by run_label (`compensation`:
    Pipe-SGD's runs'; `bucket_size`: ddp's, bytes)."""
    return {
        run_label(algo, codec): predict(
            algo, world_size, cal, codec, width, ps_pulls, compensation, bucket_size
        )
        for algo, codec in runs
    }


def speedups(preds: dict, baseline: str = "ps-sync") -> dict:
    """{label: baseline iteration time / label's}: how many times faster per iteration."""
    base = preds[baseline].iter_time_s
    return {k: base / v.iter_time_s for k, v in preds.items()}
