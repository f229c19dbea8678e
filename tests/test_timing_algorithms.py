"""The timing models cost the AllReduce algorithm the workers run (timing/terms.py): the ring
by default, the job's algorithm when it names one, and under auto the one comm/choose.py picks
from the same inputs the workers have (the fitted figures, the transport, the emulated link)."""

from __future__ import annotations

import json
import math

import pytest

from pipesgd_ref.comm import algorithms, choose
from pipesgd_ref.timing import Calibration, ring_allreduce_time
from pipesgd_ref.timing.iteration import sync
from pipesgd_ref.timing.terms import allreduce_algorithm, ring_bandwidth, ring_time

# Fitted figures with a crossover inside the test's sizes: oneshot cheap to start and dear per
# byte, the ring the other way round; rd and rab in between.
FIGURES = {
    "shm": {
        "ring": {"alpha": 80e-6, "beta": 1 / 8e9},
        "oneshot": {"alpha": 20e-6, "beta": 1 / 4e9},
        "twoshot": {"alpha": 30e-6, "beta": 1 / 6e9},
        "rd": {"alpha": 60e-6, "beta": 1 / 2e9},
        "rab": {"alpha": 70e-6, "beta": 1 / 6e9},
    }
}


@pytest.fixture
def fitted(tmp_path, monkeypatch):
    path = tmp_path / "models.json"
    path.write_text(json.dumps({"models": FIGURES}))
    monkeypatch.setenv("PIPESGD_ALLREDUCE_MODELS", str(path))
    return {a: (m["alpha"], m["beta"]) for a, m in FIGURES["shm"].items()}


def cal(**kw) -> Calibration:
    base = dict(n_params=1000, t_comp=0.01, t_update=0.001, alpha=1e-4, bandwidth=1e9, gamma=1e-10)
    return Calibration(**(base | kw))


def test_the_ring_by_default():
    c = cal()
    want = ring_allreduce_time(4, 4000, 1e-4, ring_bandwidth(4, c), 1e-10)
    assert allreduce_algorithm(4, c, "none", 4000) == "ring"
    assert ring_time(4, c, "none", 4000, 1e-4) == want


@pytest.mark.parametrize("algo", ["rd", "rab"])
def test_a_named_link_algorithm_is_costed_by_its_own_formula(algo):
    c = cal(allreduce=algo)
    want = algorithms.cost(algo, 6, 4000, 1e-4, ring_bandwidth(6, c), 1e-10)
    assert ring_time(6, c, "none", 4000, 1e-4) == pytest.approx(want)
    assert want != ring_time(6, cal(), "none", 4000, 1e-4)


def test_auto_on_one_unemulated_host_picks_and_costs_as_the_workers_do(fitted):
    c = cal(allreduce="auto", bandwidth=math.inf, transport="shm")
    picked = {}
    for nbytes in (1 << 10, 1 << 16, 1 << 20, 1 << 24, 1 << 27):
        algo = allreduce_algorithm(4, c, "none", nbytes)
        assert algo == choose.pick(["ring", "oneshot", "twoshot"], 4, nbytes, fitted)
        picked[nbytes] = algo
        if algo != "ring":
            want = choose.model_time(algo, 4, nbytes, *fitted[algo])
            assert ring_time(4, c, "none", nbytes, 1e-4) == pytest.approx(want)
    assert len(set(picked.values())) > 1, f"the sizes should cross over: {picked}"


def test_auto_on_an_emulated_link_chooses_among_the_link_algorithms(fitted):
    c = cal(allreduce="auto", latency=1e-3, bandwidth=1e8, transport="shm")
    for nbytes in (1 << 10, 1 << 20, 1 << 26):
        algo = allreduce_algorithm(8, c, "none", nbytes)
        assert algo in ("ring", "rd", "rab")
        assert algo == choose.pick(["ring", "rd", "rab"], 8, nbytes, fitted, 1e-3, 1e8)


def test_a_codec_rides_the_ring_and_sync_uses_the_chosen_cost(fitted):
    c = cal(allreduce="auto", bandwidth=math.inf, n_params=256, codecs={"q8": (4.0, 0.0, 0.0)})
    assert allreduce_algorithm(4, c, "q8", 1024) == "ring"
    algo = allreduce_algorithm(4, c, "none", 1024)
    assert sync(4, c).comm_s == pytest.approx(ring_time(4, c, "none", 1024, c.alpha)), algo
