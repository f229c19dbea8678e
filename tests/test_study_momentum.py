"""`pipesgd compare --study staleness` (commands/study_momentum.py): the ResNet with batch norm at
momentum 0 and 0.9, every run its oracle's (running statistics included), ddp within float
rounding of sync, the effective-step grid, the command line's own keys kept, the SAPipe table
with their figures labelled as theirs. Small sizes: the full study is the tutorial's and
RESULTS.md's."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipesgd_ref.commands.cli import main
from pipesgd_ref.commands.study_momentum import (
    MOMENTA,
    PROBLEM,
    QUICK_PROBLEM,
    SAPIPE,
    command_line_keys,
    ddp_average,
    effective_curvature,
    format_sapipe,
    momenta_of,
    sapipe_rows,
    study_config,
    theory_bounds,
)
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.methods.optimizer import SGD
from pipesgd_ref.methods.reference import average_gradient, delayed_sgd, model_grad_fn
from pipesgd_ref.runtime.worker import Worker

TINY = ["--steps=4", "--batch-size=8", "--eval-every=0"]


@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory):
    """The quick study cut to 4 steps of batch 8 at one effective step: (its study.json, what
    it printed, its folder)."""
    import contextlib
    import io

    out = tmp_path_factory.mktemp("study") / "momentum"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        rc = main(["compare", "--study", "staleness", "--quick", "--no-progress", *TINY,
                   "--lrs", "0.6", f"--out={out}"])  # fmt: skip
    assert rc == 0
    return json.loads((out / "study.json").read_text()), printed.getvalue(), out


def test_every_method_runs_at_every_effective_step_and_momentum(tiny_study):
    report, text, out = tiny_study
    assert report["momenta"] == list(MOMENTA) and report["effective_lrs"] == [0.6]
    assert report["methods"] == ["sync", "ddp", "pipe", "pipe+dc", "pipe+predict"]
    seen = {(r["method"], r["momentum"], r["effective_lr"]) for r in report["rows"]}
    assert seen == {(m, mo, e) for m in report["methods"] for mo in MOMENTA for e in (0.6,)}
    for r in report["rows"]:  # lr = eta (1 - M), and every field study.py's runs keep
        assert r["lr"] == pytest.approx(r["effective_lr"] * (1 - r["momentum"]), rel=1e-12)
        assert {"test_accuracy", "diverged", "steps_to_target", "time_to_target_s"} <= set(r)
    # the command line's --steps and --batch-size, the quick problem's resnet for the rest
    cfg = report["config"]
    assert (cfg["steps"], cfg["batch_size"], cfg["model"]) == (4, 8, "resnet")
    assert (cfg["depth"], cfg["channels"]) == (QUICK_PROBLEM["depth"], [4, 8, 16])
    assert "momentum 0.9: final test accuracy after 4 steps" in text
    theirs = next(line for line in text.splitlines() if line.startswith("theirs: ResNet-50"))
    assert theirs.split()[-4:] == ["93.2", "89.3", "93.2", "-"], theirs


def test_ddp_ends_within_float_rounding_of_sync(tiny_study):
    """After 1 step and after the last (4), at both momenta: ddp's weights within float32
    rounding of sync's, held at the steps of gap_steps."""
    report, text, _ = tiny_study
    gaps = [r["weights_gap_to_sync"] for r in report["rows"] if r["method"] == "ddp"]
    assert len(gaps) == 2 and all([s for s, _ in g] == [1, 4] for g in gaps), gaps
    assert all(0 <= gap < 1e-5 for g in gaps for _, gap in g), gaps
    for b in report["blocks"]:
        assert set(b["ddp_vs_sync"]["weights_gap_by_step"]) == {"1", "4"}
    assert "ddp against sync (the same update" in text


def test_a_row_is_its_oracle_with_the_running_statistics(tiny_study):
    """pipe+predict at momentum 0.9: delayed_sgd with heavy ball, worker 0's forward passes
    updating the running statistics, evaluated with them; the row's accuracy is that one."""
    report, _, _ = tiny_study
    row = next(r for r in report["rows"] if r["method"] == "pipe+predict" and r["momentum"])
    cfg = TrainConfig(**{**report["config"], "momentum": 0.9, "lr": row["lr"]})
    w = Worker.build(cfg, 0, cfg.world_size)
    buffers = w.model.init_buffers()
    grad_fn = model_grad_fn(w.model, w.data, w.sampler, buffers)
    traj = delayed_sgd(grad_fn, w.params, cfg.world_size, cfg.steps, w.lr_at, staleness=1,
                       compensation="predict", optimizer=SGD(0.9))  # fmt: skip
    assert buffers.any() and not np.array_equal(buffers, w.model.init_buffers())
    acc = w.model.accuracy(traj.params, w.data.X_test, w.data.y_test, buffers=buffers)
    assert row["test_accuracy"] == acc


