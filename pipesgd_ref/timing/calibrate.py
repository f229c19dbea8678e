"""Calibration: the figures of the timing models (timing/models.py), measured on this machine.

`calibrate(cfg)` measures every figure a `Calibration` holds for cfg's model, batch size,
world size and link:

- t_comp and t_u are timed on the actual model and batch size in this process (`time_compute`);
  t_comp with k = 1..p pinned worker processes computing at once (`time_shared_compute`: the
  median, the slowest rank of each step, the CPU time of a step), and, for Pipe-SGD, p workers
  computing while pipe's own communication thread AllReduces a gradient per step
  (`time_busy_compute`).
- gamma and the codecs' e and d are timed on gradient-sized arrays (`time_gamma_and_copy`,
  `time_codecs`).
- alpha is the emulated link's latency plus the software cost of one hop, measured by a ring
  AllReduce among p local processes on the run's own link with a gradient chunk per hop
  (`measure_hop`: a ping-pong round the ring; on an emulated link the receiver then sleeps
  until the emulated arrival and must be woken, as in a real step).
- B is the emulated link's; the bandwidth of a streaming test between two processes
  (`p2p_figures`, `network_figures`) caps an emulated bandwidth set above what loopback can
  move, and `copy` is the CPU time the sending and the receiving thread of that stream spent
  per byte.

The shared and busy compute figures are the fastest of two launches, of three when they
disagree (`best_of`): on a shared machine a burst of other load only ever slows a launch down.
Calibrations of the same setup made minutes apart merge figure by figure into their median
(`merged_calibration`); `calibrations_disagree` and `merge_passes` are the accuracy grid's
(benchmarks/timing_model_accuracy.py) rules for when to calibrate again and how a point's
passes combine. benchmarks/RESULTS.md records what these choices did to the models' error.

Everything here launches processes or times this one; the models themselves
(timing/models.py) import nothing of it.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import replace

import numpy as np

from pipesgd_ref.codecs import get_codec
from pipesgd_ref.comm.ring import allreduce, barrier
from pipesgd_ref.comm.transport import Frame, Kind
from pipesgd_ref.commands.train import load_before_fork
from pipesgd_ref.config import link_model
from pipesgd_ref.methods.pipe import CommThread
from pipesgd_ref.runtime.launch import launch_local
from pipesgd_ref.runtime.worker import Worker
from pipesgd_ref.timing.models import COMPARE_RUNS, Calibration, Prediction, describe, predict
from pipesgd_ref.trace import Timeline

CALIBRATION_REPS = 12  # timed steps per process when timing compute shared by several workers


# --- timing in this process ----------------------------------------------------------------------


def median_time(fn, reps: int, warmup: int = 2) -> float:
    """The median seconds of `reps` calls of fn(), after `warmup` untimed ones."""
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
    w = Worker.build(cfg.replace(resume=""), 0, cfg.world_size)
    grads = np.empty_like(w.params)
    step = iter(range(10**9))
    with _one_blas_thread():  # as in a worker (launch.pin_to_core): one core, one BLAS thread
        t_comp = median_time(lambda: w.loss_and_grad(next(step), grads), reps)
        params = w.params.copy()
        t_update = median_time(lambda: w.model.backend.sgd_step(params, grads, 1e-12), reps)
    return w.model.n_params, t_comp, t_update


def _one_blas_thread():
    try:
        from threadpoolctl import threadpool_limits

        return threadpool_limits(1)
    except ImportError:  # without threadpoolctl, BLAS decides (as in the workers)
        from contextlib import nullcontext

        return nullcontext()


def time_gamma_and_copy(n: int, reps: int = 5) -> tuple[float, float]:
    """(gamma, copy) in s per byte: dst += src, and a memory copy (a socket moves every byte
    through at least one copy on each side)."""
    a = np.ones(max(n, 1024), np.float32)
    b = np.ones_like(a)
    gamma = median_time(lambda: np.add(a, b, out=a), reps) / a.nbytes
    copy = median_time(lambda: np.copyto(a, b), reps) / a.nbytes
    return gamma, copy


def time_codecs(n: int, backend: str = "numpy", names=("trunc16", "bf16", "q8"), reps: int = 5):
    """{codec: (r, encode s/byte, decode-add s/byte)} on an n-element gradient."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n).astype(np.float32)
    acc = np.zeros_like(x)
    out = {}
    for name in names:
        codec = get_codec(name, backend)
        codes = np.empty(codec.wire_bytes(n), np.uint8)
        e = median_time(lambda c=codec, b=codes: c.encode(x, b), reps) / (4 * n)
        d = median_time(lambda c=codec, b=codes: c.add_decoded_into(b, acc), reps) / (4 * n)
        out[name] = (4 * n / codec.wire_bytes(n), e, d)
    return out


