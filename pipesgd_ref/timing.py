"""How long one iteration takes: the analytic models of shared/PAPER.md section 3, calibrated.

Every model below is the alpha-beta ("latency-bandwidth") model of a link, applied to the
schedule each method runs. Symbols (DESIGN.md names): p = world_size workers; M = 4n gradient
bytes (n float32 parameters); alpha = seconds per message; B = bandwidth, bytes/s per link and
direction (full duplex); gamma = seconds per byte of reduction (dst += src); t_comp = forward and
backward of one minibatch; t_u = one SGD update; r = compression ratio (wire bytes M/r); e, d =
encode and decode seconds per float32 byte of the codec.

Ring AllReduce (comm/ring.py). 2(p-1) steps; at each a rank sends one chunk of M/p bytes to its
right neighbour while receiving one from its left (full duplex: the two overlap). A step costs
alpha + M/(pB); the p-1 reduce-scatter steps also add the received chunk into the local one,
(M/p) gamma each:

    T_ar = 2(p-1) alpha + 2(p-1)/p * M/(rB) + (p-1)/p * M gamma  + codec        # PAPER.md (3)

With a codec (comm/compressed.py) the wire carries M/r, and every reduce-scatter hop decodes,
adds and re-encodes its chunk, each all-gather hop decodes the chunk it forwards, and the owner
of a chunk encodes and decodes it once more: (p-1)/p M (d + e) + (p-1)/p M d + 1/p M (e + d),

    codec = M (d + e) + (p-1)/p * M d.

Synchronous AllReduce SGD (algorithms/sync.py): compute, then communicate, then update; nothing
overlaps:

    T_sync = t_comp + T_ar + t_u      (on shared cores: at least the cpu bound below, too)

Pipe-SGD of width K (algorithms/pipe.py). Two resources per worker, the compute thread (needs
t_comp + t_u per iteration) and the communication thread (needs T_ar). With K iterations in
flight the steady-state cycle is bounded by each resource, and by the K-deep dependency chain
(a gradient must be computed, reduced and applied before the iteration K later can start):

    T_pipe(K) = max(t_comp + t_u, T_ar, (t_comp + t_u + T_ar) / K)

Since max(a, b) >= (a + b)/2, K = 2 already reaches max(t_comp + t_u, T_ar): wider pipelines
add staleness, never speed. The hidden share of communication is min(T_ar, t_comp + t_u) / T_ar.

Parameter server, synchronous (algorithms/ps.py, comm/ps.py). The server's single link carries
every push in and every pull out. It sends the p pulls one after another, so worker i has its
weights (i+1) M/B after the update; the last worker computes and pushes while the earlier pushes
already cross the (full-duplex) ingress wire; its push arrives M/(rB) later, and the server
averages p gradients (p M gamma, plus p decodes with a codec) and updates:

    T_ps-sync = t_comp + 2 alpha + p M/B + M/(rB) + p M gamma + t_u   (+ p M d with a codec)

(PAPER.md writes 2pM/B: all pulls sent at once sharing the link; comm/ps.py explains why this
server pays (p+1) M/B.) With --ps-pulls=shared the server does send them at once: all workers
have their weights after p M/B, compute together (k = p), and their p pushes queue on the
ingress wire:

    T_ps-sync(shared) = t_comp + 2 alpha + p M/B + p M/(rB) + p M gamma + t_u

Parameter server, asynchronous. Each worker loops compute, push, pull on its own; the server
applies each push on arrival. A worker's cycle is t_comp + 2 alpha + M/(rB) + M/B (+ t_u of the
server); the server's links bound the rate at B/M pulls per second, so each worker's iteration
(one of its own gradients applied) takes

    T_ps-async = max(t_comp + 2 alpha + M/(rB) + M/B + t_u,  p M/B)

One machine, many workers. On a single machine the p worker processes share C cores: when k of
them compute at once each runs at min(1, C/k) of a core. Ring methods compute in lock step
(k = p). In ps-sync the pulls arrive M/B apart, so about 1 + t_comp/(M/B) computations overlap;
ps-async workers compute a t_comp/cycle share f of the time, each on its own schedule; the
timed worker (worker 0, pinned like all ranks to core rank mod C) shares its core with the m - 1
other workers pinned there, so on average 1 + (m - 1) f computations share that core, whatever
the load elsewhere: t_comp(ps-async) = t_comp(one per core) * (1 + (m - 1) f). Both are fixed
points, solved by iteration. Pipe-SGD on shared cores has a third bound besides compute and
network: every byte a rank sends or receives costs CPU time too (copies and reductions), which
the communication thread takes from the same cores: t_comp(p shared) + p (t_u + cpu_comm) / C,
where cpu_comm = 2 * 2(p-1)/p * M/r * copy + (p-1)/p M gamma + codec. No schedule beats that
CPU work divided by the cores, so the cpu bound holds for synchronous SGD as well:
T_sync = max(t_comp + T_ar + t_u, cpu bound) (its sum assumes every worker has its own core for
its copies, reductions and update; on C < p cores they queue like the computations do).
The parameter server's p + 1 processes have the same kind of bound, core by core
(`ps_cpu_bound`). ps-sync moves in lock step, so its busiest core bounds it: with p = 4 on
2 cores, core 0 holds the server and workers 1 and 3,

    T_ps-sync >= 2 (t_cpu + (M/r + M) copy + M e) + p ((M/r + M) copy + M (d + gamma)) + t_u

where t_cpu is the CPU time one step costs its core with the p workers sharing the cores
(`step_cpu`: measured, t_comp_cpu; two processes taking turns on a core make each step cost
more CPU than one process a core does, and finish at different times, so their median wall
time is no measure of it). That work cannot start at the round's start, though, nor end it: a
core's workers start when the first of them has its weights, and the round ends when that
core's last push has crossed the wire and been added. The chain through core c, holding the
workers of ranks R_c, whose first pull (rank k_c = min R_c; with shared pulls k_c = p) arrives
at alpha + k_c M/B (`ps_sync_core_bound`):

    T_c = alpha + k_c M/B + |R_c| (t_cpu + (M/r + M) copy + M e) + [c = 0] (server's work then)
          + alpha + M/(rB) + (M/r) copy + M (d + gamma) + t_u

and T_ps-sync = max(the sum above, the cpu bound, max_c T_c). Measured, p = 4 on 2 cores,
10 Gbit, 1024x1024: core 0's workers had their weights 7-8 ms into the round and kept the core
busy for 63-65 ms; the sum and the cpu bound alone predicted 65-72 ms against runs of 81-85.

ps-async's workers do not wait for each other and its iteration is worker 0's, so the bound is
worker 0's core: the m workers pinned there, m (t_cpu + (M/r + M) copy + M e), plus the
server's p ((M/r + M) copy + M (d + gamma) + t_u) only where it shares that core (C = 1).

Every step of a ring method waits for its slowest rank. On shared cores the ranks' steps differ
(time slices, caches): the per-step maximum over ranks is 10-25% above the median, measured. So
sync and pipe read t_comp_lockstep, the median over steps of the slowest rank; the parameter
server reads t_comp_shared, the median over ranks, and its core bounds t_comp_cpu. Pipe-SGD's
busy figure is its compute thread's cycle in a run of its schedule without the optimizer
(`time_busy_compute`): width two gives the ranks a step of slack, so the slowest rank of each
step overstates it.

Calibration (`calibrate`): t_comp and t_u are timed on the actual model and batch size in this
process; gamma and the codecs' e and d are timed on gradient-sized arrays; alpha and B are the
emulated link's settings plus the software cost of one hop, measured by a ring AllReduce among p
local processes on the run's own link with a gradient chunk per hop (a ping-pong round the ring:
on an emulated link the receiver then sleeps until the emulated arrival and must be woken, as in
a real step), and the bandwidth of a streaming test between two processes (which caps an
emulated bandwidth set above what loopback can move); `copy` is the CPU time the sending and
the receiving thread of that stream spent per byte. The shared and busy compute figures are the
fastest of two launches (of three when they disagree): on a shared machine a burst of other load
only ever slows a launch down.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import asdict, dataclass, field, replace

import numpy as np

ALGOS = ("ps-sync", "ps-async", "sync", "pipe")
CALIBRATION_REPS = 12  # timed steps per process when timing compute shared by several workers


@dataclass(frozen=True)
class Calibration:
    """The figures every model reads, and where each came from."""

    n_params: int  # n: float32 parameters (M = 4n gradient bytes)
    t_comp: float  # s: forward + backward of one worker's minibatch, alone on a core
    t_update: float  # s: one SGD step over the parameters
    alpha: float  # s per message: link latency + software cost of one hop
    bandwidth: float  # bytes/s per link and direction (the emulated link's; inf: none)
    gamma: float  # s per byte added (float32 dst += src)
    copy: float = 0.0  # CPU s per byte sent or received through a local socket
    # bytes/s two local processes stream over loopback TCP: this machine's own limit under any
    # emulated link (inf on a cluster). p ranks moving bytes at once on C < p cores share it:
    # a ring gets loop_bandwidth * C / p per link.
    loop_bandwidth: float = math.inf
    cores: int = 1  # CPU cores the worker processes share (1e9: no sharing)
    # t_comp when k = 1, 2, ... worker processes compute at once on this machine (measured;
    # empty: t_comp * max(1, k / cores)). Sharing costs more than k / cores: caches and memory
    # bandwidth are shared too.
    t_comp_shared: tuple = ()
    # The same launches, per step the slowest of the k (the median over steps of the per-step
    # maximum over ranks): what a ring method gets, whose every step waits for its slowest
    # rank. On shared cores the ranks' steps differ by 10-25% (time slices, caches), so this
    # is that much above t_comp_shared. Empty: t_comp_shared.
    t_comp_lockstep: tuple = ()
    # The same launches, the CPU time of one step (the thread's own, median over ranks and
    # steps): what a step costs the core it runs on. Not the wall time over the sharing: with
    # k > cores two processes take turns on a core, one finishes first, and the median wall
    # time is below twice the CPU time. Each step costs more CPU when processes share a core
    # (caches): measured 6.7-7.1 ms a step with one process a core, 7.7-7.9 with two. Empty:
    # t_comp_shared at k = cores, where every core runs one process.
    t_comp_cpu: tuple = ()
    # t_comp of p workers at once while each one's communication thread runs one ring AllReduce
    # of the gradient per step, on the same link with this codec: what Pipe-SGD's compute
    # thread gets (measured: its cycle, computing and waiting for the AllReduce of the step
    # before, the median over ranks and steps; codec name -> s).
    # On shared cores the comm threads' wake-ups, copies and cache traffic slow the
    # computation beyond the bytes' own CPU cost.
    t_comp_busy: dict = field(default_factory=dict)
    # alpha while the workers compute: a ring hop must wait for a core, a wake-up, the GIL
    # (measured the same way, a ping-pong round the ring, next to the computations); what
    # Pipe-SGD's AllReduces pay. None: not measured, alpha applies.
    alpha_busy: float | None = None
    codecs: dict = field(default_factory=dict)  # name -> (ratio r, encode s/B, decode s/B)
    source: dict = field(default_factory=dict)  # figure -> how it was obtained

    @property
    def grad_bytes(self) -> int:
        return 4 * self.n_params

    def codec(self, name: str) -> tuple[float, float, float]:
        """(r, e, d) of a codec; none is (1, 0, 0)."""
        if name == "none":
            return 1.0, 0.0, 0.0
        if name not in self.codecs:
            raise ValueError(f"no calibration for codec {name!r}; have {sorted(self.codecs)}")
        return tuple(self.codecs[name])

    def with_network(self, alpha: float | None = None, bandwidth: float | None = None):
        """The same machine on another network (for sweeps)."""
        return replace(
            self,
            alpha=self.alpha if alpha is None else alpha,
            bandwidth=self.bandwidth if bandwidth is None else bandwidth,
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Calibration:
        # JSON has no tuples: turn the lists back, so that from_dict(to_dict(c)) == c after a
        # round trip through a file, too.
        return cls(
            **{
                **d,
                "t_comp_shared": tuple(d.get("t_comp_shared", ())),
                "t_comp_lockstep": tuple(d.get("t_comp_lockstep", ())),
                "t_comp_cpu": tuple(d.get("t_comp_cpu", ())),
                "t_comp_busy": dict(d.get("t_comp_busy", {})),
                "codecs": {k: tuple(v) for k, v in d.get("codecs", {}).items()},
            }
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


# --- the formulas ---------------------------------------------------------------------------


def ring_allreduce_time(
    p: int,
    nbytes: float,
    alpha: float,
    bandwidth: float,
    gamma: float = 0.0,
    ratio: float = 1.0,
    encode: float = 0.0,
    decode: float = 0.0,
) -> float:
    """T_ar of the module docstring: 2(p-1) alpha + 2(p-1)/p M/(rB) + (p-1)/p M gamma + codec."""
    if p <= 1:
        return 0.0
    hops = 2 * (p - 1) * alpha
    wire = 2 * (p - 1) / p * nbytes / (ratio * bandwidth)
    reduce = (p - 1) / p * nbytes * gamma
    codec = nbytes * (decode + encode) + (p - 1) / p * nbytes * decode if ratio != 1 else 0.0
    return hops + wire + reduce + codec


def compute_time(cal: Calibration, k: float, lockstep: bool = False) -> float:
    """t_comp when k workers compute at once: measured (cal.t_comp_shared, interpolated
    linearly between whole k), else t_comp * max(1, k / cores). Beyond the table (a sweep to
    more workers than were measured) its last entry is scaled by the same core-sharing law:
    t(k) = t(K) * max(1, k / cores) / max(1, K / cores), K = len(table). `lockstep`: the
    slowest of the k, step by step (cal.t_comp_lockstep, where measured)."""
    table = (lockstep and cal.t_comp_lockstep) or cal.t_comp_shared
    if not table:
        return cal.t_comp * max(1.0, k / cal.cores)
    n = len(table)
    if k > n:  # unmeasured: k / cores of a core each, relative to the last measured point
        return table[-1] * max(1.0, k / cal.cores) / max(1.0, n / cal.cores)
    k = max(k, 1.0)
    lo = int(math.floor(k))
    hi = min(lo + 1, n)
    frac = k - lo
    return table[lo - 1] * (1 - frac) + table[hi - 1] * frac


def shared_compute(cal: Calibration, concurrency) -> float:
    """t_comp when the workers share the cores and k (the number computing at once) depends on
    t_comp itself: `concurrency(t)` gives k, solved by fixed-point iteration (it converges: k
    grows with t, and t with k, both bounded)."""
    return _fixed_point(lambda t: compute_time(cal, concurrency(t)), cal.t_comp)


def workers_on_timed_core(p: int, cores: int) -> int:
    """Workers of a parameter-server job on the core of worker 0, whose steps are timed: rank 0
    is the server and rank r the worker r - 1, pinned to core r mod cores (launch.pin_to_core).
    1 where the cores are not shared."""
    if cores >= p + 1:
        return 1
    return sum(1 for rank in range(1, p + 1) if rank % cores == 1 % cores)


def _fixed_point(fn, t: float) -> float:
    """t = fn(t) by damped iteration (fn grows with t, boundedly: it converges; damped because
    the map can overshoot where a concurrency jumps)."""
    for _ in range(100):
        t_new = fn(t)
        if abs(t_new - t) < 1e-9:
            return t_new
        t = 0.5 * (t + t_new)
    return t


def predict(
    algo: str,
    world_size: int,
    cal: Calibration,
    codec: str = "none",
    width: int = 2,
    ps_pulls: str = "sequential",
):
    """The predicted iteration time of `algo` on p = world_size workers (a Prediction).
    `ps_pulls`: how ps-sync's server sends its pulls (comm/ps.py): "sequential" or "shared"."""
    p, M = world_size, cal.grad_bytes
    a, g, C = cal.alpha, cal.gamma, cal.cores
    r, e, d = cal.codec(codec)
    tu = cal.t_update
    # The emulated link, or what the machine itself can move if that is less: all p ring ranks
    # stream at once and share the cores; the server streams alone.
    B_ring = min(cal.bandwidth, cal.loop_bandwidth * min(1.0, C / p))
    B = min(cal.bandwidth, cal.loop_bandwidth)
    if algo in ("sync", "pipe"):
        B = B_ring
        tc = compute_time(cal, p, lockstep=True)  # all p compute at once; each step waits
        busy = cal.t_comp_busy.get(codec) if algo == "pipe" and width > 1 else None
        if algo == "pipe" and width > 1 and cal.alpha_busy is not None:
            a = max(a, cal.alpha_busy)  # its AllReduces run while the workers compute
        t_ar = ring_allreduce_time(p, M, a, B, g, r, e, d)
        moved = 2 * 2 * (p - 1) / p * M / r  # bytes sent + received per AllReduce
        cpu_comm = moved * cal.copy + (t_ar - 2 * (p - 1) * a - 2 * (p - 1) / p * M / (r * B))
        cpu = tc + p * (tu + cpu_comm) / C  # all CPU work of p workers on C cores
        if algo == "sync" or width == 1:
            # Nothing overlaps: the sum; but on shared cores the p updates and AllReduces
            # queue for the cores too, and no schedule beats the cpu bound.
            it, bound = (tc + t_ar + tu, "sum") if tc + t_ar + tu >= cpu else (cpu, "cpu")
            return Prediction(algo, codec, p, 1, it, tc + tu, t_ar, 0.0, bound)
        bounds = {
            "compute": tc + tu,
            "network": t_ar,
            "chain": (tc + tu + t_ar) / width,
            "cpu": cpu,
        }
        if busy is not None:  # measured with the communication running: it holds the cpu
            bounds["compute"] = busy + tu  # bound's extra CPU work, and more (wake-ups)
            del bounds["cpu"]
        bound = max(bounds, key=bounds.get)
        it = bounds[bound]
        return Prediction(algo, codec, p, width, it, tc + tu, t_ar, min(t_ar, tc + tu), bound)
    if algo == "ps-sync":
        if ps_pulls == "shared":
            tc = compute_time(cal, p)  # every worker has its weights at once: all p compute
            comm = 2 * a + p * M / B + p * M / (r * B)  # p pulls out together, p pushes in
        else:
            pull = M / B
            tc = shared_compute(cal, lambda t: min(p, 1 + t / max(pull, 1e-12)))
            comm = 2 * a + p * M / B + M / (r * B)  # Eq. ps-sync: p pulls out, the last push in
        server = p * M * (g + d) + tu
        it, bound = max((tc + comm + server, "server"),
                        (ps_cpu_bound(algo, p, cal, codec), "cpu"),
                        (ps_sync_core_bound(p, cal, codec, ps_pulls), "core"))  # fmt: skip
        return Prediction(algo, codec, p, 1, it, tc, comm, 0.0, bound)
    if algo == "ps-async":
        comm = 2 * a + M / (r * B) + M / B
        m = workers_on_timed_core(p, C)

        def own_core(t: float) -> float:
            # Each worker computes a share f of its cycle, on its own schedule. The timed worker
            # (worker 0) shares its core with m - 1 others: on average 1 + (m - 1) f computing
            # there, each at that fraction of the core; a core to itself runs at the speed of
            # one process per core while the others' p f computations load the rest.
            f = t / (t + comm + tu)
            return compute_time(cal, min(max(1.0, p * f), C)) * (1 + (m - 1) * f)

        tc = _fixed_point(own_core, cal.t_comp)
        cycle = tc + comm + tu + M * d
        server = p * M / B  # the server's link: B/M pulls per second for p workers
        it, bound = max((cycle, "worker"), (server, "server"),
                        (ps_cpu_bound(algo, p, cal, codec), "cpu"))  # fmt: skip
        return Prediction(algo, codec, p, 1, it, tc, comm, 0.0, bound)
    raise ValueError(f"unknown algo {algo!r}; choose one of {', '.join(ALGOS)}")


