"""Issue 41: every file the product reads that a user can break (a --config file, a --resume
checkpoint, an AllReduce models file at bench's --fit target) is checked when it is read, and
a bad one is one line naming the file and what is wrong, exit status 2, no traceback, before
any worker starts. Each case runs the CLI entry in this process: a few milliseconds each."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pipesgd_ref.commands.cli import main

TINY = ["--preset=tiny", "--no-progress", "--steps=2"]


def _one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def _config(tmp_path: Path, kind: str) -> Path:
    """A --config file broken one way."""
    name = {"wrong types json": "c.json", "not an object": "c.json"}.get(kind, "c.toml")
    path = tmp_path / name
    if kind == "directory":
        path.mkdir()
    elif kind == "symlink into /proc":
        path.symlink_to("/proc/self/status")  # a regular file to stat, whatever a read gives
    elif kind == "huge":
        path.write_text("# a comment\n" * 100_000)  # 1.2 MB of valid TOML
    else:
        path.write_text(
            {
                "empty": "",
                "blank": "\n  \n",
                "truncated": "lr = 0.1\nsteps =",
                "wrong types": 'lr = "fast"\n',
                "wrong types json": '{"steps": [1]}',
                "unknown key": "learning_rate = 0.1\n",
                "not an object": "[1, 2]",
            }[kind]
        )
    return path


@pytest.mark.parametrize(
    "kind, words",
    [
        ("empty", "is empty; write the keys to set in it, or drop --config"),
        ("blank", "is empty"),
        ("truncated", "is not valid toml"),
        ("wrong types", ": config key 'lr' expects a number, got 'fast'"),
        ("wrong types json", ": config key 'steps' expects an integer, got [1]"),
        ("unknown key", ": unknown config key 'learning_rate'"),
        ("not an object", ": expected a table of keys at the top"),
        ("directory", "is a directory; --config takes a .toml or .json file"),
        ("symlink into /proc", "a file the kernel makes up as it is read, not a config file"),
        ("huge", "is over 1 MiB: not a config file"),
    ],
)
def test_a_broken_config_file_is_one_line_naming_it(kind, words, tmp_path, capsys):
    path = _config(tmp_path, kind)
    assert main(["train", *TINY, f"--config={path}", f"--out={tmp_path / 'out'}"]) == 2
    err = _one_line(capsys)
    assert err.startswith(f"pipesgd: error: config file {str(path)!r}"), err
    assert words in err, err
    assert not (tmp_path / "out").exists()


def _checkpoint(tmp_path: Path, kind: str) -> Path:
    """A --resume folder whose checkpoint.npz is broken one way."""
    folder = tmp_path / "run"
    folder.mkdir()
    path = folder / "checkpoint.npz"
    if kind == "a folder":
        path.mkdir()
    elif kind == "a FIFO":
        os.mkfifo(path)  # np.load would block on it for ever
    elif kind == "symlink into /proc":
        path.symlink_to("/proc/self/status")
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        path.write_bytes(b"PK\x03\x04" + b"\0" * 40)
    elif kind == "not an npz":
        path.write_text(json.dumps({"params": [1.0]}))
    return folder


@pytest.mark.parametrize(
    "kind, words",
    [
        ("a folder", "its checkpoint.npz is not a regular file (a folder, a FIFO or a device)"),
        ("a FIFO", "its checkpoint.npz is not a regular file"),
        ("symlink into /proc", "a file the kernel makes up as it is read, not a checkpoint"),
        ("empty", "checkpoint.npz is empty (0 bytes)"),
        ("truncated", "checkpoint.npz is truncated or corrupt"),
        ("not an npz", "checkpoint.npz is"),
    ],
)
def test_a_broken_checkpoint_is_one_line_naming_it_once_per_job(kind, words, tmp_path, capsys):
    """Two ranks: still one line (the launcher reads it before any worker starts)."""
    folder = _checkpoint(tmp_path, kind)
    argv = ["train", *TINY, "--world-size=2", f"--resume={folder}"]
    assert main(argv) == 2
    err = _one_line(capsys)
    assert err.startswith("pipesgd: error: --resume") and str(folder) in err, err
    assert words in err and "rank" not in err, err


@pytest.mark.parametrize(
    "kind, words",
    [
        ("missing", "no such folder"),
        ("a FIFO", "that is not a folder (a FIFO or a device)"),
        ("/proc", "which the kernel makes up as it is read, not a run's folder"),
        ("folder without one", "no checkpoint.npz there"),
    ],
)
def test_a_resume_path_that_is_no_runs_folder_says_what_it_is(kind, words, tmp_path, capsys):
    """--resume of a path that is missing, a FIFO or a kernel file said 'no checkpoint.npz
    there' (and of /proc/self/status suggested --resume /proc/self): now what the path is."""
    folder = tmp_path / "run"
    if kind == "a FIFO":
        os.mkfifo(folder)
    elif kind == "/proc":
        folder = Path("/proc/self/status")
    elif kind == "folder without one":
        folder.mkdir()
    assert main(["train", *TINY, f"--resume={folder}"]) == 2
    err = _one_line(capsys)
    assert err.startswith(f"pipesgd: error: --resume {folder}: ") and words in err, err


@pytest.mark.parametrize("command", ["bench", "compare"])
def test_a_broken_models_file_is_one_line_before_bench_or_compare_starts_a_rank(
    command, tmp_path, monkeypatch, capsys
):
    """auto's figures (comm/choose.py) were read in every rank: a broken file was one line
    per rank, after compare's calibration had begun or bench's machine was measured."""
    from pipesgd_ref.commands import bench, compare

    def started(*_a, **_k):
        raise AssertionError("measured before reading the models file")

    monkeypatch.setattr(bench, "measure_machine", started)
    monkeypatch.setattr(compare, "calibrate_machine", started)
    monkeypatch.setattr(compare, "calibrate_for", started)
    path = tmp_path / "models.json"
    path.write_text('{"models": {"shm": {"ring": {"alpha": "fast", "beta": 1}}}}')
    monkeypatch.setenv("PIPESGD_ALLREDUCE_MODELS", str(path))
    argv = {
        "bench": ["bench", "allreduce", "--world-size=2", "--sizes=4KB", "--peers=none"],
        "compare": ["compare", "--quick", "--no-progress", f"--out={tmp_path / 'out'}"],
    }[command]
    assert main(argv) == 2
    err = _one_line(capsys)
    assert err.startswith(
        f'pipesgd: error: AllReduce models file {path}: models.shm.ring needs "alpha" and '
        f'"beta", two finite numbers >= 0'
    ), err
