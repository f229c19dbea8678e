"""Build the documentation site: every tutorial executed as a notebook, with its printed output
and figures, beside the notes on the paper and the reference pages.

    python docs/build.py                 # all tutorials at full size (about 10 minutes here)
    python docs/build.py --small         # PIPESGD_TUTORIAL_SMALL=1: what CI builds (about 2)
    python docs/build.py --only 05 12    # just these tutorials (the others' pages are left out)
    python docs/build.py --sync          # rewrite tutorials/*.ipynb from the .py sources, stop

The site lands in build/docs/site/ (`--out DIR` to move it). Browse it served, as the search
box needs (a browser will not load the search index from file://):

    python -m http.server -d build/docs/site     # then open http://127.0.0.1:8000/

Opening build/docs/site/index.html directly works too (pages are .html files, not folders),
search aside. The equations are typeset by MathJax from its CDN (without a network they show
as their TeX source). Needs the `docs` extra: pip install -e ".[docs]". The tools and how to
replace them: docs/reference/docs_stack.md.

How it works: the tutorials' source is tutorials/NN_topic.py in jupytext's percent format
(`# %%` cells). Each is read as a notebook and run by a Jupyter kernel (nbclient), in the
build folder, exactly as Jupyter or `jupyter nbconvert --execute` would run it: no `__file__`,
the notebook's folder as the working folder, figures shown inline by plots.save_figure. The
executed notebooks and the Markdown pages of docs/ go to a staging folder that mkdocs (with
mkdocs-material and mkdocs-jupyter) renders. A tutorial that raises is reported with its
failing cell and the build goes on with the others, then exits 1: one broken tutorial does not
hide the state of the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from html import escape
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
TUTORIALS = ROOT / "tutorials"
PAGES = ["index.md", "paper.md", "glossary.md", "solutions.md"]  # docs/ pages of the site
REFERENCE = DOCS / "reference"  # the reference pages (commands, methods, figures, layout)
# reference pages whose file name does not capitalise into their navigation title
REFERENCE_TITLES = {"gpu": "GPU", "allreduce": "AllReduce", "docs_stack": "Documentation stack"}
# MathJax 3 typesets the pages' TeX (pymdownx.arithmatex, generic mode). Neither mkdocs-material
# nor pymdownx ships it, so it comes from its CDN; offline, the TeX source stays readable.
MATHJAX_URL = "https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js"
MATHJAX_CONFIG = """window.MathJax = {
  tex: {inlineMath: [["\\\\(", "\\\\)"]], displayMath: [["\\\\[", "\\\\]"]],
        processEscapes: true, processEnvironments: true},
  options: {ignoreHtmlClass: ".*|", processHtmlClass: "arithmatex"}
};
"""
# Material's column is 61rem wide: 100-character code lines and the wide tables need more.
PLACEHOLDER_ALT = 'alt="No description has been provided for this image"'  # nbconvert's
SITE_CSS = """.md-grid { max-width: 1440px; }
.md-typeset table:not([class]) { font-size: 0.7rem; }
.md-typeset table:not([class]) code { white-space: nowrap; }
"""


def tutorial_sources() -> list[Path]:
    return sorted(TUTORIALS.glob("[0-9][0-9]_*.py"))


def read_notebook(path: Path):
    """The tutorial as a notebook (jupytext reads the percent format): the kernel named, the
    cells given ids by their position."""
    import jupytext

    nb = jupytext.read(path)
    for i, cell in enumerate(nb.cells):  # ids by position, not random: a re-sync rewrites
        cell.id = f"cell-{i:03d}"  # a notebook only where its cells changed
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    return nb


def sync_notebooks() -> list[Path]:
    """Write tutorials/NN_topic.ipynb from each .py (no outputs): the notebook a learner opens
    in Jupyter, VS Code or Colab. tests/test_tutorials.py checks that they match the sources."""
    import jupytext

    written = []
    for src in tutorial_sources():
        nb = read_notebook(src)
        dst = src.with_suffix(".ipynb")
        jupytext.write(nb, dst, fmt="ipynb")
        written.append(dst)
    return written


def title_of(nb) -> str:
    """The first Markdown heading of a notebook: its page title, as the navigation shows it."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return nav_title(line[2:])
    return "untitled"