# --- compute in worker processes -----------------------------------------------------------------


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


def _compute_job(comm, cfg, reps: int) -> tuple[list[float], list[float]]:
    """(wall times, CPU times) of `reps` steps of this rank, every step started together."""
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


def time_shared_compute(
    cfg, max_k: int, reps: int = CALIBRATION_REPS, tries: int = CALIBRATION_TRIES
) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
    """(t_comp_shared, t_comp_lockstep, t_comp_cpu): t_comp with k = 1..max_k worker processes
    computing at once, pinned as the workers are (launch.pin_to_core), every step started
    together: for each k, the median over ranks and steps, the median over steps of the
    slowest rank, and the median CPU time of a step; each the fastest over `tries` launches,
    or one more when they disagree (best_of)."""
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


HOP_STEPS = 3  # steps of the busy compute measurement that also time a ring hop


def _busy_compute_job(comm, cfg, reps: int, hop_bytes: int = 4) -> tuple[list[float], float]:
    """Pipe-SGD's schedule without the optimizer: step t hands a gradient-sized buffer to pipe's
    communication thread (methods/pipe.py: one ring AllReduce, the run's codec and link) and
    computes the next gradient meanwhile, then waits for that AllReduce. Returns the compute
    thread's cycles (computing and that wait: step t + 1 of a rank starts once the AllReduce of
    the gradient before step t is done everywhere, as in pipe.py, one step of slack between the
    ranks) and the median hop."""
    w = Worker.build(cfg.replace(resume=""), comm.rank, comm.world_size)
    grads = np.empty_like(w.params)
    w.loss_and_grad(0, grads)
    traffic = np.ones_like(w.params)  # what the comm thread reduces while grads is computed

    tiny = np.zeros(comm.world_size * hop_bytes // 4, np.float32)
    serialize = hop_bytes / link_model(cfg).bandwidth  # the emulated wire's share of a hop
    hops: list[float] = []

    # The last HOP_STEPS steps also time a ping-pong round the ring; their extra traffic
    # would slow the computation, so their compute times are left out.
    hop_steps = min(HOP_STEPS, reps)

    def ping_pong(step: int) -> None:
        """In the comm thread, after step's AllReduce: a ping-pong round the ring, twice (the
        first waits for the slowest rank, the second times 2(p-1) hops while the computations
        go on: latency and software; its bytes' serialization is taken out)."""
        if step <= reps - hop_steps:
            return
        allreduce(comm, tiny)
        start = time.perf_counter()
        allreduce(comm, tiny)
        hop = (time.perf_counter() - start) / (2 * (comm.world_size - 1))
        hops.append(max(0.0, hop - serialize))

    barrier(comm)
    comm_thread = CommThread(comm, Timeline(comm.rank), w, w.codec(), after=ping_pong)
    cycles = []
    try:
        for step in range(1, reps + 1):
            comm_thread.start_allreduce(step, traffic)  # the previous gradient's AllReduce
            start = time.perf_counter()
            w.loss_and_grad(step, grads)
            comm_thread.wait(step)  # width two: one AllReduce in flight
            cycles.append(time.perf_counter() - start)
    finally:
        comm_thread.stop()
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


# --- the link: a ring hop, and point to point ----------------------------------------------------


HOP_BYTES = 256 << 10  # per-hop message of the hop measurement on an emulated link (at most)


def hop_message_bytes(cal_bytes: int, world_size: int, emulated: bool) -> int:
    """Bytes per hop of the message `measure_hop` sends: on an emulated link a gradient chunk
    (M/p, at most HOP_BYTES), large enough that the receiver sleeps until the emulated arrival
    and must be woken, as in a real step; unemulated, one float (the wire term is modelled on
    its own there, from the stream)."""
    if not emulated or world_size < 2:
        return 4
    return int(max(4, min(HOP_BYTES, cal_bytes // world_size)) // 4 * 4)


def hop_job(comm, n: int, reps: int) -> float:
    x = np.ones(n, np.float32)
    barrier(comm)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        allreduce(comm, x)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_hop(world_size: int, model=None, hop_bytes: int = 4, reps: int | None = None) -> float:
    """Software cost of one ring hop among `world_size` local processes: a ring AllReduce of
    `hop_bytes` per hop (a ping-pong round the ring, 2(p-1) hops) on the link `model` (None:
    not emulated), less the link's own latency + bytes/B, divided by its hop count. What is
    left is what the alpha-beta model calls software: waking the receiver (from the socket, or
    from the sleep until an emulated arrival), frames, the sending thread, Python."""
    if world_size < 2:
        return 0.0
    hops = 2 * (world_size - 1)
    latency, bandwidth = (model.latency, model.bandwidth) if model is not None else (0.0, math.inf)
    wire = latency + hop_bytes / bandwidth
    if reps is None:  # about a second of emulated wire time, 5..50 reps
        reps = int(min(50, max(5, 1.0 / max(hops * wire, 1e-9))))
    n = world_size * hop_bytes // 4
    per_rank = launch_local(world_size, hop_job, (n, reps), start_method="fork", model=model)
    return max(0.0, max(per_rank) / hops - wire)


def p2p_job(comm, nbytes: int, reps: int) -> dict:
    """Rank 0 streams `nbytes` to rank 1 `reps` times, each rep timed on its own after a
    barrier, with the CPU time the sending and the receiving thread spent on it (bandwidth and
    the socket path's CPU cost per byte); then 200 one-byte ping-pongs (latency). Uses the ring
    links directly: right of 0 is 1, left of 0 is 1."""
    buf = np.zeros(nbytes, np.uint8)
    small = np.zeros(1, np.uint8)
    frame = Frame(kind=Kind.DATA)
    times, cpu = [], []
    for _ in range(reps):
        barrier(comm)
        cpu_start, start = time.thread_time(), time.perf_counter()
        if comm.rank == 0:
            comm.right.send(frame, memoryview(buf))
        else:
            got = comm.left.recv_header("p2p")
            comm.left.recv_payload_into(got, memoryview(buf), "p2p")
        times.append(time.perf_counter() - start)
        cpu.append(time.thread_time() - cpu_start)
    barrier(comm)
    pings = 200
    start = time.perf_counter()
    for _ in range(pings):
        if comm.rank == 0:
            comm.right.send(frame, memoryview(small))
            got = comm.left.recv_header("pong")
            comm.left.recv_payload_into(got, memoryview(small), "pong")
        else:
            got = comm.left.recv_header("ping")
            comm.left.recv_payload_into(got, memoryview(small), "ping")
            comm.right.send(frame, memoryview(small))
    rtt = (time.perf_counter() - start) / pings
    return {"times": times, "cpu": cpu, "one_way": rtt / 2}


def p2p_figures(nbytes: int = 16 << 20, reps: int = 8) -> dict:
    """Two local processes over TCP: {"bandwidth": bytes/s of the median rep, as the receiver
    saw it (the fastest is an outlier on a shared machine); "latency": one-way s; "cpu_send",
    "cpu_recv": CPU s per byte of the sending and the receiving thread (median over reps:
    kernel copies and TCP, what every byte costs the cores whatever the link)}."""
    send, recv = launch_local(2, p2p_job, (nbytes, reps), start_method="fork")
    return p2p_summary(send, recv, nbytes)


def p2p_summary(send: dict, recv: dict, nbytes: int) -> dict:
    """p2p_job's two results (the sender's, the receiver's) as p2p_figures' dict: over any
    wire the ring's links run on (compare_mpi.py streams over MPI)."""
    return {
        "bandwidth": nbytes / statistics.median(recv["times"]),
        "latency": send["one_way"],
        "cpu_send": statistics.median(send["cpu"]) / nbytes,
        "cpu_recv": statistics.median(recv["cpu"]) / nbytes,
    }


def measure_p2p(nbytes: int = 16 << 20, reps: int = 8) -> tuple[float, float]:
    """(bandwidth bytes/s, one-way latency s) between two local processes over TCP."""
    got = p2p_figures(nbytes, reps)
    return got["bandwidth"], got["latency"]


def measure_gamma(nbytes: int = 16 << 20, reps: int = 5) -> float:
    """Seconds per byte of the reduction step (dst += src, float32) on this machine."""
    a = np.ones(nbytes // 4, np.float32)
    b = np.ones_like(a)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        np.add(b, a, out=a)
        times.append(time.perf_counter() - start)
    return min(times) / nbytes


def cluster_calibration(cfg) -> Calibration:
    """The figures of p workers on a cluster, each its own machine of one core, on cfg's link:
    t_comp and t_u of cfg's model and batch timed in this process, gamma and the copy cost on
    the gradient (at most 4 MB of it: past the caches a per-byte cost no longer changes), alpha
    and B the link's. Starts no process (`pipesgd compare --study`, tutorial 11)."""
    n, t_comp, t_update = time_compute(cfg)
    gamma, copy = time_gamma_and_copy(min(n, 1 << 20))
    link = link_model(cfg)
    return Calibration(n_params=n, t_comp=t_comp, t_update=t_update, alpha=link.latency,
                       bandwidth=link.bandwidth, gamma=gamma, copy=copy,
                       cores=cfg.world_size)  # fmt: skip


def network_figures(nbytes: int = 16 << 20, reps: int = 6) -> dict:
    """{"stream": bytes/s, "copy": CPU s per byte}: what two local processes stream over
    loopback TCP (the median rep), and the CPU time each byte costs a side (the mean of the
    sender's and the receiver's, the median over reps). Machine figures: measure once."""
    return stream_and_copy(p2p_figures(nbytes, reps))


def stream_and_copy(p2p: dict) -> dict:
    """{"stream", "copy"} of network_figures from p2p_figures' (or p2p_summary's) dict."""
    return {"stream": p2p["bandwidth"], "copy": (p2p["cpu_send"] + p2p["cpu_recv"]) / 2}


# --- the whole calibration -----------------------------------------------------------------------


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


# --- merging calibrations made minutes apart -----------------------------------------------------


# A block whose calibrations predict some method's iteration further apart than this (slowest
# over fastest) gets one more calibration, and its merge is the median of three.
CAL_SPREAD = 1.10


def merged_calibration(cals: list[Calibration]) -> Calibration:
    """Calibrations of the same (model, batch, world size, link) made minutes apart, merged
    figure by figure into their median (the mean of two).

    Why the median and not the fastest: the runs a calibration predicts are measured as the
    fastest of their passes, one run each; every compute figure of one calibration is already
    the fastest of two launches (best_of), the same statistic. The fastest over the passes as
    well would be the fastest of four against runs that are the fastest of two: predictions
    biased fast (benchmarks/RESULTS.md: the accuracy grid's bias with either merge). A
    busy-compute or codec figure that only some
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


def calibrations_disagree(
    cals: list[Calibration], world_size: int, width: int, spread: float = CAL_SPREAD
) -> bool:
    """Whether a block's calibrations (two or more) predict the iteration of some method of
    the grid more than `spread` apart, the slowest prediction over the fastest: one of them
    then likely ran in a slow stretch of the machine, and the median of two (their mean) would
    carry half of it into every prediction of the block."""
    if len(cals) < 2:
        return False
    for algo, codec in COMPARE_RUNS:
        times = [predict(algo, world_size, c, codec, width).iter_time_s for c in cals]
        if max(times) > spread * min(times):
            return True
    return False


def against(pred: Prediction, measured_s: float) -> dict:
    """A point's prediction beside its measured iteration: the fields a row keeps of it."""
    return {
        "predicted_s": pred.iter_time_s,
        "error": (pred.iter_time_s - measured_s) / measured_s,
        "bound": pred.bound,
        "prediction": pred.to_dict(),
    }


def merge_passes(runs: list[dict], cal: Calibration, width: int) -> dict:
    """One point's rows, one a pass, merged: the fastest measured run of them all against the
    prediction from `cal` (the block's calibrations merged by merged_calibration).
    With one pass, the row as it was. Failed only when every pass failed."""
    if len(runs) == 1:
        return runs[0]
    done = [r for r in runs if not r.get("failed")]
    if not done:
        return runs[-1]
    best = min(done, key=lambda r: r["measured_s"])
    pred = predict(best["algo"], best["world_size"], cal, best["codec"], width)
    return {
        **best,
        "measured_all_s": [t for r in done for t in r["measured_all_s"]],
        **against(pred, best["measured_s"]),
        "passes": [
            {k: r.get(k) for k in ("measured_s", "predicted_s", "error", "failed")} for r in runs
        ],
    }
