"""Every tutorial runs top to bottom at its small size (PIPESGD_TUTORIAL_SMALL=1).

A tutorial ends with asserts against the oracle, so running it is a test of what it teaches.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

TUTORIALS = sorted((Path(__file__).parent.parent / "tutorials").glob("[0-9][0-9]_*.py"))


def test_there_are_tutorials():
    assert len(TUTORIALS) >= 2, f"expected the tutorials in tutorials/, found {TUTORIALS}"


@pytest.mark.slow
@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_runs(path):
    env = {**os.environ, "PIPESGD_TUTORIAL_SMALL": "1", "MPLBACKEND": "Agg"}
    done = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=240, env=env
    )
    assert done.returncode == 0, (
        f"{path.name} failed (exit {done.returncode}):\n"
        f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
