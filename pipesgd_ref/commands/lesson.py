"""The lesson core (pipesgd_ref/core) run as the product runs: `pipesgd train --lesson` and
`pipesgd lesson-file`.

    pipesgd train --lesson [config options]           the core's sync, pipe or ps-sync, in
                                                      processes over TCP, on the product's
                                                      data and presets; summary.json,
                                                      trace.json and checkpoint.npz as usual
    pipesgd train --lesson-threads [config options]   the same, every rank a thread of one
                                                      process (a debugger steps through all)
    pipesgd lesson-file pipe_sgd.py                   the core as one runnable file (NumPy
                                                      only), for a notebook or Colab

An option the core does not have (a codec, an emulated link, compensation...) is refused in
one line naming it: a lesson run is the plain method, and its weights are bitwise the
product's run of the same config with --allreduce ring --transport tcp.
"""

from __future__ import annotations

import time
from pathlib import Path

from pipesgd_ref.config import TrainConfig
from pipesgd_ref.errors import ConfigError
from pipesgd_ref.methods.table import method
from pipesgd_ref.units import parse_bandwidth, parse_latency

ALGOS = ("sync", "pipe", "ps-sync")  # the core's methods (core/launch.py METHODS)

# field -> (does the core run this value?, what it runs instead): every option that changes
# what a run computes or how its bytes travel; the others (eval_every, timeout, out, ...) are
# taken, and the product's speed knobs (comm_first, master_port, ...) do not apply.
_CORE_RUNS = {
    "model": (lambda v: v in ("mlp", "softmax"), "the MLP (or softmax: no hidden layer)"),
    "backend": (lambda v: v == "numpy", "NumPy"),
    "device": (lambda v: v == "cpu", "the CPU"),
    "comm": (lambda v: v == "sockets", "its own sockets"),
    "transport": (lambda v: v in ("auto", "tcp"), "TCP (socketpairs with --lesson-threads)"),
    "allreduce": (lambda v: v in ("auto", "ring"), "the ring"),
    "compensation": (lambda v: v == "none", "no compensation"),
    "codec": (lambda v: v == "none", "float32 on the wire"),
    "error_feedback": (lambda v: not v, "no error feedback"),
    "codec_pull": (lambda v: v == "none", "float32 pulls"),
    "max_staleness": (lambda v: v < 0, "no ps-async"),
    "latency": (lambda v: parse_latency(v) == 0, "no emulated link"),
    "bandwidth": (lambda v: parse_bandwidth(v) == float("inf"), "no emulated link"),
    "checkpoint_every": (lambda v: v == 0, "a checkpoint at the end only"),
    "resume": (lambda v: not v, "a run from w_0"),
    "max_restarts": (lambda v: v == 0, "no restarts"),
    "skip_nonfinite": (lambda v: not v, "no skipping of gradients"),
    # the optimiser: plain SGD, with lr / (1 + lr_decay * t) (methods/optimizer.py's inverse)
    "momentum": (lambda v: v == 0, "plain SGD"),
    "nesterov": (lambda v: not v, "plain SGD"),
    "weight_decay": (lambda v: v == 0, "plain SGD"),
    "lr_schedule": (lambda v: v in ("constant", "inverse"), "lr / (1 + lr_decay * t)"),
    "lr_warmup": (lambda v: v == 0, "lr / (1 + lr_decay * t)"),
}


def check_lesson(cfg: TrainConfig) -> None:
    """One ConfigError naming every option of cfg that the core lacks."""
    if cfg.algo not in ALGOS:
        raise ConfigError(
            f"--lesson runs {', '.join(ALGOS)} (the core's methods), not --algo {cfg.algo}"
        )
    bad = [key for key, (runs, _) in _CORE_RUNS.items() if not runs(getattr(cfg, key))]
    if bad:
        named = ", ".join(f"--{key.replace('_', '-')} {getattr(cfg, key)}" for key in bad)
        instead = "; ".join(dict.fromkeys(_CORE_RUNS[key][1] for key in bad))  # each once
        raise ConfigError(
            f"--lesson: the lesson core has no {named}; drop "
            f"{'it' if len(bad) == 1 else 'them'} (it runs {instead}), "
            f"or run without --lesson"
        )


def problem_of(cfg: TrainConfig, inputs):
    """The core's Problem for cfg, on the product's data (inputs: runtime.inputs.JobInputs)."""
    from pipesgd_ref.core import Problem

    data, pipe = inputs.data, method(cfg.algo).pipelined
    return Problem(
        data.X_train,
        data.y_train,
        data.n_classes,
        hidden=() if cfg.model == "softmax" else cfg.hidden,
        world_size=cfg.world_size,
        width=cfg.width if pipe else 1,
        warmup=cfg.warmup_steps if pipe else 0,
        batch_size=cfg.batch_size,
        lr=cfg.lr,
        lr_decay=cfg.lr_decay,
        steps=inputs.steps,
        seed=cfg.seed,
        keep_every=cfg.eval_every,
    )