def ps_cpu_bound(algo: str, world_size: int, cal: Calibration, codec: str = "none") -> float:
    """The CPU work per iteration on the core that bounds a parameter-server job whose p + 1
    processes share C < p + 1 cores, pinned rank r to core r mod C (rank 0 the server): no
    schedule finishes an iteration sooner. 0 where every process has a core of its own.

    A worker's work per iteration: one computation (t_comp with every core busy), encoding its
    push, and the socket path's CPU for the push out and the pull in, (M/r + M) copy. The
    server's, per push: the push in and the pull out, (M/r + M) copy, decoding and adding,
    M (d + gamma); plus one update per push (ps-async) or per round (ps-sync).

    ps-sync moves in lock step (the server waits for every push, every worker for its pull):
    the busiest core bounds it, the server's core 0 with the workers pinned there. ps-async's
    workers do not wait for each other, and its iteration is worker 0's (rank 1): the bound is
    that core's work, worker 0 and the workers pinned with it going at one rate, the server
    only where it shares that core (C = 1); the server's own core slows the workers there,
    not worker 0."""
    p, C = world_size, cal.cores
    if C >= p + 1:
        return 0.0
    M = cal.grad_bytes
    r, e, d = cal.codec(codec)
    worker = ps_worker_step(cal, p, codec)
    per_push = (M / r + M) * cal.copy + M * (d + cal.gamma)
    if algo == "ps-async":
        server = p * (per_push + cal.t_update)
    elif algo == "ps-sync":
        server = p * per_push + cal.t_update
    else:
        raise ValueError(f"ps_cpu_bound is for the parameter server, not {algo!r}")
    load = [0.0] * C
    load[0] = server
    for rank in range(1, p + 1):
        load[rank % C] += worker
    return load[1 % C] if algo == "ps-async" else max(load)


