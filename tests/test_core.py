"""The lesson core (pipesgd_ref/core): its ring and methods against their one-process
definitions, the product against the core (bitwise, ring over tcp), its failures named, its
command-line faces (`train --lesson`, `--lesson-threads`, `lesson-file`), and its size."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipesgd_ref.commands.cli import main
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.core import Problem, blobs, chunk_bounds, launch, oracle, simulate
from pipesgd_ref.core.ring import ring_allreduce
from pipesgd_ref.core.wire import HEADER, Link
from strategies import lengths, world_sizes

SMALL = dict(hidden=(16,), batch_size=8, steps=12)  # a few steps of a small MLP on digits


def problem(algo: str = "pipe", p: int = 4, K: int = 2, **kw) -> Problem:
    X, y = blobs(400, 12, 5, seed=1)
    args = dict(hidden=(8,), world_size=p, width=K, batch_size=8, steps=10, lr=0.2) | kw
    return Problem(X, y, 5, **args)


# --- the ring --------------------------------------------------------------------------------


@given(st.data())
def test_chunk_bounds_cover_the_array_in_order(data):
    p, n = data.draw(world_sizes), data.draw(st.integers(0, 100))
    bounds = chunk_bounds(n, p)
    sizes = [b - a for a, b in bounds]
    assert bounds[0][0] == 0 and bounds[-1][1] == n and len(bounds) == p
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def ring_in_threads(arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Every rank's ring_allreduce, each in a thread, over socketpairs."""
    p = len(arrays)
    pairs = [socket.socketpair() for _ in range(p)]  # pair r: rank r -> r + 1
    errors = []

    def rank(r: int) -> None:
        right = Link(pairs[r][0], r, (r + 1) % p, 10.0)
        left = Link(pairs[(r - 1) % p][1], r, (r - 1) % p, 10.0)
        try:
            ring_allreduce(r, p, left, right, arrays[r])
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(p)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return arrays


@given(st.data())
def test_the_ring_over_sockets_is_its_simulation_bitwise(data):
    p, n = data.draw(world_sizes), data.draw(lengths)
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    arrays = [rng.normal(size=n).astype(np.float32) for _ in range(p)]
    want = simulate(arrays)
    got = ring_in_threads([a.copy() for a in arrays])
    for r in range(p):
        assert np.array_equal(got[r], want[r]), f"rank {r} of {p}, n = {n}"
        np.testing.assert_allclose(got[r], np.mean(arrays, axis=0), rtol=1e-5, atol=1e-6)


# --- the methods, distributed, against their oracles -----------------------------------------


@pytest.mark.parametrize(
    "algo, p, K",
    [("sync", 3, 1), ("pipe", 4, 2), ("pipe", 2, 3), ("pipe", 3, 1), ("ps-sync", 3, 1)],
)
def test_each_method_ends_at_its_oracle_bitwise_in_processes(algo, p, K):
    prob = problem(algo, p, K)
    results = launch(prob, algo)
    want = oracle(prob, algo)
    assert len(results) == p + (algo == "ps-sync")
    for r in results:
        assert np.array_equal(r["params"], want), f"{algo}: rank {r['rank']} is not the oracle"
        assert len(r["losses"]) == prob.steps and r["bytes_sent"] > 0


def test_ranks_as_threads_compute_what_processes_do():
    prob = problem("pipe", 3, 2, warmup=2)
    threads, procs = launch(prob, "pipe", threads=True), launch(prob, "pipe")
    assert np.array_equal(threads[0]["params"], procs[0]["params"])
    assert np.array_equal(threads[0]["params"], oracle(prob, "pipe"))


def test_pipe_trains_and_staleness_changes_the_weights():
    prob = problem("pipe", 2, 2, steps=60)
    pipe, sync = oracle(prob, "pipe"), oracle(prob, "sync")
    assert not np.array_equal(pipe, sync), "staleness one must change the trajectory"
    losses = launch(prob, "pipe")[0]["losses"]
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:5]), "the loss must fall"


def test_the_ring_sends_two_p_minus_one_over_p_of_the_gradient():
    prob = problem("sync", 4, 1, steps=3)
    n = prob.model().n_params
    chunks = chunk_bounds(n, 4)
    for r in launch(prob, "sync"):
        rs = sum(b - a for a, b in (chunks[(r["rank"] - s) % 4] for s in range(3)))
        ag = sum(b - a for a, b in (chunks[(r["rank"] + 1 - s) % 4] for s in range(3)))
        header = HEADER.size  # a frame's header, 2(p - 1) of them
        assert r["bytes_sent"] == 3 * (4 * (rs + ag) + 6 * header), f"rank {r['rank']}"


# --- failures are named ----------------------------------------------------------------------