def run_lesson(cfg: TrainConfig, threads: bool = False, log=print) -> dict:
    """Run cfg with the core; write cfg.out's summary.json, trace.json and checkpoint.npz;
    return the summary."""
    from pipesgd_ref.commands.train import log_outcome
    from pipesgd_ref.core import launch
    from pipesgd_ref.outputs import write_json
    from pipesgd_ref.runtime import checkpoint
    from pipesgd_ref.runtime.inputs import JobInputs
    from pipesgd_ref.runtime.summary import summarise
    from pipesgd_ref.trace import chrome_trace

    check_lesson(cfg)
    inputs = JobInputs.load(cfg)
    prob = problem_of(cfg, inputs)
    ranks = "threads over socketpairs" if threads else "processes over tcp"
    row = method(cfg.algo)
    log(
        f"{cfg.algo} (the lesson core, pipesgd_ref/core: {ranks}"
        f"{'' if row.server else ', ring allreduce'}): {cfg.world_size} workers, "
        f"{cfg.dataset}, {cfg.model}{f', width {cfg.width}' if row.pipelined else ''}"
    )
    start = time.perf_counter()
    results = launch(prob, cfg.algo, threads=threads, timeout=cfg.timeout)
    wall = time.perf_counter() - start
    worker_results = [_as_product(r, cfg, inputs, threads) for r in results]
    summary = summarise(cfg, worker_results, wall)
    summary["lesson"] = {
        "core": "pipesgd_ref.core",
        "ranks": "threads" if threads else "processes",
        "transport": "socketpair" if threads else "tcp",
        "allreduce": None if row.server else "ring",
    }
    log_outcome(cfg, summary, wall, log)
    if cfg.out:
        out = Path(cfg.out)
        checkpoint.save(out, cfg, results[0]["params"], prob.steps, {})
        write_json(out / "summary.json", summary)
        write_json(out / "trace.json", chrome_trace([e for r in worker_results for e in r.events]))
        log(f"wrote {out / 'summary.json'}, {out / 'trace.json'} and {out / checkpoint.FILE}")
    return summary


def _ring_ran(result: dict, p: int, threads: bool) -> list[dict]:
    """summary.json's allreduce_ran for a core ring rank: one AllReduce of the whole gradient
    per step, its payload bytes (what it sent less the 2(p - 1) frame headers of each)."""
    from pipesgd_ref.core.wire import HEADER

    calls, nbytes = len(result["losses"]), result["params"].nbytes
    payload = result["bytes_sent"] - calls * 2 * (p - 1) * HEADER.size
    transport = "socketpair" if threads else "tcp"
    if p == 1:
        transport = "none"
    ran = {"bytes": nbytes, "algorithm": "ring", "transport": transport, "calls": calls}
    return [{**ran, "bytes_sent": payload}]


def _as_product(result: dict, cfg: TrainConfig, inputs, threads: bool):
    """A core rank's result as the product's WorkerResult, which runtime/summary.py reads:
    rank 0 evaluates its kept weights and its final ones on the test set."""
    from pipesgd_ref.runtime.worker import WorkerResult

    rank, params, data = result["rank"], result["params"], inputs.data
    events = [
        {"name": name, "ph": "X", "pid": rank, "tid": thread, "ts": a * 1e6,
         "dur": (b - a) * 1e6, "args": {"step": step}}
        for name, thread, a, b, step in result["spans"]
    ]  # fmt: skip
    extra = {}
    if rank == 0:
        accuracy = inputs.model.accuracy
        extra["test_accuracy"] = accuracy(params, data.X_test, data.y_test)
        extra["eval_curve"] = [
            {"step": step, "time": when, "test_accuracy": accuracy(w, data.X_test, data.y_test)}
            for step, when, w in result["kept"]
        ]
        if method(cfg.algo).server:
            extra["role"] = "server"
        else:
            extra["allreduce_ran"] = _ring_ran(result, cfg.world_size, threads)
    losses, ends = result["losses"], result["step_end"]
    return WorkerResult(rank, params, losses, ends, events, result["bytes_sent"], extra)


# --- pipesgd lesson-file ----------------------------------------------------------------------

# The core's modules in reading order; each one's imports of the others are dropped, since in
# one file the names are simply defined above.
MODULES = ("model", "wire", "ring", "methods", "launch", "__main__")


def lesson_source() -> str:
    """The whole core as the text of one Python file that needs only NumPy."""
    import pipesgd_ref.core as core

    folder = Path(core.__file__).parent
    parts = [
        '"""Pipe-SGD, the lesson core of pipesgd_ref in one file (NumPy only).\n\n'
        "    python pipe_sgd.py --algo pipe --world-size 4     processes over TCP\n"
        "    python pipe_sgd.py --algo pipe --threads          ranks as threads (a debugger)\n"
        "    from pipe_sgd import Problem, blobs, launch, oracle   (in a notebook)\n\n"
        "Written by `pipesgd lesson-file`; the package's pipesgd_ref/core/ is the source.\n"
        '"""\n\nfrom __future__ import annotations\n'
    ]
    for name in MODULES:
        lines = (folder / f"{name}.py").read_text().splitlines()
        kept = [
            line
            for line in lines
            if not line.startswith(("from pipesgd_ref.core", "from __future__ import"))
        ]
        parts.append(f"\n# {'=' * 20} core/{name}.py {'=' * (70 - len(name))}\n")
        parts.append("\n".join(kept).strip("\n") + "\n")
    return "\n".join(parts)


def write_lesson_file(path: str, overwrite: bool = False) -> Path:
    target = Path(path)
    if target.is_dir():
        raise ConfigError(f"lesson-file {path}: a folder; give a file name, e.g. pipe_sgd.py")
    if target.exists() and not overwrite:
        raise ConfigError(f"lesson-file {path}: the file exists; add --overwrite to replace it")
    if not target.parent.is_dir():
        raise ConfigError(f"lesson-file {path}: no folder {target.parent}")
    target.write_text(lesson_source())
    return target
