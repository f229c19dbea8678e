"""The documentation site builds with its one command (`python docs/build.py`), every tutorial
executed as a notebook at its small size, and every tutorial page shows its figures and no
error.

This is also the test that the tutorials run as notebooks: nbclient runs them as Jupyter
does, with no `__file__` and a working folder other than tutorials/ (tests/test_tutorials.py
runs them as scripts)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from site_pages import figures_announced

ROOT = Path(__file__).parent.parent
TUTORIALS = sorted((ROOT / "tutorials").glob("[0-9][0-9]_*.py"))

pytestmark = pytest.mark.slow  # the whole site, built once (tests/conftest.py): about 2 min

pytest.importorskip("mkdocs_jupyter", reason="the docs extra: pip install -e '.[docs]'")
pytest.importorskip("matplotlib", reason="the tutorials' figures need the plot extra")


def test_the_site_has_a_page_per_tutorial_and_the_paper_notes(site):
    report = json.loads((site / "build.json").read_text(encoding="utf-8"))
    assert [t["name"] for t in report["tutorials"]] == [p.stem for p in TUTORIALS]
    assert (site / "site" / "index.html").is_file()
    assert (site / "site" / "paper.html").is_file()
    for path in TUTORIALS:
        assert (site / "site" / "tutorials" / f"{path.stem}.html").is_file(), path.stem


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
    page = (site / "site" / "tutorials" / f"{path.stem}.html").read_text(encoding="utf-8")
    assert page.count('src="data:image/png') >= shown
    assert str(site) not in page, f"{path.stem} shows the build folder's path"
    images = [tag for tag in re.findall(r"<img [^>]*>", page) if 'src="data:image/png' in tag]
    alts = [re.search(r'alt="([^"]*)"', tag) for tag in images]
    assert len(images) == shown, f"{path.stem}: {len(images)} figures on the page, {shown} shown"
    assert all(a and a.group(1).startswith("Figure: ") for a in alts), f"{path.stem}: alt text"
    assert "Traceback (most recent call last)" not in page
    if "save_figure(" in path.read_text(encoding="utf-8"):
        assert shown > 0, f"{path.stem} saves figures but the page shows none"


def test_the_pages_open_from_files_with_their_titles_and_math(site):
    """Opened from file://, a link is a page (page.html), not a folder listing; the reference
    pages' titles keep their capitals; the paper's equations are marked for MathJax; the
    column is widened; no font is fetched from Google."""
    home = (site / "site" / "index.html").read_text(encoding="utf-8")
    links = re.findall(r'href="([^"#]+)"', home)
    local = [h for h in links if "://" not in h and not h.startswith("data:")]
    assert local and not [h for h in local if h.endswith("/")], "directory URLs in the nav"
    assert "tutorials/05_pipe_sgd.html" in local and "reference/gpu.html" in local
    assert re.search(r">\s*GPU\s*<", home) and re.search(r">\s*AllReduce\s*<", home)
    assert "<title>AllReduce - pipesgd_ref</title>" in (
        site / "site" / "reference" / "allreduce.html"
    ).read_text(encoding="utf-8")
    paper = (site / "site" / "paper.html").read_text(encoding="utf-8")
    assert paper.count('class="arithmatex"') >= 12, "the equations (1)-(12) are not TeX"
    assert "fonts.googleapis.com" not in home
    css = (site / "site" / "assets" / "site.css").read_text(encoding="utf-8")
    assert re.search(r"\.md-grid\s*\{\s*max-width:\s*1[0-9]{3}px", css), css
