"""The bench's algorithm rows: which (algorithm, transport) pairs run, each one's fitted model,
and `--fit`, which fits them and writes the figures `auto` chooses by (comm/choose.py).

Row names are `<algorithm>-<transport>`: ring-tcp, rd-tcp, rab-shm, oneshot-shm, auto-auto...
`auto-auto` is what a user gets without flags: the transport and the algorithm both chosen.

The fit. For each algorithm a on each transport, the model is

    T = steps(a, p, M) * alpha_a + volume(a, p) * M * beta_a

(comm/choose.py: the latencies and the bytes of its critical path). Given a row's measured times
at several sizes, (alpha_a, beta_a) minimise the squared *relative* error: a small message's
50 us counts as much as a large one's 50 ms. A negative figure (noise at one end) is set to 0
and the other refitted. The crossover sizes printed after the fit are where the fitted models
of two algorithms cross: nothing in the choice is a threshold written by hand.
"""

from __future__ import annotations

import datetime
import json
import platform
import socket
from typing import Any

import numpy as np

from pipesgd_ref.comm import choose, shm_group
from pipesgd_ref.comm.netem import LinkSpec
from pipesgd_ref.errors import JobError
from pipesgd_ref.outputs import write_text_atomic
from pipesgd_ref.units import format_bytes

ALGORITHMS = (*choose.NAMES, "auto")  # the rows' order


def row_names(algorithms: list[str], transports: list[str], link: LinkSpec) -> tuple[list, dict]:
    """(row names, {row: why it cannot run}): every pair, less the group's algorithms where no
    group can form (tcp or unix links, or an emulated link: the group bypasses links)."""
    names, skipped = [], {}
    for t in transports:
        for a in algorithms:
            name = f"{a}-{t}"
            if a in shm_group.ALGORITHMS and (t in ("tcp", "unix") or link.enabled):
                skipped[name] = "the shared-memory group needs --transport shm or auto, unemulated"
                continue
            names.append(name)
    return names, skipped


def split_name(name: str) -> tuple[str, str]:
    """(algorithm, transport) of a row name such as rab-shm."""
    algo, _, transport = name.partition("-")
    return algo, transport


def resolved(transport: str) -> str:
    """The links a transport makes between ranks of one host (auto: shared memory)."""
    return "shm" if transport == "auto" else transport


def model_time(algo: str, transport: str, p: int, nbytes: int, figures=None) -> float | None:
    """The fitted model's time for one row (None: no figures for it)."""
    figures = choose.fitted(resolved(transport)) if figures is None else figures
    if algo not in figures:
        return None
    return choose.model_time(algo, p, nbytes, *figures[algo])


def fit_one(algo: str, p: int, sizes: list[int], times: list[float]) -> tuple[float, float]:
    """(alpha, beta) of `algo` from measured times (module docstring)."""
    steps = np.array([choose.steps(algo, p, n) for n in sizes])
    vol = np.array([choose.volume(algo, p) * n for n in sizes], float)
    t = np.array(times)
    design = np.stack([steps / t, vol / t], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(design, np.ones(len(t)), rcond=None)
    if alpha < 0:
        alpha, beta = 0.0, float(np.sum(vol / t) / np.sum((vol / t) ** 2))
    elif beta < 0:
        alpha, beta = float(np.sum(steps / t) / np.sum((steps / t) ** 2)), 0.0
    return float(alpha), float(beta)


def fit(rows, p: int) -> dict[str, dict[str, dict[str, float]]]:
    """{transport: {algorithm: {"alpha", "beta"}}} from the bench's rows (the explicit
    algorithms' rows; auto's are made of them)."""
    by_row: dict[str, list] = {}
    for r in rows:
        algo, transport = split_name(r.name)
        if algo in choose.NAMES and r.verified:
            by_row.setdefault(r.name, []).append(r)
    models: dict[str, dict] = {}
    for name, mine in by_row.items():
        algo, transport = split_name(name)
        if len(mine) < 2:
            continue  # two figures need two sizes
        alpha, beta = fit_one(algo, p, [r.size_bytes for r in mine], [r.time_s for r in mine])
        if alpha > 0 or beta > 0:  # 0 and 0: a model that costs nothing, auto's every pick
            models.setdefault(resolved(transport), {})[algo] = {"alpha": alpha, "beta": beta}
    return models


def finish_fit(models: dict, rows, p: int, path, argv: str, print_fn) -> None:
    """Write the fit and print it; a fit with no model in it (every row of an algorithm
    failed its check, or timed nothing) is a JobError saying why, the file left as it was."""
    if not models:
        wrong = sorted({r.name for r in rows if split_name(r.name)[0] in choose.NAMES})
        why = (
            f"no row of {', '.join(wrong)} summed correctly at 2 sizes or more"
            if wrong
            else "no row of an algorithm auto chooses among ran"
        )
        raise JobError(f"--fit: nothing to fit ({why}), so {path} is left as it was")
    write_fit(models, p, path, argv)
    print_fit(models, p, path, print_fn)


def write_fit(models: dict, p: int, path, argv: str) -> dict:
    """Write the fitted figures where `auto` reads them (keeping other transports' figures)."""
    data: dict[str, Any] = {"models": {}}
    if path.exists():
        choose.read_models(path)  # a ConfigError naming the file, if it is not a models file
        data = json.loads(path.read_text())
    for transport, algos in models.items():
        data.setdefault("models", {}).setdefault(transport, {}).update(algos)
    data |= {
        "world_size": p,
        "measured": datetime.date.today().isoformat(),
        "host": socket.gethostname(),
        "machine": platform.machine(),
        "command": argv,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(str(path), json.dumps(data, indent=2) + "\n")
    return data


def crossovers(models: dict, p: int, lo: int = 64, hi: int = 1 << 28) -> dict[str, list]:
    """{transport: [(size, from, to)]}: where the fastest fitted model changes, scanning sizes
    on a fine log grid (sizes rounded to whole float32 arrays)."""
    out = {}
    grid = sorted({int(s) // 4 * 4 for s in np.geomspace(lo, hi, 400)})
    for transport, algos in models.items():
        figures = {a: (m["alpha"], m["beta"]) for a, m in algos.items()}
        changes, last = [], None
        for n in grid:
            best = choose.pick(list(figures), p, n, figures)
            if last is not None and best != last:
                changes.append((n, last, best))
            last = best
        out[transport] = changes
    return out


def print_fit(models: dict, p: int, path, print_fn) -> None:
    for transport, algos in sorted(models.items()):
        figures = ", ".join(
            f"{a} alpha {m['alpha'] * 1e6:.1f} us, {_rate(m['beta'])} per byte of volume"
            for a, m in sorted(algos.items())
        )
        print_fn(f"fitted ({transport}): {figures}")
    for transport, changes in crossovers(models, p).items():
        if changes:
            steps = "; ".join(f"{a} -> {b} at {format_bytes(n)}" for n, a, b in changes[:4])
            if len(changes) > 4:  # two models that step with the pieces, crossing back and forth
                steps += f"; {len(changes) - 4} more changes up to {format_bytes(changes[-1][0])}"
            print_fn(f"auto on {transport}, {p} ranks: {steps}")
    print_fn(f"wrote {path} (auto reads it; PIPESGD_ALLREDUCE_MODELS names another file)")


def _rate(beta: float) -> str:
    return f"{1 / beta / 1e9:.2f} GB/s" if beta > 0 else "free"
