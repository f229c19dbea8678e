"""The tutorials' exercise checks: each accepts its own answer, rejects a wrong one, and every
`check("NN.k", ...)` a tutorial calls names a registered exercise."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from pipesgd_ref.exercises import (
    EXERCISES,
    MOVED,
    check,
    close,
    equal,
    load_all,
    same_function,
)

ROOT = Path(__file__).parent.parent
load_all()
KEYS = sorted(EXERCISES)


def test_there_are_exercises_and_their_keys_name_tutorials():
    assert KEYS, "no exercise is registered"
    tutorials = {p.name[:2] for p in (ROOT / "tutorials").glob("[0-9][0-9]_*.py")}
    for key in KEYS:
        assert re.fullmatch(r"\d\d\.\d+", key), key
        assert key[:2] in tutorials, f"exercise {key} names no tutorial"


@pytest.mark.parametrize("key", KEYS)
def test_a_check_accepts_the_right_answer_and_rejects_a_wrong_one(key, capsys):
    ex = EXERCISES[key]
    assert check(key, ex.expected()) is True
    assert "correct" in capsys.readouterr().out
    assert check(key, ex.wrong()) is False
    assert "Hint:" in capsys.readouterr().out
    assert check(key, None) is None
    assert "not answered yet" in capsys.readouterr().out


def test_every_check_a_tutorial_calls_is_registered_and_every_exercise_is_asked():
    called = set()
    for path in (ROOT / "tutorials").glob("[0-9][0-9]_*.py"):
        for key in re.findall(r'check\(\s*"(\d\d\.\d+)"', path.read_text(encoding="utf-8")):
            assert key[:2] == path.name[:2], f"{path.name} checks another tutorial's {key}"
            called.add(key)
    assert called <= set(KEYS), f"tutorials check unregistered exercises {called - set(KEYS)}"
    assert set(KEYS) <= called, f"exercises no tutorial asks: {set(KEYS) - called}"


def test_a_moved_exercise_still_checks_under_its_old_key(capsys):
    """Tutorial 02's algorithms-by-size exercises moved to tutorial 13: a notebook that still
    asks check("02.4", ...) gets tutorial 13's check, and is told the new key."""
    for old, new in MOVED.items():
        assert old not in EXERCISES and new in EXERCISES, (old, new)
        assert check(old, EXERCISES[new].expected()) is True
        assert f"exercise {old} is exercise {new} now" in capsys.readouterr().out
        assert check(old, EXERCISES[new].wrong()) is False


def test_an_unknown_key_is_an_error_that_lists_the_known_ones():
    with pytest.raises(KeyError, match="checkable exercises are"):
        check("99.9", 1)


def test_the_judges():
    assert close(rel=0.1)(1.05, 1.0) and not close(rel=0.01)(1.05, 1.0)
    assert not close()([1.0, 2.0], 1.0)  # a shape mismatch is wrong, not broadcast
    assert equal(np.float32([1, 2]), np.float32([1, 2]))
    assert not equal(np.float64([1, 2]), np.float32([1, 2]))  # the same bits means the same dtype
    judge = same_function(lambda: [(1,), (2,)])
    assert judge(lambda x: x * x, lambda x: x**2)
    assert not judge(lambda x: x + x, lambda x: x**2)  # right at 2, wrong at 1
    assert not judge(lambda x: 1 / 0, lambda x: x)  # a function that raises is wrong
    assert not judge(3, lambda x: x)


def test_an_answer_of_the_wrong_kind_is_wrong_not_an_error(capsys):
    assert check(KEYS[0], "a string") is False
    assert "not yet" in capsys.readouterr().out