def nav_title(heading: str) -> str:
    """A heading as the site's navigation and page title show it: plain text, inline code
    keeping its words without the backticks. mkdocs-jupyter's own title (the H1 as its table
    of contents reads it) drops an inline-code span's words ("Reproduce the paper: , step by
    step"), so base_config tells it to use the nav's title instead."""
    return heading.replace("`", "").strip()


def count_outputs(nb) -> tuple[int, list[str]]:
    """(images shown, error messages) over the notebook's outputs."""
    images, errors = 0, []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                errors.append(f"{out.get('ename')}: {out.get('evalue')}")
            elif "image/png" in out.get("data", {}):
                images += 1
    return images, errors


def tidy_outputs(nb, workdir: Path) -> list[str]:
    """Tidy what the page shows of the executed notebook: paths relative to the notebook's
    folder (the build folder's absolute path means nothing to a reader; `figure:
    out/05_timeline.png` is where Jupyter writes it too). Returns each image's alt text, in
    order, from the file save_figure announced just before it ("Figure: 05 timeline")."""
    prefix = str(workdir.resolve())
    figure, alts = None, []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                out["text"] = out["text"].replace(prefix + os.sep, "").replace(prefix, ".")
                for line in out["text"].splitlines():
                    if line.startswith("figure: "):
                        figure = Path(line[len("figure: ") :].strip())
            elif "image/png" in out.get("data", {}):
                name = figure.with_suffix("").as_posix() if figure else f"{len(alts) + 1}"
                words = name.removeprefix("out/").replace("/", " ").replace("_", " ")
                alts.append(f"Figure: {words}")
    return alts


def label_figures(site: Path, results: list[dict]) -> None:
    """Give each tutorial page's figures their alt text (tidy_outputs'): nbconvert's HTML
    template ignores an output's alt metadata and writes the same placeholder for all."""
    for r in results:
        page = site / "tutorials" / f"{r['name']}.html"
        if not page.is_file():
            continue
        html = page.read_text(encoding="utf-8")
        for alt in r["alts"]:
            html = html.replace(PLACEHOLDER_ALT, f'alt="{escape(alt)}"', 1)
        page.write_text(html, encoding="utf-8")


def execute(src: Path, workdir: Path, timeout: float) -> dict:
    """Run one tutorial as a notebook in `workdir`; write the executed notebook there, even a
    failed one (the outputs up to the failing cell are what a reader debugs from)."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = read_notebook(src)
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(workdir)}}
    )
    start = time.perf_counter()
    failure = None
    try:
        client.execute()
    except CellExecutionError as err:
        failure = str(err).strip().splitlines()[-1] if str(err).strip() else repr(err)
    seconds = time.perf_counter() - start
    alts = tidy_outputs(nb, workdir)
    nbformat.write(nb, workdir / src.with_suffix(".ipynb").name)
    images, errors = count_outputs(nb)
    if failure and not errors:
        errors = [failure]
    return {
        "name": src.stem,
        "title": title_of(nb),
        "seconds": seconds,
        "images": images,
        "errors": errors,
        "alts": alts,
    }


def nav_of(results: list[dict]) -> list:
    tutorials = [{r["title"]: f"tutorials/{r['name']}.ipynb"} for r in results]
    reference = [
        {
            REFERENCE_TITLES.get(
                page.stem, page.stem.replace("-", " ").capitalize()
            ): f"reference/{page.name}"
        }
        for page in sorted(REFERENCE.glob("*.md"))
    ]
    nav = [
        {"Home": "index.md"},
        {"The paper": "paper.md"},
        {"Glossary": "glossary.md"},
        {"Tutorials": tutorials},
        {"Solutions to the exercises": "solutions.md"},
    ]
    if reference:
        nav.append({"Reference": reference})
    return nav


def stage_pages(stage: Path) -> None:
    """Copy docs/'s Markdown pages into the staging folder mkdocs reads."""
    for name in PAGES:
        shutil.copy2(DOCS / name, stage / name)
    if REFERENCE.is_dir():
        shutil.copytree(REFERENCE, stage / "reference", dirs_exist_ok=True)
    assets = stage / "assets"
    assets.mkdir(exist_ok=True)
    (assets / "site.css").write_text(SITE_CSS, encoding="utf-8")
    (assets / "mathjax.js").write_text(MATHJAX_CONFIG, encoding="utf-8")


