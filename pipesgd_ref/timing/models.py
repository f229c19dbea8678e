"""How long one iteration takes: the analytic models of shared/PAPER.md section 3.

Every model below is the alpha-beta ("latency-bandwidth") model of a link, applied to the
schedule each method runs; `predict` hands a method to its function (`sync`, `pipe`, `ps_sync`,
`ps_async`), each written beside its equation. Symbols (DESIGN.md names): p = world_size
workers; M = 4n gradient bytes (n float32 parameters); alpha = seconds per message; B =
bandwidth, bytes/s per link and direction (full duplex); gamma = seconds per byte of reduction
(dst += src); t_comp = forward and backward of one minibatch; t_u = one SGD update; r =
compression ratio (wire bytes M/r); e, d = encode and decode seconds per float32 byte of the
codec. The figures come from a `Calibration` (timing/calibrate.py measures them).

Ring AllReduce (comm/ring.py). 2(p-1) steps; at each a rank sends one chunk of M/p bytes to its
right neighbour while receiving one from its left (full duplex: the two overlap). A step costs
alpha + M/(pB); the p-1 reduce-scatter steps also add the received chunk into the local one,
(M/p) gamma each:

    T_ar = 2(p-1) alpha + 2(p-1)/p * M/(rB) + (p-1)/p * M gamma  + codec    (1)  PAPER.md (3)

With a codec (comm/compressed.py) the wire carries M/r, and every reduce-scatter hop decodes,
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

(PAPER.md writes 2pM/B: all pulls sent at once sharing the link; methods/ps.py explains why this
server pays (p+1) M/B.) With --ps-pulls=shared the server does send them at once: all workers
have their weights after p M/B, compute together (k = p), and their p pushes queue on the
ingress wire:

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
(`ps_cpu_bound`). ps-sync moves in lock step, so its busiest core bounds it: with p = 4 on
2 cores, core 0 holds the server and workers 1 and 3,

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

Every step of a ring method waits for its slowest rank. On shared cores the ranks' steps differ
(time slices, caches): the per-step maximum over ranks is above the median (by how much:
benchmarks/RESULTS.md). So sync and pipe read t_comp_lockstep, the median over steps of the
slowest rank; the parameter server reads t_comp_shared, the median over ranks, and its core
bounds t_comp_cpu. Pipe-SGD's busy figure is its compute thread's cycle in a run of its
schedule without the optimizer (calibrate.time_busy_compute): width two gives the ranks a step
of slack, so the slowest rank of each step overstates it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

from pipesgd_ref.units import format_bandwidth, format_bytes, format_seconds

ALGOS = ("ps-sync", "ps-async", "sync", "pipe")
# The runs of `pipesgd compare`, in its table's order: (algo, codec).
COMPARE_RUNS = (
    ("ps-sync", "none"),
    ("ps-async", "none"),
    ("sync", "none"),
    ("pipe", "none"),
    ("pipe", "trunc16"),
    ("pipe", "q8"),
)


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
    # rank. On shared cores the ranks' steps differ (time slices, caches), so this is above
    # t_comp_shared (by how much: benchmarks/RESULTS.md). Empty: t_comp_shared.
    t_comp_lockstep: tuple = ()
    # The same launches, the CPU time of one step (the thread's own, median over ranks and
    # steps): what a step costs the core it runs on. Not the wall time over the sharing: with
    # k > cores two processes take turns on a core, one finishes first, and the median wall
    # time is below twice the CPU time. Each step costs more CPU when processes share a core
    # (caches; benchmarks/RESULTS.md). Empty: t_comp_shared at k = cores, where every core
    # runs one process.
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


# --- the terms every method uses -------------------------------------------------------------


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
    # Eq. (1): 2(p-1) hops, each a chunk of M/(pr) bytes on the wire, and p-1 reductions
    hops = 2 * (p - 1) * alpha
    wire = 2 * (p - 1) / p * nbytes / (ratio * bandwidth)
    reduce = (p - 1) / p * nbytes * gamma
    # Eq. (2): every hop's encode/decode, and the owner's own round trip through the codec
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
    not worker 0. Eq. (10) of the module docstring."""
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
    of a step with p workers sharing the cores (`step_cpu`). Eq. (11) of the module
    docstring: the busiest core's chain bounds the round; the sum and the cpu bound count
    neither the wait nor the last push (how far short they fell: benchmarks/RESULTS.md)."""
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


def ring_terms(world_size: int, cal: Calibration, codec: str, alpha: float):
    """(t_comp, T_ar, cpu bound) of a ring method (sync, pipe) with `alpha` per hop: all p
    workers compute at once and each step waits for the slowest (t_comp_lockstep); the link is
    the emulated one or, if less, what the machine itself moves with all p ranks streaming at
    once on C cores."""
    p, M, C = world_size, cal.grad_bytes, cal.cores
    r, e, d = cal.codec(codec)
    B = min(cal.bandwidth, cal.loop_bandwidth * min(1.0, C / p))
    tc = compute_time(cal, p, lockstep=True)
    t_ar = ring_allreduce_time(p, M, alpha, B, cal.gamma, r, e, d)  # Eq. (1), (2)
    moved = 2 * 2 * (p - 1) / p * M / r  # bytes sent + received per AllReduce
    # Eq. (9): the CPU part of T_ar (reductions, codec) and the copies of every byte moved
    cpu_comm = moved * cal.copy + (t_ar - 2 * (p - 1) * alpha - 2 * (p - 1) / p * M / (r * B))
    cpu = tc + p * (cal.t_update + cpu_comm) / C  # Eq. (9): all CPU work of p workers on C cores
    return tc, t_ar, cpu


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


def compensation_passes(compensation: str, width: int = 2) -> int:
    """Elementwise passes over the n parameters that --compensation adds to each step of
    Pipe-SGD of width K (s = K - 1; methods/compensation.py): dc, the copy of w_t and
    w - w_then, two products, the scale, the sum: 6; dc-adaptive 6 more for the mean square
    and the elementwise lam; predict, the copies of w and of g_t and two passes (product,
    subtraction) per step in flight: 2 + 2 s."""
    s = width - 1
    return {"none": 0, "dc": 6, "dc-adaptive": 12, "predict": 2 + 2 * s}[compensation]


def pipe(
    world_size: int, cal: Calibration, codec: str = "none", width: int = 2,
    compensation: str = "none",
) -> Prediction:  # fmt: skip
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
    bound = max(bounds, key=bounds.get)
    it = bounds[bound]
    hidden = min(t_ar, tc + tu)
    return Prediction("pipe", codec, world_size, width, it, tc + tu, t_ar, hidden, bound)


def ps_sync(
    world_size: int, cal: Calibration, codec: str = "none", ps_pulls: str = "sequential"
) -> Prediction:
    """The synchronous parameter server: the round of Eq. (5) (pulls sent one after another)
    or Eq. (6) (`ps_pulls` "shared": all at once), and on shared cores the busiest core's CPU
    work (Eq. 10, `ps_cpu_bound`) and the chain through a core (Eq. 11,
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
        (ps_cpu_bound("ps-sync", p, cal, codec), "cpu"),  # Eq. (10)
        (ps_sync_core_bound(p, cal, codec, ps_pulls), "core"),  # Eq. (11)
    )
    return Prediction("ps-sync", codec, p, 1, it, tc, comm, 0.0, bound)


