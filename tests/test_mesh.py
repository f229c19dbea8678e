"""Recursive doubling and Rabenseifner over real links (comm/mesh.py): bitwise what the
one-process simulation of the same schedule computes (comm/algorithms.simulate; the schedules
themselves: tests/test_algorithms.py), over tcp and shared memory, any p (folded or not), empty
and odd lengths, many segments; the mesh links rendezvous makes; a mismatch and a killed rank
end the job with the cause named, not a hang."""

import os
import signal
import threading

import numpy as np
import pytest
from jobs import (
    TIMEOUT,
    assert_every_rank_blames_the_killed,
    assert_nothing_left_alive,
    blamed,
    run_failing,
    write_pid,
)

from pipesgd_ref.comm.algorithms import ALGORITHMS, schedule, simulate
from pipesgd_ref.comm.collectives import allreduce
from pipesgd_ref.comm.communicator import Communicator
from pipesgd_ref.comm.mesh import mesh_peers, reduce_by_schedule
from pipesgd_ref.comm.rendezvous import JobSpec
from pipesgd_ref.comm.wire import Op
from pipesgd_ref.runtime.launch import launch_local

OPS = {"sum": Op.ALLREDUCE_SUM, "mean": Op.ALLREDUCE_MEAN}


def lengths(p: int) -> list[int]:
    return sorted({0, 1, max(p - 1, 0), p + 1, 13})


def inputs(p: int, n: int, dtype, seed: int) -> list[np.ndarray]:
    return [np.random.default_rng([seed, n, r]).normal(size=n).astype(dtype) for r in range(p)]


def _cases(p: int):
    """(algo, n, op, segment_bytes) of one job: every length, both ops, and a length of many
    segments (40 bytes: 5 float64 or 10 float32 elements a frame)."""
    for algo in ALGORITHMS:
        for n in lengths(p):
            for op in OPS:
                yield algo, n, op, 1 << 20
        yield algo, 1001, "sum", 40


def _mesh_job(comm, dtype, seed):
    p, got = comm.world_size, []
    for algo, n, op, segment_bytes in _cases(p):
        x = inputs(p, n, dtype, seed)[comm.rank]
        reduce_by_schedule(comm, x, OPS[op], algo, segment_bytes)
        got.append(x)
    y = inputs(p, 9, dtype, seed)[comm.rank]
    allreduce(comm, y, "mean", algorithm="rab")  # the dispatch in comm/collectives.py
    got.append(y)
    return got, comm.seq, sorted(comm.mesh), comm.transports


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "p, transport, dtype",
    [
        (1, "tcp", np.float32),
        (2, "shm", np.float64),
        (3, "tcp", np.float64),
        (4, "shm", np.float32),
        pytest.param(5, "tcp", np.float32, marks=pytest.mark.slow),
        pytest.param(6, "shm", np.float64, marks=pytest.mark.slow),
        pytest.param(7, "tcp", np.float64, marks=pytest.mark.slow),
        pytest.param(8, "shm", np.float32, marks=pytest.mark.slow),
    ],
)
def test_equals_the_simulation_bitwise(p, transport, dtype):
    seed = 100 + p
    results = launch_local(p, _mesh_job, (dtype, seed), start_method="fork", timeout=10,
                           job_timeout=40, transport=transport, allreduce="rd")  # fmt: skip
    want = [simulate(algo, inputs(p, n, dtype, seed), op) for algo, n, op, _ in _cases(p)]
    want.append(simulate("rab", inputs(p, 9, dtype, seed), "mean"))
    for rank, (got, seq, peers, transports) in enumerate(results):
        assert len(got) == len(want) and seq == len(want), f"rank {rank}: {seq} collectives"
        for i, ((x, expected), case) in enumerate(
            zip(zip(got, want, strict=True), [*_cases(p), "allreduce rab"], strict=True)
        ):
            assert x.dtype == dtype
            np.testing.assert_array_equal(x, expected[rank], err_msg=f"rank {rank}, case {case}")
            np.testing.assert_array_equal(x, results[0][0][i], err_msg=f"rank {rank} != rank 0")
        assert peers == sorted(mesh_peers(rank, p))
        assert set(transports.values()) == ({transport} if p > 1 else set()), transports


def _large_job(comm, n, seed):
    got = []
    for algo in ALGORITHMS:
        x = inputs(comm.world_size, n, np.float64, seed)[comm.rank]
        reduce_by_schedule(comm, x, Op.ALLREDUCE_MEAN, algo)
        got.append(x)
    return got


@pytest.mark.slow  # 2-9 s: kept out of the fast subset (under 3 minutes)
@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_segments_of_full_size_both_ways_at_once(transport):
    """Whole 2 MiB segments (full shared-memory slots, and more frames than slots) and a
    part-filled one, sent by both partners of a hop at once over one link."""
    p, n, seed = 3, 1_100_001, 7  # 8.8 MB of float64: 5 segments a hop (4 slots) each way
    results = launch_local(p, _large_job, (n, seed), start_method="fork", timeout=10,
                           job_timeout=40, transport=transport, allreduce="rab")  # fmt: skip
    for i, algo in enumerate(ALGORITHMS):
        want = simulate(algo, inputs(p, n, np.float64, seed), "mean")
        for rank, got in enumerate(results):
            np.testing.assert_array_equal(got[i], want[rank], err_msg=f"{algo}, rank {rank}")


