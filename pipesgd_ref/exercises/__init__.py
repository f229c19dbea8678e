"""Checks for the tutorials' exercises: write an answer, then ask `check`.

In a tutorial an exercise with a checkable answer ends with a cell like

    answer = None  # your answer: the largest stable lr * lambda for tau = 2
    check("06.3", answer)

`check` prints one line and returns True (right), False (not yet, with a hint) or None (not
answered yet), and never raises, so a tutorial still runs top to bottom with its exercises open.
Every expected answer is computed from the package (an oracle, a timing model, a closed form),
never typed in, so it stays right when the code it is about changes; the exercises themselves
live in one module per tutorial (`t06.py` holds tutorial 06's), registered with `@exercise`.

tests/test_exercises.py feeds every check its own expected answer (it must pass) and a wrong one
(it must fail), and checks that each `check("NN.k", ...)` in the tutorials names an exercise here.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

Judge = Callable[[Any, Any], bool]


@dataclass(frozen=True)
class Exercise:
    """One checkable exercise: tutorial NN, exercise k is key "NN.k"."""

    key: str
    question: str  # what is asked, in one line
    hint: str  # printed when an answer is wrong
    expected: Callable[[], Any]  # computes the right answer (or a reference function)
    judge: Judge  # judge(answer, expected) -> right?
    wrong: Callable[[], Any]  # a plausible wrong answer, for the tests: the check must reject it


EXERCISES: dict[str, Exercise] = {}

# Exercises that moved to another tutorial: the old key still checks, and says where it went.
MOVED = {
    "02.4": "13.1",  # tutorial 02's algorithms by size became tutorial 13
    "02.5": "13.2",
    "02.8": "13.3",
    "02.9": "13.4",
    "02.10": "13.5",
}


def close(rel: float = 0.01, abs_: float = 0.0) -> Judge:
    """A number or array within rel (relative) or abs_ (absolute) of the expected one."""

    def judge(answer: Any, expected: Any) -> bool:
        a = np.asarray(answer, dtype=float)
        e = np.asarray(expected, dtype=float)
        return a.shape == e.shape and bool(np.all(np.abs(a - e) <= abs_ + rel * np.abs(e)))

    return judge


def equal(answer: Any, expected: Any) -> bool:
    """The same value exactly (ints, strings, tuples), or the same bits (arrays)."""
    if isinstance(expected, np.ndarray):
        a = np.asarray(answer)
        return (
            a.shape == expected.shape and a.dtype == expected.dtype and np.array_equal(a, expected)
        )
    return answer == expected


def same_function(cases: Callable[[], list[tuple]], judge: Judge = equal) -> Judge:
    """The answer is a function: on each case (a tuple of arguments) it returns what the
    reference function (the expected answer) returns, as judged by `judge`."""

    def judge_function(answer: Any, reference: Any) -> bool:
        if not callable(answer):
            return False
        for args in cases():
            try:
                got = answer(*args)
            except Exception:  # noqa: BLE001 - a learner's function that raises is a wrong answer
                return False
            if not judge(got, reference(*args)):
                return False
        return True

    return judge_function


def exercise(key: str, question: str, hint: str, judge: Judge | None = None, wrong=None):
    """Register the decorated function as the way to compute exercise `key`'s answer. `wrong`
    computes an answer the check must reject (default: the expected number doubled); `judge`
    defaults to close(rel=0.01)."""

    def register(expected: Callable[[], Any]) -> Callable[[], Any]:
        if key in EXERCISES:
            raise ValueError(f"exercise {key} is registered twice")
        doubled = lambda: 2 * np.asarray(expected())  # noqa: E731
        EXERCISES[key] = Exercise(key, question, hint, expected, judge or close(), wrong or doubled)
        return expected

    return register


def load_all() -> dict[str, Exercise]:
    """Every tutorial's exercises (importing their modules registers them)."""
    for module in pkgutil.iter_modules(__path__):
        if module.name.startswith("t"):  # t01.py, t02.py, ...: one module per tutorial
            importlib.import_module(f"{__name__}.{module.name}")
    return EXERCISES


def check(key: str, answer: Any) -> bool | None:
    """Say whether `answer` answers exercise `key` ("06.3"): prints one line, returns True,
    False or None (answer is None: not answered yet)."""
    exercises = load_all()
    if key in MOVED:
        print(f"exercise {key} is exercise {MOVED[key]} now (tutorial {MOVED[key][:2]})")
        key = MOVED[key]
    if key not in exercises:
        known = ", ".join(sorted(exercises))
        raise KeyError(f"no exercise {key!r}; the checkable exercises are {known}")
    ex = exercises[key]
    if answer is None:
        print(f"exercise {key}: not answered yet ({ex.question})")
        return None
    try:
        right = bool(ex.judge(answer, ex.expected()))
    except (TypeError, ValueError) as err:  # an answer of the wrong kind: say so, go on
        print(f"exercise {key}: not yet: that answer is not of the expected kind ({err})")
        return False
    if right:
        print(f"exercise {key}: correct")
    else:
        print(f"exercise {key}: not yet. Hint: {ex.hint}")
    return right
