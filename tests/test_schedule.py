"""The ring's schedule (comm/schedule.py): the index math, property-tested, and the one-process
simulation against the exact sum."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from pipesgd_ref.comm.schedule import (
    all_gather_chunks,
    chunk_bounds,
    reduce_scatter_chunks,
    segments,
    simulate_allreduce,
)
from strategies import integer_valued, ring_sizes

# --- the index math --------------------------------------------------------------------------


@given(st.integers(0, 10_000), st.integers(1, 64))
def test_chunk_bounds_partition_evenly(n, p):
    bounds = chunk_bounds(n, p)
    assert len(bounds) == p and bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    sizes = [b - a for a, b in bounds]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


@given(st.integers(1, 16))
def test_schedule_owner_and_coverage(p):
    """After reduce-scatter rank r owns chunk r+1; every chunk visits every rank once."""
    for r in range(p):
        received = [reduce_scatter_chunks(r, s, p)[1] for s in range(p - 1)]
        assert received[-1] == (r + 1) % p if p > 1 else True
        assert len(set(received)) == p - 1 and r not in received
        gathered = [all_gather_chunks(r, s, p)[1] for s in range(p - 1)]
        assert set(gathered) | {(r + 1) % p} == set(range(p))
        for s in range(p - 1):  # what r sends at step s is what r+1 receives at step s
            assert reduce_scatter_chunks(r, s, p)[0] == reduce_scatter_chunks((r + 1) % p, s, p)[1]
            assert all_gather_chunks(r, s, p)[0] == all_gather_chunks((r + 1) % p, s, p)[1]


@given(st.integers(0, 100), st.integers(0, 1000), st.integers(1, 50))
def test_segments_cover_the_range(start, length, per):
    pieces = segments(start, start + length, per)
    assert pieces[0][0] == start and pieces[-1][1] == start + length
    assert all(0 <= b - a <= per for a, b in pieces)


@given(ring_sizes(max_n=40), st.sampled_from(["sum", "mean"]))
def test_simulation_equals_exact_sum_on_integer_data(sizes, op):
    p, n = sizes
    arrays = [integer_valued(r, n, bound=50) for r in range(p)]
    want = np.sum(arrays, axis=0) / (p if op == "mean" else 1)
    for got in simulate_allreduce(arrays, op):
        np.testing.assert_array_equal(got, want)
