"""Every document the project cites is in the repository: the paths that README, the docs, the
tutorials, the package's docstrings and the tests name exist, and nothing points outside the
repository (the project's notes on the paper are docs/paper.md)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

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
