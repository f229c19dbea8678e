"""Staleness compensation (methods/compensation.py) and bounded staleness: the distributed
runs against their one-process oracles, and the stability bounds of the module docstring on
both sides, on random quadratics."""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from oracles import oracle_inputs, use_ring_order

from pipesgd_ref.config import TrainConfig
from pipesgd_ref.methods.compensation import (
    DelayCompensation,
    predicted_weights,
    stability_bound,
)
from pipesgd_ref.methods.pipe import pipe_worker
from pipesgd_ref.methods.ps import ps_async_worker
from pipesgd_ref.methods.reference import async_ps_sgd, delayed_sgd, model_grad_fn
from pipesgd_ref.runtime.launch import launch_local
from pipesgd_ref.runtime.worker import Worker

TINY = TrainConfig.preset("tiny").replace(model="mlp", hidden=(8,), steps=20)


def pipe_oracle(cfg: TrainConfig, monkeypatch=None):
    """delayed_sgd with cfg's compensation; with monkeypatch, the mean in the ring's order of
    additions (bitwise the ring at any p)."""
    if monkeypatch is not None:
        use_ring_order(monkeypatch)
    grad_fn, w0 = oracle_inputs(cfg, cfg.world_size)
    return delayed_sgd(grad_fn, w0, cfg.world_size, cfg.steps, cfg.lr_at,
                       staleness=cfg.width - 1, warmup_steps=cfg.warmup_steps,
                       compensation=cfg.compensation, dc_lambda=cfg.dc_lambda)  # fmt: skip


# --- the distributed runs equal their oracles --------------------------------------------------


@pytest.mark.timeout(180)
@pytest.mark.parametrize("compensation", ["dc", "dc-adaptive", "predict"])
@pytest.mark.parametrize(
    "p,width,warmup",
    [
        pytest.param(1, 2, 0, marks=pytest.mark.slow),
        pytest.param(2, 2, 0, marks=pytest.mark.slow),
        (2, 3, 2),
        (3, 2, 1),
    ],
)
def test_compensated_pipe_equals_its_oracle(compensation, p, width, warmup, monkeypatch):
    """Pipe-SGD with each compensation: the replicas bitwise identical, and bitwise the oracle
    (p <= 2: the plain oracle; p = 3: the oracle that sums in the ring's order). dc's lambda
    is raised so the correction is far from negligible."""
    cfg = TINY.replace(world_size=p, width=width, warmup_steps=warmup, compensation=compensation,
                       dc_lambda=2.0 if compensation == "dc" else 0.04, lr=0.3)  # fmt: skip
    results = launch_local(p, pipe_worker, (cfg,), start_method="fork", timeout=20)
    for r in results:
        np.testing.assert_array_equal(r.params, results[0].params, err_msg=f"rank {r.rank}")
    want = pipe_oracle(cfg, monkeypatch if p > 2 else None)
    np.testing.assert_array_equal(results[0].params, want.params, err_msg=compensation)
    np.testing.assert_allclose(np.mean([r.losses for r in results], axis=0), want.losses,
                               rtol=1e-5)  # fmt: skip
    grad_fn, w0 = oracle_inputs(cfg, p)
    plain = delayed_sgd(grad_fn, w0, p, cfg.steps, cfg.lr_at, staleness=width - 1,
                        warmup_steps=warmup)  # fmt: skip
    assert not np.array_equal(plain.params, want.params), "the compensation changed nothing"


def test_the_oracle_without_compensation_is_unchanged():
    """compensation='none' is delayed SGD as before; dc with lambda 0 is too (bitwise: the
    correction adds exact zeros)."""
    cfg = TINY.replace(world_size=2)
    grad_fn, w0 = oracle_inputs(cfg, 2)
    plain = delayed_sgd(grad_fn, w0, 2, 15, 0.2, staleness=1)
    zero = delayed_sgd(grad_fn, w0, 2, 15, 0.2, staleness=1, compensation="dc", dc_lambda=0.0)
    np.testing.assert_array_equal(plain.params, zero.params)