class Failing(Problem):
    """A problem whose gradient fails on one worker at one step, by `how` (or, "pause",
    stops there a while, as a rank held in a debugger does)."""

    how, at = "raise", (1, 3)

    def gradient(self, model, params, worker, step, grads):
        if (worker, step) == self.at:
            if self.how == "raise":
                raise ValueError(f"worker {worker} broke at step {step}")
            if self.how == "pause":
                time.sleep(3.0)
            else:
                os.kill(os.getpid(), signal.SIGKILL)
        return super().gradient(model, params, worker, step, grads)


def failing(how: str) -> Failing:
    X, y = blobs(400, 12, 5, seed=1)
    prob = Failing(X, y, 5, hidden=(8,), world_size=3, batch_size=8, steps=10)
    prob.how = how
    return prob


@pytest.mark.parametrize("threads", [False, True])
def test_a_rank_that_raises_is_named_and_the_others_stop(threads):
    with pytest.raises(RuntimeError) as info:
        launch(failing("raise"), "pipe", threads=threads, timeout=20.0)
    text = str(info.value)
    assert "rank 1 failed" in text and "worker 1 broke at step 3" in text
    assert "rank 2" in text and "rank 1" in text.split("rank 2 failed", 1)[1], text


@pytest.mark.slow
def test_a_rank_paused_as_in_a_debugger_trips_no_timeout_as_threads_only():
    prob = failing("pause")
    assert np.array_equal(
        launch(prob, "pipe", threads=True, timeout=1.5)[0]["params"], oracle(prob, "pipe")
    )
    with pytest.raises(RuntimeError) as info:
        launch(prob, "pipe", timeout=1.5)  # processes: a silent peer is an error naming it
    assert "nothing from rank 1 for 1.5 s" in str(info.value)


def test_a_killed_rank_is_named_by_its_neighbours():
    with pytest.raises(RuntimeError) as info:
        launch(failing("kill"), "sync", timeout=20.0)
    text = str(info.value)
    assert "rank 1 died (exit code -9)" in text
    assert "rank 2: " in text and "rank 1 (" in text, text  # rank 2 lost its left, rank 1


# --- the product ends at the core's weights --------------------------------------------------


def product_and_core(algo: str, p: int, K: int):
    from pipesgd_ref.commands.lesson import problem_of
    from pipesgd_ref.commands.train import run_training
    from pipesgd_ref.runtime.inputs import JobInputs

    cfg = TrainConfig(
        algo=algo, world_size=p, width=K, allreduce="ring", transport="tcp", **SMALL
    ).replace(eval_every=0)
    _, results = run_training(cfg, progress=False, log=lambda line: None)
    prob = problem_of(cfg, JobInputs.load(cfg))
    return results, launch(prob, algo), prob


CASES = [(a, p, K) for p in (2, 4) for a, K in [("sync", 1), ("ps-sync", 1)]] + [
    ("pipe", p, K) for p in (2, 4) for K in (1, 2, 3)
]
# The fast subset keeps each method at p = 4 and every width at p = 2; the rest run in full.
CASES = [
    pytest.param(*c, marks=pytest.mark.slow)
    if c[1] == 2 and c[0] != "pipe" or c == ("pipe", 4, 1) or c == ("pipe", 4, 3)
    else c
    for c in CASES
]


@pytest.mark.parametrize("algo, p, K", CASES)
def test_the_product_on_ring_tcp_ends_at_the_cores_weights(algo, p, K):
    product, core, prob = product_and_core(algo, p, K)
    w = core[0]["params"]
    assert np.array_equal(w, oracle(prob, algo))
    for r in product:
        assert np.array_equal(r.params, w), f"{algo} p={p} K={K}: product rank {r.rank}"


def test_the_core_builds_the_products_model_and_minibatches():
    from pipesgd_ref.commands.lesson import problem_of
    from pipesgd_ref.runtime.inputs import JobInputs

    cfg = TrainConfig(**SMALL)
    inputs = JobInputs.load(cfg)
    prob = problem_of(cfg, inputs)
    core_model = prob.model()
    w = core_model.init_params(cfg.seed)
    assert np.array_equal(w, inputs.model.init_params(cfg.seed))
    for worker, step in [(0, 0), (3, 5), (1, 10_000)]:
        rows = prob.minibatch(worker, step)
        assert np.array_equal(rows, inputs.sampler.batch_indices(worker, step))
        g_core, g_product = np.empty_like(w), np.empty_like(w)
        X, y = inputs.data.X_train[rows], inputs.data.y_train[rows]
        assert core_model.loss_and_grad(w, X, y, g_core) == inputs.model.loss_and_grad(
            w, X, y, g_product
        )
        assert np.array_equal(g_core, g_product)


# --- the command line ------------------------------------------------------------------------


