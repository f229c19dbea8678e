"""`pipesgd tutorials DIR`: copy the tutorials, each a script and its notebook, into DIR.

    pipesgd tutorials DIR [--overwrite]

A pip user has no checkout: the wheel carries the tutorials inside the package
(pipesgd_ref/_tutorials, mapped from the source tree's tutorials/ by pyproject.toml, so
tutorials/ stays their one source). From a checkout, or an editable install of one, they are
read from its tutorials/ folder. What is copied: every .py and .ipynb file there (the numbered
tutorials and their paired notebooks); they import nothing beside them but pipesgd_ref, so
they run from DIR (their figures go to DIR/out/).

DIR is made if missing. A DIR that holds anything is refused unless --overwrite, which
replaces the tutorials' files there and leaves every other file alone, as --overwrite
replaces a run's results elsewhere (outputs.py) and never removes a user's files.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
from pathlib import Path

from pipesgd_ref.errors import ConfigError, OutputError
from pipesgd_ref.outputs import prepare_out_dir

PATTERNS = ("*.py", "*.ipynb")
SMALL_ENV = "PIPESGD_TUTORIAL_SMALL"  # each tutorial's short path (tests/test_tutorials.py)


def add_parser(sub) -> argparse.ArgumentParser:
    """Add the `tutorials` command to `sub` (the subparsers object of the `pipesgd` parser)."""
    p = sub.add_parser(
        "tutorials",
        help="copy the tutorials (scripts and notebooks) into a folder, to run and edit",
        description="Copy the tutorials, each a script and its paired notebook, into DIR; "
        "they run from there (tutorials.py).",
    )
    p.add_argument("dir", metavar="DIR", help="the folder to copy them into (made if missing)")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="copy into a DIR that holds files: replace the tutorials' own, keep the rest",
    )
    return p


def source_folder() -> Path:
    """The tutorials of this installation: the wheel's pipesgd_ref/_tutorials, or a checkout's
    tutorials/ beside the package."""
    import pipesgd_ref

    package = Path(pipesgd_ref.__file__).resolve().parent
    for folder in (package / "_tutorials", package.parent / "tutorials"):
        if any(folder.glob("[0-9][0-9]_*.py")):
            return folder
    raise ConfigError(
        f"this installation of pipesgd_ref ({package}) carries no tutorials (no _tutorials "
        f"folder in it, no tutorials/ beside it); reinstall it from its wheel or a checkout"
    )


def tutorial_files(folder: Path) -> list[Path]:
    """Every file of `folder` the tutorials need: the scripts and the notebooks, by name."""
    found = {p for pattern in PATTERNS for p in folder.glob(pattern) if p.is_file()}
    return sorted(found, key=lambda p: p.name)


def copy_tutorials(target: str | Path, overwrite: bool = False) -> list[Path]:
    """Copy the tutorials into `target` (made if missing); the files written, by name.
    A `target` that holds anything is an OutputError unless `overwrite`."""
    if str(target) == "":
        raise OutputError("tutorials DIR is empty; give a folder name, e.g. pipesgd-tutorials")
    files = tutorial_files(source_folder())
    folder = prepare_out_dir(target, overwrite=True, flag="tutorials DIR")  # made, writable
    held = sorted(p.name for p in folder.iterdir())
    if held and not overwrite:
        shown = ", ".join(held[:3]) + (", ..." if len(held) > 3 else "")
        raise OutputError(
            f"tutorials DIR {str(folder)!r} is not empty ({shown}); pass --overwrite to "
            f"replace the tutorials there (other files stay), or choose an empty or new folder"
        )
    for src in files:
        if (folder / src.name).is_dir():
            raise OutputError(
                f"tutorials DIR {str(folder)!r}: {src.name} there is a folder, and a tutorial "
                f"is written under that name; remove it, or choose another folder"
            )
    written = []
    for src in files:
        shutil.copyfile(src, folder / src.name)
        written.append(folder / src.name)
    return written


def cmd_tutorials(args: argparse.Namespace) -> int:
    """`pipesgd tutorials DIR`: copy, then say what was written and how to run one."""
    written = copy_tutorials(args.dir, args.overwrite)
    folder = Path(args.dir)
    print(f"wrote {len(written)} files to {folder}:")
    by_stem: dict[str, list[str]] = {}
    for p in written:
        by_stem.setdefault(p.stem, []).append(p.name)
    for names in by_stem.values():
        print("  " + ", ".join(sorted(names, key=lambda n: not n.endswith(".py"))))
    scripts = [p.name for p in written if p.suffix == ".py" and p.name[:2].isdigit()]
    first = scripts[0] if scripts else "NN_topic.py"
    print(
        f"\nrun one as a script (it prints, and writes its figures to {folder / 'out'}):\n"
        f"  cd {shlex.quote(str(folder))}\n"
        f"  python {first}\n"
        f"  {SMALL_ENV}=1 python {first}     its short version, a few seconds\n"
        f"or open its notebook, {Path(first).with_suffix('.ipynb').name}, in Jupyter or VS Code "
        f"(the figures need matplotlib: pip install 'pipesgd_ref[plot]')"
    )
    return 0
