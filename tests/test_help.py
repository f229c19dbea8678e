"""`pipesgd COMMAND --help` lists every option the command takes: its own flags, and every
TrainConfig field as a config key, in exactly one group, with its default, one line each in a
100-column terminal; documenting the keys changes nothing in how they are parsed."""

from __future__ import annotations

import dataclasses
import re

import pytest

from pipesgd_ref.commands import help_groups
from pipesgd_ref.commands.cli import main
from pipesgd_ref.commands.parser import build_parser
from pipesgd_ref.config import PRESETS, TrainConfig, field_names

CONFIG_COMMANDS = ("compare", "train", "reference", "config")  # those that take config keys
ENTRY = re.compile(r"^  (--[a-z][a-z-]*)")  # an option's line (its first, with its help)
TITLE = re.compile(r"^(\S.*):$")  # a group's title


def help_text(monkeypatch, capsys, *argv: str) -> str:
    """What `pipesgd ARGV --help` prints in a 100-column terminal."""
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as stop:
        main([*argv, "--help"])
    assert stop.value.code == 0
    return capsys.readouterr().out


def entries(text: str) -> list[tuple[str, str, str]]:
    """(group title, option, its first line) of every option the help lists."""
    found, group = [], None
    for line in text.splitlines():
        if TITLE.match(line):
            group = TITLE.match(line).group(1)
        elif ENTRY.match(line) and group is not None:
            found.append((group, ENTRY.match(line).group(1), line))
    return found


def expected_default(command: str, name: str) -> str:
    """The default the help should show for a field: the value the command's preset starts
    from, written as on the command line (128,64; true; none for an empty one)."""
    preset = {"compare": "compare"}.get(command, "laptop")
    if command == "compare" and name == "bandwidth":
        return "fit to this machine"  # compare chooses the link (compare_link.py)
    if name == "channels" and "channels" not in PRESETS[preset]:
        return "the model's"
    value = getattr(TrainConfig.preset(preset), name)
    if isinstance(value, tuple):
        value = ",".join(map(str, value))
    if isinstance(value, bool):
        return str(value).lower()
    return str(value) or "none"


def config_key_problems(text: str, command: str) -> list[str]:
    """Why `text`, the help of `command`, does not list every TrainConfig field once with its
    default: missing, in two groups, without its default, or with a wrong one."""
    listed = entries(text)
    key_groups = {title for title, _ in help_groups.CONFIG_GROUPS}
    problems = []
    for name in field_names():
        flag = help_groups.option(name)
        where = [(group, line) for group, opt, line in listed if opt == flag]
        if len(where) != 1:
            problems.append(f"{flag}: listed {len(where)} times ({[g for g, _ in where]})")
            continue
        group, line = where[0]
        if group not in key_groups:  # the command's own flag takes the key (compare's --out)
            if "default" not in line:
                problems.append(f"{flag}: the command's own flag shows no default")
        elif f"(default {expected_default(command, name)})" not in line:
            problems.append(f"{flag}: not its default {expected_default(command, name)!r}")
    return problems


@pytest.mark.parametrize("command", CONFIG_COMMANDS)
def test_every_config_key_is_listed_once_with_its_default(command, monkeypatch, capsys):
    text = help_text(monkeypatch, capsys, command)
    assert config_key_problems(text, command) == []


def test_a_field_without_a_help_line_or_in_two_groups_is_caught(monkeypatch, capsys):
    """The check above, failing: "seed" dropped from the table, "lr" in two groups."""
    groups = [(title, dict(rows)) for title, rows in help_groups.CONFIG_GROUPS]
    seed_group = next(rows for _, rows in groups if "seed" in rows)
    del seed_group["seed"]
    lr_row = next(rows["lr"] for _, rows in groups if "lr" in rows)
    groups[-1][1]["lr"] = lr_row
    monkeypatch.setattr(help_groups, "CONFIG_GROUPS", tuple(groups))
    problems = config_key_problems(help_text(monkeypatch, capsys, "train"), "train")
    assert [p.split(":")[0] for p in problems] == ["--lr", "--seed"], problems


def test_the_table_names_every_field_once():
    names = [name for _, rows in help_groups.CONFIG_GROUPS for name in rows]
    assert sorted(names) == sorted(field_names()), "each TrainConfig field: one row, one group"


def test_train_help_names_the_options_a_new_user_looks_for(monkeypatch, capsys):
    options = {opt for _, opt, _ in entries(help_text(monkeypatch, capsys, "train"))}
    wanted = {"--algo", "--steps", "--world-size", "--allreduce", "--transport"}
    assert wanted <= options, sorted(wanted - options)


@pytest.mark.parametrize("command", CONFIG_COMMANDS)
def test_each_config_key_is_one_line_in_100_columns(command, monkeypatch, capsys):
    lines = help_text(monkeypatch, capsys, command).splitlines()
    assert all(len(line) <= 100 for line in lines), [ln for ln in lines if len(ln) > 100]
    key_groups = {title for title, _ in help_groups.CONFIG_GROUPS}
    group = None
    for line, after in zip(lines, lines[1:] + [""], strict=True):
        group = TITLE.match(line).group(1) if TITLE.match(line) else group
        if group in key_groups and ENTRY.match(line):
            assert "(default " in line and not after.startswith("    "), (line, after)


def test_top_level_help_lists_each_command_on_one_line(monkeypatch, capsys):
    lines = help_text(monkeypatch, capsys).splitlines()
    block = lines[lines.index("  COMMAND") + 1 :]
    block = block[: block.index("")]  # the commands, up to the blank line after them
    names = [line.split()[0] for line in block]
    assert {"compare", "train", "reference", "config", "lesson-file"} <= set(names), block
    assert all(re.match(r"^    \S+ {2,}\S", line) for line in block), block
    text = " ".join(lines)
    assert "`pipesgd COMMAND --help` lists a command's options" in " ".join(text.split())


def test_documented_keys_are_still_parsed_as_overrides():
    """argparse never sees a config key: it stays in the rest that split_overrides reads, so
    --key value, --key=value and a yes/no key alone resolve as before."""
    parser = build_parser()
    argv = ["--algo", "sync", "--world-size=2", "--nesterov", "--momentum", "0.9"]
    args, rest = parser.parse_known_args(["config", *argv, "--comm-first", "false"])
    assert rest == [*argv, "--comm-first", "false"]
    assert not {f.name for f in dataclasses.fields(TrainConfig)} & set(vars(args))


def test_config_resolves_documented_keys(capsys):
    rc = main(["config", "--algo", "sync", "--world-size=2", "--nesterov", "--momentum", "0.9"])
    assert rc == 0
    out = capsys.readouterr().out
    for text in ('"algo": "sync"', '"world_size": 2', '"nesterov": true', '"momentum": 0.9'):
        assert text in out
