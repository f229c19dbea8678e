"""The documentation site builds with its one command (`python docs/build.py`), every tutorial
executed as a notebook at its small size, and every tutorial page shows its figures and no
error.

This is also the test that the tutorials run as notebooks: nbclient runs them as Jupyter
does, with no `__file__` and a working folder other than tutorials/ (tests/test_tutorials.py
runs them as scripts)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
TUTORIALS = sorted((ROOT / "tutorials").glob("[0-9][0-9]_*.py"))

pytestmark = pytest.mark.slow  # builds the whole site: about 90 s

pytest.importorskip("mkdocs_jupyter", reason="the docs extra: pip install -e '.[docs]'")
pytest.importorskip("matplotlib", reason="the tutorials' figures need the plot extra")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("docs")
    env = {**os.environ, "PIPESGD_TUTORIAL_SMALL": "1"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "build.py"), "--small", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=1500,
        env=env,
        cwd=out,
    )
    assert done.returncode == 0, (
        f"docs/build.py failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    )
    return out


def figures_announced(cells: list[dict]) -> int:
    """How many figures the tutorial wrote: save_figure prints `figure: PATH` for each (a
    tutorial may list paths again later, so distinct paths are counted)."""
    text = "".join(
        "".join(o.get("text", ""))
        for c in cells
        for o in c.get("outputs", [])
        if o.get("name") == "stdout"
    )
    return len(set(re.findall(r"^figure: (.+)$", text, flags=re.M)))


def test_the_site_has_a_page_per_tutorial_and_the_paper_notes(site):
    report = json.loads((site / "build.json").read_text(encoding="utf-8"))
    assert [t["name"] for t in report["tutorials"]] == [p.stem for p in TUTORIALS]
    assert (site / "site" / "index.html").is_file()
    assert (site / "site" / "paper" / "index.html").is_file()
    for path in TUTORIALS:
        assert (site / "site" / "tutorials" / path.stem / "index.html").is_file(), path.stem


@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_every_tutorial_page_shows_its_figures_and_no_error(site, path):
    notebook = site / "pages" / "tutorials" / f"{path.stem}.ipynb"
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    outputs = [o for c in cells for o in c.get("outputs", [])]
    errors = [f"{o['ename']}: {o['evalue']}" for o in outputs if o.get("output_type") == "error"]
    assert not errors, f"{path.stem} raised as a notebook: {errors}"
    shown = sum("image/png" in o.get("data", {}) for o in outputs)
    written = figures_announced(cells)
    assert shown == written, f"{path.stem} wrote {written} figures but showed {shown} inline"
    page = (site / "site" / "tutorials" / path.stem / "index.html").read_text(encoding="utf-8")
    assert page.count('src="data:image/png') >= shown
    assert "Traceback (most recent call last)" not in page
    if "save_figure(" in path.read_text(encoding="utf-8"):
        assert shown > 0, f"{path.stem} saves figures but the page shows none"
