"""Every document the project cites is in the repository: the paths that README, the docs, the
tutorials, the package's docstrings and the tests name exist, and nothing points outside the
repository (the project's notes on the paper are docs/paper.md). The site's navigation shows
each tutorial's title as written and has the glossary and the solutions, which answer every
exercise (without building the site: tests/test_site.py builds it)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
# A path into one of the project's folders, ending in a file type worth checking.
CITED = re.compile(
    r"(?<![\w/.-])((?:docs|tutorials|benchmarks|pipesgd_ref|tests)/[\w./-]*?\.(?:py|md|sh|ipynb|toml))"
    r"(?![\w])"
)
OUTSIDE = re.compile(r"PAPER\.md|DESIGN\.md|STYLE\.md|\.\./shared|shared/")


def tracked_text_files() -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files", "*.py", "*.md", "*.toml", "*.sh"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    if not names:  # not a git checkout (an sdist): every text file under the root
        return [
            p
            for ext in ("py", "md", "toml", "sh")
            for p in ROOT.rglob(f"*.{ext}")
            if ".venv" not in p.parts and "build" not in p.parts
        ]
    return [ROOT / n for n in names]


def citations(text: str) -> set[str]:
    found = set()
    for path in CITED.findall(text):
        if any(mark in path for mark in ("*", "NN", "{", "/out/")):
            continue  # a pattern or a generated output, not a document
        found.add(path.rstrip("."))
    return found


def test_the_citation_finder():
    text = "see docs/paper.md, section 3, and tutorials/05_pipe_sgd.py; runs/x.json; a/docs/x.md"
    assert citations(text) == {"docs/paper.md", "tutorials/05_pipe_sgd.py"}
    assert citations("tutorials/NN_topic.py and tutorials/out/01.png") == set()


# Files whose paths are not citations: the dated history of runs names modules as they were then,
# and the architecture tests build made-up packages with made-up test files.
NOT_CITING = {"test_docs.py", "RESULTS.md", "test_architecture.py"}


def test_every_cited_document_exists():
    missing = []
    for path in tracked_text_files():
        if path.name in NOT_CITING:
            continue
        for cited in citations(path.read_text(encoding="utf-8", errors="replace")):
            if not (ROOT / cited).exists():
                missing.append(f"{path.relative_to(ROOT)} cites {cited}")
    assert not missing, "cited but not in the repository:\n" + "\n".join(sorted(missing))


def test_nothing_cites_a_file_outside_the_repository():
    found = []
    for path in tracked_text_files():
        if path.name == "test_docs.py":
            continue
        for n, line in enumerate(
            path.read_text(encoding="utf-8", errors="replace").splitlines(), 1
        ):
            if OUTSIDE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not found, "cites a file outside the repository:\n" + "\n".join(found)


def test_the_paper_notes_cite_the_paper():
    notes = (ROOT / "docs" / "paper.md").read_text(encoding="utf-8")
    assert "1811.03619" in notes and "NeurIPS 2018" in notes
    for n in range(1, 7):
        assert re.search(rf"^## {n}\. ", notes, flags=re.M), f"docs/paper.md has no section {n}"


# --- the site's navigation and the pages beside the tutorials --------------------------------


def site_builder():
    """docs/build.py as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("docs_build", ROOT / "docs" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tutorial_sources() -> list[Path]:
    return sorted((ROOT / "tutorials").glob("[0-9][0-9]_*.py"))


def test_a_title_with_inline_code_keeps_its_words():
    build = site_builder()
    title = "09 · Reproduce the paper: `pipesgd compare`, step by step"
    assert build.nav_title(title) == "09 · Reproduce the paper: pipesgd compare, step by step"


def test_every_tutorial_title_appears_in_the_navigation_as_written():
    """Each tutorial's first heading, backticks aside, is its title in the site's navigation
    (a title once lost its inline code: "Reproduce the paper: , step by step"), and the
    notebook plugin is told not to replace the nav's titles with its own reading of the H1."""
    pytest.importorskip("jupytext")
    build = site_builder()
    results, written = [], []
    for src in tutorial_sources():
        heading = re.search(r"^# # (.+)$", src.read_text(encoding="utf-8"), flags=re.M)
        assert heading, f"{src.name} has no title heading"
        written.append(heading.group(1).replace("`", "").strip())
        results.append({"name": src.stem, "title": build.title_of(build.read_notebook(src))})
    nav = build.nav_of(results)
    tutorials = next(entry["Tutorials"] for entry in nav if "Tutorials" in entry)
    shown = [title for entry in tutorials for title in entry]
    assert shown == written, f"the navigation shows {shown}, the tutorials are titled {written}"
    plugin = next(
        p["mkdocs-jupyter"] for p in build.base_config()["plugins"] if isinstance(p, dict)
    )
    assert plugin.get("ignore_h1_titles") is True, (
        "mkdocs-jupyter must keep the nav's titles (ignore_h1_titles): its own drops inline code"
    )


def test_the_glossary_and_the_solutions_are_pages_of_the_site():
    build = site_builder()
    pages = {page for entry in build.nav_of([]) for page in entry.values() if isinstance(page, str)}
    for name in ("glossary.md", "solutions.md"):
        assert name in build.PAGES and name in pages, f"docs/{name} is not in the site's nav"
        assert (ROOT / "docs" / name).is_file()
        assert f"({name})" in (ROOT / "docs" / "index.md").read_text(encoding="utf-8"), (
            f"docs/index.md does not link {name}"
        )


def exercises_of(path: Path) -> list[int]:
    """The numbers of a tutorial's exercises: the `**k.**` items after its Exercises heading."""
    text = path.read_text(encoding="utf-8")
    start = re.search(r"^# ## Exercises\s*$", text, flags=re.M)
    assert start, f"{path.name} has no Exercises section"
    return [int(k) for k in re.findall(r"^# \*\*(\d+)\.\*\*", text[start.end() :], flags=re.M)]


def solutions_by_tutorial() -> dict[str, list[int]]:
    """docs/solutions.md's entries: `## NN · title` per tutorial, `### NN.k · title` per
    exercise, each entry under its own tutorial's heading."""
    found: dict[str, list[int]] = {}
    section = None
    text = (ROOT / "docs" / "solutions.md").read_text(encoding="utf-8")
    for line in text.splitlines():
        if m := re.match(r"^## (\d\d) · ", line):
            section = m.group(1)
            assert section not in found, f"docs/solutions.md has two sections {section}"
            found[section] = []
        elif m := re.match(r"^### (\d\d)\.(\d+) · ", line):
            assert m.group(1) == section, f"{line!r} is not under its tutorial's heading"
            found[section].append(int(m.group(2)))
    return found


def test_every_exercise_has_a_written_solution():
    """docs/solutions.md answers each tutorial's exercises, one entry each, no more and no
    fewer: a tutorial that gains, loses or renumbers an exercise must update its solutions."""
    solved = solutions_by_tutorial()
    asked = {path.name[:2]: exercises_of(path) for path in tutorial_sources()}
    for number, exercises in asked.items():
        assert exercises == list(range(1, len(exercises) + 1)), (
            f"tutorial {number}'s exercises are numbered {exercises}"
        )
        assert solved.get(number) == exercises, (
            f"tutorial {number} asks exercises {exercises}; docs/solutions.md answers "
            f"{solved.get(number)}: update its section {number}"
        )
    assert set(solved) <= set(asked), f"solutions for no tutorial: {set(solved) - set(asked)}"