def render(out: Path, stage: Path, nav: list) -> float:
    """mkdocs renders the staged pages and notebooks into out/site; returns seconds taken."""
    config = base_config()
    config.update({"docs_dir": str(stage), "site_dir": str(out / "site"), "nav": nav})
    cfg = out / "mkdocs.yml"
    cfg.write_text(json.dumps(config, indent=1), encoding="utf-8")  # JSON is YAML
    start = time.perf_counter()
    mkdocs = [sys.executable, "-m", "mkdocs", "build", "--quiet", "--clean", "-f", str(cfg)]
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # a notice about mkdocs' future, not the site
    subprocess.run(mkdocs, check=True, cwd=out, env=env)
    return time.perf_counter() - start


def base_config() -> dict:
    return {
        "site_name": "pipesgd_ref",
        "site_description": "Pipe-SGD and its baselines, taught and measured",
        # pages as page.html, not page/index.html: a link opened from file:// is the page,
        # not a folder listing
        "use_directory_urls": False,
        # no Google Fonts (font: false): the system's fonts, and no request that fails offline
        "theme": {"name": "material", "features": ["navigation.sections"], "font": False},
        "extra_css": ["assets/site.css"],
        "extra_javascript": ["assets/mathjax.js", {"path": MATHJAX_URL, "async": True}],
        "markdown_extensions": [
            "admonition",
            "tables",
            "toc",
            "pymdownx.details",
            {"pymdownx.arithmatex": {"generic": True}},
        ],
        "plugins": [
            "search",
            {
                "mkdocs-jupyter": {
                    "execute": False,
                    "include": ["*.ipynb"],
                    "allow_errors": True,
                    # the title is the nav's (nav_title), not the H1 as mkdocs-jupyter reads it
                    # from its table of contents, which drops inline code's words
                    "ignore_h1_titles": True,
                }
            },
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="PIPESGD_TUTORIAL_SMALL=1 (as CI)")
    parser.add_argument("--only", nargs="+", metavar="NN", help="tutorials to build, by number")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "docs", help="build folder")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per cell")
    parser.add_argument("--sync", action="store_true", help="rewrite tutorials/*.ipynb, stop")
    args = parser.parse_args(argv)
    if args.sync:
        for path in sync_notebooks():
            print(f"wrote {path.relative_to(ROOT)}")
        return 0

    sources = tutorial_sources()
    if args.only:
        sources = [s for s in sources if s.name[:2] in {n.zfill(2) for n in args.only}]
        if not sources:
            parser.error(f"no tutorial numbered {' '.join(args.only)}")
    if args.small:
        os.environ["PIPESGD_TUTORIAL_SMALL"] = "1"  # the kernels inherit it
    out = args.out.resolve()
    stage = out / "pages"
    notebooks = stage / "tutorials"
    if stage.exists():
        shutil.rmtree(stage)
    notebooks.mkdir(parents=True)
    stage_pages(stage)

    start = time.perf_counter()
    results = []
    for i, src in enumerate(sources, 1):
        print(f"[{i}/{len(sources)}] {src.name} ...", flush=True)
        r = execute(src, notebooks, args.timeout)
        state = "ok" if not r["errors"] else "FAILED: " + "; ".join(r["errors"])
        print(f"    {r['seconds']:.1f} s, {r['images']} figures, {state}", flush=True)
        results.append(r)
    render_s = render(out, stage, nav_of(results))
    label_figures(out / "site", results)
    total = time.perf_counter() - start
    (out / "build.json").write_text(
        json.dumps(
            {
                "small": args.small,
                "seconds": total,
                "render_seconds": render_s,
                "tutorials": results,
            },
            indent=1,
        ),
        encoding="utf-8",
    )
    failed = [r["name"] for r in results if r["errors"]]
    print(f"site: {out / 'site' / 'index.html'} ({total:.0f} s; mkdocs {render_s:.1f} s)")
    if failed:
        print(f"{len(failed)} tutorial(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
