"""The `pipesgd` command: the main job runs, bad input exits 2 with one clear line."""

import json
import subprocess
import sys

import pytest

from pipesgd_ref.cli import main


def test_compare_quick_runs_and_writes_results(tmp_path, capsys):
    rc = main(["compare", "--quick", "--no-progress", "--out", str(tmp_path), "--steps=60"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "sync" in out and "pipe (staleness 1)" in out
    result = json.loads((tmp_path / "compare.json").read_text())
    for run in result["runs"].values():
        assert 0.0 <= run["test_accuracy"] <= 1.0 and run["steps"] == 60
        assert len(run["loss_curve"]) == 60
    assert result["runs"]["sync"]["test_accuracy"] > 0.8, "60 sync steps on digits learn little"


def test_reference_writes_summary(tmp_path):
    out = tmp_path / "run"
    rc = main(["reference", "--preset", "tiny", "--no-progress", f"--out={out}", "--width", "2"])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["width"] == 2 and summary["config"]["model"] == "softmax"
    assert summary["steps_to_target"] is None or summary["steps_to_target"] <= summary["steps"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["reference", "--lrr=0.1"], "unknown config key 'lrr'"),
        (["reference", "--lr=-1"], "lr must be a positive finite number"),
        (["reference", "--dataset=imagenet"], "unknown dataset 'imagenet'"),
        (["reference", "--dataset=mnist:/nonexistent"], "/nonexistent"),
        (["reference", "--world-size=5000"], "larger than the training set"),
        (["reference", "--batch-size=1000"], "batch"),
        (["reference", "--preset=huge"], "unknown preset 'huge'"),
        (["reference", "--config=/nonexistent.toml"], "does not exist"),
    ],
)
def test_bad_input_exits_2_with_a_message(argv, message, capsys):
    assert main(argv + ["--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipesgd: error:") and message in err
    assert "Traceback" not in err


def test_diverging_run_is_stopped(capsys):
    rc = main(["reference", "--steps=100", "--lr=50", "--no-progress"])
    assert rc == 2
    assert "diverged" in capsys.readouterr().err


def test_python_dash_m_entry_point():
    done = subprocess.run(
        [sys.executable, "-m", "pipesgd_ref", "config", "--preset", "tiny", "--lr=0.5"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["lr"] == 0.5