def step_cpu(cal: Calibration, k: int) -> float:
    """The CPU time one step of computation costs its core when k worker processes share the
    cores (cal.t_comp_cpu at k; its last entry beyond the table), or, not measured, t_comp
    with every core busy (k = cores)."""
    if cal.t_comp_cpu:
        return cal.t_comp_cpu[min(max(int(k), 1), len(cal.t_comp_cpu)) - 1]
    return compute_time(cal, min(k, cal.cores))


def ps_worker_step(cal: Calibration, world_size: int, codec: str = "none") -> float:
    """The CPU work one parameter-server worker's iteration costs its core: a step of
    computation with p workers sharing the cores (`step_cpu`), encoding its push, and the
    socket path's CPU for the push out and the pull in, (M/r + M) copy."""
    M = cal.grad_bytes
    r, e, _ = cal.codec(codec)
    return step_cpu(cal, world_size) + M * e + (M / r + M) * cal.copy


def ps_sync_core_bound(
    world_size: int, cal: Calibration, codec: str = "none", ps_pulls: str = "sequential"
) -> float:
    """ps-sync's iteration as the chain through one core, on C < p + 1 shared cores (0 where
    every process has a core of its own): a core's work cannot start before the first of its
    workers has its weights, and the round cannot end before that core's last push has
    crossed the wire and been added. For core c, holding the workers of ranks R_c (rank r on
    core r mod C; the server, rank 0, on core 0):

        T_c = alpha + k_c M / B                   # pull k_c = min R_c arrives (shared: k_c = p)
            + |R_c| (t_cpu + M e + (M / r + M) copy)       # its workers' steps, one at a time
            + [c = 0] ((p - k_c) M copy + (p - 1) s)       # the server's pulls and pushes then
            + alpha + M / (r B) + s + t_u         # the last push crosses, is added; the update

    where s = (M / r) copy + M (d + gamma) is the server's work on one push and t_cpu the CPU
    of a step with p workers sharing the cores (`step_cpu`). The busiest core's chain bounds
    the round: measured (p = 4 on 2 cores, 10 Gbit, 1024x1024) core 0's workers got their
    weights 7-8 ms into the round and kept the core busy until their last push, 63-65 ms
    later; the sum and the cpu bound, which count neither the wait nor the last push, were
    10-20% short."""
    p, C = world_size, cal.cores
    if C >= p + 1:
        return 0.0
    M = cal.grad_bytes
    r, e, d = cal.codec(codec)
    B = min(cal.bandwidth, cal.loop_bandwidth)
    worker = ps_worker_step(cal, p, codec)
    push = (M / r) * cal.copy + M * (d + cal.gamma)  # s: the server's work on one push
    tail = cal.alpha + M / (r * B) + push + cal.t_update
    longest = 0.0
    for core in range(C):
        ranks = [rank for rank in range(1, p + 1) if rank % C == core]
        if not ranks:
            continue
        first = p if ps_pulls == "shared" else min(ranks)
        work = len(ranks) * worker
        if core == 0:  # the server's own work while its core's workers compute
            work += (p - first) * M * cal.copy + (p - 1) * push
        longest = max(longest, cal.alpha + first * M / B + work + tail)
    return longest


