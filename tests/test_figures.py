"""The figures README.md and the docs quote come from one place, docs/figures.json
(docs/figures.py): every quote in every page is the recorded figure, so two pages cannot
disagree; `render` rewrites inline and block quotes; `record compare` keeps a run's figures."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def figures():
    spec = importlib.util.spec_from_file_location("docs_figures", ROOT / "docs" / "figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_page_quotes_the_recorded_figures(figures, capsys):
    assert figures.render(check_only=True) == 0, capsys.readouterr().err
    quoted = {f"{e}.{f}" for p in figures.pages() for e, f, _ in figures.QUOTE.findall(
        p.read_text(encoding="utf-8"))}  # fmt: skip
    assert {"main_job.bandwidth", "main_job.table"} <= quoted
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    docs = (ROOT / "docs" / "reference" / "benchmarks.md").read_text(encoding="utf-8")
    for name in ("bandwidth", "table", "checks"):  # the same run in both
        want = figures.text_of(figures.load(), "main_job", name, block=name != "bandwidth")
        assert want in readme and want in docs, name


def test_render_rewrites_quotes_and_names_the_missing(figures):
    recorded = {"run": {"fields": {"speed": "9 Gbit/s", "table": "```text\na b\n```"}}}
    page = (
        "at <!-- fig run.speed -->1 Gbit/s<!-- /fig --> here\n"
        "<!-- fig run.table -->\n```text\nold\n```\n<!-- /fig -->\n"
        "and <!-- fig run.gone -->7<!-- /fig -->"
    )
    new, missing = figures.rendered(page, recorded)
    assert "at <!-- fig run.speed -->9 Gbit/s<!-- /fig --> here" in new
    assert "<!-- fig run.table -->\n```text\na b\n```\n<!-- /fig -->" in new
    assert missing == ["run.gone"] and "<!-- fig run.gone -->7<!-- /fig -->" in new
    assert figures.rendered(new, recorded)[0] == new  # rendering twice changes nothing


def test_record_compare_keeps_a_runs_figures(figures, tmp_path, monkeypatch):
    row = {"run": "sync", "iter_ms": 100.0, "predicted_ms": 97.9, "error": -0.03,
           "iter_speedup": 3.2, "time_to_target_s": 3.06, "steps_to_target": 30,
           "speedup_to_target": 3.15, "test_accuracy": 0.9639}  # fmt: skip
    report = {
        "kind": "compare",
        "config": {"target_accuracy": 0.96, "world_size": 4, "dataset": "digits"},
        "link": {"bandwidth_bytes_s": 922e6 / 8, "t_ar_s": 0.0604, "t_comp_s": 0.0521},
        "wall_time_s": 110.2,
        "table": [row],
        "checks": [{"text": "every run reached the target accuracy"}],
    }
    (tmp_path / "compare.json").write_text(json.dumps(report))
    monkeypatch.setattr(figures, "FIGURES", tmp_path / "figures.json")
    figures.record_compare(tmp_path, "main_job", "pipesgd compare", "abc1234")
    fields = json.loads((tmp_path / "figures.json").read_text())["main_job"]["fields"]
    assert fields["bandwidth"] == "922 Mbit/s" and fields["commit"] == "abc1234"
    assert (fields["t_ar"], fields["t_comp"], fields["wall"]) == ("60 ms", "52 ms", "110 s")
    assert "sync" in fields["table"] and "to 96% s" in fields["table"]
    assert fields["checks"] == "```text\nevery run reached the target accuracy\n```"
