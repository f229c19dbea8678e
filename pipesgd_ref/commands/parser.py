"""The `pipesgd` command line: its commands and flags, and the config a command line resolves to.

Config options, applied in order: --preset NAME, --config FILE (.toml/.json), then any
--key=value (or --key value, or a yes/no key alone) naming a TrainConfig field. A usage error is
one line, as every other error is (`Parser.error`), exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import math
import sys
from pathlib import Path

from pipesgd_ref.commands.help_groups import TOP_EPILOG, CommandsFormatter, add_config_groups
from pipesgd_ref.config import (
    MIN_TIMEOUT,
    PRESETS,
    TrainConfig,
    apply_dict,
    parse_overrides,
    read_config_file,
)
from pipesgd_ref.errors import ConfigError
from pipesgd_ref.presets import COMPARE_PRESET_OF_MODEL
from pipesgd_ref.runtime.launch import add_many_workers_flag

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

EXIT_USAGE = 2
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
BIND_HELP = (
    "interface for this rank's listeners when joining a job from the environment "
    "(default: loopback for a loopback MASTER_ADDR, else all interfaces)"
)
OVERWRITE_HELP = "replace the results already in --out"


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is the one line every other error is (no usage block):
    "pipesgd: error: WHAT (see `pipesgd COMMAND --help`)", exit status 2."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"pipesgd: error: {message} (see `{self.prog} --help`)\n")


def log_level(text: str) -> str:
    """--log-level: a level name, any case (argparse type)."""
    if text.strip().upper() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"unknown log level {text!r}: expected one of {', '.join(LOG_LEVELS)}"
        )
    return text.strip().upper()


def seconds(text: str) -> float:
    """--timeout: a positive, finite number of seconds (argparse type)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(
            f"expected a positive number of seconds, e.g. 60, got {text!r}"
        )
    if value < MIN_TIMEOUT:
        raise argparse.ArgumentTypeError(
            f"{text} s is shorter than a frame, or a peer's start, can take on a busy host; "
            f"give at least {MIN_TIMEOUT:g} s"
        )
    return value


def package_version() -> str:
    """`pipesgd --version`: the installed version, or, run from a checkout that is not
    installed, the version its pyproject.toml declares."""
    try:
        return importlib.metadata.version("pipesgd_ref")
    except importlib.metadata.PackageNotFoundError:
        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
        try:
            return tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["version"]
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "unknown"