@pytest.mark.parametrize("algo", ["sync", "pipe", "ps-sync"])
def test_train_lesson_writes_the_products_outputs(tmp_path, capsys, algo):
    out = tmp_path / algo
    args = ["train", "--lesson", "--no-progress", f"--algo={algo}", "--steps=20", "--hidden=16"]
    assert main([*args, "--eval-every=5", "--out", str(out)]) == 0
    line = capsys.readouterr().out
    assert "the lesson core" in line and f"{algo}: 20 steps" in line
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 20 and summary["params_identical_on_all_ranks"]
    assert summary["lesson"]["ranks"] == "processes" and summary["lesson"]["transport"] == "tcp"
    if algo != "ps-sync":  # the ring: 2(p-1)/p of the gradient a step, on every rank
        (ran,) = summary["allreduce_ran"]
        assert (ran["algorithm"], ran["transport"], ran["calls"]) == ("ring", "tcp", 20)
        assert ran["bytes_sent"] == pytest.approx(20 * 1.5 * ran["bytes"], rel=0.01)
        assert f"{algo}: gradients reduced by ring over tcp (20 x" in line
    assert [e["step"] for e in summary["eval_curve"]] == [5, 10, 15, 20]
    assert 0 < summary["test_accuracy"] <= 1 and min(summary["bytes_sent_per_rank"]) > 0
    with np.load(out / "checkpoint.npz") as z:
        assert int(z["next_step"]) == 20 and z["params"].dtype == np.float32
    assert json.loads((out / "trace.json").read_text())["traceEvents"]


def test_train_lesson_threads_runs_and_says_so(tmp_path, capsys):
    out = tmp_path / "t"
    rc = main(["train", "--lesson-threads", "--no-progress", "--preset=tiny", "--out", str(out)])
    assert rc == 0 and "threads over socketpairs" in capsys.readouterr().out
    assert json.loads((out / "summary.json").read_text())["lesson"]["ranks"] == "threads"


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--codec=q8"], "--codec q8"),
        (["--latency=1ms", "--compensation=dc"], "--compensation dc, --latency 1ms"),
        (["--latency=1ms", "--bandwidth=1Gbit"], "1Gbit; drop them (it runs no emulated link),"),
        (["--algo=ddp"], "not --algo ddp"),
        (["--transport=shm"], "--transport shm"),
        (["--allreduce=rd"], "--allreduce rd"),
    ],
)
def test_train_lesson_refuses_what_the_core_lacks_in_one_line(capsys, flags, named):
    assert main(["train", "--lesson", "--no-progress", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err, err


def test_lesson_file_trains_by_itself(tmp_path, capsys):
    path = tmp_path / "pipe_sgd.py"
    assert main(["lesson-file", str(path)]) == 0
    text = path.read_text()
    assert "pipesgd_ref" not in "".join(
        line for line in text.splitlines() if line.startswith(("import", "from"))
    )
    env = {"PATH": os.environ["PATH"]}  # no PYTHONPATH: the file alone, run outside the checkout
    for extra in ([], ["--threads", "--algo=ps-sync", "--world-size=3"]):
        run = subprocess.run(
            [sys.executable, "-I", str(path), "--steps=40", *extra],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr
        assert "bit for bit: True" in run.stdout and "replicas identical: True" in run.stdout
    assert main(["lesson-file", str(path)]) == 2  # never over a file without --overwrite
    assert "--overwrite" in capsys.readouterr().err


def test_importing_the_core_loads_no_product_module():
    code = "import sys, pipesgd_ref.core; print(sorted(m for m in sys.modules if 'pipesgd_' in m))"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = [m for m in eval(run.stdout) if "editable" not in m]  # pip's editable finder
    assert loaded and all(m in ("pipesgd_ref", "pipesgd_ref.core") or m.startswith(
        "pipesgd_ref.core.") for m in loaded), loaded  # fmt: skip


@given(st.data())
def test_the_cores_ring_simulation_is_the_products(data):
    """The product's fast paths are checked against comm/schedule.py's simulation; this ties
    that simulation to the core's, so they are checked against the core too."""
    from pipesgd_ref.comm.schedule import simulate_allreduce

    p, n = data.draw(world_sizes), data.draw(lengths)
    rng = np.random.default_rng(data.draw(st.integers(0, 99)))
    arrays = [rng.normal(size=n).astype(np.float32) for _ in range(p)]
    for mine, product in zip(simulate(arrays), simulate_allreduce(arrays, "mean"), strict=True):
        assert np.array_equal(mine, product)


@pytest.mark.parametrize("algo", ["sync", "pipe"])
def test_the_products_default_path_ends_at_the_cores_weights(algo):
    """The default (--allreduce auto --transport auto: on one host the shared-memory group,
    which sums in the ring's order) ends where the core does, bit for bit."""
    from pipesgd_ref.commands.lesson import problem_of
    from pipesgd_ref.commands.train import run_training
    from pipesgd_ref.runtime.inputs import JobInputs

    cfg = TrainConfig(algo=algo, **SMALL).replace(eval_every=0)
    _, results = run_training(cfg, progress=False, log=lambda line: None)
    want = launch(problem_of(cfg, JobInputs.load(cfg)), algo)[0]["params"]
    assert all(np.array_equal(r.params, want) for r in results)