# The runs of `pipesgd compare`, in its table's order: (algo, codec).
COMPARE_RUNS = (
    ("ps-sync", "none"),
    ("ps-async", "none"),
    ("sync", "none"),
    ("pipe", "none"),
    ("pipe", "trunc16"),
    ("pipe", "q8"),
)


def predict_all(
    world_size: int,
    cal: Calibration,
    runs=COMPARE_RUNS,
    width: int = 2,
    ps_pulls: str = "sequential",
):
    """Predictions for every (algo, codec) of `runs`, keyed by run_label."""
    return {
        run_label(algo, codec): predict(algo, world_size, cal, codec, width, ps_pulls)
        for algo, codec in runs
    }


# --- calibration: measure the figures on this machine ------------------------------------------


def _median_time(fn, reps: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def usable_cores() -> int:
    """Cores this process may run on (taskset/cgroup-aware where the OS tells)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def time_compute(cfg, reps: int = 10) -> tuple[int, float, float]:
    """(n_params, t_comp, t_update) of cfg's model and batch size, timed in this process."""
    from pipesgd_ref.algorithms.worker import Worker

    w = Worker.build(cfg.replace(resume=""), 0, cfg.world_size)
    grads = np.empty_like(w.params)
    step = iter(range(10**9))
    with _one_blas_thread():  # as in a worker (launch.pin_to_core): one core, one BLAS thread
        t_comp = _median_time(lambda: w.loss_and_grad(next(step), grads), reps)
        params = w.params.copy()
        t_update = _median_time(lambda: w.model.backend.sgd_step(params, grads, 1e-12), reps)
    return w.model.n_params, t_comp, t_update


def _one_blas_thread():
    try:
        from threadpoolctl import threadpool_limits

        return threadpool_limits(1)
    except ImportError:  # without threadpoolctl, BLAS decides (as in the workers)
        from contextlib import nullcontext

        return nullcontext()


def _compute_job(comm, cfg, reps: int) -> tuple[list[float], list[float]]:
    """(wall times, CPU times) of `reps` steps of this rank, every step started together."""
    from pipesgd_ref.algorithms.worker import Worker
    from pipesgd_ref.comm.ring import barrier

    w = Worker.build(cfg.replace(resume=""), comm.rank, comm.world_size)
    grads = np.empty_like(w.params)
    w.loss_and_grad(0, grads)
    times, cpu = [], []
    for step in range(1, reps + 1):
        barrier(comm)  # every step starts together: all k compute at once, step by step
        start, cpu_start = time.perf_counter(), time.thread_time()
        w.loss_and_grad(step, grads)
        times.append(time.perf_counter() - start)
        cpu.append(time.thread_time() - cpu_start)
    return times, cpu


def step_statistics(per_rank: list[list[float]]) -> tuple[float, float]:
    """(median over ranks and steps, median over steps of the slowest rank) of per-rank lists
    of step times, step i of every rank taken together."""
    steps = min(len(t) for t in per_rank)
    every = [t for times in per_rank for t in times[:steps]]
    slowest = [max(times[i] for times in per_rank) for i in range(steps)]
    return statistics.median(every), statistics.median(slowest)


def steps_spanning(step_s: float, span_s: float, least: int, most: int) -> int:
    """How many steps of `step_s` make a measurement span `span_s` seconds, within
    [least, most]: short steps need more of them, or one scheduling hiccup of a few ms moves
    their median by a third."""
    return max(least, min(most, math.ceil(span_s / max(step_s, 1e-9))))


MAX_CALIBRATION_REPS = 40  # the most steps `calibrate` times where steps are short (span_s)
CALIBRATION_TRIES = 2  # each busy or shared compute figure: the fastest of this many launches...
CALIBRATION_SPREAD = 1.10  # ...and one more when they differ by more than this ratio


def best_of(measure, tries: int = CALIBRATION_TRIES):
    """The fastest of `tries` calls of measure() (a number, or a tuple compared by its first
    item), with one more call when they disagree by more than CALIBRATION_SPREAD: a burst of
    other load on a shared machine only ever slows a measurement down, and the runs the
    models are checked against are the fastest of 2-3 too."""
    got = [measure() for _ in range(max(1, tries))]

    def key(x):
        return x[0] if isinstance(x, tuple) else x

    if len(got) > 1 and max(map(key, got)) > CALIBRATION_SPREAD * min(map(key, got)):
        got.append(measure())
    return min(got, key=key)


def merged_calibration(cals: list[Calibration]) -> Calibration:
    """Calibrations of the same (model, batch, world size, link) made minutes apart, merged
    figure by figure into their median (the mean of two).

    Why the median and not the fastest: the runs a calibration predicts are measured as the
    fastest of their passes, one run each; every compute figure of one calibration is already
    the fastest of two launches (best_of), the same statistic. The fastest over the passes as
    well would be the fastest of four against runs that are the fastest of two: predictions
    biased fast (re-predicting the runs of one two-pass grid, the median merge alone moved the
    median signed error from -6.7% to -3.3%). A busy-compute or codec figure that only some
    calibrations have comes from those that have it; shared-compute tables of different
    lengths are not merged (the first one's is kept)."""
    if not cals:
        raise ValueError("merged_calibration needs at least one calibration")
    first = cals[0]
    if any(c.n_params != first.n_params or c.bandwidth != first.bandwidth for c in cals):
        raise ValueError("calibrations of different models or links cannot be merged")
    mid = statistics.median

    def typical(name: str):
        values = [getattr(c, name) for c in cals if getattr(c, name) is not None]
        return mid(values) if values else None

    def table(name: str) -> tuple:
        """A per-k table, element by element; the first one's where they differ in length."""
        tables = [getattr(c, name) for c in cals]
        if all(tables) and len({len(t) for t in tables}) == 1:
            return tuple(mid(v) for v in zip(*tables, strict=True))
        return getattr(first, name)

    busy = {k: mid([c.t_comp_busy[k] for c in cals if k in c.t_comp_busy])
            for c0 in cals for k in c0.t_comp_busy}  # fmt: skip
    codecs = {}
    for name in sorted({name for c in cals for name in c.codecs}):
        have = [c.codecs[name] for c in cals if name in c.codecs]
        codecs[name] = (have[0][0], mid(h[1] for h in have), mid(h[2] for h in have))
    return replace(
        first,
        t_comp=typical("t_comp"),
        t_update=typical("t_update"),
        alpha=typical("alpha"),
        gamma=typical("gamma"),
        copy=typical("copy"),
        loop_bandwidth=typical("loop_bandwidth"),
        t_comp_shared=table("t_comp_shared"),
        t_comp_lockstep=table("t_comp_lockstep"),
        t_comp_cpu=table("t_comp_cpu"),
        t_comp_busy=busy,
        alpha_busy=typical("alpha_busy"),
        codecs=codecs,
        source={
            **first.source,
            "merged": f"the median of {len(cals)} calibrations, figure by figure "
            "(merged_calibration)",
        },
    )


def time_shared_compute(
    cfg, max_k: int, reps: int = CALIBRATION_REPS, tries: int = CALIBRATION_TRIES
) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
    """(t_comp_shared, t_comp_lockstep, t_comp_cpu): t_comp with k = 1..max_k worker processes
    computing at once, pinned as the workers are (launch.pin_to_core), every step started
    together: for each k, the median over ranks and steps, the median over steps of the
    slowest rank, and the median CPU time of a step; each the fastest over `tries` launches,
    or one more when they disagree (best_of)."""
    from pipesgd_ref.launch import launch_local

    shared: list[float] = []
    lockstep: list[float] = []
    cpu: list[float] = []
    for k in range(1, max_k + 1):
        launches: list[tuple[float, float, float]] = []

        def launch(k=k, launches=launches) -> tuple[float, float, float]:
            per_rank = launch_local(k, _compute_job, (cfg, reps), start_method="fork")
            typical, slowest = step_statistics([wall for wall, _ in per_rank])
            step_cpu = statistics.median(t for _, times in per_rank for t in times)
            launches.append((typical, slowest, step_cpu))
            return launches[-1]

        best_of(launch, tries)
        # each statistic the fastest of the launches: one slow core (a VM's vCPU losing time
        # for a few seconds) slows one launch's slowest rank without moving its median
        typical = min(t for t, _, _ in launches)
        slowest = min(s for _, s, _ in launches)
        # More workers never compute faster: a noisy sample below the last one is noise.
        shared.append(max([typical, *shared[-1:]]))
        lockstep.append(max([slowest, shared[-1], *lockstep[-1:]]))
        cpu.append(max([min(c for _, _, c in launches), *cpu[-1:]]))
    return tuple(shared), tuple(lockstep), tuple(cpu)


def _busy_compute_job(comm, cfg, reps: int, hop_bytes: int = 4) -> tuple[list[float], float]:
    """Pipe-SGD's schedule without the optimizer: step t hands a gradient-sized buffer to a
    communication thread (one ring AllReduce, the run's codec and link) and computes the next
    gradient meanwhile, then waits for that AllReduce. Returns the compute thread's cycles
    (computing and that wait: step t + 1 of a rank starts once the AllReduce of the gradient
    before step t is done everywhere, as in pipe.py, one step of slack between the ranks) and
    the median hop."""
    import queue
    import threading

    from pipesgd_ref.algorithms.worker import Worker
    from pipesgd_ref.comm.ring import allreduce, barrier

    w = Worker.build(cfg.replace(resume=""), comm.rank, comm.world_size)
    grads = np.empty_like(w.params)
    codec = w.codec()
    w.loss_and_grad(0, grads)
    traffic = np.ones_like(w.params)
    todo: queue.SimpleQueue = queue.SimpleQueue()
    done: queue.SimpleQueue = queue.SimpleQueue()

    from pipesgd_ref.config import link_model

    tiny = np.zeros(comm.world_size * hop_bytes // 4, np.float32)
    serialize = hop_bytes / link_model(cfg).bandwidth  # the emulated wire's share of a hop
    hops: list[float] = []

    # The last HOP_STEPS steps also time a ping-pong round the ring; their extra traffic
    # would slow the computation, so their compute times are left out.
    hop_steps = min(HOP_STEPS, reps)

    def communicate() -> None:  # one AllReduce per computed gradient, as in pipe.py
        try:
            for step in range(reps):
                todo.get()
                allreduce(comm, traffic, "mean", codec=codec)
                if step < reps - hop_steps:
                    done.put(None)
                    continue
                # ...then a ping-pong round the ring, twice: the first waits for the slowest
                # rank, the second times 2(p-1) hops while the computations go on (latency
                # and software; its bytes' serialization is taken out)
                allreduce(comm, tiny)
                start = time.perf_counter()
                allreduce(comm, tiny)
                hop = (time.perf_counter() - start) / (2 * (comm.world_size - 1))
                hops.append(max(0.0, hop - serialize))
                done.put(None)
        except BaseException as e:  # handed to the main thread, which raises it
            done.put(e)

    barrier(comm)
    thread = threading.Thread(target=communicate, daemon=True)
    thread.start()
    cycles = []
    for step in range(1, reps + 1):
        todo.put(step)  # the AllReduce of the previous gradient starts now
        start = time.perf_counter()
        w.loss_and_grad(step, grads)
        got = done.get(timeout=2 * comm.timeout)  # width two: one AllReduce in flight
        cycles.append(time.perf_counter() - start)
        if isinstance(got, BaseException):
            raise got
    thread.join(timeout=comm.timeout)
    return cycles[: reps - hop_steps] or cycles, statistics.median(hops)


def time_busy_compute(
    cfg, codecs=("none",), reps: int = CALIBRATION_REPS, hop_bytes: int = 4,
    tries: int = CALIBRATION_TRIES,
):  # fmt: skip
    """({codec: t_comp}, alpha) of cfg.world_size pinned workers computing while their
    communication threads run a ring AllReduce of the gradient per step, with that codec, on
    cfg's link, and a ping-pong round the ring of `hop_bytes` per hop (alpha: its latency and
    software per hop). t_comp: the median over ranks and steps of the compute thread's cycle,
    computing and waiting for the AllReduce before (a slow step of one rank holds the others
    only through that wait, one step later: the pipe's slack). Each codec's figures: those of
    the launch that computed fastest, of `tries` or one more when they disagree (best_of)."""
    from pipesgd_ref.config import link_model
    from pipesgd_ref.launch import launch_local
    from pipesgd_ref.train import load_before_fork

    out, hops = {}, []
    for name in codecs:
        run = cfg.replace(codec=name, resume="")
        load_before_fork(run)  # the forked ranks inherit Numba and the codec

        def launch(run=run) -> tuple[float, float]:
            per_rank = launch_local(run.world_size, _busy_compute_job, (run, reps, hop_bytes),
                                    model=link_model(run), start_method="fork")  # fmt: skip
            typical, _ = step_statistics([t for t, _ in per_rank])
            return typical, statistics.median(h for _, h in per_rank)

        out[name], hop = best_of(launch, tries)
        hops.append(hop)
    return out, (statistics.median(hops) if hops else None)


def time_codecs(n: int, backend: str = "numpy", names=("trunc16", "bf16", "q8"), reps: int = 5):
    """{codec: (r, encode s/byte, decode-add s/byte)} on an n-element gradient."""
    from pipesgd_ref.codecs import get_codec

    rng = np.random.default_rng(0)
    x = rng.standard_normal(n).astype(np.float32)
    acc = np.zeros_like(x)
    out = {}
    for name in names:
        codec = get_codec(name, backend)
        codes = np.empty(codec.wire_bytes(n), np.uint8)
        e = _median_time(lambda c=codec, b=codes: c.encode(x, b), reps) / (4 * n)
        d = _median_time(lambda c=codec, b=codes: c.add_decoded_into(b, acc), reps) / (4 * n)
        out[name] = (4 * n / codec.wire_bytes(n), e, d)
    return out


def time_gamma_and_copy(n: int, reps: int = 5) -> tuple[float, float]:
    """(gamma, copy) in s per byte: dst += src, and a memory copy (a socket moves every byte
    through at least one copy on each side)."""
    a = np.ones(max(n, 1024), np.float32)
    b = np.ones_like(a)
    gamma = _median_time(lambda: np.add(a, b, out=a), reps) / a.nbytes
    copy = _median_time(lambda: np.copyto(a, b), reps) / a.nbytes
    return gamma, copy


def _hop_job(comm, n: int, reps: int) -> float:
    from pipesgd_ref.comm.ring import allreduce, barrier

    x = np.ones(n, np.float32)
    barrier(comm)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        allreduce(comm, x)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


HOP_STEPS = 3  # steps of the busy compute measurement that also time a ring hop
HOP_BYTES = 256 << 10  # per-hop message of the hop measurement on an emulated link (at most)


def hop_message_bytes(cal_bytes: int, world_size: int, emulated: bool) -> int:
    """Bytes per hop of the message `measure_hop` sends: on an emulated link a gradient chunk
    (M/p, at most HOP_BYTES), large enough that the receiver sleeps until the emulated arrival
    and must be woken, as in a real step; unemulated, one float (the wire term is modelled on
    its own there, from the stream)."""
    if not emulated or world_size < 2:
        return 4
    return int(max(4, min(HOP_BYTES, cal_bytes // world_size)) // 4 * 4)


def measure_hop(world_size: int, model=None, hop_bytes: int = 4, reps: int | None = None) -> float:
    """Software cost of one ring hop among `world_size` local processes: a ring AllReduce of
    `hop_bytes` per hop (a ping-pong round the ring, 2(p-1) hops) on the link `model` (None:
    not emulated), less the link's own latency + bytes/B, divided by its hop count. What is
    left is what the alpha-beta model calls software: waking the receiver (from the socket, or
    from the sleep until an emulated arrival), frames, the sending thread, Python."""
    from pipesgd_ref.launch import launch_local

    if world_size < 2:
        return 0.0
    hops = 2 * (world_size - 1)
    latency, bandwidth = (model.latency, model.bandwidth) if model is not None else (0.0, math.inf)
    wire = latency + hop_bytes / bandwidth
    if reps is None:  # about a second of emulated wire time, 5..50 reps
        reps = int(min(50, max(5, 1.0 / max(hops * wire, 1e-9))))
    n = world_size * hop_bytes // 4
    per_rank = launch_local(world_size, _hop_job, (n, reps), start_method="fork", model=model)
    return max(0.0, max(per_rank) / hops - wire)


def network_figures(nbytes: int = 16 << 20, reps: int = 6) -> dict:
    """{"stream": bytes/s, "copy": CPU s per byte}: what two local processes stream over
    loopback TCP (the median rep), and the CPU time each byte costs a side (the mean of the
    sender's and the receiver's, the median over reps). Machine figures: measure once."""
    from pipesgd_ref.bench import p2p_figures

    got = p2p_figures(nbytes, reps)
    return {"stream": got["bandwidth"], "copy": (got["cpu_send"] + got["cpu_recv"]) / 2}


def calibrate(
    cfg,
    network: dict | None = None,
    log=None,
    busy_codecs=(),
    reps: int = CALIBRATION_REPS,
    tries: int = CALIBRATION_TRIES,
    span_s: float = 0.0,
) -> Calibration:
    """Measure every figure of the models for cfg (model, batch size, world size, link).

    `network` may carry already measured {"hop": s, "stream": bytes/s, "copy": s/byte}
    (`network_figures`: the stream and copy depend only on the machine, so a grid or sweep
    measures them once; "hop" is measured on cfg's link unless given). `busy_codecs`: the
    codecs to time Pipe-SGD's computation under (t_comp_busy); none by default (then the pipe
    model uses the shared-core t_comp and its cpu bound). `reps`: timed steps per process in
    the shared and busy compute measurements (fewer: faster, noisier), more (up to
    MAX_CALIBRATION_REPS) where a step is shorter than `span_s` / reps (`steps_spanning`);
    `tries`: launches per shared or busy compute figure, the fastest kept (see best_of)."""
    from pipesgd_ref.config import link_model

    link = link_model(cfg)
    n, t_comp, t_update = time_compute(cfg)
    reps = steps_spanning(t_comp, span_s, reps, max(reps, MAX_CALIBRATION_REPS))
    hop_bytes = hop_message_bytes(4 * n, cfg.world_size, link.enabled)
    shared, lockstep, per_step_cpu = time_shared_compute(cfg, cfg.world_size, reps, tries)
    busy, hop_busy = {}, None
    if busy_codecs and cfg.world_size > 1:
        busy, hop_busy = time_busy_compute(cfg, busy_codecs, reps, hop_bytes, tries)
    gamma, copy = time_gamma_and_copy(n)
    codecs = time_codecs(n, cfg.codec_backend)
    net = {**(network or {})}
    if "stream" not in net or "copy" not in net:
        net = {**network_figures(), **net}
    if "hop" not in net:
        net["hop"] = measure_hop(cfg.world_size, link if link.enabled else None, hop_bytes)
    cal = Calibration(
        n_params=n,
        t_comp=t_comp,
        t_update=t_update,
        alpha=link.latency + net["hop"],
        bandwidth=link.bandwidth,
        loop_bandwidth=net["stream"],
        gamma=gamma,
        # Each byte a rank sends or receives costs the cores the socket path's CPU time (kernel
        # copies and TCP: measured on a stream), which is far above a memcpy.
        copy=max(copy, net["copy"]),
        cores=usable_cores(),
        t_comp_shared=shared,
        t_comp_lockstep=lockstep,
        t_comp_cpu=per_step_cpu,
        t_comp_busy=busy,
        alpha_busy=hop_busy,  # measured on the emulated link: its latency is in it
        codecs=codecs,
        source={
            "t_comp": f"median of 10 timed loss_and_grad, batch {cfg.batch_size}, this process",
            "t_update": "median of 10 timed sgd_step",
            "alpha": f"emulated latency {link.latency:g} s + measured hop {net['hop']:.3g} s "
            f"(a ring AllReduce of {hop_bytes} B per hop on this link, its wire time taken out)",
            "bandwidth": f"the emulated link: {link.bandwidth:.4g} bytes/s",
            "loop_bandwidth": "the median of 6 streams of 16 MB between two local processes",
            "copy": "CPU time per byte of the sending and receiving thread of those streams "
            "(their mean)",
            "gamma": "np.add over the gradient",
            "cores": "os.sched_getaffinity",
            "t_comp_shared": f"median of {reps} timed loss_and_grad in k pinned processes at "
            f"once, every step started together, the fastest of {tries} launches (one more "
            "when they disagree)",
            "t_comp_lockstep": "the same launches: the median over steps of the slowest rank",
            "t_comp_cpu": "the same launches: the median CPU time (thread_time) of a step",
        },
    )
    if log:
        log(describe(cal))
    return cal


def describe(cal: Calibration) -> str:
    """One paragraph of the calibrated figures, in the units people read."""
    from pipesgd_ref.units import format_bandwidth, format_bytes, format_seconds

    codecs = ", ".join(
        f"{k}: r={r:.2f} e={e * 1e9:.2f} d={d * 1e9:.2f} ns/B"
        for k, (r, e, d) in cal.codecs.items()
    )
    return (
        f"n={cal.n_params} params (M={format_bytes(cal.grad_bytes)}), "
        f"t_comp={format_seconds(cal.t_comp)}, t_u={format_seconds(cal.t_update)}, "
        f"alpha={format_seconds(cal.alpha)}"
        + (f" ({format_seconds(cal.alpha_busy)} computing)" if cal.alpha_busy else "")
        + f", B={format_bandwidth(cal.bandwidth)}, "
        f"gamma={cal.gamma * 1e9:.3f} ns/B, copy={cal.copy * 1e9:.3f} ns/B, cores={cal.cores}"
        + (
            f", t_comp(k=1..)=[{', '.join(f'{t * 1e3:.2f}' for t in cal.t_comp_shared)}] ms"
            if cal.t_comp_shared
            else ""
        )
        + (
            f" (the slowest of k: [{', '.join(f'{t * 1e3:.2f}' for t in cal.t_comp_lockstep)}] ms)"
            if cal.t_comp_lockstep
            else ""
        )
        + (
            f" (CPU a step: [{', '.join(f'{t * 1e3:.2f}' for t in cal.t_comp_cpu)}] ms)"
            if cal.t_comp_cpu
            else ""
        )
        + (f"; {codecs}" if codecs else "")
    )


def speedups(preds: dict, baseline: str = "ps-sync") -> dict:
    """{label: baseline iteration time / label's}: how many times faster per iteration."""
    base = preds[baseline].iter_time_s
    return {k: base / v.iter_time_s for k, v in preds.items()}


def sweep_values(spec: str) -> tuple[str, list[float]]:
    """'bandwidth=100Mbit..100Gbit' -> ('bandwidth', [bytes/s ...], log-spaced, 13 points);
    'world_size=2..64' -> ('world_size', [2, 3, 4, ..., 64] in powers of two and between)."""
    from pipesgd_ref.units import parse_bandwidth, parse_latency

    if "=" not in spec or ".." not in spec:
        raise ValueError(
            f"cannot read sweep {spec!r}: expected KEY=LOW..HIGH, e.g. bandwidth=100Mbit..100Gbit "
            f"or world_size=2..64"
        )
    key, rng = spec.split("=", 1)
    key = key.strip().replace("-", "_")
    lo_text, hi_text = rng.split("..", 1)
    if key == "world_size":
        try:
            lo, hi = int(lo_text), int(hi_text)
        except ValueError:
            raise ValueError(
                f"cannot read sweep {spec!r}: world_size needs whole numbers, e.g. world_size=2..64"
            ) from None
        if not 1 <= lo < hi:
            raise ValueError(f"world_size sweep needs 1 <= LOW < HIGH, got {lo}..{hi}")
        vals = sorted({lo, hi} | {2**k for k in range(1, 20) if lo < 2**k < hi}
                      | {3 * 2**k for k in range(0, 20) if lo < 3 * 2**k < hi})  # fmt: skip
        return key, [float(v) for v in vals]
    parse = {"bandwidth": parse_bandwidth, "latency": parse_latency}.get(key)
    if parse is None:
        raise ValueError(f"cannot sweep {key!r}: choose bandwidth, latency or world_size")
    lo, hi = parse(lo_text), parse(hi_text)
    if not 0 < lo < hi < math.inf:
        raise ValueError(f"{key} sweep needs 0 < LOW < HIGH, finite; got {lo_text}..{hi_text}")
    return key, list(np.geomspace(lo, hi, 13))
