"""The figures README.md and the docs quote, from one place: docs/figures.json.

    python docs/figures.py record compare DIR   # DIR/compare.json's figures become `main_job`
    python docs/figures.py render               # rewrite every quoted figure from figures.json
    python docs/figures.py check                # exit 1, naming each, where a page differs

A page quotes a figure between two HTML comments, which Markdown (GitHub's, the site's) shows
as nothing:

    the bandwidth compare chose here, <!-- fig main_job.bandwidth -->922 Mbit/s<!-- /fig -->

and a whole block (a table in a code fence) the same way, with the markers on lines of their
own. `render` replaces what lies between the markers with the figure's text; `check` (which
tests/test_docs.py runs) fails where any page's text differs from it, or names a figure that
figures.json lacks. So two pages cannot quote two runs, and a page cannot drift from the
record: a new run is `record`ed, then `render`ed into every page at once.

`record compare` reads what `pipesgd compare` wrote (compare.json) and keeps, besides the
command and the commit it ran at: the bandwidth compare chose, the time of the ring AllReduce
there and of the workers' step, the wall time of the runs, the table as compare prints it, and
the checks' lines with the load line (how busy the machine was while it ran).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "docs" / "figures.json"
QUOTE = re.compile(r"<!-- fig ([a-z0-9_]+)\.([a-z0-9_]+) -->(.*?)<!-- /fig -->", re.S)


def pages() -> list[Path]:
    """The pages that may quote figures: README.md and every Markdown page under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def load() -> dict:
    return json.loads(FIGURES.read_text(encoding="utf-8")) if FIGURES.exists() else {}


def text_of(figures: dict, entry: str, field: str, block: bool) -> str | None:
    """The text a quote of entry.field stands for (a block's between newlines); None when
    figures.json has no such figure."""
    value = figures.get(entry, {}).get("fields", {}).get(field)
    if value is None:
        return None
    return f"\n{value}\n" if block else value


def rendered(page: str, figures: dict) -> tuple[str, list[str]]:
    """`page` with every quote rewritten from `figures`, and the quotes it names that figures
    lacks ("entry.field")."""
    missing: list[str] = []

    def one(m: re.Match) -> str:
        entry, field, old = m.group(1), m.group(2), m.group(3)
        new = text_of(figures, entry, field, block=old.startswith("\n"))
        if new is None:
            missing.append(f"{entry}.{field}")
            return m.group(0)
        return f"<!-- fig {entry}.{field} -->{new}<!-- /fig -->"

    return QUOTE.sub(one, page), missing


def render(check_only: bool) -> int:
    """Rewrite (or, `check_only`, compare) every page's quotes; 1 where one differs."""
    figures, problems = load(), []
    for path in pages():
        page = path.read_text(encoding="utf-8")
        new, missing = rendered(page, figures)
        name = path.relative_to(ROOT)
        problems += [f"{name}: quotes {m}, which docs/figures.json does not hold" for m in missing]
        if new != page:
            if check_only:
                problems.append(f"{name}: its figures differ from docs/figures.json")
            else:
                path.write_text(new, encoding="utf-8")
                print(f"rewrote {name}")
    for line in problems:
        print(line, file=sys.stderr)
    if problems and check_only:
        print("run `python docs/figures.py render` to write the recorded figures", file=sys.stderr)
    return 1 if problems else 0


def compare_fields(report: dict) -> dict[str, str]:
    """The figures of one `pipesgd compare` run (its compare.json) that the pages quote."""
    from pipesgd_ref.commands.compare import format_table
    from pipesgd_ref.config import TrainConfig, apply_dict
    from pipesgd_ref.timing import load
    from pipesgd_ref.units import format_bandwidth

    cfg = apply_dict(TrainConfig(), report["config"])
    link = report["link"]
    table = format_table(report["table"], cfg).splitlines()[1:]  # without the problem line
    checks = [c["text"] for c in report["checks"]]
    if "load" in report:  # how quiet the machine was: the figures' reliability
        checks.append(load.describe(report["load"]))
    return {
        "bandwidth": format_bandwidth(link["bandwidth_bytes_s"]).split(" (")[0],
        "t_ar": f"{link['t_ar_s'] * 1e3:.0f} ms",
        "t_comp": f"{link['t_comp_s'] * 1e3:.0f} ms",
        "wall": f"{report['wall_time_s']:.0f} s",
        "table": "```text\n" + "\n".join(table) + "\n```",
        "checks": "```text\n" + "\n".join(checks) + "\n```",
    }


def record_compare(folder: Path, entry: str, command: str, commit: str | None) -> None:
    report = json.loads((folder / "compare.json").read_text(encoding="utf-8"))
    if report.get("kind") != "compare":
        raise SystemExit(f"{folder / 'compare.json'} is not a pipesgd compare report")
    commit = (
        commit
        or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    )
    figures = load()
    fields = {"commit": commit, **compare_fields(report)}
    figures[entry] = {"command": command, "commit": commit, "fields": fields}
    FIGURES.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    print(f"recorded {entry} from {folder / 'compare.json'} (commit {commit}) in {FIGURES}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    rec = sub.add_parser("record", help="keep a run's figures in docs/figures.json")
    rec.add_argument("kind", choices=["compare"])
    rec.add_argument("folder", type=Path, help="the run's --out folder")
    rec.add_argument("--as", dest="entry", default="main_job", help="the entry (main_job)")
    rec.add_argument("--command", default="pipesgd compare --no-progress")
    rec.add_argument("--commit", default=None, help="default: the checkout's HEAD")
    sub.add_parser("render", help="rewrite every quoted figure from docs/figures.json")
    sub.add_parser("check", help="exit 1 where a page's figures differ from docs/figures.json")
    args = parser.parse_args(argv)
    if args.what == "record":
        record_compare(args.folder, args.entry, args.command, args.commit)
        return 0
    return render(check_only=args.what == "check")


if __name__ == "__main__":
    sys.exit(main())
