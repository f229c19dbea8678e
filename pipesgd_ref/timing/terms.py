"""The terms every method's prediction uses: the ring's T_ar, compute on shared cores, CPU bounds.

Equation numbers are those of timing/iteration.py's docstring, where each is derived; the
method functions there combine these terms. Symbols: p workers, M = 4n gradient bytes, alpha,
B, gamma, copy, C cores, a codec's r, e, d (figures.py: `Calibration`).
"""

from __future__ import annotations

import math

from pipesgd_ref.comm import algorithms, choose
from pipesgd_ref.timing.figures import Calibration


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
    """T_ar, Eq. (1) and (2): 2(p-1) alpha + 2(p-1)/p M/(rB) + (p-1)/p M gamma + codec."""
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
    return fixed_point(lambda t: compute_time(cal, concurrency(t)), cal.t_comp)


def workers_on_timed_core(p: int, cores: int) -> int:
    """Workers of a parameter-server job on the core of worker 0, whose steps are timed: rank 0
    is the server and rank r the worker r - 1, pinned to core r mod cores (jobenv.pin_to_core).
    1 where the cores are not shared."""
    if cores >= p + 1:
        return 1
    return sum(1 for rank in range(1, p + 1) if rank % cores == 1 % cores)


def fixed_point(fn, t: float) -> float:
    """t = fn(t) by damped iteration (fn grows with t, boundedly: it converges; damped because
    the map can overshoot where a concurrency jumps)."""
    for _ in range(100):
        t_new = fn(t)
        if abs(t_new - t) < 1e-9:
            return t_new
        t = 0.5 * (t + t_new)
    return t


def ps_sync_cpu_bound(world_size: int, cal: Calibration, codec: str = "none") -> float:
    """ps-sync's CPU bound, Eq. (10): the busiest core's work per round, on C < p + 1 shared
    cores (0 where every process has a core of its own). ps-sync moves in lock step (the server
    waits for every push, every worker for its pull), so the busiest core bounds it: the
    server's core 0 with the workers pinned there. The server updates once a round."""
    p = world_size
    if cal.cores >= p + 1:
        return 0.0
    server = p * ps_push_work(cal, codec) + cal.t_update
    return max(_ps_core_loads(p, cal, codec, server))


def ps_async_cpu_bound(world_size: int, cal: Calibration, codec: str = "none") -> float:
    """ps-async's CPU bound: the work per iteration on worker 0's core (rank 1's), on C < p + 1
    shared cores (0 where every process has a core of its own). Its workers do not wait for each
    other, and its iteration is worker 0's: that core's workers go at one rate, the server
    counts only where it shares that core (C = 1); the server's own core slows the workers
    there, not worker 0. The server updates once a push."""
    p = world_size
    if cal.cores >= p + 1:
        return 0.0
    server = p * (ps_push_work(cal, codec) + cal.t_update)
    return _ps_core_loads(p, cal, codec, server)[1 % cal.cores]


def ps_push_work(cal: Calibration, codec: str) -> float:
    """The server's CPU work on one push: the push in and the pull out through its sockets,
    (M/r + M) copy, then decoding and adding it, M (d + gamma)."""
    M = cal.grad_bytes
    r, e, d = cal.codec(codec)
    return (M / r + M) * cal.copy + M * (d + cal.gamma)


def _ps_core_loads(world_size: int, cal: Calibration, codec: str, server: float) -> list[float]:
    """The CPU work per iteration on each core of a parameter-server job whose p + 1 processes
    share C cores, pinned rank r to core r mod C: the server's (`server`) on core 0, and each
    worker's (`ps_worker_step`: one computation with every core busy, encoding its push, the
    socket path's CPU for the push out and the pull in)."""
    load = [0.0] * cal.cores
    load[0] = server
    worker = ps_worker_step(cal, world_size, codec)
    for rank in range(1, world_size + 1):
        load[rank % cal.cores] += worker
    return load


# Method name -> its CPU bound on shared cores.
PS_CPU_BOUNDS = {"ps-sync": ps_sync_cpu_bound, "ps-async": ps_async_cpu_bound}


def ps_cpu_bound(algo: str, world_size: int, cal: Calibration, codec: str = "none") -> float:
    """The CPU work per iteration on the core that bounds a parameter-server job (`algo`
    ps-sync or ps-async) whose p + 1 processes share C < p + 1 cores: no schedule finishes an
    iteration sooner. 0 where every process has a core of its own."""
    if algo not in PS_CPU_BOUNDS:
        raise ValueError(f"ps_cpu_bound is for the parameter server, not {algo!r}")
    return PS_CPU_BOUNDS[algo](world_size, cal, codec)


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
    of a step with p workers sharing the cores (`step_cpu`). Eq. (11): the busiest core's
    chain bounds the round; the sum and the cpu bound count
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


