"""The `pipesgd` command: the main job runs, bad input exits 2 with one clear line."""

import json
import os
import subprocess
import sys

import pytest

from pipesgd_ref.commands.cli import main
from pipesgd_ref.config import TrainConfig


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_compare_quick_runs_and_writes_results(tmp_path, capsys):
    """The main job end to end, made cheap: a 64-32-10 MLP, 2 workers, no emulated link.
    It still calibrates this machine, runs every method, and writes compare.json."""
    from pipesgd_ref.commands.compare import quick_config
    from pipesgd_ref.timing import COMPARE_RUNS, run_label

    overrides = ["--hidden=32", "--batch-size=16", "--steps=24", "--world-size=2",
                 "--bandwidth=inf", "--latency=0", "--target-accuracy=0.1"]  # fmt: skip
    rc = main(["compare", "--quick", "--no-progress", "--out", str(tmp_path), *overrides])
    assert rc == 0
    out = capsys.readouterr().out
    assert "calibrating the timing model" in out and "timing model: median |error|" in out
    result = json.loads((tmp_path / "compare.json").read_text())
    labels = [run_label(algo, codec) for algo, codec in COMPARE_RUNS]
    assert list(result["runs"]) == labels and [r["run"] for r in result["table"]] == labels
    steps = quick_config(TrainConfig.preset("compare").replace(steps=24)).steps
    assert result["config"]["steps"] == steps < 24, "--quick: fewer steps of the same problem"
    assert result["config"]["hidden"] == [32] and result["config"]["world_size"] == 2
    for label, run in result["runs"].items():
        assert 0.0 <= run["test_accuracy"] <= 1.0 and run["steps"] == steps, label
        assert len(run["loss_curve"]) == steps, label
    for row in result["table"]:
        assert row["predicted_ms"] > 0 and row["iter_ms"] > 0, row
    assert result["checks"][0]["check"] == "every run reaches the target"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_compare_quick_default_problem_reaches_the_target(tmp_path, capsys):
    """`pipesgd compare --quick` exactly as a user types it (about a minute): the default
    problem, every method, every run at the target accuracy (the steps to it are fixed by the
    seeds: 28-30 of the 32 steps for the ring and server-sync methods, about 10 for ps-async).
    The speed ratios are printed, not asserted: they are timings on a shared machine."""
    rc = main(["compare", "--quick", "--no-progress", "--out", str(tmp_path)])
    assert rc == 0
    result = json.loads((tmp_path / "compare.json").read_text())
    assert result["checks"][0]["ok"], result["checks"][0]["text"]
    for row in result["table"]:
        assert row["time_to_target_s"] is not None, row
        assert row["test_accuracy"] >= result["config"]["target_accuracy"] - 0.02, row
    figures = {"loss_vs_time.png", "time_breakdown.png", "timeline.png",
               "predicted_vs_bandwidth.png"}  # fmt: skip
    pytest.importorskip("matplotlib")
    assert figures <= {p.name for p in tmp_path.iterdir()}, sorted(tmp_path.iterdir())


@pytest.mark.parametrize(
    "bad, words",
    [(["--bandwidth=fast"], ("bandwidth", "fast")), (["--repeats", "0"], ("repeats", "0"))],
)
def test_compare_bad_input_exits_2_with_one_line(tmp_path, capsys, bad, words):
    """Refused before anything is calibrated or run: one line, no traceback, no files."""
    rc = main(["compare", "--quick", "--no-progress", "--out", str(tmp_path / "c"), *bad])
    assert rc == 2
    captured = capsys.readouterr()
    err = captured.err
    assert err.startswith("pipesgd: error:") and all(w in err for w in words), err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "calibrating" not in captured.out and not (tmp_path / "c").exists()


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


def test_a_yes_no_field_alone_is_a_flag():
    from pipesgd_ref.commands.parser import build_parser, resolve_config, split_overrides

    argv = ["--skip-nonfinite", "--algo", "sync", "--error-feedback", "false", "--lr", "0.1",
            "--comm_first"]  # fmt: skip
    assert split_overrides(argv) == ["--skip-nonfinite=true", "--algo=sync",
                                      "--error-feedback=false", "--lr=0.1",
                                      "--comm_first=true"]  # fmt: skip
    args, rest = build_parser().parse_known_args(["train", "--skip-nonfinite", "--steps=3"])
    cfg = resolve_config(args, rest)
    assert cfg.skip_nonfinite and cfg.steps == 3


@pytest.mark.parametrize(
    "argv, named",
    [
        (["compare"], False),
        (["compare", "--quick", "--model=cnn"], False),
        (["compare", "--bandwidth", "1Gbit"], True),
        (["compare", "--bandwidth=inf"], True),
        (["compare", "--preset", "compare-cnn-compute"], True),
        (["compare", "--latency=1ms"], False),
    ],
)
def test_compare_tells_a_named_bandwidth_from_the_default(argv, named):
    """compare chooses the link's bandwidth only where neither the preset, nor --config's file,
    nor a --bandwidth names one."""
    from pipesgd_ref.commands.parser import build_parser, resolve_named

    args, rest = build_parser().parse_known_args(argv)
    cfg, keys = resolve_named(args, rest)
    assert ("bandwidth" in keys) == named, keys
    assert cfg.bandwidth == ("inf" if not named else cfg.bandwidth)


def test_a_config_files_bandwidth_is_named_too(tmp_path):
    from pipesgd_ref.commands.parser import build_parser, resolve_named

    path = tmp_path / "link.toml"
    path.write_text('bandwidth = "2Gbit"\nworld-size = 4\n')
    args, rest = build_parser().parse_known_args(["compare", "--config", str(path)])
    cfg, keys = resolve_named(args, rest)
    assert cfg.bandwidth == "2Gbit" and {"bandwidth", "world_size"} <= keys


