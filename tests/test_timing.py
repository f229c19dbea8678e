"""timing/iteration.py and terms.py against hand-computed values, and their properties.

The hand-computed cases use one textbook calibration: M = 4e6 bytes (n = 1e6 float32), alpha =
1 ms, B = 1e8 bytes/s (800 Mbit/s), t_comp = 50 ms, t_u = 2 ms, gamma = copy = 0, and cores
so many (10**6) that no two workers ever share one: the formulas of docs/paper.md, section 3,
then hold term by term, and each test writes the arithmetic out. Core sharing has tests of its
own at the end. One smoke test calibrates on this machine (it launches two processes).
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipesgd_ref import timing
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.timing import (
    COMPARE_RUNS,
    Calibration,
    compute_time,
    predict,
    predict_all,
    ring_allreduce_time,
    shared_compute,
    speedups,
    sweep_values,
)
from pipesgd_ref.timing.calibrate import calibrate
from pipesgd_ref.timing.merge import calibrations_disagree, merge_passes, merged_calibration
from pipesgd_ref.timing.sharing import best_of, step_statistics, steps_spanning
from pipesgd_ref.units import parse_size
from strategies import calibrations, log_uniform, timing_world_sizes

MANY = 10**6  # cores: every worker has its own, the textbook formulas

M = 4e6  # bytes
ALPHA = 1e-3  # s
B = 1e8  # bytes/s
T_COMP = 0.05  # s
T_U = 0.002  # s


def textbook(**changes) -> Calibration:
    base = dict(
        n_params=1_000_000,
        t_comp=T_COMP,
        t_update=T_U,
        alpha=ALPHA,
        bandwidth=B,
        gamma=0.0,
        copy=0.0,
        cores=MANY,
        codecs={"trunc16": (2.0, 1e-9, 2e-9), "q8": (4.0, 2e-9, 1e-9)},
    )
    return Calibration(**{**base, **changes})


def close(got: float, want: float, what: str, rel: float = 1e-9) -> None:
    assert got == pytest.approx(want, rel=rel, abs=1e-15), (
        f"{what}: expected {want!r}, got {got!r} (difference {got - want:.3g})"
    )


# --- ring AllReduce ---------------------------------------------------------------------------


def test_ring_allreduce_by_hand():
    # p = 4: 2(p-1) = 6 hops of alpha, and 2(p-1)/p = 1.5 gradients over the wire:
    # T_ar = 6 * 1e-3 + 1.5 * 4e6 / 1e8 = 0.006 + 0.06 = 0.066 s
    close(ring_allreduce_time(4, M, ALPHA, B), 0.066, "T_ar(p=4)")
    # + the reduction: (p-1)/p M gamma = 0.75 * 4e6 * 1e-10 = 3e-4 s
    close(ring_allreduce_time(4, M, ALPHA, B, gamma=1e-10), 0.0663, "T_ar(p=4, gamma)")
    # p = 2: 2 hops, one gradient: 0.002 + 1.0 * 0.04 = 0.042 s
    close(ring_allreduce_time(2, M, ALPHA, B), 0.042, "T_ar(p=2)")


def test_ring_allreduce_of_one_worker_is_free():
    assert ring_allreduce_time(1, M, ALPHA, B, gamma=1e-9, ratio=2, encode=1, decode=1) == 0.0


def test_ring_codec_cost_by_hand():
    # r = 2, e = 1e-9, d = 2e-9 s/B, p = 4, no latency, no gamma:
    # wire  = 2(p-1)/p * M/(rB) = 1.5 * 4e6 / 2e8 = 0.03 s
    # codec = M (d + e) + (p-1)/p M d = 4e6 * 3e-9 + 0.75 * 4e6 * 2e-9 = 0.012 + 0.006 = 0.018 s
    got = ring_allreduce_time(4, M, 0.0, B, ratio=2.0, encode=1e-9, decode=2e-9)
    close(got, 0.03 + 0.018, "T_ar(p=4, r=2, e=1ns, d=2ns)")
    # the codec term alone: infinitely fast link
    close(ring_allreduce_time(4, M, 0.0, math.inf, 0.0, 2.0, 1e-9, 2e-9), 0.018, "codec term")


def test_ring_without_a_codec_pays_no_codec_cost():
    # ratio 1 is "none": e and d have nothing to encode
    assert ring_allreduce_time(4, M, 0.0, B, 0.0, 1.0, 1e-9, 2e-9) == ring_allreduce_time(
        4, M, 0.0, B
    )


# --- synchronous AllReduce and Pipe-SGD --------------------------------------------------------


def test_sync_by_hand():
    # T_sync = t_comp + T_ar + t_u = 0.05 + 0.066 + 0.002 = 0.118 s
    pred = predict("sync", 4, textbook())
    close(pred.iter_time_s, 0.118, "T_sync")
    close(pred.compute_s, 0.052, "sync compute (t_comp + t_u)")
    close(pred.comm_s, 0.066, "sync comm (T_ar)")
    assert pred.hidden_s == 0.0 and pred.bound == "sum" and pred.width == 1


def test_pipe_width_two_network_bound_by_hand():
    # T_pipe(2) = max(t_comp + t_u, T_ar, (t_comp + t_u + T_ar) / 2)
    #           = max(0.052, 0.066, 0.059) = 0.066 s: the network sets the cycle, and all of
    #           compute (0.052 s of the 0.066 s AllReduce) hides under it
    pred = predict("pipe", 4, textbook(), width=2)
    close(pred.iter_time_s, 0.066, "T_pipe(2)")
    close(pred.hidden_s, 0.052, "hidden communication (min(T_ar, t_comp + t_u))")
    assert pred.bound == "network" and pred.width == 2


def test_pipe_width_two_compute_bound_by_hand():
    # t_comp = 0.1: max(0.102, 0.066, 0.084) = 0.102 s, the whole AllReduce hidden
    pred = predict("pipe", 4, textbook(t_comp=0.1))
    close(pred.iter_time_s, 0.102, "T_pipe(2), compute bound")
    close(pred.hidden_s, 0.066, "hidden")
    assert pred.bound == "compute"


def test_pipe_width_one_is_sync():
    # K = 1: nothing in flight beside the current step, the sum 0.118 s
    one = predict("pipe", 4, textbook(), width=1)
    sync = predict("sync", 4, textbook())
    close(one.iter_time_s, 0.118, "T_pipe(1)")
    assert (one.iter_time_s, one.bound, one.width) == (sync.iter_time_s, "sum", 1)


def test_pipe_width_three_is_never_faster_than_two():
    # (t_comp + t_u + T_ar) / 3 = 0.0393 is below max(0.052, 0.066): the same 0.066 s cycle
    for cal in (textbook(), textbook(t_comp=0.1), textbook(bandwidth=1e10)):
        two, three = predict("pipe", 4, cal, width=2), predict("pipe", 4, cal, width=3)
        assert three.iter_time_s >= two.iter_time_s, (two, three)
        close(three.iter_time_s, two.iter_time_s, "T_pipe(3) vs T_pipe(2)")


def test_pipe_with_a_codec_by_hand():
    # q8: r = 4, e = 2e-9, d = 1e-9; T_ar = 6 alpha + 1.5 * M / (4B) + M (e + d) + 0.75 M d
    #      = 0.006 + 0.015 + 0.012 + 0.003 = 0.036 s < t_comp + t_u = 0.052: compute bound
    pred = predict("pipe", 4, textbook(), codec="q8")
    close(pred.comm_s, 0.036, "T_ar with q8")
    close(pred.iter_time_s, 0.052, "T_pipe(2) with q8")
    assert pred.bound == "compute" and pred.label == "pipe+q8"


# --- parameter server ----------------------------------------------------------------------------


def test_ps_sync_by_hand():
    # T = t_comp + 2 alpha + (p + 1) M/B + p M gamma + t_u
    #   = 0.05 + 0.002 + 5 * 0.04 + 0 + 0.002 = 0.254 s   (p = 4)
    pred = predict("ps-sync", 4, textbook())
    close(pred.iter_time_s, 0.254, "T_ps-sync")
    close(pred.comm_s, 0.202, "ps-sync comm (2 alpha + (p + 1) M/B)")
    close(pred.compute_s, T_COMP, "ps-sync compute")
    assert pred.bound == "server"


def test_ps_sync_with_gamma_and_a_codec_by_hand():
    # trunc16 (r = 2, d = 2e-9), gamma = 1e-10: the pushes shrink, the pulls do not:
    # comm   = 2 alpha + p M/B + M/(rB)      = 0.002 + 0.16 + 0.02 = 0.182
    # server = p M (gamma + d) + t_u         = 1.6e7 * 2.1e-9 + 0.002 = 0.0336 + 0.002
    # T      = 0.05 + 0.182 + 0.0356 = 0.2676 s
    pred = predict("ps-sync", 4, textbook(gamma=1e-10), codec="trunc16")
    close(pred.comm_s, 0.182, "ps-sync comm with trunc16")
    close(pred.iter_time_s, 0.2676, "T_ps-sync with trunc16, gamma")


def test_ps_sync_pays_one_more_gradient_per_worker():
    # each worker adds one pull (M/B = 0.04) and one more sum (M gamma = 4e-4) at the server
    cal = textbook(gamma=1e-10)
    step = predict("ps-sync", 5, cal).iter_time_s - predict("ps-sync", 4, cal).iter_time_s
    close(step, 0.04 + 4e-4, "T_ps-sync(5) - T_ps-sync(4)")


def test_ps_async_worker_bound_by_hand():
    # p = 2: a worker's cycle t_comp + 2 alpha + M/B (push) + M/B (pull) + t_u
    #        = 0.05 + 0.002 + 0.08 + 0.002 = 0.134 s; the server's link: p M/B = 0.08 s
    pred = predict("ps-async", 2, textbook())
    close(pred.iter_time_s, 0.134, "T_ps-async, worker bound")
    assert pred.bound == "worker"


def test_ps_async_server_bound_by_hand():
    # p = 4: the server must send p pulls of M: 4 * 0.04 = 0.16 s > the worker's 0.134 s
    pred = predict("ps-async", 4, textbook())
    close(pred.iter_time_s, 0.16, "T_ps-async, server bound")
    assert pred.bound == "server"


def test_ps_async_codec_by_hand():
    # trunc16, p = 2: push M/(rB) = 0.02, + the server's decode M d = 4e6 * 2e-9 = 0.008:
    # 0.05 + 0.002 + 0.02 + 0.04 + 0.002 + 0.008 = 0.122 s (the server link, 0.08 s, is not
    # the bound)
    pred = predict("ps-async", 2, textbook(), codec="trunc16")
    close(pred.iter_time_s, 0.122, "T_ps-async with trunc16")


# --- compute time on shared cores ----------------------------------------------------------------


def test_compute_time_without_a_table_divides_the_cores():
    cal = textbook(t_comp=0.01, cores=2)
    # k workers on 2 cores: each gets min(1, 2/k) of a core
    for k, want in ((1, 0.01), (2, 0.01), (3, 0.015), (4, 0.02), (0.5, 0.01)):
        close(compute_time(cal, k), want, f"compute_time(k={k}) on 2 cores")


def test_compute_time_interpolates_the_measured_table():
    cal = textbook(t_comp=0.01, cores=2, t_comp_shared=(0.01, 0.012, 0.02, 0.03))
    close(compute_time(cal, 1), 0.01, "k=1")
    close(compute_time(cal, 2), 0.012, "k=2: measured, not 0.01 (caches are shared too)")
    close(compute_time(cal, 2.5), 0.016, "k=2.5: halfway between 0.012 and 0.02")
    close(compute_time(cal, 4), 0.03, "k=4: the last measured point")
    close(compute_time(cal, 0.3), 0.01, "k<1 is one worker")


def test_ring_methods_wait_for_the_slowest_rank_each_step():
    """With a lock-step table, sync and pipe (every step waits for the slowest rank) read it;
    the parameter server, whose workers do not wait for each other, reads the shared one."""
    shared = (0.01, 0.012, 0.02, 0.03)
    lockstep = (0.01, 0.014, 0.024, 0.036)
    cal = textbook(t_comp=0.01, cores=2, t_comp_shared=shared, t_comp_lockstep=lockstep,
                   bandwidth=math.inf, alpha=0.0)  # fmt: skip
    close(compute_time(cal, 4, lockstep=True), 0.036, "k=4, the slowest of four")
    close(compute_time(cal, 3.5, lockstep=True), 0.03, "interpolated as the shared table")
    close(compute_time(cal, 4), 0.03, "k=4, the typical one")
    close(predict("sync", 4, cal).compute_s, 0.036 + T_U, "sync")
    close(predict("pipe", 4, cal).compute_s, 0.036 + T_U, "pipe")
    close(predict("ps-sync", 4, cal).compute_s, 0.03, "ps-sync: all four compute at once")
    without = dataclasses.replace(cal, t_comp_lockstep=())
    close(predict("sync", 4, without).compute_s, 0.03 + T_U, "no lock-step table: the shared")


def test_step_statistics_by_hand():
    """Step i of every rank together: the typical step, and the typical slowest rank."""
    per_rank = [[1.0, 5.0, 2.0, 9.0], [3.0, 1.0, 4.0], [2.0, 2.0, 2.0]]  # step 4 not shared
    typical, slowest = step_statistics(per_rank)
    assert typical == 2.0, "median of 1 5 2 3 1 4 2 2 2"
    assert slowest == 4.0, "median of the per-step maxima 3 5 4"


def test_compute_time_extrapolates_past_the_table_by_the_core_law():
    # measured up to K = 4 on 2 cores: 8 workers get half the core time 4 did
    # t(8) = t(4) * max(1, 8/2) / max(1, 4/2) = 0.03 * 4 / 2 = 0.06 s
    cal = textbook(t_comp=0.01, cores=2, t_comp_shared=(0.01, 0.012, 0.02, 0.03))
    close(compute_time(cal, 8), 0.06, "k=8 past a table of 4")
    close(compute_time(cal, 5), 0.0375, "k=5: 0.03 * 2.5 / 2")
    # on more cores than k, nothing to extrapolate: the last entry stays
    wide = textbook(t_comp=0.01, cores=16, t_comp_shared=(0.01, 0.011))
    close(compute_time(wide, 8), 0.011, "k=8 on 16 cores")


def test_shared_compute_finds_the_fixed_point():
    # 1 core, k = 1 + t/0.04 computing at once (ps-sync's pulls 40 ms apart):
    # t = 0.01 (1 + t / 0.04)  =>  t = 0.01 / (1 - 0.25) = 0.013333 s
    cal = textbook(t_comp=0.01, cores=1)
    t = shared_compute(cal, lambda t: min(4.0, 1 + t / 0.04))
    # shared_compute stops when a step moves t by < 1e-9 s: a relative 1e-6 here
    close(t, 0.01 / 0.75, "fixed point of t = t_comp (1 + t / pull)", rel=1e-6)
    assert t == pytest.approx(compute_time(cal, 1 + t / 0.04), rel=1e-6), "not a fixed point"


def test_shared_compute_is_t_comp_when_nobody_shares():
    assert shared_compute(textbook(), lambda t: 4.0) == T_COMP  # 4 workers, 10**6 cores


def test_sharing_slows_the_lock_step_methods():
    # 4 workers on 2 cores, no table: t_comp(4) = 0.05 * 4/2 = 0.1 s
    # sync: 0.1 + 0.066 + 0.002 = 0.168 s; pipe: max(0.102, 0.066, 0.084, cpu) with
    # cpu = 0.1 + 4 * (0.002 + 0) / 2 = 0.104 s: the updates of four workers queue for two cores
    cal = textbook(cores=2)
    close(predict("sync", 4, cal).iter_time_s, 0.168, "T_sync on 2 cores")
    pipe = predict("pipe", 4, cal)
    close(pipe.iter_time_s, 0.104, "T_pipe on 2 cores")
    assert pipe.bound == "cpu"


def test_cpu_bound_counts_copies_and_reductions():
    # copy = gamma = 1e-10, 2 cores: cpu_comm = 2 * 1.5 * 4e6 * 1e-10 + 0.75 * 4e6 * 1e-10
    #      = 1.2e-3 + 3e-4 = 1.5e-3; cpu = 0.1 + 4 * (0.002 + 0.0015) / 2 = 0.107 s
    pipe = predict("pipe", 4, textbook(cores=2, copy=1e-10, gamma=1e-10))
    close(pipe.iter_time_s, 0.107, "T_pipe, cpu bound with copies")


def test_sync_obeys_the_cpu_bound_too():
    # One core, unlimited link: T_ar = 0.75 M gamma = 3e-4 s, but four workers also queue four
    # updates and four AllReduces' copies on that core:
    # cpu = t_comp(4) + 4 (t_u + cpu_comm) = 0.2 + 4 * (0.01 + 1.5e-3) = 0.246 s > the sum
    # 0.2 + 3e-4 + 0.01, and pipelining cannot beat it either.
    cal = textbook(cores=1, t_update=0.01, bandwidth=math.inf, alpha=0.0, gamma=1e-10, copy=1e-10)
    sync, pipe = predict("sync", 4, cal), predict("pipe", 4, cal)
    close(sync.iter_time_s, 0.246, "T_sync, cpu bound")
    assert sync.bound == "cpu" and pipe.bound == "cpu"
    assert pipe.iter_time_s <= sync.iter_time_s


def test_ps_sync_on_one_core_shares_compute():
    # 1 core, p = 4: pulls M/B = 0.04 s apart, so k = 1 + t/0.04 workers compute at once.
    # t = 0.05 (1 + t/0.04) has no positive solution (each computation outlasts the gap between
    # pulls), so all p overlap: k = 4, t = 0.05 * 4 = 0.2 s
    pred = predict("ps-sync", 4, textbook(cores=1))
    close(pred.compute_s, 0.2, "ps-sync compute on one core, k capped at p", rel=1e-6)


def test_ps_async_on_one_core_shares_compute():
    # One core: all p = 4 workers on the timed worker's core. While it computes, each of the
    # other 3 computes a share f = t / (t + comm + t_u) of its cycle (comm = 0.082,
    # t_u = 0.002): t = 0.05 (1 + 3 f)  =>  (t - 0.05)(t + 0.084) = 0.15 t
    #   =>  t^2 - 0.116 t - 0.0042 = 0  =>  t = (0.116 + sqrt(0.116^2 + 0.0168)) / 2
    pred = predict("ps-async", 4, textbook(cores=1))
    close(pred.compute_s, (0.116 + math.sqrt(0.116**2 + 0.0168)) / 2, "ps-async, one core",
          rel=1e-6)  # fmt: skip


@pytest.mark.parametrize(
    "p, cores, m",
    [(2, 2, 1), (3, 2, 2), (4, 2, 2), (5, 2, 3), (4, 1, 4), (3, 4, 1), (8, 4, 2), (2, 64, 1)],
)
def test_workers_on_timed_core(p, cores, m):
    # rank 0 is the server, rank r worker r - 1 on core r mod cores; worker 0 is timed
    assert timing.workers_on_timed_core(p, cores) == m


def test_ps_cpu_bound_by_hand():
    """p = 4 workers and the server on 2 cores, rank r pinned to core r mod 2: core 0 holds the
    server and workers 1 and 3 (ranks 2 and 4), core 1 workers 0 and 2. M = 4 MB, copy = gamma
    = 0.1 ns/B: a worker's iteration is one computation with both cores busy (12 ms) and 8 MB
    through its sockets (0.8 ms); the server's, per push, 8 MB through its sockets and 4 MB
    added (1.2 ms), and an update (2 ms) per round (sync) or per push (async)."""
    cal = textbook(cores=2, copy=1e-10, gamma=1e-10, t_comp_shared=(0.01, 0.012, 0.02, 0.03))
    # ps-sync in lock step: the busiest core, the server's
    close(timing.ps_cpu_bound("ps-sync", 4, cal), 2 * 0.0128 + 4 * 0.0012 + 0.002, "sync")
    # ps-async: worker 0's core, whose two workers go at one rate; the server is elsewhere
    close(timing.ps_cpu_bound("ps-async", 4, cal), 2 * 0.0128, "async, p = 4")
    close(timing.ps_cpu_bound("ps-async", 3, cal), 2 * 0.0128, "async, p = 3")
    close(timing.ps_cpu_bound("ps-sync", 3, cal), 2 * 0.0128, "sync, p = 3: core 1 is busier")
    # one core: everything on it, the server's p pushes and updates too
    one = dataclasses.replace(cal, cores=1)
    close(timing.ps_cpu_bound("ps-async", 2, one), 2 * (0.01 + 8e6 * 1e-10) + 2 * 0.0032, "C=1")
    # with a codec the push is M/r and costs encoding and decoding: trunc16 r=2 e=1 d=2 ns/B
    got = timing.ps_cpu_bound("ps-sync", 4, cal, "trunc16")
    worker = 0.012 + 4e6 * 1e-9 + 6e6 * 1e-10
    close(got, 2 * worker + 4 * (6e6 * 1e-10 + 4e6 * (2e-9 + 1e-10)) + 0.002, "trunc16")
    assert timing.ps_cpu_bound("ps-async", 3, textbook(cores=4)) == 0.0, "a core each"
    # on a free network, with four computations at once little slower than two per core,
    # the server's core sets the iteration: 22 ms computing + 1.6 ms adding < 30.4 ms
    free = dataclasses.replace(cal, bandwidth=math.inf, alpha=0.0, t_update=0.0,
                               t_comp_shared=(0.01, 0.012, 0.018, 0.022))  # fmt: skip
    pred = predict("ps-sync", 4, free)
    assert pred.bound == "cpu"
    close(pred.iter_time_s, 2 * 0.0128 + 4 * 0.0012, "ps-sync on a free network")
    with pytest.raises(ValueError, match="parameter server"):
        timing.ps_cpu_bound("sync", 4, cal)


def test_ps_sync_core_bound_by_hand():
    """p = 4 workers and the server on 2 cores (core 0: the server, ranks 2 and 4; core 1:
    ranks 1 and 3), M = 4 MB, B = 1 GB/s (a pull or push 4 ms), alpha 1 ms, copy = gamma =
    0.1 ns/B, a step of computation 14 ms of CPU with four workers sharing the cores.
    A worker's step on its core: 14 ms + 8 MB through its sockets (0.8 ms) = 14.8 ms. The
    server's work on a push, s: 4 MB received and added (0.8 ms); on a pull, 0.4 ms. The tail
    after a core's last push leaves: alpha + M / B + s + t_u = 1 + 4 + 0.8 + 2 = 7.8 ms.
        core 0, sequential pulls: rank 2's pull arrives at alpha + 2 M / B = 9 ms; then its
            workers' 29.6 ms, the server's 2 later pulls (0.8 ms) and 3 other pushes (2.4 ms):
            9 + 32.8 + 7.8 = 49.6 ms
        core 1: rank 1's pull at 5 ms, then 29.6 ms: 5 + 29.6 + 7.8 = 42.4 ms
    The sum of the textbook model is 45.6 ms (compute 20 ms with all four computing), core 0's
    CPU work 36.4 ms: the chain through core 0 sets the iteration. With shared pulls every
    worker waits for all four (alpha + 4 M / B = 17 ms): core 0 17 + 29.6 + 2.4 + 7.8."""
    cal = textbook(cores=2, copy=1e-10, gamma=1e-10, bandwidth=1e9,
                   t_comp_shared=(0.01, 0.012, 0.016, 0.02),
                   t_comp_cpu=(0.01, 0.011, 0.0125, 0.014))  # fmt: skip
    close(timing.ps_sync_core_bound(4, cal), 0.009 + 0.0328 + 0.0078, "sequential")
    close(timing.ps_sync_core_bound(4, cal, ps_pulls="shared"), 0.017 + 0.032 + 0.0078, "shared")
    pred = predict("ps-sync", 4, cal)
    assert pred.bound == "core", pred
    close(pred.iter_time_s, 0.0496, "ps-sync, the chain through core 0")
    close(timing.ps_cpu_bound("ps-sync", 4, cal), 2 * 0.0148 + 4 * 0.0012 + 0.002, "cpu work")
    # p = 3: core 1 holds ranks 1 and 3, core 0 the server and rank 2 (pull 2 at 9 ms)
    core0 = 0.009 + (0.0125 + 0.0008) + 0.0004 + 2 * 0.0008 + 0.0078
    core1 = 0.005 + 2 * (0.0125 + 0.0008) + 0.0078
    close(timing.ps_sync_core_bound(3, cal), max(core0, core1), "p = 3")
    assert timing.ps_sync_core_bound(3, textbook(cores=4)) == 0.0, "a core each"


def test_step_cpu_reads_the_cpu_table_else_t_comp_with_every_core_busy():
    cal = textbook(cores=2, t_comp_shared=(0.01, 0.012, 0.016, 0.02),
                   t_comp_cpu=(0.01, 0.011, 0.0125))  # fmt: skip
    assert [timing.step_cpu(cal, k) for k in (1, 2, 3, 4, 8)] == [0.01, 0.011, 0.0125, 0.0125,
                                                                   0.0125]  # fmt: skip
    unmeasured = dataclasses.replace(cal, t_comp_cpu=())
    assert [timing.step_cpu(unmeasured, k) for k in (1, 2, 4)] == [0.01, 0.012, 0.012]


def test_ps_async_timed_worker_sharing_its_core_computes_slower():
    # p = 3 workers on 2 cores: worker 0 (rank 1, core 1) shares core 1 with rank 3, while
    # rank 2 has core 0 beside the idle server. Same cores, p = 2: a core to itself.
    # p = 3: t = 0.05 (1 + f), f = t / (t + 0.084)  =>  t^2 - 0.016 t - 0.0042 = 0
    cal = textbook(cores=2)
    alone, shared = predict("ps-async", 2, cal), predict("ps-async", 3, cal)
    close(alone.compute_s, cal.t_comp, "ps-async, a core to itself")
    close(shared.compute_s, (0.016 + math.sqrt(0.016**2 + 0.0168)) / 2, "ps-async, 2 on a core",
          rel=1e-6)  # fmt: skip


# --- ddp: buckets all-reduced during the backward (Eq. 12) ---------------------------------------


def test_ddp_with_one_bucket_at_the_end_is_sync():
    # one unit ready when the backward ends: its AllReduce after it, as sync's
    cal = textbook(backward_units=((4_000_000, 1.0),))
    close(predict("ddp", 4, cal).iter_time_s, predict("sync", 4, cal).iter_time_s, "ddp")
    # a bucket larger than the gradient holds every unit: the same
    cal = textbook(backward_units=((1_000_000, 0.4), (3_000_000, 1.0)))
    got = predict("ddp", 4, cal, bucket_size=10**9)
    close(got.iter_time_s, 0.05 + 0.066 + 0.002, "ddp of one bucket")
    assert got.bound == "tail" and got.hidden_s == 0.0


def test_ddp_three_buckets_by_hand():
    # T_ar(b) = 6 alpha + 1.5 b / B: 1 MB -> 6 + 15 = 21 ms, 2 MB -> 6 + 30 = 36 ms;
    # ready at 0.4, 0.6, 1.0 of t_comp = 20, 30, 50 ms
    cal = textbook(backward_units=((1_000_000, 0.4), (2_000_000, 0.6), (1_000_000, 1.0)))
    got = predict("ddp", 4, cal, bucket_size=0)  # a bucket per unit
    # s1 = 20, e1 = 41; s2 = max(30, 41) = 41, e2 = 77; s3 = max(50, 77) = 77, e3 = 98
    close(got.iter_time_s, 0.098 + T_U, "ddp, three buckets")
    close(got.comm_s, 0.021 + 0.036 + 0.021, "the buckets' AllReduces")
    close(got.hidden_s, (0.041 - 0.020) + (0.050 - 0.041), "before t_comp ends")
    assert got.bound == "network", "the last bucket waited for the ring"
    # buckets of at least 1.5 MB: [1 MB + 2 MB] ready at 30 ms, 6 + 45 = 51 ms -> 81;
    # [1 MB] at max(50, 81) = 81 -> 102
    close(predict("ddp", 4, cal, bucket_size=1_500_000).iter_time_s, 0.102 + T_U, "two buckets")


def test_ddp_tail_when_the_ring_waits_for_the_last_bucket():
    # 2 MB ready at 10 ms, done at 46 < 50; the last 2 MB from 50 to 86
    cal = textbook(backward_units=((2_000_000, 0.2), (2_000_000, 1.0)))
    got = predict("ddp", 4, cal, bucket_size=0)
    close(got.iter_time_s, 0.086 + T_U, "ddp with a tail")
    close(got.hidden_s, 0.036, "the first bucket, all hidden")
    assert got.bound == "tail"


def test_ddp_without_a_measured_backward_assumes_ten_equal_layers():
    # 10 layers of 400 KB, ready at 1/3 + 2/3 i / 10 of 50 ms (20 ms for the first); each
    # 6 + 1.5 * 4e5 / 1e8 = 12 ms on the ring, which they queue for from 20 ms on
    got = predict("ddp", 4, textbook())
    close(got.iter_time_s, 0.020 + 10 * 0.012 + T_U, "ten queued buckets")
    assert got.bound == "network"
    assert timing.DEFAULT_BUCKET_BYTES == parse_size(TrainConfig.bucket_size)


def test_ddp_with_infinite_bandwidth_and_no_latency_is_compute_bound():
    cal = textbook(bandwidth=math.inf, alpha=0.0, backward_units=((1e6, 0.4), (3e6, 1.0)))
    got = predict("ddp", 4, cal)
    close(got.iter_time_s, T_COMP + T_U, "compute alone")
    assert got.bound == "compute"


def test_ddp_pays_alpha_busy_for_buckets_beside_the_backward():
    cal = textbook(alpha_busy=2e-3, backward_units=((2_000_000, 0.2), (2_000_000, 1.0)))
    # the first bucket: 6 x 2 ms + 30 ms = 42 ms from 10 ms, done at 52 > 50; the second,
    # after the backward, 6 x 1 ms + 30 = 36 ms from 52 to 88
    close(predict("ddp", 4, cal, bucket_size=0).iter_time_s, 0.088 + T_U, "alpha_busy")


def test_ddp_bucket_beside_the_backward_takes_its_cpu_from_it():
    # copy 1 ns/B: a 2 MB bucket moves 2 * 2(p-1)/p * 2 MB = 6 MB through the sockets, 6 ms of
    # CPU. The first bucket runs from 10 ms wholly beside the backward: 36 + 6 = 42 ms, to 52;
    # the backward ends 6 ms late, at 56, when the second is ready: 36 ms, to 92
    cal = textbook(copy=1e-9, backward_units=((2_000_000, 0.2), (2_000_000, 1.0)))
    got = predict("ddp", 4, cal, bucket_size=0)
    close(got.iter_time_s, 0.092 + T_U, "ddp with the CPU of its first bucket")
    close(got.compute_s, 0.056 + T_U, "the backward, 6 ms later")
    close(got.hidden_s, 0.042, "the first bucket, beside the backward")


@pytest.mark.parametrize("bandwidth", [1e6, 1e7, 1e8])
def test_pipe_beats_ddp_beats_sync_when_communication_is_heavy(bandwidth):
    units = ((41_000, 0.36), (4_198_400, 0.67), (266_240, 1.0))  # the compare preset's MLP
    cal = textbook(n_params=1_126_410, bandwidth=bandwidth, backward_units=units)
    pipe, ddp, sync = (predict(a, 4, cal).iter_time_s for a in ("pipe", "ddp", "sync"))
    assert pipe < ddp < sync, (pipe, ddp, sync)


@st.composite
def backward_profiles(draw):
    """A backward's units: 1..6 of them, (bytes, fraction ready), fractions rising, whole
    float32 parameters each."""
    k = draw(st.integers(1, 6))
    sizes = [4 * n for n in draw(st.lists(st.integers(1, 10**6), min_size=k, max_size=k))]
    fractions = sorted(draw(st.lists(st.floats(0.01, 1.0), min_size=k, max_size=k)))
    return tuple(zip(sizes, fractions, strict=True))


@given(calibrations(cores=MANY), timing_world_sizes, backward_profiles(), st.integers(0, 10**7))
def test_pipe_never_slower_than_ddp_and_ddp_than_sync_without_costs(cal, p, units, cap):
    cal = dataclasses.replace(cal, n_params=sum(b for b, _ in units) // 4, backward_units=units)
    ddp = predict("ddp", p, cal, bucket_size=cap)
    assert predict("pipe", p, cal).iter_time_s <= ddp.iter_time_s * (1 + 1e-9)
    assert ddp.iter_time_s >= predict("sync", p, cal).iter_time_s - ddp.comm_s * (1 + 1e-9)
    assert 0 <= ddp.hidden_s <= ddp.comm_s * (1 + 1e-9)
    # no per-bucket cost, no CPU taken from the backward: never slower than sync
    free = dataclasses.replace(cal, alpha=0.0, copy=0.0, gamma=0.0)
    sync = predict("sync", p, free).iter_time_s
    assert predict("ddp", p, free, bucket_size=cap).iter_time_s <= sync * (1 + 1e-9)


# --- predict_all, speedups, labels, errors -------------------------------------------------------


def test_predict_all_labels_and_speedups():
    preds = predict_all(4, textbook())
    assert list(preds) == [timing.run_label(a, c) for a, c in COMPARE_RUNS]
    assert list(preds) == ["ps-sync", "ps-async", "sync", "ddp", "pipe", "pipe+trunc16", "pipe+q8"]
    ups = speedups(preds)
    assert ups["ps-sync"] == 1.0
    close(ups["sync"], 0.254 / 0.118, "sync over ps-sync")
    close(ups["pipe"], 0.254 / 0.066, "pipe over ps-sync")
    close(speedups(preds, "sync")["pipe"], 0.118 / 0.066, "pipe over sync")
    for label, pred in preds.items():
        d = pred.to_dict()
        assert d["label"] == label and d["iter_time_s"] == pred.iter_time_s


@pytest.mark.parametrize(
    "algo, changes, bound",
    [
        ("sync", {}, "sum"),
        ("pipe", {}, "network"),
        ("pipe", {"t_comp": 0.1}, "compute"),
        ("pipe", {"cores": 2}, "cpu"),
        ("ps-sync", {}, "server"),
        ("ps-async", {}, "server"),
        ("ps-async", {"bandwidth": 1e10}, "worker"),
    ],
)
def test_bound_labels(algo, changes, bound):
    pred = predict(algo, 4, textbook(**changes))
    assert pred.bound == bound, f"{algo} with {changes}: expected {bound}, got {pred}"


def test_unknown_algo_and_codec_are_errors():
    with pytest.raises(ValueError, match="unknown algo 'allgather'.*ps-sync, ps-async, sync, pipe"):
        predict("allgather", 4, textbook())
    with pytest.raises(ValueError, match=r"no calibration for codec 'fp8'.*\['q8', 'trunc16'\]"):
        predict("pipe", 4, textbook(), codec="fp8")
    assert textbook().codec("none") == (1.0, 0.0, 0.0)


def test_calibration_round_trip():
    cal = textbook(
        t_comp_shared=(0.05, 0.06),
        source={"t_comp": "by hand"},
        backward_units=((41_000, 0.36), (4_198_400, 0.67)),
    )
    assert Calibration.from_dict(cal.to_dict()) == cal
    # through a JSON file: lists come back, and must become tuples again
    assert Calibration.from_dict(json.loads(json.dumps(cal.to_dict()))) == cal
    assert cal.grad_bytes == 4_000_000
    moved = cal.with_network(alpha=5e-5)
    assert (moved.alpha, moved.bandwidth) == (5e-5, B)
    assert cal.with_network(bandwidth=1e9).bandwidth == 1e9


def test_describe_names_every_figure():
    text = timing.describe(textbook(t_comp_shared=(0.05, 0.06)))
    for part in ("n=1000000", "M=4.0 MB", "t_comp=50.00 ms", "alpha=1.00 ms", "cores=1000000"):
        assert part in text, f"{part!r} missing from {text!r}"
    assert "q8: r=4.00" in text and "[50.00, 60.00] ms" in text
    text = timing.describe(textbook(backward_units=((1000, 0.5), (3000, 1.0))))
    assert "backward ready at [0.50, 1.00] of t_comp" in text


# --- sweeps --------------------------------------------------------------------------------------


def test_sweep_bandwidth():
    key, vals = sweep_values("bandwidth=100Mbit..100Gbit")
    assert key == "bandwidth" and len(vals) == 13
    close(vals[0], 12.5e6, "100 Mbit/s in bytes/s")
    close(vals[-1], 12.5e9, "100 Gbit/s in bytes/s")
    ratios = [b / a for a, b in zip(vals[:-1], vals[1:], strict=True)]
    assert max(ratios) == pytest.approx(min(ratios)), "not log-spaced"


def test_sweep_latency_and_dashes():
    key, vals = sweep_values("latency=10us..10ms")
    assert key == "latency" and len(vals) == 13
    close(vals[0], 1e-5, "10 us")
    close(vals[6], 1e-4 * math.sqrt(10), "the middle of three decades")
    assert sweep_values("world-size=2..4")[0] == "world_size"


def test_sweep_world_size():
    key, vals = sweep_values("world_size=2..64")
    assert key == "world_size"
    assert vals == [2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
    assert sweep_values("world_size=1..5")[1] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    "spec, message",
    [
        ("bandwidth", "expected KEY=LOW..HIGH, e.g. bandwidth=100Mbit..100Gbit"),
        ("bandwidth=1Gbit", "expected KEY=LOW..HIGH"),
        ("speed=1..2", "cannot sweep 'speed': choose bandwidth, latency or world_size"),
        ("world_size=a..4", "world_size needs whole numbers, e.g. world_size=2..64"),
        ("world_size=0..4", "1 <= LOW < HIGH, got 0..4"),
        ("world_size=8..4", "1 <= LOW < HIGH, got 8..4"),
        ("bandwidth=1Gbit..1Mbit", "0 < LOW < HIGH"),
        ("bandwidth=1Gbit..unlimited", "finite"),
        ("latency=0..1ms", "0 < LOW < HIGH"),
        ("bandwidth=1Gb..10Gbit", "ambiguous bandwidth unit 'Gb'"),
        ("latency=1ms..2parsecs", "unknown latency unit 'parsecs'"),
    ],
)
def test_bad_sweeps_say_what_to_write(spec, message):
    with pytest.raises(ValueError) as info:
        sweep_values(spec)
    assert message in str(info.value), f"{spec!r}: {info.value}"


# --- properties ----------------------------------------------------------------------------------

codec_names = st.sampled_from(["none", "trunc16", "q8"])


@given(calibrations(cores=MANY), timing_world_sizes, codec_names)
def test_pipe_never_slower_than_sync_on_own_cores(cal, p, codec):
    pipe, sync = predict("pipe", p, cal, codec), predict("sync", p, cal, codec)
    assert pipe.iter_time_s <= sync.iter_time_s * (1 + 1e-12), (pipe, sync)


@given(calibrations(), timing_world_sizes, codec_names)
def test_pipe_never_slower_than_sync_on_shared_cores(cal, p, codec):
    # the cpu bound applies to both: sharing cores never makes pipelining a loss
    pipe, sync = predict("pipe", p, cal, codec), predict("sync", p, cal, codec)
    assert pipe.iter_time_s <= sync.iter_time_s * (1 + 1e-12), (pipe, sync)


@given(calibrations(), timing_world_sizes, codec_names, st.integers(2, 8))
def test_pipe_is_at_least_each_resource(cal, p, codec, width):
    # no schedule beats the busier of the two threads: max(t_comp + t_u, T_ar)
    pipe = predict("pipe", p, cal, codec, width)
    assert pipe.iter_time_s >= max(pipe.compute_s, pipe.comm_s) * (1 - 1e-12), pipe
    assert 0 <= pipe.hidden_s <= min(pipe.compute_s, pipe.comm_s)


@given(calibrations(), timing_world_sizes, codec_names, st.integers(3, 8))
def test_wider_pipelines_are_never_faster_than_two(cal, p, codec, width):
    two, wide = predict("pipe", p, cal, codec, 2), predict("pipe", p, cal, codec, width)
    assert wide.iter_time_s >= two.iter_time_s * (1 - 1e-12), (two, wide)


@given(
    st.integers(2, 64),
    log_uniform(1, 1e9),
    log_uniform(1, 1e9),
    log_uniform(1e-7, 1e-2),
    log_uniform(1e5, 1e11),
)
def test_ring_time_grows_with_bytes(p, m1, m2, alpha, bandwidth):
    small, large = sorted((m1, m2))
    assert ring_allreduce_time(p, small, alpha, bandwidth, 1e-10) <= ring_allreduce_time(
        p, large, alpha, bandwidth, 1e-10
    )


@given(st.integers(2, 10**6), log_uniform(1, 1e9), log_uniform(1e5, 1e11))
def test_ring_bytes_term_is_bandwidth_optimal(p, m, bandwidth):
    # 2(p-1)/p M/B: at least one gradient over each link, never two, and within 1/p of two
    wire = ring_allreduce_time(p, m, 0.0, bandwidth)
    one = m / bandwidth
    assert one * (1 - 1e-12) <= wire < 2 * one
    assert wire == pytest.approx(2 * one * (1 - 1 / p), rel=1e-12)


@given(calibrations(), st.integers(1, 63), codec_names)
def test_ps_sync_grows_with_world_size(cal, p, codec):
    assert predict("ps-sync", p + 1, cal, codec).iter_time_s >= predict(
        "ps-sync", p, cal, codec
    ).iter_time_s * (1 - 1e-12)


@given(calibrations(), timing_world_sizes, codec_names)
def test_ps_async_is_the_slowest_of_worker_server_and_its_core(cal, p, codec):
    pred = predict("ps-async", p, cal, codec)
    server = p * cal.grad_bytes / cal.bandwidth
    core = timing.ps_cpu_bound("ps-async", p, cal, codec)
    assert pred.iter_time_s >= server * (1 - 1e-12)
    assert pred.iter_time_s >= pred.compute_s + pred.comm_s
    assert pred.iter_time_s >= core * (1 - 1e-12)
    if pred.bound == "server":
        assert pred.iter_time_s == server
    elif pred.bound == "cpu":
        assert pred.iter_time_s == core
    else:
        assert pred.bound == "worker", pred


@given(calibrations(), timing_world_sizes, codec_names)
def test_ps_sync_is_at_least_its_busiest_core_s_work(cal, p, codec):
    for pulls in ("sequential", "shared"):
        pred = predict("ps-sync", p, cal, codec, ps_pulls=pulls)
        work = timing.ps_cpu_bound("ps-sync", p, cal, codec)
        chain = timing.ps_sync_core_bound(p, cal, codec, pulls)
        assert pred.iter_time_s >= max(work, chain) * (1 - 1e-12)
        if pred.bound == "cpu":
            assert pred.iter_time_s == work
        elif pred.bound == "core":
            assert pred.iter_time_s == chain
        else:
            assert pred.bound == "server", pred
        if cal.cores >= p + 1:
            assert chain == 0.0, "a core each: no chain through a shared one"


@given(calibrations(cores=MANY), timing_world_sizes)
def test_speedups_invert_the_iteration_times(cal, p):
    preds = predict_all(p, cal)
    for base in preds:
        ups = speedups(preds, base)
        assert ups[base] == 1.0
        for label, up in ups.items():
            assert up * preds[label].iter_time_s == pytest.approx(preds[base].iter_time_s)


@given(calibrations())
def test_calibration_round_trips_through_json(cal):
    assert Calibration.from_dict(json.loads(json.dumps(cal.to_dict()))) == cal


@given(
    calibrations(),
    st.lists(log_uniform(1e-5, 1.0), min_size=0, max_size=8),
    st.floats(0.5, 128),
    st.floats(0.5, 128),
)
def test_compute_time_never_falls_as_workers_are_added(cal, table, k1, k2):
    # with no table, or a measured one (sorted: more workers never compute faster), inside it
    # and past its end
    cal = Calibration.from_dict({**cal.to_dict(), "t_comp_shared": sorted(table)})
    lo, hi = sorted((k1, k2))
    assert compute_time(cal, lo) <= compute_time(cal, hi) * (1 + 1e-12), (cal.t_comp_shared, lo, hi)


# --- calibration on this machine -----------------------------------------------------------------


@pytest.mark.slow
def test_calibrate_smoke():
    """Calibrate the tiny preset (2 workers: launches two processes, a few seconds)."""
    from pipesgd_ref.config import TrainConfig

    lines = []
    cfg = TrainConfig.preset("tiny").replace(latency="50us", bandwidth="1Gbit")
    cal = calibrate(cfg, log=lines.append)
    assert cal.n_params == 650  # softmax on digits: 64 features x 10 classes + 10 biases
    assert cal.t_comp > 0 and cal.t_update > 0 and cal.gamma > 0
    assert cal.alpha >= 50e-6, "alpha is the emulated latency plus the measured hop"
    assert cal.bandwidth <= 125e6, "B is capped by the emulated 1 Gbit/s"
    assert len(cal.t_comp_shared) == 2 and cal.cores >= 1
    assert len(cal.t_comp_cpu) == 2 and 0 < cal.t_comp_cpu[0] <= cal.t_comp_cpu[1]
    assert "CPU a step" in lines[0]
    assert set(cal.codecs) == {"trunc16", "bf16", "q8"}
    assert lines and "n=650 params" in lines[0]
    preds = predict_all(2, cal)
    assert all(p.iter_time_s > 0 for p in preds.values())
    assert Calibration.from_dict(json.loads(json.dumps(cal.to_dict()))) == cal


def test_calibration_keeps_the_fastest_and_measures_once_more_when_launches_disagree():
    calls = []

    def measure(values):
        it = iter(values)

        def one():
            calls.append(1)
            return next(it)

        return one

    assert best_of(measure([1.0, 1.05, 0.1]), tries=2) == 1.0  # agree: two calls
    assert len(calls) == 2
    calls.clear()
    assert best_of(measure([2.0, 1.5, 1.2]), tries=2) == 1.2  # disagree: a third
    assert len(calls) == 3
    # tuples compare by their first item (the computation), the rest comes along
    got = best_of(measure([(2.0, "a"), (1.0, "b"), (3.0, "c")]), tries=2)
    assert got == (1.0, "b")


@pytest.mark.parametrize(
    "step_s, span_s, want", [(0.01, 0.3, 30), (0.1, 0.3, 12), (0.001, 0.3, 40), (0.05, 0, 12)]
)
def test_steps_spanning(step_s, span_s, want):
    assert steps_spanning(step_s, span_s, least=12, most=40) == want


def test_merged_calibration_takes_every_figure_at_its_median():
    """Calibrations of one block, each slow in some figures: the merge has every figure at its
    median (the mean of two), element by element in the tables."""
    slow_compute = textbook(
        t_comp=0.08,
        t_comp_shared=(0.08, 0.1),
        t_comp_busy={"none": 0.12, "q8": 0.13},
        alpha=2e-4,
        alpha_busy=5e-4,
        loop_bandwidth=2e9,
        codecs={"trunc16": (2.0, 1e-9, 3e-9), "q8": (4.0, 5e-9, 1e-9)},
    )
    slow_network = textbook(
        t_comp=0.05,
        t_comp_shared=(0.05, 0.13),
        t_comp_busy={"none": 0.15, "q8": 0.11},
        alpha=4e-4,
        alpha_busy=3e-4,
        loop_bandwidth=3e9,
        t_update=0.004,
        codecs={"trunc16": (2.0, 2e-9, 2e-9), "q8": (4.0, 1e-9, 4e-9)},
    )
    got = merged_calibration([slow_compute, slow_network])
    close(got.t_comp, 0.065, "t_comp")
    close(got.t_update, (T_U + 0.004) / 2, "t_update")
    close(got.alpha, 3e-4, "alpha")
    close(got.alpha_busy, 4e-4, "alpha_busy")
    close(got.loop_bandwidth, 2.5e9, "loop_bandwidth")
    assert got.t_comp_shared == pytest.approx((0.065, 0.115)), "element by element"
    assert got.t_comp_busy == pytest.approx({"none": 0.135, "q8": 0.12})
    assert got.codecs["q8"] == pytest.approx((4.0, 3e-9, 2.5e-9))
    assert got.codecs["trunc16"] == pytest.approx((2.0, 1.5e-9, 2.5e-9))
    assert "merged" in got.source
    # three: the middle one, figure by figure, not the fastest nor the slowest
    middle = textbook(t_comp=0.06, t_comp_shared=(0.07, 0.2), alpha=1e-4)
    three = merged_calibration([slow_compute, slow_network, middle])
    assert (three.t_comp, three.t_comp_shared, three.alpha) == (0.06, (0.07, 0.13), 2e-4)
    alone = merged_calibration([slow_compute])
    assert dataclasses.replace(alone, source=slow_compute.source) == slow_compute, "merge of one"
    # a figure only one calibration has comes from that one, whichever it is
    extra = textbook(codecs={"bf16": (2.0, 3e-9, 3e-9)}, t_comp_busy={"trunc16": 0.14})
    some = merged_calibration([slow_compute, extra])
    assert some.codecs["bf16"] == (2.0, 3e-9, 3e-9) and some.codecs["q8"] == (4.0, 5e-9, 1e-9)
    assert some.t_comp_busy == {"none": 0.12, "q8": 0.13, "trunc16": 0.14}
    with pytest.raises(ValueError, match="at least one"):
        merged_calibration([])
    with pytest.raises(ValueError, match="different models or links"):
        merged_calibration([slow_compute, textbook(n_params=10)])


# --- the accuracy grid's merges (benchmarks/timing_model_accuracy.py) -------------------------


def test_grid_merges_passes_into_the_fastest_run_against_the_merged_calibration():
    """The default grid's two passes (no processes: made-up rows and calibrations): a point
    keeps its fastest run of both passes, predicted from its block's merged calibration (the
    median of its calibrations, figure by figure)."""

    def cal(t_comp):
        return Calibration(n_params=10_000, t_comp=t_comp, t_update=1e-4, alpha=1e-4,
                           bandwidth=125e6, gamma=1e-10, cores=2,
                           t_comp_shared=(t_comp, 2 * t_comp))  # fmt: skip

    slow, fast = cal(0.02), cal(0.01)
    merged = merged_calibration([slow, fast])

    def row(measured_s, c):
        pred = timing.predict("sync", 2, c)
        return {"world_size": 2, "algo": "sync", "codec": "none", "measured_s": measured_s,
                "measured_all_s": [measured_s], "predicted_s": pred.iter_time_s,
                "error": pred.iter_time_s / measured_s - 1}  # fmt: skip

    got = merge_passes([row(0.030, slow), row(0.025, fast), row(0.028, slow)], merged, 2)
    want = timing.predict("sync", 2, merged).iter_time_s
    between = [timing.predict("sync", 2, c).iter_time_s for c in (fast, slow)]
    assert between[0] < want < between[1], "the merge is neither calibration"
    assert got["measured_s"] == 0.025 and got["measured_all_s"] == [0.030, 0.025, 0.028]
    assert got["predicted_s"] == pytest.approx(want), "from the merged calibration"
    assert got["error"] == pytest.approx((want - 0.025) / 0.025)
    assert [q["measured_s"] for q in got["passes"]] == [0.030, 0.025, 0.028]
    failed = {"world_size": 2, "algo": "sync", "codec": "none", "failed": "OSError: boom"}
    assert merge_passes([failed, row(0.03, slow)], merged, 2)["measured_s"] == 0.03
    assert merge_passes([failed, failed], merged, 2)["failed"], "failed in every pass"
    only = row(0.03, slow)
    assert merge_passes([only], merged, 2) is only, "one pass: the row as it was"


def test_grid_calibrates_a_block_again_when_its_calibrations_disagree():
    """Two calibrations of a block whose predictions differ by more than 10% for some method
    (one likely ran in a slow stretch) call for a third; within 10%, or one alone, do not."""
    base = Calibration(n_params=10_000, t_comp=0.01, t_update=1e-4, alpha=1e-4,
                       bandwidth=125e6, gamma=1e-10, cores=2, t_comp_shared=(0.01, 0.02),
                       codecs={"trunc16": (2.0, 1e-9, 1e-9), "q8": (4.0, 1e-9, 1e-9)})  # fmt: skip
    near = dataclasses.replace(base, t_comp=0.0105, t_comp_shared=(0.0105, 0.021))
    slow = dataclasses.replace(base, t_comp=0.013, t_comp_shared=(0.013, 0.026))
    assert not calibrations_disagree([base, near], 2, 2)
    assert calibrations_disagree([base, slow], 2, 2)
    assert calibrations_disagree([slow, base, near], 2, 2), "any two of them"
    assert not calibrations_disagree([slow], 2, 2), "one alone agrees with itself"