def ps_async(world_size: int, cal: Calibration, codec: str = "none") -> Prediction:
    """The asynchronous parameter server: worker 0's cycle or the server's link (Eq. 7), its
    computation shared with the workers on its core (Eq. 8), and on shared cores that core's
    CPU work (`ps_cpu_bound`)."""
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

    tc = _fixed_point(own_core, cal.t_comp)
    cycle = tc + comm + tu + M * d  # Eq. (7): worker 0's cycle
    server = p * M / B  # Eq. (7): the server's link, B/M pulls per second for p workers
    it, bound = max(
        (cycle, "worker"),
        (server, "server"),
        (ps_cpu_bound("ps-async", p, cal, codec), "cpu"),  # worker 0's core
    )
    return Prediction("ps-async", codec, p, 1, it, tc, comm, 0.0, bound)


def predict(
    algo: str,
    world_size: int,
    cal: Calibration,
    codec: str = "none",
    width: int = 2,
    ps_pulls: str = "sequential",
    compensation: str = "none",
) -> Prediction:
    """The predicted iteration time of `algo` on p = world_size workers (a Prediction), from
    its method's function. `width`: Pipe-SGD's K; `ps_pulls`: how ps-sync's server sends its
    pulls (methods/ps.py): "sequential" or "shared"; `compensation`: Pipe-SGD's."""
    if algo == "sync":
        return sync(world_size, cal, codec)
    if algo == "pipe":
        return pipe(world_size, cal, codec, width, compensation)
    if algo == "ps-sync":
        return ps_sync(world_size, cal, codec, ps_pulls)
    if algo == "ps-async":
        return ps_async(world_size, cal, codec)
    raise ValueError(f"unknown algo {algo!r}; choose one of {', '.join(ALGOS)}")


def predict_all(
    world_size: int,
    cal: Calibration,
    runs=COMPARE_RUNS,
    width: int = 2,
    ps_pulls: str = "sequential",
    compensation: str = "none",
):
    """Predictions for every (algo, codec) of `runs`, keyed by run_label (`compensation`:
    Pipe-SGD's runs')."""
    return {
        run_label(algo, codec): predict(
            algo, world_size, cal, codec, width, ps_pulls, compensation
        )  # fmt: skip
        for algo, codec in runs
    }


# --- reading the figures ----------------------------------------------------------------------


def describe(cal: Calibration) -> str:
    """One paragraph of the calibrated figures, in the units people read."""
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