def ring_bandwidth(world_size: int, cal: Calibration) -> float:
    """B of a ring method's links: the emulated one or, if less, what the machine itself moves
    with all p ranks streaming at once on C cores."""
    return min(cal.bandwidth, cal.loop_bandwidth * min(1.0, cal.cores / world_size))


def allreduce_algorithm(world_size: int, cal: Calibration, codec: str, nbytes: float) -> str:
    """The algorithm the workers run for a message of nbytes: the job's (`cal.allreduce`), and
    under auto the one comm/choose.py picks from the same inputs the workers have (the fitted
    figures, the transport, the emulated link), so the model costs what runs. A codec rides
    the compressed ring."""
    if codec != "none" or world_size <= 1 or cal.allreduce != "auto":
        return "ring" if codec != "none" or world_size <= 1 else cal.allreduce
    emulated = cal.latency > 0 or cal.bandwidth != math.inf
    names = choose.candidates(cal.transport == "shm" and not emulated)
    figures = choose.fitted(cal.transport)
    return choose.pick(names, world_size, int(nbytes), figures, cal.latency, cal.bandwidth)


def ring_time(world_size: int, cal: Calibration, codec: str, nbytes: float, alpha: float) -> float:
    """T_ar, Eq. (1) and (2), of `nbytes` on a ring method's links (`ring_bandwidth`) with
    `alpha` per hop: the whole gradient's for sync and pipe, one bucket's for ddp (Eq. 12).
    Another algorithm (`allreduce_algorithm`) is costed by its own model: rd and rab by their
    alpha-beta formulas on the same alpha, B and gamma (comm/algorithms.py), the shared-memory
    group by its fitted model (comm/choose.py)."""
    r, e, d = cal.codec(codec)
    B = ring_bandwidth(world_size, cal)
    algo = allreduce_algorithm(world_size, cal, codec, nbytes)
    if algo in ("rd", "rab"):
        return algorithms.cost(algo, world_size, nbytes, alpha, B, cal.gamma)
    if algo in ("oneshot", "twoshot"):
        figures = choose.fitted(cal.transport)
        if algo in figures:
            return choose.model_time(algo, world_size, int(nbytes), *figures[algo])
    return ring_allreduce_time(world_size, nbytes, alpha, B, cal.gamma, r, e, d)


def ring_cpu(world_size: int, cal: Calibration, codec: str, nbytes: float) -> float:
    """The CPU time a ring AllReduce of `nbytes` costs each rank, Eq. (9)'s cpu_comm: the
    socket path's copy of every byte sent and received, 2 * 2(p-1)/p * b/r * copy, and the
    CPU part of T_ar (the reductions, the codec)."""
    p = world_size
    if p <= 1:
        return 0.0
    r, _, _ = cal.codec(codec)
    moved = 2 * 2 * (p - 1) / p * nbytes / r  # bytes sent + received per AllReduce
    cpu_part = ring_allreduce_time(p, nbytes, 0.0, math.inf, cal.gamma, *cal.codec(codec))
    return moved * cal.copy + cpu_part


def ring_terms(world_size: int, cal: Calibration, codec: str, alpha: float):
    """(t_comp, T_ar, cpu bound) of a ring method (sync, pipe) with `alpha` per hop: all p
    workers compute at once and each step waits for the slowest (t_comp_lockstep); the link is
    `ring_bandwidth`'s."""
    p, M, C = world_size, cal.grad_bytes, cal.cores
    tc = compute_time(cal, p, lockstep=True)
    t_ar = ring_time(p, cal, codec, M, alpha)  # Eq. (1), (2)
    # Eq. (9): the CPU part of T_ar (reductions, codec) and the copies of every byte moved
    cpu_comm = ring_cpu(p, cal, codec, M)
    cpu = tc + p * (cal.t_update + cpu_comm) / C  # Eq. (9): all CPU work of p workers on C cores
    return tc, t_ar, cpu


def compensation_passes(compensation: str, width: int = 2) -> int:
    """Elementwise passes over the n parameters that --compensation adds to each step of
    Pipe-SGD of width K (s = K - 1; methods/compensation.py): dc, the copy of w_t and
    w - w_then, two products, the scale, the sum: 6; dc-adaptive 6 more for the mean square
    and the elementwise lam; predict, the copies of w and of g_t and two passes (product,
    subtraction) per step in flight: 2 + 2 s."""
    s = width - 1
    return {"none": 0, "dc": 6, "dc-adaptive": 12, "predict": 2 + 2 * s}[compensation]
