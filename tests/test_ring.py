"""Ring AllReduce over real worker processes and real sockets, against the exact sum and
against the one-process simulation of the same schedule (the schedule itself:
tests/test_schedule.py)."""

import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipesgd_ref.comm.collectives import allgather, allreduce, barrier, broadcast
from pipesgd_ref.comm.netem import LinkSpec
from pipesgd_ref.comm.schedule import simulate_allreduce
from pipesgd_ref.runtime.launch import launch_local
from strategies import integer_valued, ring_sizes

# --- real processes --------------------------------------------------------------------------


def _allreduce_job(comm, n, dtype, op, in_place, seed, segment_bytes):
    x = np.random.default_rng([seed, comm.rank]).normal(size=n).astype(dtype)
    exact = integer_valued([seed + 1, comm.rank], n, dtype)
    allreduce(comm, x, op, segment_bytes=segment_bytes)
    if in_place:
        allreduce(comm, exact, op, segment_bytes=segment_bytes)
        return x, exact, None
    kept = exact.copy()
    out = np.empty_like(exact)
    allreduce(comm, exact, op, out=out, segment_bytes=segment_bytes)
    return x, out, np.array_equal(kept, exact)  # the input must be left as it was


@pytest.mark.slow
@settings(max_examples=30)
@given(
    sizes=ring_sizes(max_p=6),
    dtype=st.sampled_from([np.float32, np.float64]),
    op=st.sampled_from(["sum", "mean"]),
    in_place=st.booleans(),
    seed=st.integers(0, 2**16),
    segment_bytes=st.sampled_from([8, 64, 1 << 20]),
)
def test_allreduce_over_processes(sizes, dtype, op, in_place, seed, segment_bytes):
    p, n = sizes
    results = launch_local(
        p, _allreduce_job, (n, dtype, op, in_place, seed, segment_bytes),
        start_method="fork", timeout=10, job_timeout=60,
    )  # fmt: skip
    exact_inputs = [integer_valued([seed + 1, r], n, dtype) for r in range(p)]
    want_exact = np.sum(np.array(exact_inputs, np.float64), axis=0)
    if op == "mean":
        want_exact = want_exact / p
    random_inputs = [
        np.random.default_rng([seed, r]).normal(size=n).astype(dtype) for r in range(p)
    ]
    simulated = simulate_allreduce(random_inputs, op)[0]
    for rank, (x, exact, input_kept) in enumerate(results):
        assert x.dtype == dtype and exact.dtype == dtype
        # Integer-valued data: the sum is exact in any order (the mean up to one rounding).
        np.testing.assert_allclose(exact, want_exact, rtol=1e-6 if op == "mean" else 0,
                                   err_msg=f"rank {rank} of {p}: wrong sum")  # fmt: skip
        # Random data: bitwise what the one-process schedule computes, on every rank.
        np.testing.assert_array_equal(x, simulated, err_msg=f"rank {rank} differs")
        np.testing.assert_array_equal(x, results[0][0], err_msg=f"rank {rank} != rank 0")
        assert input_kept in (None, True), f"rank {rank}: out= modified the input"


def _collectives_job(comm, root):
    data = np.arange(10, dtype=np.int64) * (comm.rank + 1)
    broadcast(comm, data, root=root)
    barrier(comm)
    x = np.ones(3, np.float32)
    allreduce(comm, x, "mean")
    return data, x, comm.seq


@pytest.mark.parametrize("p", [1, 2, 5])
def test_broadcast_and_barrier(p):
    root = p - 1
    for data, x, seq in launch_local(p, _collectives_job, (root,), start_method="fork"):
        np.testing.assert_array_equal(data, np.arange(10) * (root + 1))
        np.testing.assert_array_equal(x, np.ones(3, np.float32))
        assert seq == 3


def _allgather_job(comm):
    r = comm.rank
    mine = np.arange(r * 2, dtype=np.float64) + 10 * r  # rank r: 2r values (rank 0: none)
    if r == 1:
        mine[0] = np.inf  # x + 0 = x for infinities too
    return allgather(comm, mine)


@pytest.mark.parametrize("p", [1, 3])
def test_allgather_returns_every_ranks_array_on_every_rank(p):
    want = [np.arange(r * 2, dtype=np.float64) + 10 * r for r in range(p)]
    if p > 1:
        want[1][0] = np.inf
    for rank, got in enumerate(launch_local(p, _allgather_job, start_method="fork")):
        assert len(got) == p, f"rank {rank}: {len(got)} arrays for {p} ranks"
        for r in range(p):
            np.testing.assert_array_equal(got[r], want[r], err_msg=f"rank {rank}, from rank {r}")


def test_spawned_workers():
    """The default start method (spawn: no inherited state) works too."""
    results = launch_local(3, _allreduce_job, (50, np.float32, "sum", True, 7, 1 << 20))
    np.testing.assert_array_equal(results[0][0], results[2][0])


