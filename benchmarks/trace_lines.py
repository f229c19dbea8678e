"""How much code one Pipe-SGD iteration runs: the lesson core against the product.

Traces every thread of rank 0 (sys.settrace, inherited by the forked workers and the threads
they start) and keeps the distinct lines of the package that run during one steady-state
iteration: from the moment rank 0's compute thread starts step STEP to the moment it starts
step STEP + 1. In that window the compute thread computes g_t and applies avg(g_{t-1}), and the
communication thread (and any sending thread) AllReduces over the wire down to the socket's
send: one iteration of the pipeline, everything it touches.

    python benchmarks/trace_lines.py [--json PATH]

Rows: `pipesgd train --lesson` (the core: processes over tcp, the ring), the product's default
path (`--allreduce auto --transport auto`: on one host the shared-memory group), and the
product on `--allreduce ring --transport tcp` (the path the core is bitwise equal to).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path

import pipesgd_ref

PACKAGE = str(Path(pipesgd_ref.__file__).parent) + os.sep
STEP = 4  # a steady-state step: after the pipe filled, before the drain
LOOPS = {"pipe_worker"}  # the function whose local `t` is the step (core and product alike)

_state = {"on": False, "done": False, "lines": set(), "out": None}


def _rank_of(frame) -> int | None:
    me = frame.f_locals.get("me") or frame.f_locals.get("comm")
    return getattr(me, "rank", None)


def _tracer(frame, event, arg):
    code = frame.f_code
    if not code.co_filename.startswith(PACKAGE) or _state["done"]:
        return None  # no line events for frames outside the package
    return _lines


def _lines(frame, event, arg):
    if event != "line" or _state["done"]:
        return _lines
    if frame.f_code.co_name in LOOPS and _rank_of(frame) == 0:
        t = frame.f_locals.get("t")
        if t == STEP and not _state["on"]:
            _state["on"] = True
        elif t == STEP + 1 and _state["on"]:
            _state["on"], _state["done"] = False, True
            Path(_state["out"]).write_text(json.dumps(sorted(_state["lines"])))
            return _lines
    if _state["on"]:
        _state["lines"].add((frame.f_code.co_filename[len(PACKAGE) :], frame.f_lineno))
    return _lines


def traced(run, out: str) -> list[tuple[str, int]]:
    """The package lines rank 0 ran in step STEP of `run()` (which forks the workers)."""
    _state.update(on=False, done=False, lines=set(), out=out)
    sys.settrace(_tracer)
    threading.settrace(_tracer)
    try:
        run()
    finally:
        sys.settrace(None)
        threading.settrace(None)
    return [tuple(x) for x in json.loads(Path(out).read_text())]


def main(argv: list[str] | None = None) -> int:
    from pipesgd_ref.commands.lesson import run_lesson
    from pipesgd_ref.commands.train import run_training
    from pipesgd_ref.config import TrainConfig

    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--json", default=None, help="also write the rows here")
    args = cli.parse_args(argv)
    base = TrainConfig.preset("laptop").replace(algo="pipe", steps=STEP + 4, eval_every=0)
    quiet = dict(log=lambda line: None)
    rows = {
        "core (--lesson)": lambda: run_lesson(base, **quiet),
        "product, default (auto/auto)": lambda: run_training(base, progress=False, **quiet),
        "product, --allreduce ring --transport tcp": lambda: run_training(
            base.replace(allreduce="ring", transport="tcp"), progress=False, **quiet
        ),
    }
    table = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, run) in enumerate(rows.items()):
            lines = traced(run, os.path.join(tmp, f"{i}.json"))
            files = Counter(f for f, _ in lines)
            table[name] = {"lines": len(lines), "files": len(files), "per_file": dict(files)}
    print(f"distinct package lines rank 0 runs in one pipe iteration (step {STEP}, p = 4):")
    for name, row in table.items():
        print(f"  {name:44s} {row['lines']:5d} lines in {row['files']:2d} files")
    for name, row in table.items():
        top = ", ".join(f"{f} {n}" for f, n in sorted(row["per_file"].items(), key=lambda x: -x[1]))
        print(f"\n{name}: {top}")
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