def test_dc_and_predict_by_hand():
    """The formulas of the module docstring, element by element."""
    g = np.array([1.0, -2.0, 0.5], np.float32)
    w_now, w_then = np.array([1.0, 1.0, 1.0], np.float32), np.array([0.5, 2.0, 1.0], np.float32)
    got = DelayCompensation("dc", 0.5, 3).correct(g, w_now, w_then)
    np.testing.assert_allclose(got, g + 0.5 * g * g * (w_now - w_then))
    ada = DelayCompensation("dc-adaptive", 0.5, 3)
    got = ada.correct(g, w_now, w_then)
    ms = 0.05 * g * g
    np.testing.assert_allclose(ada.mean_square, ms, rtol=1e-6)
    np.testing.assert_allclose(got, g + 0.5 / np.sqrt(ms + 1e-7) * g * g * (w_now - w_then),
                               rtol=1e-5)  # fmt: skip
    out = np.empty(3, np.float32)
    np.testing.assert_allclose(predicted_weights(w_now, [(0.1, g), (0.2, g)], out),
                               w_now - 0.1 * g - 0.2 * g, rtol=1e-6)  # fmt: skip


# --- ps-async: bounded staleness and delay compensation --------------------------------------


@pytest.mark.timeout(180)
@pytest.mark.parametrize("max_staleness,compensation", [(0, "none"), (1, "none"), (-1, "dc"),
                                                        (1, "dc-adaptive")])  # fmt: skip
def test_ps_async_equals_its_oracle_in_the_recorded_order(max_staleness, compensation):
    """ps-async with --max-staleness S and/or dc: the server's weights bitwise the oracle's
    replay of the recorded arrival order, the staleness list equal, and no update staler than
    the bound allows: while a worker computes at clock c the slowest is at c - S or later, and
    every other worker can push from its clock (c - S at least) up to c + S + 1 before the
    bound holds it, so at most (p - 1)(2S + 1) updates come between its pull and its push."""
    p = 3
    cfg = TINY.replace(algo="ps-async", world_size=p, width=1, max_staleness=max_staleness,
                       compensation=compensation, dc_lambda=1.0)  # fmt: skip
    results = launch_local(p + 1, ps_async_worker, (cfg,), start_method="fork", timeout=20,
                           star=True)  # fmt: skip
    server = results[0]
    order = server.extra["arrival_order"]
    grad_fn, w0 = oracle_inputs(cfg, p)
    want = async_ps_sgd(grad_fn, w0, p, order, cfg.lr_at, compensation=compensation,
                        dc_lambda=cfg.dc_lambda,
                        max_staleness=None if max_staleness < 0 else max_staleness)  # fmt: skip
    np.testing.assert_array_equal(server.params, want.params)
    assert server.extra["staleness"] == want.staleness
    if max_staleness >= 0:
        assert max(want.staleness) <= (p - 1) * (2 * max_staleness + 1), want.staleness
    if max_staleness == 0:  # lockstep: every round of p pushes is one step of every worker
        for k in range(cfg.steps):
            assert sorted(order[k * p : (k + 1) * p]) == list(range(p)), order


def test_ssp_oracle_refuses_an_order_the_server_cannot_see():
    cfg = TINY.replace(world_size=2)
    grad_fn, w0 = oracle_inputs(cfg, 2)
    with pytest.raises(ValueError, match="held back"):
        async_ps_sgd(grad_fn, w0, 2, [0, 0, 1], 0.1, max_staleness=0)
    lockstep = async_ps_sgd(grad_fn, w0, 2, [0, 1, 1, 0, 0, 1], 0.1, max_staleness=0)
    assert lockstep.staleness == [0, 1, 0, 1, 0, 1]


