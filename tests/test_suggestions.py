"""Every fix an error suggests is a command that works: each test takes an error a user meets,
reads the suggested options out of its message, and runs the command again with each one."""

from __future__ import annotations

import re

import pytest

from pipesgd_ref.commands.cli import main

TINY = ["--preset=tiny", "--no-progress"]


def refused(argv: list[str], capsys) -> str:
    """The one-line error of a refused command (exit 2)."""
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipesgd: error:") and err.count("\n") == 1, err
    return err


SUGGESTION = re.compile(r"(?:pass|raise) (--[a-z-]+(?:=\S+)?)|, (--[a-z-]+=\S+) to")


def suggested(err: str) -> list[str]:
    """The options a message tells the user to pass (`--name` or `--name=value`), in order."""
    return [a or b for a, b in SUGGESTION.findall(err)]


@pytest.mark.timeout(120)
def test_an_earlier_runs_folder_suggests_overwrite_and_resume_and_both_work(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *TINY, "--steps=6", f"--out={out}"]) == 0
    err = refused(["train", *TINY, "--steps=10", f"--out={out}"], capsys)
    fixes = suggested(err)
    assert fixes == ["--overwrite", f"--resume={out}"], err
    for fix in reversed(fixes):  # resume first: the overwrite would remove what it continues
        assert main(["train", *TINY, "--steps=10", f"--out={out}", fix]) == 0, fix
    assert main(["train", *TINY, "--steps=10", f"--out={tmp_path / 'another'}"]) == 0


@pytest.mark.timeout(120)
def test_a_finished_checkpoint_suggests_more_steps_and_that_works(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *TINY, "--steps=6", f"--out={out}"]) == 0
    err = refused(["train", *TINY, "--steps=6", f"--out={out}", f"--resume={out}"], capsys)
    assert "raise --steps" in err, err
    assert main(["train", *TINY, "--steps=8", f"--out={out}", f"--resume={out}"]) == 0


@pytest.mark.parametrize("command", ["reference", "compare"])
def test_commands_that_cannot_resume_do_not_suggest_it(command, tmp_path, capsys):
    """reference and compare start from w_0 and refuse --resume: their folder error suggests
    only what they take. (The run itself is not started: the folder is refused first.)"""
    out = tmp_path / "run"
    out.mkdir()
    (out / ("summary.json" if command == "reference" else "compare.json")).write_text("{}")
    argv = [command, *TINY, f"--out={out}"] if command == "reference" else [
        command, "--quick", "--no-progress", f"--out={out}"]  # fmt: skip
    err = refused(argv, capsys)
    assert suggested(err) == ["--overwrite"], err
    assert "--resume" not in err, err


@pytest.mark.timeout(120)
def test_reference_takes_the_overwrite_it_suggests(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["reference", *TINY, "--steps=4", f"--out={out}"]) == 0
    err = refused(["reference", *TINY, "--steps=4", f"--out={out}"], capsys)
    (fix,) = suggested(err)
    assert main(["reference", *TINY, "--steps=4", f"--out={out}", fix]) == 0