def build_parser() -> argparse.ArgumentParser:
    """The whole tree: compare, train, reference, config, predict, bench allreduce."""
    p = Parser(
        prog="pipesgd",
        description="Pipe-SGD reference implementation: train, compare, predict.",
        epilog=TOP_EPILOG,
        formatter_class=CommandsFormatter,
    )
    p.add_argument("--version", action="version", version=f"pipesgd_ref {package_version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_compare(sub)
    _add_train(sub)
    r = sub.add_parser("reference", help="train with a one-process oracle")
    _add_config_flags(r)
    r.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    _add_config_flags(sub.add_parser("config", help="print the resolved configuration as JSON"))
    from pipesgd_ref.commands.predict import add_parser as add_predict_parser

    add_predict_parser(sub)  # beside its command: predict.py
    lf = sub.add_parser(
        "lesson-file", help="write the lesson core as one runnable file (NumPy only)"
    )
    lf.add_argument("path", help="the file to write, e.g. pipe_sgd.py")
    lf.add_argument("--overwrite", action="store_true", help="replace the file if it exists")
    from pipesgd_ref.commands.tutorials import add_parser as add_tutorials_parser

    add_tutorials_parser(sub)  # beside its command: tutorials.py
    b = sub.add_parser("bench", help="benchmarks of the communication layer")
    _add_bench_allreduce(b.add_subparsers(dest="bench", required=True, metavar="BENCHMARK"))
    for name in ("compare", "train", "reference", "config"):  # the commands of config keys
        add_config_groups(sub.choices[name], name)
    return p


def _add_config_flags(sp: argparse.ArgumentParser) -> None:
    """The flags of every command that resolves a TrainConfig (the keys come as --key=value)."""
    *first, last = PRESETS  # every preset, named as presets.py defines them
    presets = f"{', '.join(first)} or {last}"
    sp.add_argument("--preset", default="laptop", help=presets)
    sp.add_argument("--config", help="a .toml or .json file of config keys")
    sp.add_argument("--no-progress", action="store_true", help="no progress bar")


def _add_compare(sub) -> None:
    c = sub.add_parser("compare", help="the paper's comparison in miniature (the main job)")
    _add_config_flags(c)
    c.set_defaults(preset="compare")
    c.add_argument("--quick", action="store_true", help="a short run (CI, tutorials)")
    c.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="runs of each method, the one that reaches the target soonest kept "
        "(default 2, 1 with --quick)",
    )
    c.add_argument(
        "--out",
        dest="out_dir",
        default=None,
        help="where to write results (default runs/compare, runs/study with --study)",
    )
    c.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    c.add_argument(
        "--study",
        choices=("staleness",),
        default=None,
        help="instead of the methods of the comparison: where staleness costs accuracy, the "
        "learning-rate sweep of sync, ddp, pipe, pipe+dc and pipe+predict on a ResNet-20 at "
        "momentum 0 and 0.9 (study_momentum.py); with --model mlp, softmax or cnn, the "
        "plain-SGD sweep of that model with every compensation (study.py)",
    )
    c.add_argument(
        "--lrs",
        default=None,
        help="--study's learning rates, a comma list: on the ResNet the effective steps "
        "lr/(1-M) (default study_momentum.EFFECTIVE_LRS, --quick QUICK_EFFECTIVE_LRS); with "
        "another --model the learning rates themselves (study.LRS, --quick QUICK_LRS)",
    )
    c.add_argument(
        "--peers",
        default=None,
        help="other libraries' rows beside ours: torch (PyTorch DDP and Pipe-SGD as a DDP "
        "hook: torch-ddp, torch-pipe), or a comma list of torch-ddp, torch-pipe; none by "
        "default (needs the torch extra; skipped in one line without it)",
    )
    add_many_workers_flag(c)


def _add_train(sub) -> None:
    t = sub.add_parser(
        "train",
        help="train --algo in local workers, or as one rank of a torchrun, mpirun or srun job",
    )
    _add_config_flags(t)
    t.add_argument(
        "--log-level", default="INFO", type=log_level, help="DEBUG, INFO, WARNING, ERROR"
    )
    t.add_argument("--bind", default=None, help=BIND_HELP)
    t.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    t.add_argument(
        "--lesson",
        action="store_true",
        help="run the lesson core (pipesgd_ref/core: sync, pipe, ps-sync in processes over "
        "tcp), bitwise the product's --allreduce ring --transport tcp run",
    )
    t.add_argument(
        "--lesson-threads",
        action="store_true",
        help="the lesson core with every rank a thread of this process, over socketpairs and "
        "without timeouts: pdb and IDEs step through all ranks",
    )
    add_many_workers_flag(t)


