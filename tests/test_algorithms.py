"""The AllReduce algorithms besides the ring (comm/algorithms.py), by their one-process
simulations: every rank ends with the same bits, the sum is exact where the inputs make every
order of additions exact, the schedules mirror each other, and their step counts and bytes are
what the cost formulas charge."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipesgd_ref.comm import algorithms
from pipesgd_ref.comm.algorithms import ALGORITHMS, cost, schedule, simulate, split
from strategies import integer_valued, ring_sizes

algos = st.sampled_from(ALGORITHMS)


@settings(max_examples=150, deadline=None)
@given(
    algo=algos,
    size=ring_sizes(),
    seed=st.integers(0, 2**31),
    op=st.sampled_from(["sum", "mean"]),
    dtype=st.sampled_from([np.float32, np.float64]),
)
def test_every_rank_ends_with_the_same_bits_and_the_exact_sum(algo, size, seed, op, dtype):
    p, n = size
    inputs = [integer_valued([seed, r], n, dtype) for r in range(p)]
    out = simulate(algo, inputs, op)
    total = np.sum(np.stack(inputs), axis=0, dtype=np.float64)  # exact: integers, small sums
    want = (total / p if op == "mean" else total).astype(dtype)
    for r in range(p):
        assert out[r].dtype == dtype
        assert np.array_equal(out[r], out[0]), f"rank {r} differs from rank 0"
    assert np.array_equal(out[0], want)


@settings(max_examples=100, deadline=None)
@given(algo=algos, size=ring_sizes(), seed=st.integers(0, 2**31))
def test_random_floats_agree_across_ranks_and_sum_within_rounding(algo, size, seed):
    p, n = size
    rng = np.random.default_rng(seed)
    inputs = [rng.standard_normal(n).astype(np.float32) for _ in range(p)]
    out = simulate(algo, inputs)
    assert all(np.array_equal(o, out[0]) for o in out)
    exact = np.sum(np.stack(inputs).astype(np.float64), axis=0)
    scale = np.sum(np.abs(np.stack(inputs)), axis=0, dtype=np.float64)
    assert np.all(np.abs(out[0] - exact) <= 1e-6 * p * scale + 1e-30)


def test_the_inputs_are_left_alone():
    inputs = [np.arange(5.0) + r for r in range(3)]
    copies = [a.copy() for a in inputs]
    simulate("rab", inputs)
    assert all(np.array_equal(a, c) for a, c in zip(inputs, copies, strict=True))


def test_each_rank_contributes_once():
    """Rank r holds 10^r: each digit of the sum says how often rank r's value was added."""
    for algo in ALGORITHMS:
        for p in range(1, 9):
            out = simulate(algo, [np.full(11, 10.0**r) for r in range(p)])
            assert np.all(out[0] == sum(10.0**r for r in range(p))), (algo, p)


@pytest.mark.parametrize("algo", ALGORITHMS)
@pytest.mark.parametrize("p", range(1, 9))
def test_steps_are_what_the_cost_formula_charges(algo, p):
    """The number of steps is the alpha coefficient; the elements a rank sends, summed over
    the steps along the busiest rank, are the bandwidth term's (exactly, for n divisible by p2)."""
    p2, e = split(p)
    n = 16 * 1024
    plans = [schedule(algo, r, p, n) for r in range(p)]
    assert len({len(plan) for plan in plans}) == 1
    steps = len(plans[0])
    # per step, the most elements any rank sends or receives: the step's wire time
    per_step = [
        max(max(_size(h.send), _size(h.recv)) for h in (plan[s] for plan in plans) if h)
        for s in range(steps)
    ]
    alpha_only = cost(algo, p, 0, 1.0, 1.0)
    wire_only = cost(algo, p, 4 * n, 0.0, 4.0)  # bytes / (bytes/s) = elements
    assert steps == alpha_only
    assert sum(per_step) == pytest.approx(wire_only)


def _size(r):
    return 0 if r is None else r[1] - r[0]


def test_rabenseifner_sends_the_rings_bytes_and_recursive_doubling_logp_times_more():
    n, p = 1 << 12, 8
    sent = {algo: sum(_size(h.send) for h in schedule(algo, 0, p, n) if h) for algo in ALGORITHMS}
    assert sent["rab"] == 2 * (p - 1) * n // p  # as the ring
    assert sent["rd"] == 3 * n  # log2(8) whole arrays


def test_an_unknown_algorithm_or_op_is_refused():
    with pytest.raises(ValueError, match="unknown algorithm"):
        schedule("tree", 0, 4, 10)
    with pytest.raises(ValueError, match="op must be"):
        simulate("rd", [np.zeros(2)] * 2, op="max")


def test_the_split_and_the_virtual_ranks():
    assert [split(p) for p in (1, 2, 3, 5, 8)] == [(1, 0), (2, 0), (2, 1), (4, 1), (8, 0)]
    p = 6  # p2 = 4, e = 2: ranks 0 and 2 fold into 1 and 3
    assert [algorithms.virtual_rank(r, p) for r in range(p)] == [None, 0, None, 1, 2, 3]
    assert [algorithms.real_rank(v, p) for v in range(4)] == [1, 3, 4, 5]


# --- the models auto chooses by (comm/choose.py) ----------------------------------------------


@given(p=st.integers(1, 64), nbytes=st.integers(0, 1 << 30))
def test_chooses_steps_and_volume_are_the_cost_formulas_terms(p, nbytes):
    """choose.steps and choose.volume are the latency and bandwidth terms of each link
    algorithm's alpha-beta cost: the fitted model has the schedules' own shape."""
    from pipesgd_ref.comm import choose
    from pipesgd_ref.timing import ring_allreduce_time

    for algo in ("rd", "rab"):
        assert cost(algo, p, nbytes, 1.0, math.inf) == choose.steps(algo, p, nbytes)
        assert cost(algo, p, nbytes, 0.0, 1.0) == pytest.approx(choose.volume(algo, p) * nbytes)
    assert ring_allreduce_time(p, nbytes, 1.0, math.inf) == choose.steps("ring", p, nbytes)
    assert ring_allreduce_time(p, nbytes, 0.0, 1.0) == pytest.approx(
        choose.volume("ring", p) * nbytes
    )


def test_pick_takes_the_fastest_model_and_the_ring_without_figures():
    from pipesgd_ref.comm import choose

    figures = {"ring": (100e-6, 1e-10), "oneshot": (10e-6, 1e-9)}
    assert choose.pick(["ring", "oneshot"], 4, 1000, figures) == "oneshot"
    assert choose.pick(["ring", "oneshot"], 4, 1 << 26, figures) == "ring"
    assert choose.pick(["ring", "rd"], 4, 1000, {}) == "ring"
    # an emulated link's latency weighs on the link algorithms' steps, not on the group's
    slow = choose.pick(["ring", "oneshot"], 4, 1 << 20, figures, latency=1.0)
    assert slow == "oneshot"