def test_mesh_peers_are_every_schedules_peers_and_symmetric():
    for p in range(1, 17):
        for r in range(p):
            peers = mesh_peers(r, p)
            assert r not in peers
            for algo in ALGORITHMS:
                assert {h.peer for h in schedule(algo, r, p, 5) if h} <= peers
            for q in peers:  # both ends make the same pair: one connection between them
                assert r in mesh_peers(q, p)
    assert mesh_peers(0, 6) == {1}  # folded into rank 1: it talks to no one else
    assert mesh_peers(1, 6) == {0, 3, 4}  # its fold partner; virtual ranks 1 and 2


def test_a_job_without_mesh_links_is_refused():
    comm = Communicator(JobSpec(0, 2), None, None)
    x = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="allreduce rd, rab or auto"):
        reduce_by_schedule(comm, x, Op.ALLREDUCE_SUM, "rd")
    with pytest.raises(ValueError, match="unknown algorithm"):
        reduce_by_schedule(comm, x, Op.ALLREDUCE_SUM, "ring")
    assert comm.seq == 0  # refused before it took a sequence number
    alone = Communicator(JobSpec(0, 1), None, None)
    reduce_by_schedule(alone, x, Op.ALLREDUCE_MEAN, "rab")
    assert alone.seq == 1 and not x.any()


# --- failures --------------------------------------------------------------------------------


def _mismatch_job(comm, algo, odd_rank, pid_dir):
    write_pid(pid_dir)
    x = np.ones(11 if comm.rank == odd_rank else 10, np.float32)
    reduce_by_schedule(comm, x, Op.ALLREDUCE_SUM, algo)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("algo", ALGORITHMS)
def test_a_mismatched_length_is_an_error_naming_both_ranks(algo, tmp_path):
    p, odd = 4, 1
    partner = schedule(algo, odd, p, 10)[0].peer  # at step 0: rd 0, rab 3
    failed, elapsed = run_failing(p, _mismatch_job, (algo, odd, tmp_path), allreduce=algo)
    assert elapsed < TIMEOUT, f"took {elapsed:.2f} s: a mismatch needs no timeout to be seen"
    assert sorted(failed.errors) == list(range(p)), failed
    text = failed.errors[odd]
    head = f"rank 1: rank {partner} sent a frame of allreduce_sum #1 of 10 float32"
    assert text.startswith(head), text
    assert "while this rank is in allreduce_sum #1 of 11 float32" in text, text
    text = failed.errors[partner]
    assert text.startswith(f"rank {partner}: rank 1 sent a frame of allreduce_sum #1 of 11"), text
    for rank in set(range(p)) - {odd, partner}:  # told by the news 1 or its partner sent
        text = failed.errors[rank]
        assert "of 11 float32" in text and "of 10 float32" in text, f"rank {rank}: {text}"
    assert_nothing_left_alive(tmp_path, expected=p)


def _killed_job(comm, algo, victim, n, reps, pid_dir):
    write_pid(pid_dir)
    x = np.ones(n, np.float32)
    reduce_by_schedule(comm, x, Op.ALLREDUCE_SUM, algo)  # warm-up: every link carries data
    if comm.rank == victim:  # SIGKILL: no cleanup, no message, sockets reset by the kernel
        threading.Timer(0.01, os.kill, (os.getpid(), signal.SIGKILL)).start()
    for _ in range(reps):
        reduce_by_schedule(comm, x, Op.ALLREDUCE_SUM, algo)


@pytest.mark.timeout(60)
def test_a_rank_killed_mid_allreduce_is_named_by_every_rank(tmp_path):
    p, victim = 5, 3  # rab on 5 ranks: rank 0 folds into 1; the victim is in the core
    args = ("rab", victim, 1_000_000, 20, tmp_path)
    failed, elapsed = run_failing(p, _killed_job, args, allreduce="rab")
    assert elapsed < 2 * TIMEOUT, f"the job took {elapsed:.2f} s to fail; bound 2 x timeout"
    assert_every_rank_blames_the_killed(failed, p, victim)
    assert_nothing_left_alive(tmp_path, expected=p)


def _stopped_job(comm, algo, victim, pid_dir):
    write_pid(pid_dir)
    x = np.ones(1000, np.float32)
    reduce_by_schedule(comm, x, Op.ALLREDUCE_SUM, algo)
    if comm.rank == victim:  # alive, sockets open, silent: only a timeout can tell
        os.kill(os.getpid(), signal.SIGSTOP)
    reduce_by_schedule(comm, x, Op.ALLREDUCE_SUM, algo)


@pytest.mark.slow  # a timeout and the launcher's grace: ~4 s
@pytest.mark.timeout(60)
def test_a_stopped_rank_is_a_timeout_every_rank_blames(tmp_path):
    """No rank waits forever: the stopped rank's partners time out, the others hear it from
    them (heartbeats keep them from timing out on a partner that is only waiting too)."""
    p, victim = 6, 4
    failed, elapsed = run_failing(p, _stopped_job, ("rab", victim, tmp_path), allreduce="rab",
                                  grace=1.5)  # fmt: skip
    assert elapsed < 2 * TIMEOUT + 1.5, f"took {elapsed:.2f} s; bound 2 x timeout + grace"
    assert sorted(failed.errors) == list(range(p)), failed
    for rank in set(range(p)) - {victim}:
        text = failed.errors[rank]
        assert blamed(text) == victim, f"rank {rank} should blame rank {victim}: {text}"
    assert_nothing_left_alive(tmp_path, expected=p)