def _add_bench_allreduce(bsub) -> None:
    ar = bsub.add_parser("allreduce", help="ring AllReduce time, algbw and busbw per size")
    ar.add_argument("--world-size", type=int, default=4, help="ranks to start (default 4)")
    ar.add_argument("--sizes", default="4KB,1MB,16MB,64MB", help="comma-separated sizes")
    ar.add_argument("--latency", default=None, help="emulated link latency, e.g. 50us, 1ms")
    ar.add_argument("--bandwidth", default=None, help="emulated bandwidth, e.g. 1Gbit, 125MB")
    ar.add_argument(
        "--reps",
        type=int,
        default=None,
        help="timed repeats per size (default 10, and up to 200 below 4 MB: each row times at "
        "least 4 MB of AllReduce, as short calls need more repeats to be measured)",
    )
    ar.add_argument("--warmup", type=int, default=2, help="untimed repeats per size")
    ar.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="times every row runs at every size, in turns; each keeps its best (default 2)",
    )
    ar.add_argument("--timeout", type=seconds, default=60.0, help="communication timeout, s")
    ar.add_argument("--json", dest="json_path", default=None, help="also write results here")
    ar.add_argument(
        "--peers",
        default=None,
        help="other libraries' AllReduce to time in turns with ours: a comma list of "
        "gloo (torch), mpi (Open MPI via mpi4py), mpi-tcp (Open MPI over TCP only), "
        "or none (default: gloo; a peer whose library is missing is skipped)",
    )
    ar.add_argument("--no-gloo", action="store_true", help="leave gloo out of the peers")
    ar.add_argument("--codec", default="none", help="none, trunc16, bf16, q8: compress each hop")
    ar.add_argument(
        "--transport",
        default="auto",
        help="auto (the default: shm on one host), tcp, unix, shm, or a comma list run in "
        "turns (e.g. tcp,shm)",
    )
    ar.add_argument(
        "--allreduce",
        default=None,
        help="the algorithms to time, a comma list of ring, rd, rab, oneshot, twoshot, auto "
        "(default: all; a rank of a joined job: auto): one row per algorithm and transport; "
        "auto's row says what it picked",
    )
    ar.add_argument(
        "--fit",
        nargs="?",
        const="",
        default=None,
        metavar="PATH",
        help="fit each algorithm's alpha-beta model to the times and write the figures auto "
        "chooses by (default path: ~/.cache/pipesgd/allreduce_models.json)",
    )
    ar.add_argument(
        "--log-level", default="WARNING", type=log_level, help="DEBUG, INFO, WARNING, ERROR"
    )
    ar.add_argument("--bind", default=None, help=BIND_HELP)
    ar.add_argument(
        "--comm",
        default="sockets",
        choices=("sockets", "mpi"),
        help="sockets (the project's TCP links) or mpi (the same ring over MPI "
        "point-to-point; run alone, it starts --world-size ranks through mpirun)",
    )
    add_many_workers_flag(ar)


def split_overrides(rest: list[str]) -> list[str]:
    """Accept --key=value and --key value, and a yes/no field alone (--skip-nonfinite) as
    --key=true; anything else is an error."""
    bools = [f.name for f in dataclasses.fields(TrainConfig) if f.type in (bool, "bool")]
    flags = {f"--{n}" for n in bools} | {f"--{n.replace('_', '-')}" for n in bools}
    out, i = [], 0
    while i < len(rest):
        arg = rest[i]
        value_follows = i + 1 < len(rest) and not rest[i + 1].startswith("--")
        if arg.startswith("--") and "=" not in arg and value_follows and arg not in flags:
            out.append(f"{arg}={rest[i + 1]}")
            i += 2
            continue
        if arg in flags and not (value_follows and rest[i + 1].lower() in ("true", "false")):
            arg += "=true"
        elif arg in flags:  # --flag true / --flag false
            arg, i = f"{arg}={rest[i + 1]}", i + 1
        out.append(arg)
        i += 1
    return out


def resolve_config(args: argparse.Namespace, rest: list[str]) -> TrainConfig:
    """The TrainConfig of a command line: the preset, then --config's file, then the keys."""
    return resolve_named(args, rest)[0]


def resolve_named(args: argparse.Namespace, rest: list[str]) -> tuple[TrainConfig, frozenset]:
    """resolve_config's TrainConfig, and the keys the command line named: its preset's,
    --config's file's and the --key=value ones (compare chooses the link's bandwidth for this
    machine only where none of them names it: compare_link.py)."""
    overrides = split_overrides(rest)
    given = parse_overrides(overrides)
    preset = args.preset
    if args.config == "":
        raise ConfigError("--config is empty; give a .toml or .json file of config keys")
    from_file = read_config_file(args.config) if args.config else {}
    model = given.get("model", from_file.get("model"))
    if args.command == "compare" and preset == "compare":
        if getattr(args, "study", None) and model is None:
            model = "resnet"  # --study staleness: the deep net unless another model is named
        if model in COMPARE_PRESET_OF_MODEL:
            preset = COMPARE_PRESET_OF_MODEL[model]  # the model's own comparison (presets.py)
    cfg = apply_dict(TrainConfig.preset(preset), from_file)
    named = set(PRESETS[preset]) | set(given) | set(from_file)
    if given.get("comm") == "mpi" and not args.config and not {"latency", "bandwidth"} & set(given):
        # A preset's emulated link (compare's) paces the project's own sockets; under MPI the
        # library owns the wire, so the preset's link is dropped rather than refused.
        cfg = cfg.replace(latency="0", bandwidth="inf")
    return apply_dict(cfg, given), frozenset(key.replace("-", "_") for key in named)
