"""Every figure draws a method in its own colour and line style (plots.method_style): no two
methods share a colour, every label compare, the studies and the peers draw has its entry, and
a figure of compare's keeps sync and ddp apart."""

from __future__ import annotations

import pytest

from pipesgd_ref.commands import study, study_momentum
from pipesgd_ref.plots import METHOD_STYLES, SPARE, method_style
from pipesgd_ref.timing.iteration import COMPARE_RUNS, run_label
from pipesgd_ref.torch_peer import PEERS


def test_no_two_methods_share_a_colour():
    colours = [c for c, _ in METHOD_STYLES.values()]
    assert len(set(colours)) == len(colours)
    assert not set(colours) & set(SPARE)


def test_every_label_a_figure_draws_has_its_own_style():
    drawn = {run_label(a, c) for a, c in COMPARE_RUNS} | set(PEERS)
    drawn |= {m[0] for m in study.METHODS} | {m[0] for m in study_momentum.METHODS}
    drawn |= {run_label("pipe", c) for c in ("trunc16", "bf16", "q8")}
    assert drawn <= set(METHOD_STYLES), drawn - set(METHOD_STYLES)


def test_a_label_not_listed_gets_a_spare_colour_the_same_every_time():
    style = method_style("pipe(width=3)+q8")
    assert style == method_style("pipe(width=3)+q8")
    assert style["color"] in SPARE and style["linestyle"] not in ("-", "--", ":", "-.")


def test_compares_loss_figure_draws_sync_and_ddp_apart():
    pytest.importorskip("matplotlib")
    from types import SimpleNamespace

    from pipesgd_ref.commands.compare_figures import _loss_figure
    from pipesgd_ref.plots import pyplot

    curve = {"loss_curve": [{"wall_time_s": 0.1, "loss": 1.0}, {"wall_time_s": 0.2, "loss": 0.5}],
             "eval_curve": [{"wall_time_s": 0.2, "test_accuracy": 0.9}]}  # fmt: skip
    plt = pyplot()
    fig = _loss_figure(plt, {"sync": curve, "ddp": curve}, SimpleNamespace(target_accuracy=0.9))
    try:
        for ax in fig.axes:
            lines = {ln.get_label(): ln for ln in ax.get_lines()}
            sync, ddp = lines["sync"], lines["ddp"]
            assert sync.get_color() != ddp.get_color()
            assert sync.get_linestyle() != ddp.get_linestyle()
    finally:
        plt.close(fig)