def test_the_figure_is_written(tiny_study):
    pytest.importorskip("matplotlib")
    assert (tiny_study[2] / "momentum_study.png").stat().st_size > 10_000


def test_ddp_average_sums_bucket_by_bucket_as_the_ring_does():
    """Two workers: a + b in every chunk, bitwise the rank-order mean; four: within float32
    rounding of it (the ring adds in another order)."""
    for p, exact in ((2, True), (4, False)):
        cfg = study_config(TrainConfig.preset("compare"), set(), quick=True).replace(world_size=p)
        w = Worker.build(cfg, 0, p)
        grad_fn = model_grad_fn(w.model, w.data, w.sampler)
        loss, mean = ddp_average(cfg)(grad_fn, w.params, p, 0)
        want_loss, want = average_gradient(grad_fn, w.params, p, 0)
        assert loss == pytest.approx(want_loss)
        if exact:
            np.testing.assert_array_equal(mean, want)
        np.testing.assert_allclose(mean, want, rtol=1e-5, atol=1e-7)


def test_the_command_line_keys_are_its_own_not_the_presets(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("depth = 14\n")
    argv = ["compare", "--study", "staleness", "--steps", "50", "--channels=4,8,8", "--quick",
            "--config", str(f), "--out", "x", "--no-progress"]  # fmt: skip
    assert command_line_keys(argv) == {"steps", "channels", "depth"}
    cfg = TrainConfig.preset("compare").replace(
        model="resnet", steps=50, channels=(4, 8, 8), depth=14
    )
    got = study_config(cfg, command_line_keys(argv))
    assert (got.steps, got.channels, got.depth) == (50, (4, 8, 8), 14)
    assert (got.model, got.batch_size, got.lr_schedule) == ("resnet", 32, "cosine")
    assert study_config(TrainConfig.preset("compare"), set()).steps == PROBLEM["steps"]


@pytest.mark.parametrize(
    "extra, model, preset_lr",
    [
        ([], "resnet", 0.1),  # no model named: the deep net, from compare-resnet
        (["--model=resnet"], "resnet", 0.1),
        (["--model=mlp"], "mlp", 0.03),  # the MLP's plain-SGD sweep, from compare
        (["--config", "FILE"], "mlp", 0.03),  # a model named in --config's file counts
        (["--channels=4,8,8"], "resnet", 0.1),  # three widths: a ResNet's, no kernels asked
    ],
)
def test_the_study_trains_the_deep_net_unless_another_model_is_named(
    extra, model, preset_lr, tmp_path
):
    from pipesgd_ref.commands.parser import build_parser, resolve_named

    f = tmp_path / "c.toml"
    f.write_text('model = "mlp"\n')
    argv = ["compare", "--study", "staleness", *[str(f) if a == "FILE" else a for a in extra]]
    cfg, _ = resolve_named(*build_parser().parse_known_args(argv))
    assert (cfg.model, cfg.lr) == (model, preset_lr)
    plain, _ = resolve_named(*build_parser().parse_known_args(["compare"]))
    assert plain.model == "mlp"  # without --study, compare's own preset


def test_momentum_names_the_second_momentum():
    cfg = TrainConfig.preset("compare")
    assert momenta_of(cfg, set()) == MOMENTA == (0.0, 0.9)
    assert momenta_of(cfg.replace(momentum=0.5), {"momentum"}) == (0.0, 0.5)
    assert momenta_of(cfg, {"momentum"}) == (0.0,)


@settings(max_examples=50)
@given(lam=st.floats(1e-3, 1e3), m=st.floats(0.0, 0.99))
def test_in_effective_steps_pipes_edge_does_not_move_with_the_momentum(lam, m):
    """lr/(1-M) < 1/lam at staleness one for every M; sync's widens by (1+M)/(1-M)."""
    b = theory_bounds(lam, m)
    assert b["pipe"] / (1 - m) == pytest.approx(1 / lam, rel=1e-9)
    assert b["sync"] / (1 - m) == pytest.approx(2 * (1 + m) / (1 - m) / lam, rel=1e-9)
    assert theory_bounds(None, m) == {} == theory_bounds(-lam, m)


def rows_of(momentum: float, table: dict) -> list[dict]:
    """Made-up rows: {method: [accuracy or None (diverged) per lr]} at lrs 0.1, 0.2, 0.4."""
    return [
        {"method": k, "momentum": momentum, "lr": lr, "diverged": a is None, "test_accuracy": a}
        for k, accs in table.items()
        for lr, a in zip((0.1, 0.2, 0.4), accs, strict=True)
    ]


def test_sapipes_columns_are_read_at_syncs_best_lr_and_at_each_ones_best():
    rows = rows_of(0.9, {"sync": [0.9, 0.95, 0.95], "pipe": [0.9, 0.5, None],
                         "pipe+predict": [0.9, 0.94, 0.93]})  # fmt: skip
    at_sync, own, recipe = sapipe_rows([{"momentum": 0.9, "rows": rows}])
    assert at_sync["lr"] == 0.2  # the smallest of sync's best (a tie at 0.2 and 0.4)
    assert (at_sync["sync"], at_sync["pipe"], at_sync["pipe+predict"]) == (0.95, 0.5, 0.94)
    assert own["lr"] is None and (own["pipe"], own["pipe+predict"]) == (0.9, 0.94)
    assert recipe["lr"] == 0.1 and recipe["pipe"] == 0.9  # SAPipe's lr 0.1 at M 0.9
    assert len(sapipe_rows([{"momentum": 0.0, "rows": rows_of(0.0, {"sync": [1, 1, 1]})}])) == 2
    theirs = {"source": "S", "figures": SAPIPE}
    report = {"model": "resnet-8 4,8,16", "config": {"dataset": "digits"},
              "sapipe": [at_sync, own], "sapipe_theirs": theirs}  # fmt: skip
    text = format_sapipe(report)
    ours = next(line for line in text.splitlines() if line.startswith("ours, M 0.9, sync's"))
    assert ours.split()[-4:] == ["95.0", "50.0", "94.0", "-"] and "best lr: 0.2 " in ours
    assert "theirs: VGG-16, CIFAR-10, M 0.9" in text and "92.6" in text


def test_the_effective_curvature_comes_from_syncs_lowest_measured_edge():
    """sync at M = 0 trains to 0.2 and fails at 0.4: lam_eff = 2 / 0.2; an edge at the grid's
    top (M = 0.9 here) says only that it lies beyond, so it is not used."""
    from pipesgd_ref.commands.study import edges

    blocks = []
    for m, accs in ((0.9, [0.9, 0.9, 0.9]), (0.0, [0.9, 0.9, None])):
        rows = rows_of(m, {"sync": accs})
        blocks.append({"momentum": m, "rows": rows, "edges": edges(rows)})
    got = effective_curvature(blocks)
    assert got == {"lam_eff": pytest.approx(10.0), "from_momentum": 0.0, "sync_edge": 0.2}
    assert effective_curvature(blocks[:1])["lam_eff"] is None


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--repeats", "3"], ["--study staleness", "--repeats"]),
        (["--lrs", "0.6,fast"], ["--lrs", "fast"]),
        (["--lrs", "0.6,0.6"], ["more than once"]),
    ],
)
def test_a_bad_option_of_the_momentum_study_is_one_line(extra, words, tmp_path, capsys):
    rc = main(["compare", "--study", "staleness", "--quick", *extra, f"--out={tmp_path}/x"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and all(w in err[0] for w in words), err


def test_ddp_against_sync_is_read_where_sync_trains():
    """Past sync's edge both runs are chaotic: the weights gap and the accuracy spread are
    taken at the lrs up to the edge only."""
    from pipesgd_ref.commands.study_momentum import ddp_line, ddp_vs_sync

    rows = rows_of(0.9, {"sync": [0.9, 0.95, 0.1], "ddp": [0.91, 0.93, 0.3]})
    gaps = ([[1, 1e-7], [3, 0.01]], [[1, 2e-7], [3, 0.2]], [[1, 5.0]])  # ddp at 0.1, 0.2, 0.4
    for r, gap in zip(rows[3:], gaps, strict=True):
        r["weights_gap_to_sync"] = gap
    got = ddp_vs_sync(rows, sync_edge=0.2)
    assert got["lrs"] == [0.1, 0.2] and got["weights_gap_by_step"] == {"1": 2e-7, "3": 0.2}
    assert got["max_accuracy_gap"] == pytest.approx(0.02)
    assert "at lr <= 0.2" in ddp_line(got) and "up to 2.0 points" in ddp_line(got)
    assert ddp_vs_sync(rows, sync_edge=None) is None
    assert ddp_vs_sync(rows[:3], sync_edge=0.2) is None  # no ddp rows