# --- stability on quadratics -----------------------------------------------------------------
#
# Along each eigenvector of A the noise-free iterates follow the recurrences of
# compensation.py's docstring; x = lr * lam_max. Just inside a bound (x = (1 - d) * bound) the
# distance to the optimum shrinks by 1e-3 or more; just outside (x = (1 + d) * bound) it grows
# 100-fold. The start is close to the optimum (1e-6) so that dc's g * g term, of third order,
# stays negligible: its bound is the linearisation's, a local one.

BOUNDS = {"sync": 2.0, "pipe": 1.0, "dc": 1.0, "dc-adaptive": 1.0, "predict": 2.0}


def quadratic(dim: int, seed: int, lam_max: float, cond: float, p: int = 1, noise: float = 0.0):
    """(grad_fn, A, w_star): f = 1/2 (w - w*)^T A (w - w*), A = Q diag(lam) Q^T with lam in
    [lam_max / cond, lam_max] and lam_max among them; with noise, worker r's gradient at step t
    has noise * (a fixed normal draw of (seed, r, t)) added."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((dim, dim)))
    lams = np.concatenate([[lam_max], rng.uniform(lam_max / cond, lam_max, dim - 1)])
    A = (q * lams) @ q.T
    w_star = rng.standard_normal(dim)

    def grad_fn(w, rank, step):
        g = A @ (w - w_star)
        if noise:
            g = g + noise * np.random.default_rng((seed, rank, step)).standard_normal(dim)
        return 0.5 * float((w - w_star) @ A @ (w - w_star)), g

    return grad_fn, A, w_star


def distances(variant, grad_fn, A, w_star, w0, lr, steps, p=1, c=1.0):
    """||w_t - w*|| along the run of `variant` (sync, pipe or a compensation of staleness 1)."""
    seen = []
    kwargs = {}
    if variant == "sync":
        kwargs["staleness"] = 0
    else:
        kwargs["staleness"] = 1
        if variant != "pipe":
            kwargs["compensation"] = variant
        if variant == "dc-exact":
            kwargs |= {"curvature": lambda v: A @ v, "dc_lambda": c}
    delayed_sgd(grad_fn, w0, p, steps, lr, drain=False,
                callback=lambda t, w, loss: seen.append(np.linalg.norm(w - w_star)),
                **kwargs)  # fmt: skip
    return np.array(seen)


@settings(max_examples=15, deadline=None)
@given(
    variant=st.sampled_from(sorted(BOUNDS) + ["dc-exact"]),
    c=st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]),
    dim=st.integers(1, 5),
    seed=st.integers(0, 10_000),
    lam_max=st.floats(0.1, 10.0),
    cond=st.floats(1.0, 20.0),
)
def test_each_variant_is_stable_just_inside_its_bound_and_not_outside(variant, c, dim, seed,
                                                                      lam_max, cond):  # fmt: skip
    bound = stability_bound(variant, c) if variant == "dc-exact" else BOUNDS[variant]
    assert bound == stability_bound(variant, c)
    grad_fn, A, w_star = quadratic(dim, seed, lam_max, cond)
    rng = np.random.default_rng(seed + 1)
    w0 = w_star + 1e-6 * rng.standard_normal(dim)
    start = np.linalg.norm(w0 - w_star)
    d = 0.1
    inside = distances(variant, grad_fn, A, w_star, w0, (1 - d) * bound / lam_max, 600, c=c)
    assert inside[-1] <= 1e-3 * start, f"{variant} (c={c}): {inside[-1] / start:.2e} of the start"
    outside = distances(variant, grad_fn, A, w_star, w0, (1 + d) * bound / lam_max, 600, c=c)
    assert outside.max() >= 100 * start, f"{variant} (c={c}) outside: at most {outside.max():.2e}"


def test_the_derived_bounds():
    assert stability_bound("pipe") == 1.0 and stability_bound("sync") == 2.0
    assert stability_bound("dc-exact", 0.0) == 1.0 and stability_bound("dc-exact", 1.0) == 2.0
    assert stability_bound("dc-exact", 0.75) == pytest.approx(4.0)
    with pytest.raises(ValueError):
        stability_bound("dc-exact", 1.5)


@settings(max_examples=12, deadline=None)
@given(
    dim=st.integers(2, 6),
    seed=st.integers(0, 10_000),
    x=st.floats(0.05, 0.6),
    cond=st.floats(1.0, 4.0),
)
def test_compensated_variants_reach_the_optimum_wherever_plain_staleness_does(dim, seed, x,
                                                                              cond):  # fmt: skip
    """Strongly convex, noisy gradients (4 workers, each its own noise): wherever plain staleness
    one ends within TOL of the optimum (a start at distance about sqrt(dim)), dc, dc-adaptive
    and predict do too."""
    tol = 0.05
    grad_fn, A, w_star = quadratic(dim, seed, 1.0, cond, p=4, noise=0.01)
    w0 = np.zeros(dim)
    lr = x  # lam_max = 1

    def final(variant):
        return distances(variant, grad_fn, A, w_star, w0, lr, 400, p=4)[-20:].mean()

    plain = final("pipe")
    assume(plain <= tol)
    for variant in ("dc", "dc-adaptive", "predict"):
        got = final(variant)
        assert got <= tol, f"{variant}: {got:.3g} from the optimum where plain ends {plain:.3g}"


def test_the_timing_model_charges_each_compensation_its_passes():
    """Pipe's compute thread pays the passes (compensation_passes) at gamma per byte: the
    prediction grows by exactly that where the compute thread is the bound."""
    from pipesgd_ref.timing import Calibration, compensation_passes, pipe

    cal = Calibration(n_params=1_000_000, t_comp=0.05, t_update=0.001, alpha=1e-5,
                      bandwidth=1e12, gamma=1e-10, copy=0.0, cores=8)  # fmt: skip
    base = pipe(4, cal).iter_time_s
    for kind, passes in (("dc", 6), ("dc-adaptive", 12), ("predict", 4)):
        assert compensation_passes(kind) == passes
        got = pipe(4, cal, compensation=kind).iter_time_s
        assert got == pytest.approx(base + passes * 1e-10 * 4_000_000), kind
    assert compensation_passes("predict", width=3) == 6


@pytest.mark.timeout(120)
def test_resuming_a_compensated_run(tmp_path, capsys):
    """The final checkpoint of a compensated run (nothing in flight) resumes with a fresh fill;
    a mid-run one (gradients in flight, whose kept weights or local gradients a checkpoint
    does not hold) is refused in one line."""
    from pipesgd_ref.commands.cli import main
    from pipesgd_ref.runtime import checkpoint

    args = ["train", "--preset=tiny", "--algo=pipe", "--compensation=dc", "--no-progress"]
    rc = main([*args, "--steps=10", f"--out={tmp_path / 'a'}"])
    assert rc == 0
    rc = main([*args, "--steps=14", f"--resume={tmp_path / 'a'}", f"--out={tmp_path / 'b'}"])
    assert rc == 0, capsys.readouterr().err
    cfg = TrainConfig.preset("tiny").replace(algo="pipe", compensation="dc", steps=10)
    w = Worker.build(cfg, 0, cfg.world_size).params
    checkpoint.save(tmp_path / "mid", cfg, w, 6, {5: np.zeros_like(w)})
    capsys.readouterr()
    rc = main([*args, "--steps=10", f"--resume={tmp_path / 'mid'}", f"--out={tmp_path / 'c'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "in flight" in err[0] and "final" in err[0], err


# --- the study (study.py) at a small size ----------------------------------------------------


@pytest.mark.timeout(180)
def test_the_staleness_study_at_a_small_size(tmp_path, capsys):
    """`pipesgd compare --study staleness --model mlp` on a small MLP: every method at every
    lr, each row the oracle's run (the pipe rows bitwise delayed_sgd's weights' accuracy), the
    table, the edges and study.json; with matplotlib, the figure."""
    import json

    from pipesgd_ref.commands.cli import main

    out = tmp_path / "study"
    rc = main(["compare", "--study", "staleness", "--model=mlp", "--no-progress", "--hidden=16",
               "--world-size=2", "--steps=12", "--eval-every=4", "--target-accuracy=0.3",
               "--lrs", "0.1,0.5,5000", f"--out={out}"])  # fmt: skip
    assert rc == 0
    text = capsys.readouterr().out
    assert "final test accuracy after 12 steps" in text and "measured edge" in text, text
    report = json.loads((out / "study.json").read_text())
    assert report["lrs"] == [0.1, 0.5, 5000.0] and report["lam_max"] > 0
    assert {(r["method"], r["lr"]) for r in report["rows"]} == {
        (m, lr) for m in report["methods"] for lr in (0.1, 0.5, 5000.0)
    }
    by = {(r["method"], r["lr"]): r for r in report["rows"]}
    assert by[("sync", 5000.0)]["diverged"] and by[("pipe", 5000.0)]["diverged"]
    assert report["edges"]["sync"] == 0.5
    from pipesgd_ref.commands.study import run_one

    cfg = TrainConfig.preset("compare").replace(hidden=(16,), world_size=2, steps=12,
                                                eval_every=4, target_accuracy=0.3)  # fmt: skip
    w = Worker.build(cfg.replace(lr=0.5), 0, 2)
    grad_fn = model_grad_fn(w.model, w.data, w.sampler)
    want = delayed_sgd(grad_fn, w.params, 2, 12, 0.5, staleness=1, compensation="predict")
    acc = w.model.accuracy(want.params, w.data.X_test, w.data.y_test)
    assert (
        by[("pipe+predict", 0.5)]["test_accuracy"]
        == acc
        == run_one(cfg, 2, "predict", 0.5)["test_accuracy"]
    )
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (out / "staleness_study.png").stat().st_size > 10_000


@settings(max_examples=40, deadline=None)
@given(p=st.integers(2, 4), bound=st.integers(0, 2), seed=st.integers(0, 10_000))
def test_the_ssp_staleness_bound_holds_for_any_arrival_order(p, bound, seed):
    """Random arrival orders the server can see (a held-back worker never arrives): every
    update is at most (p - 1)(2S + 1) updates stale, and the worker clocks never spread by more
    than S + 1 (a worker is held once it is S + 1 ahead)."""
    rng = np.random.default_rng(seed)
    steps = 12
    clocks, held, order = [0] * p, set(), []
    for _ in range(p * steps):
        free = [r for r in range(p) if r not in held and clocks[r] < steps]
        r = int(rng.choice(free))
        order.append(r)
        clocks[r] += 1
        assert max(clocks) - min(clocks) <= bound + 1
        held.add(r)
        held = {h for h in held if clocks[h] - min(clocks) > bound}

    def grad_fn(w, rank, step):
        return 0.0, np.ones_like(w)

    traj = async_ps_sgd(grad_fn, np.zeros(1), p, order, 0.1, max_staleness=bound)
    assert max(traj.staleness) <= (p - 1) * (2 * bound + 1), (order, traj.staleness)


@pytest.mark.parametrize("compensation, dc_lambda, first", [
    ("dc", 1e300, "Lower --dc-lambda (now 1e+300"), ("dc-adaptive", 5.0, "Lower --dc-lambda"),
    ("dc", 0.04, "Lower --lr (now 0.1)"), ("none", 0.04, "Lower --lr (now 0.1)"),
])  # fmt: skip
def test_the_divergence_advice_names_dc_lambda_when_its_correction_is_large(
    compensation, dc_lambda, first
):
    """A delay compensation weighed far above the default blows up before the step size does
    (issue 29, 19): the advice names --dc-lambda first."""
    from pipesgd_ref.config import TrainConfig
    from pipesgd_ref.runtime.worker import diverged

    cfg = TrainConfig(compensation=compensation, dc_lambda=dc_lambda)
    message = str(diverged("worker 0", "the training loss is nan at step 2", cfg))
    assert message.startswith("worker 0: the training loss is nan at step 2; the run diverged.")
    assert f"diverged. {first}" in message
