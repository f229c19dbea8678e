"""Every tutorial runs top to bottom at its small size (PIPESGD_TUTORIAL_SMALL=1).

A tutorial ends with asserts against the oracle, so running it is a test of what it teaches.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
TUTORIALS = sorted((ROOT / "tutorials").glob("[0-9][0-9]_*.py"))


def test_every_tutorial_is_run_and_listed():
    """The tests below run every script in tutorials/ (none left out by a name that the glob
    misses), numbered 01, 02, ... without a gap or a repeat, and the README lists each one."""
    scripts = sorted(p.name for p in (ROOT / "tutorials").glob("*.py"))
    run = [p.name for p in TUTORIALS]
    assert run == scripts, (
        f"tutorials/ holds {scripts} but the tests run {run}: name each tutorial NN_topic.py"
    )
    numbers = [int(name[:2]) for name in run]
    assert numbers == list(range(1, len(run) + 1)), (
        f"tutorials numbered {numbers}: number them 01, 02, ... in reading order, no gap"
    )
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    listed = re.findall(r"^- `(\d\d_\w+\.py)`:", readme, flags=re.M)
    assert listed == run, f"README.md lists the tutorials {listed}, tutorials/ holds {run}"


@pytest.mark.slow
@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_runs(path, tmp_path):
    """As a script, from another folder than its own (a learner's working folder is anywhere);
    the notebook run is tests/test_site.py's."""
    env = {**os.environ, "PIPESGD_TUTORIAL_SMALL": "1", "MPLBACKEND": "Agg"}
    done = subprocess.run(
        [sys.executable, str(path)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, (
        f"{path.name} failed (exit {done.returncode}):\n"
        f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )


def test_each_tutorial_has_its_paired_notebook_in_step():
    """tutorials/NN_topic.ipynb holds the same cells as NN_topic.py (the source): the notebook a
    learner opens in Jupyter, VS Code or Colab. After editing a tutorial, run
    `python docs/build.py --sync`."""
    jupytext = pytest.importorskip("jupytext")
    nbformat = pytest.importorskip("nbformat")
    for path in TUTORIALS:
        paired = path.with_suffix(".ipynb")
        assert paired.exists(), f"{paired.name} is missing: run python docs/build.py --sync"
        want = [(c.cell_type, c.source) for c in jupytext.read(path).cells]
        cells = nbformat.read(paired, as_version=4).cells
        have = [(c.cell_type, c.source) for c in cells]
        assert have == want, (
            f"{paired.name} differs from {path.name}: run python docs/build.py --sync"
        )
        assert all(not c.get("outputs") for c in cells), (
            f"{paired.name} holds outputs: the paired notebooks are kept without them"
        )


def test_the_site_builder_names_a_tutorial_it_does_not_have():
    done = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "build.py"), "--only", "99"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "no tutorial numbered 99" in done.stderr