def test_bad_arrays_are_refused():
    from pipesgd_ref.comm.communicator import Communicator
    from pipesgd_ref.comm.rendezvous import JobSpec

    comm = Communicator(JobSpec(0, 1), None, None)
    with pytest.raises(ValueError, match="float32, float64"):
        allreduce(comm, np.zeros(3, np.int64))
    with pytest.raises(ValueError, match="contiguous 1-D"):
        allreduce(comm, np.zeros((2, 2), np.float32))
    with pytest.raises(ValueError, match="'sum' or 'mean'"):
        allreduce(comm, np.zeros(2, np.float32), op="max")


# --- link emulation --------------------------------------------------------------------------


def _timed_allreduce_job(comm, n, reps):
    x = np.ones(n, np.float32)
    times = []
    barrier(comm)
    for _ in range(reps):
        start = time.perf_counter()
        allreduce(comm, x)
        times.append(time.perf_counter() - start)
    return times


def test_emulated_ring_matches_the_alpha_beta_formula():
    """Latency 2 ms, bandwidth 100 MB/s, 4 MB on 4 ranks: within 15% of
    T = 2(p-1) alpha + 2(p-1)/p M/B (the gamma term is below 3% of it here)."""
    p, n, link = 4, 1_000_000, LinkSpec(latency=2e-3, bandwidth=100e6)
    M = 4 * n
    predicted = 2 * (p - 1) * link.latency + 2 * (p - 1) / p * M / link.bandwidth
    per_rank = launch_local(p, _timed_allreduce_job, (n, 7), start_method="fork", link=link)
    # The slowest rank of each repeat; then the fastest repeat: the emulated link's time, with
    # as little as possible of this shared machine's scheduling noise (other processes can only
    # make a repeat slower, never faster than the link allows).
    measured = min(max(rank[i] for rank in per_rank) for i in range(7))
    assert abs(measured - predicted) / predicted < 0.15, (
        f"measured {measured * 1e3:.1f} ms, alpha-beta formula {predicted * 1e3:.1f} ms"
    )


def _traced_job(comm):
    allreduce(comm, np.ones(10, np.float32))


def test_trace_prints_every_chunk_and_step(monkeypatch):
    """PIPESGD_TRACE=1: one line per rank, step and chunk, rank-tagged, in the parent's log."""
    import io
    import logging

    from pipesgd_ref.logs import configure_parent_logging

    monkeypatch.setenv("PIPESGD_TRACE", "1")
    stream = io.StringIO()
    logger = logging.getLogger("pipesgd")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    configure_parent_logging("INFO", stream=stream)
    try:
        launch_local(3, _traced_job, start_method="fork")
    finally:  # leave the logger as this test found it
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        for handler in saved[0]:
            logger.addHandler(handler)
        logger.setLevel(saved[1])
        logger.propagate = saved[2]
    lines = [line for line in stream.getvalue().splitlines() if "allreduce #1" in line]
    assert len(lines) == 3 * 4, "\n".join(lines)  # p ranks x 2(p-1) steps
    assert any("[rank 2]" in line and "step 3 (all-gather) | rank 2 -> 0" in line for line in lines)


def _peak_memory_job(comm, n):
    import tracemalloc

    x = np.ones(n, np.float32)
    allreduce(comm, x)  # warm up: threads and buffers that live as long as the link
    tracemalloc.start()
    allreduce(comm, x)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def test_extra_memory_is_one_chunk_not_the_whole_array():
    """Per-rank extra memory of the ring is O(M/p) (one segment-sized receive buffer, at most a
    chunk), not O(M p): with M = 16 MB on 4 ranks, at most M/p plus 10% (NumPy reports its
    buffers to tracemalloc)."""
    p, n = 4, 4 << 20
    M = 4 * n
    for rank, peak in enumerate(launch_local(p, _peak_memory_job, (n,), start_method="fork")):
        assert peak <= 1.1 * M / p, f"rank {rank}: {peak / 1e6:.1f} MB extra for M = {M / 1e6} MB"


def _star_job(comm):
    from pipesgd_ref.comm.wire import Frame, Kind

    if comm.rank == 0:
        got = {}
        for r, link in sorted(comm.clients.items()):
            frame = link.recv_header()
            buf = np.empty(1, np.int64)
            link.recv_payload_into(frame, memoryview(buf).cast("B"))
            got[r] = int(buf[0])
        return got
    comm.server.send(Frame(kind=Kind.DATA, dtype=3), np.array([comm.rank * 10]).view(np.uint8))
    return None


@pytest.mark.parametrize("p", [2, 4])
def test_star_links_to_rank_0(p):
    """With star=True every rank also has a link to rank 0 (the parameter server's links)."""
    results = launch_local(p, _star_job, start_method="fork", star=True)
    assert results[0] == {r: r * 10 for r in range(1, p)}