# --- outputs: checked before the work, locked while in use, written atomically -------------

TINY_REF = ["reference", "--preset", "tiny", "--no-progress", "--steps=3"]


def test_an_earlier_run_is_kept_unless_overwrite(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*TINY_REF, f"--out={out}"]) == 0
    first = (out / "summary.json").read_text()
    assert main([*TINY_REF, f"--out={out}", "--lr=0.2"]) == 2
    err = capsys.readouterr().err
    assert "already holds an earlier run's results (summary.json)" in err and "--overwrite" in err
    assert (out / "summary.json").read_text() == first, "the refused run touched the results"
    assert main([*TINY_REF, f"--out={out}", "--lr=0.2", "--overwrite"]) == 0
    assert json.loads((out / "summary.json").read_text())["config"]["lr"] == 0.2


def test_resume_in_place_is_not_an_earlier_run(tmp_path):
    common = ["train", "--preset=tiny", "--algo=sync", "--no-progress"]
    assert main([*common, "--steps=4", f"--out={tmp_path}"]) == 0
    assert main([*common, "--steps=6", f"--out={tmp_path}", f"--resume={tmp_path}"]) == 0
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 2


def test_the_lock_is_released_and_a_stale_one_taken_over(tmp_path, capsys):
    from pipesgd_ref.outputs import LOCK_FILE, lock_out_dir

    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_FILE).write_text("999999999\n")  # left by a job that was SIGKILLed
    assert main([*TINY_REF, f"--out={out}"]) == 0
    assert not (out / LOCK_FILE).exists(), "the lock outlived its command"
    with lock_out_dir(out):  # a live job (this process) holds the folder
        assert main([*TINY_REF, f"--out={out}", "--overwrite"]) == 2
    assert f"in use by another pipesgd job (pid {os.getpid()})" in capsys.readouterr().err
    with lock_out_dir(out):  # released on exit: it can be taken again at once
        pass


def test_a_refused_run_leaves_no_folder_behind(tmp_path, capsys):
    out = tmp_path / "new" / "run"
    assert main([*TINY_REF, f"--out={out}", "--dataset=mnist:/nonexistent"]) == 2
    assert "/nonexistent" in capsys.readouterr().err
    assert not (tmp_path / "new").exists(), "the folders made for --out were left behind"


def test_prepare_file_refuses_what_cannot_be_replaced_atomically(tmp_path):
    from pipesgd_ref.errors import OutputError
    from pipesgd_ref.outputs import prepare_file

    (tmp_path / "f").write_text("x")
    os.mkfifo(tmp_path / "fifo")
    for bad, words in [(tmp_path, "is a folder"), (tmp_path / "f" / "x.json", "is under"),
                       (tmp_path / "fifo", "not a regular file"), ("", "is empty"),
                       (tmp_path / ("n" * 250), "too long")]:  # fmt: skip
        with pytest.raises(OutputError, match=words):
            prepare_file(bad, "--json")
    assert prepare_file(tmp_path / "a" / "b.json") == tmp_path / "a" / "b.json"
    assert (tmp_path / "a").is_dir() and not list((tmp_path / "a").iterdir())


def test_atomic_writes_leave_no_temporary_files(tmp_path):
    from pipesgd_ref.outputs import write_text_atomic

    write_text_atomic(tmp_path / "r.json", "1")
    write_text_atomic(tmp_path / "r.json", "2")
    assert (tmp_path / "r.json").read_text() == "2" and len(list(tmp_path.iterdir())) == 1
    pytest.importorskip("matplotlib")
    from pipesgd_ref.plots import pyplot, save_figure

    fig, ax = pyplot().subplots()
    ax.plot([0, 1])
    save_figure(fig, tmp_path / "fig.pdf")
    assert (tmp_path / "fig.pdf").read_bytes().startswith(b"%PDF")  # the format of the name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig.pdf", "r.json"]


def test_a_path_error_at_the_end_is_one_line_and_a_bug_keeps_its_traceback(monkeypatch, capsys):
    import errno

    import pipesgd_ref.commands.cli as cli

    def disk_full(*_, **__):
        raise OSError(errno.ENOSPC, "No space left on device", "/data/run/summary.json")

    monkeypatch.setattr(cli, "run_reference", disk_full)
    assert main(["reference", "--preset=tiny", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err == "pipesgd: error: /data/run/summary.json: No space left on device\n", err

    def bug(*_, **__):
        raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")

    monkeypatch.setattr(cli, "run_reference", bug)
    with pytest.raises(ConnectionResetError):
        main(["reference", "--preset=tiny", "--no-progress"])


def test_many_local_workers_need_an_override(monkeypatch):
    from pipesgd_ref.errors import ConfigError
    from pipesgd_ref.runtime.launch import ALLOW_MANY_ENV, check_local_workers, local_worker_limit

    limit = local_worker_limit()
    assert limit >= 64 and limit >= 16 * len(os.sched_getaffinity(0))
    check_local_workers(limit, allow=False, what="train")
    with pytest.raises(ConfigError, match="--allow-many-workers"):
        check_local_workers(limit + 1, allow=False, what="train")
    check_local_workers(limit + 1, allow=True, what="train")
    monkeypatch.setenv(ALLOW_MANY_ENV, "1")
    check_local_workers(limit + 1, allow=False, what="train")


def test_a_usage_error_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "allreduce", "--world-size", "two"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid int value: 'two'" in err and "usage" not in err
