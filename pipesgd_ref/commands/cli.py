"""The `pipesgd` command (also `python -m pipesgd_ref`).

    pipesgd compare [--quick] [--out DIR] [config options]   the main job (see below)
    pipesgd train [config options] [--bind IFACE]             --algo in worker processes over TCP
    pipesgd reference [config options]                        one run of a one-process oracle
    pipesgd config [config options]                           print the resolved configuration
    pipesgd predict [--world-size P] [--hidden ...] [--bandwidth B] [--sweep KEY=LO..HI]
                                                              predicted iteration times
    pipesgd bench allreduce [--world-size P] [--sizes ...] [--transport tcp,unix,shm,auto]
                            [--peers gloo,mpi,mpi-tcp] [--latency L] [--bandwidth B]
                                                              ring AllReduce benchmark

Config options, applied in order: --preset NAME (laptop, compare, compare-cnn,
compare-cnn-compute, tiny), --config FILE (.toml/.json), then any --key=value (or --key value)
naming a TrainConfig field, e.g. --lr=0.05 --hidden=128,64. `compare --model cnn` starts from
the compare-cnn preset.

`compare` (pipesgd_ref/commands/compare.py) trains ps-sync, ps-async, sync, pipe, pipe+trunc16 and
pipe+q8 on the same problem (the `compare` preset) through one emulated network, each twice
(--repeats), and prints measured against predicted iteration times and the wall-clock time to
the target accuracy (of each method's repeat that reached it soonest). With --comm mpi every
run is a job of world size + 1 MPI ranks instead (compare_mpi.py; run alone it starts them
through mpirun), on MPI's own wire: the preset's emulated link is dropped.

`train` starts cfg.world_size local workers, or, when the environment describes a job (torchrun's
RANK/WORLD_SIZE, mpirun's or srun's variables, with MASTER_ADDR/MASTER_PORT; see launch.py),
runs as that one rank of it: every rank runs the same command, rank 0 prints and writes --out.

Bad input (unknown key, wrong type, impossible value, missing data file, an unusable output
path) prints one line that says what is wrong and exits with status 2, never a traceback.

Outputs are checked before any work (pipesgd_ref/outputs.py): train's and reference's --out,
compare's --out, bench's --json, predict's --json/--plot/--out are created and tried for
writing first; a folder holding an earlier run's results is refused unless --overwrite (or
--resume of that folder), and a lock keeps a second job off a folder in use until the first
one ends. Local worker counts beyond a sane bound for this machine's cores
(`local_worker_limit`) are refused unless --allow-many-workers (or PIPESGD_ALLOW_MANY_WORKERS=1).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import math
import os
import sys

from pipesgd_ref.commands.train import run_reference, run_training, run_training_joined
from pipesgd_ref.config import (
    TrainConfig,
    apply_dict,
    check_idle_options,
    field_names,
    load_config_file,
    parse_overrides,
)
from pipesgd_ref.errors import (
    CommError,
    ConfigError,
    DataError,
    JobError,
    JobStopped,
    LaunchError,
    TrainingDiverged,
)
from pipesgd_ref.runtime.launch import add_many_workers_flag, check_local_workers, detect_env

EXIT_USAGE = 2
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# OSErrors that a path the user gave causes (a last resort: outputs.py checks paths before the
# work); any other OSError is a bug or a network fault and keeps its traceback.
PATH_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.ENOENT, errno.ENOTDIR, errno.EISDIR,
                         errno.EEXIST, errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.ENAMETOOLONG,
                         errno.ELOOP, errno.EFBIG, errno.ETXTBSY})  # fmt: skip
BIND_HELP = (
    "interface for this rank's listeners when joining a job from the environment "
    "(default: loopback for a loopback MASTER_ADDR, else all interfaces)"
)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is the one line every other error is (no usage block):
    "pipesgd: error: WHAT (see `pipesgd COMMAND --help`)", exit status 2."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"pipesgd: error: {message} (see `{self.prog} --help`)\n")


def _log_level(text: str) -> str:
    """--log-level: a level name, any case (argparse type)."""
    if text.strip().upper() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"unknown log level {text!r}: expected one of {', '.join(LOG_LEVELS)}"
        )
    return text.strip().upper()


def _seconds(text: str) -> float:
    """--timeout: a positive, finite number of seconds (argparse type)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(
            f"expected a positive number of seconds, e.g. 60, got {text!r}"
        )
    return value


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="pipesgd",
        description="Pipe-SGD reference implementation: train, compare, predict.",
        epilog="Config keys (as --key=value): " + ", ".join(field_names()),
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--preset", default="laptop", help="laptop, compare, compare-cnn, "
                        "compare-cnn-compute or tiny")  # fmt: skip
        sp.add_argument("--config", help="a .toml or .json file of config keys")
        sp.add_argument("--no-progress", action="store_true", help="no progress bar")

    c = sub.add_parser("compare", help="the paper's comparison in miniature (the main job)")
    common(c)
    c.set_defaults(preset="compare")
    c.add_argument("--quick", action="store_true", help="a short run (CI, tutorials)")
    c.add_argument("--repeats", type=int, default=None,
                   help="runs of each method, the one that reaches the target soonest kept "
                   "(default 2, 1 with --quick)")  # fmt: skip
    c.add_argument("--out", dest="out_dir", default=None,
                   help="where to write results (default runs/compare, runs/study with "
                   "--study)")  # fmt: skip
    c.add_argument("--overwrite", action="store_true", help="replace the results already in --out")
    c.add_argument("--study", choices=("staleness",), default=None,
                   help="instead of the six methods: staleness, the learning-rate sweep of "
                   "sync, pipe and pipe's compensations (study.py)")  # fmt: skip
    c.add_argument("--lrs", default=None,
                   help="--study's learning rates, a comma list (default: study.LRS; "
                   "--quick: study.QUICK_LRS)")  # fmt: skip
    add_many_workers_flag(c)
    t = sub.add_parser(
        "train",
        help="train with --algo in worker processes over TCP (local, or one rank of a job "
        "that torchrun, mpirun or srun started)",
    )
    common(t)
    t.add_argument("--log-level", default="INFO", type=_log_level,
                   help="DEBUG, INFO, WARNING, ERROR")  # fmt: skip
    t.add_argument("--bind", default=None, help=BIND_HELP)
    t.add_argument("--overwrite", action="store_true", help="replace the results already in --out")
    add_many_workers_flag(t)
    r = sub.add_parser("reference", help="train with a one-process oracle")
    common(r)
    r.add_argument("--overwrite", action="store_true", help="replace the results already in --out")
    g = sub.add_parser("config", help="print the resolved configuration as JSON")
    common(g)
    from pipesgd_ref.commands.predict import add_parser as add_predict_parser

    add_predict_parser(sub)
    b = sub.add_parser("bench", help="benchmarks of the communication layer")
    bsub = b.add_subparsers(dest="bench", required=True, metavar="BENCHMARK")
    ar = bsub.add_parser("allreduce", help="ring AllReduce time, algbw and busbw per size")
    ar.add_argument("--world-size", type=int, default=4, help="ranks to start (default 4)")
    ar.add_argument("--sizes", default="4KB,1MB,16MB,64MB", help="comma-separated sizes")
    ar.add_argument("--latency", default=None, help="emulated link latency, e.g. 50us, 1ms")
    ar.add_argument("--bandwidth", default=None, help="emulated bandwidth, e.g. 1Gbit, 125MB")
    ar.add_argument("--reps", type=int, default=10, help="timed repeats per size")
    ar.add_argument("--warmup", type=int, default=2, help="untimed repeats per size")
    ar.add_argument("--timeout", type=_seconds, default=60.0, help="communication timeout, s")
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
        default="tcp",
        help="tcp, unix, shm, auto, or a comma list run in turns (e.g. tcp,unix,shm): one "
        "row of the table each",
    )
    ar.add_argument("--log-level", default="WARNING", type=_log_level,
                    help="DEBUG, INFO, WARNING, ERROR")  # fmt: skip
    ar.add_argument("--bind", default=None, help=BIND_HELP)
    ar.add_argument("--comm", default="sockets", choices=("sockets", "mpi"),
                    help="sockets (the project's TCP links) or mpi (the same ring over MPI "
                    "point-to-point; run alone, it starts --world-size ranks through "
                    "mpirun)")  # fmt: skip
    add_many_workers_flag(ar)
    return p


def _split_overrides(rest: list[str]) -> list[str]:
    """Accept --key=value and --key value, and a yes/no field alone (--skip-nonfinite) as
    --key=true; anything else is an error."""
    import dataclasses

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
    overrides = _split_overrides(rest)
    given = parse_overrides(overrides)
    preset = args.preset
    if args.command == "compare" and preset == "compare" and given.get("model") == "cnn":
        preset = "compare-cnn"  # the CNN's own comparison (config.py), not the MLP's with a CNN
    cfg = TrainConfig.preset(preset)
    if args.config == "":
        raise ConfigError("--config is empty; give a .toml or .json file of config keys")
    if args.config:
        cfg = load_config_file(args.config, base=cfg)
    if given.get("comm") == "mpi" and not args.config and not {"latency", "bandwidth"} & set(given):
        # A preset's emulated link (compare's) paces the project's own sockets; under MPI the
        # library owns the wire, so the preset's link is dropped rather than refused.
        cfg = cfg.replace(latency="0", bandwidth="inf")
    return apply_dict(cfg, given)


def _claimed(path: str, overwrite: bool, resume: str = "", flag: str = "--out"):
    """The results folder of this command, checked, created and locked for the whole command
    (outputs.claim_out_dir); nothing when there is none."""
    if not path:
        return contextlib.nullcontext()
    from pipesgd_ref.outputs import claim_out_dir

    return claim_out_dir(path, overwrite=overwrite, resume=resume, flag=flag)


def _check_faults(n_ranks: int, cfg: TrainConfig | None) -> None:
    """PIPESGD_FAULT, parsed and checked against the job here, in one line (each worker would
    otherwise fail on its own, or a fault for a rank outside the job would never fire)."""
    from pipesgd_ref.runtime import faults

    try:
        faults.check(n_ranks, steps=None if cfg is None else _fixed_steps(cfg),
                     ps_async=cfg is not None and cfg.algo == "ps-async")  # fmt: skip
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _fixed_steps(cfg: TrainConfig) -> int | None:
    """The run's steps when they are known without loading the data (no --epochs, no --resume)."""
    return cfg.steps if cfg.epochs <= 0 and not cfg.resume else None


def cmd_compare(args: argparse.Namespace, cfg: TrainConfig) -> int:
    from pipesgd_ref.commands.compare import (
        QUICK_CALIBRATION_REPS,
        QUICK_CALIBRATION_TRIES,
        REPEATS,
        quick_config,
        run_compare,
    )
    from pipesgd_ref.logs import configure_parent_logging

    if args.repeats is not None and args.repeats < 1:
        raise ConfigError(f"--repeats must be at least 1, got {args.repeats}")
    if args.study is not None:
        return _study(args, cfg)
    if args.lrs is not None:
        raise ConfigError("--lrs sets the learning rates of --study staleness; add --study "
                          "staleness, or set one rate with --lr")  # fmt: skip
    args.out_dir = args.out_dir or "runs/compare"
    more = {"repeats": REPEATS}
    if args.quick:
        cfg, more = quick_config(cfg), {"calibration_reps": QUICK_CALIBRATION_REPS,
                                        "calibration_tries": QUICK_CALIBRATION_TRIES,
                                        "repeats": 1}  # fmt: skip
    if args.repeats is not None:
        more["repeats"] = args.repeats
    if cfg.comm == "mpi":
        return _compare_mpi(args, cfg, more)
    check_local_workers(cfg.world_size + 1, args.allow_many_workers, "compare")  # ps: + server
    _check_faults(cfg.world_size + 1, None)
    configure_parent_logging("WARNING")
    with _claimed(args.out_dir, args.overwrite):
        run_compare(cfg, out=args.out_dir, progress=not args.no_progress, **more)
    return 0


def _study(args: argparse.Namespace, cfg: TrainConfig) -> int:
    """`pipesgd compare --study staleness` (study.py): one process, the oracles."""
    from pipesgd_ref.commands.study import LRS, QUICK_LRS, run_staleness_study

    if cfg.comm == "mpi" or args.repeats is not None:
        flag = "--comm mpi" if cfg.comm == "mpi" else "--repeats"
        raise ConfigError(f"--study staleness runs the one-process oracles (it measures "
                          f"accuracy, not speed): {flag} does nothing there; drop it")  # fmt: skip
    lrs = QUICK_LRS if args.quick else LRS
    if args.lrs is not None:
        try:
            lrs = tuple(float(x) for x in args.lrs.split(","))
        except ValueError:
            lrs = ()
        if not lrs or not all(math.isfinite(x) and x > 0 for x in lrs):
            raise ConfigError(f"--lrs {args.lrs!r}: give a comma list of positive learning "
                              f"rates, e.g. --lrs 0.1,0.5,1")  # fmt: skip
        if len(set(lrs)) != len(lrs):
            raise ConfigError(f"--lrs {args.lrs!r} names a learning rate more than once")
    out = args.out_dir or "runs/study"
    with _claimed(out, args.overwrite):
        run_staleness_study(cfg, lrs=tuple(sorted(lrs)), out=out)
    return 0


def _compare_mpi(args: argparse.Namespace, cfg: TrainConfig, more: dict) -> int:
    """`pipesgd compare --comm mpi`: under mpirun or srun, this process is one rank of the
    job (rank 0 drives, compare_mpi.py); run alone, it starts the job through mpirun,
    world size + 1 ranks of this very command, and returns mpirun's exit code."""
    from pipesgd_ref.comm import mpi
    from pipesgd_ref.commands.compare_mpi import ranks_needed, run_compare_mpi
    from pipesgd_ref.logs import configure_parent_logging
    from pipesgd_ref.runtime import faults

    if faults.planned():
        raise ConfigError(f"{faults.ENV} is not taken by compare --comm mpi (a fault would end "
                          f"one of its runs, and with it the job); inject faults into `pipesgd "
                          f"train --comm mpi`")  # fmt: skip
    if not mpi.launched():
        check_local_workers(ranks_needed(cfg), args.allow_many_workers, "compare")
        with _claimed(args.out_dir, args.overwrite):
            pass  # a bad --out is one line here; rank 0 claims the folder for the job
        return mpi.run_under_mpirun(ranks_needed(cfg), args.argv)
    configure_parent_logging("WARNING")
    rank0 = mpi.mpi_job().rank == 0
    with _claimed(args.out_dir if rank0 else "", args.overwrite):
        run_compare_mpi(cfg, out=args.out_dir if rank0 else None,
                        progress=not args.no_progress and rank0, **more)  # fmt: skip
    return 0


def _bench_memory(world_size: int, sizes: list[int]) -> None:
    """Refuse sizes whose buffers cannot fit: every rank holds the array and about as much again
    in flight (chunks, codec buffers)."""
    try:
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not a POSIX sysconf
        return
    from pipesgd_ref.units import format_bytes

    need = 2 * max(sizes) * world_size
    if need > ram:
        raise ConfigError(
            f"--sizes {format_bytes(max(sizes))} on {world_size} ranks needs about "
            f"{format_bytes(need)} of memory (2 copies a rank), this machine has "
            f"{format_bytes(ram)}; choose smaller --sizes or fewer ranks"
        )


def cmd_bench(args: argparse.Namespace) -> int:
    from pipesgd_ref.comm.netem import LinkModel
    from pipesgd_ref.commands.bench import bench_allreduce, bench_allreduce_joined, link_problem
    from pipesgd_ref.logs import configure_parent_logging
    from pipesgd_ref.units import parse_size

    try:
        sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
        model = LinkModel.from_strings(args.latency, args.bandwidth)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if args.world_size < 1 or args.reps < 1 or args.warmup < 0 or not sizes:
        raise ConfigError("need --world-size >= 1, --reps >= 1, --warmup >= 0 and some --sizes")
    if any(s % 4 for s in sizes):
        raise ConfigError(f"sizes must be whole float32 arrays (multiples of 4 bytes): {sizes}")
    if args.codec not in ("none", "trunc16", "bf16", "q8"):
        raise ConfigError(f"--codec must be none, trunc16, bf16 or q8, got {args.codec!r}")
    from pipesgd_ref.comm.rendezvous import TRANSPORTS
    from pipesgd_ref.commands.bench_peers import PEERS

    transports = _names("--transport", args.transport, TRANSPORTS)
    if not transports:
        raise ConfigError(f"--transport takes {', '.join(TRANSPORTS)} or a comma list of them, "
                          f"got {args.transport!r}")  # fmt: skip
    peers = [] if args.peers in ("none", "") else _names("--peers", args.peers or "gloo", PEERS)
    if args.no_gloo and "gloo" in peers:
        peers.remove("gloo")
    if os.environ.get("PIPESGD_FAULT"):
        raise ConfigError("PIPESGD_FAULT is set, but bench allreduce injects no faults (only "
                          "`pipesgd train` does); unset it")  # fmt: skip
    if args.comm == "mpi":
        from pipesgd_ref.comm import mpi

        if model.enabled:
            raise ConfigError("bench allreduce --comm mpi with --latency or --bandwidth: link "
                              "emulation paces the project's own sockets, and under MPI the "
                              "MPI library owns the wire; drop them, or use --comm "
                              "sockets")  # fmt: skip
        if args.codec != "none":
            raise ConfigError(f"bench allreduce --comm mpi times the plain ring; --codec "
                              f"{args.codec} runs with --comm sockets only")  # fmt: skip
        if not mpi.launched():
            check_local_workers(args.world_size, args.allow_many_workers, "bench allreduce")
            if args.json_path:
                from pipesgd_ref.outputs import prepare_file

                prepare_file(args.json_path, "--json")
            return mpi.run_under_mpirun(args.world_size, args.argv)
        job = mpi.mpi_job()
    else:
        job = detect_env()  # one rank of a job started by torchrun, mpirun or srun, or None
    if job is not None and len(transports) > 1:
        raise ConfigError(f"--transport {args.transport}: a rank of a job from the environment "
                          f"runs one transport; give one")  # fmt: skip
    if job is not None and args.peers not in (None, "none", ""):
        raise ConfigError(f"--peers {args.peers}: the peers run as local jobs of their own, not "
                          f"inside a job from the environment; leave --peers out")  # fmt: skip
    ranks = job.world_size if job is not None else args.world_size
    if job is None:
        check_local_workers(args.world_size, args.allow_many_workers, "bench allreduce")
    slow = link_problem(ranks, sizes, model, args.timeout, args.codec if job is None else "none")
    if slow is not None:  # a frame that cannot arrive in time: say so now, not after a timeout
        raise ConfigError(slow)
    _bench_memory(1 if job is not None else ranks, sizes)
    if args.json_path and (job is None or job.rank == 0):  # a joined job: rank 0 writes it
        from pipesgd_ref.outputs import prepare_file

        prepare_file(args.json_path, "--json")
    configure_parent_logging(args.log_level)
    kwargs = dict(model=model, reps=args.reps, warmup=args.warmup, timeout=args.timeout,
                  json_path=args.json_path)  # fmt: skip
    if job is not None:
        bench_allreduce_joined(sizes, bind=args.bind, transport=transports[0],
                               comm_kind=args.comm, **kwargs)  # fmt: skip
    else:
        bench_allreduce(args.world_size, sizes, transports=transports, peers=peers,
                        codec=args.codec, **kwargs)  # fmt: skip
    return 0


def _names(flag: str, text: str, known: tuple[str, ...]) -> list[str]:
    """A comma list of names from `known` (--transport, --peers), each once, in the order
    given; anything else is a ConfigError naming it."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in names if t not in known]
    if unknown:
        raise ConfigError(f"{flag}: unknown {', '.join(map(repr, unknown))}; {flag} takes "
                          f"{', '.join(known)} or a comma list of them")  # fmt: skip
    twice = sorted({t for t in names if names.count(t) > 1})
    if twice:
        raise ConfigError(f"{flag} names {', '.join(twice)} more than once")
    return names


def cmd_train(args: argparse.Namespace, cfg: TrainConfig) -> int:
    from pipesgd_ref.commands.train import n_ranks
    from pipesgd_ref.logs import configure_parent_logging

    check_idle_options(cfg)  # an option that would do nothing in this run: refused, saying why
    if cfg.comm == "mpi":
        return _train_mpi(args, cfg)
    job = detect_env()  # one rank of a job started by torchrun, mpirun or srun, or None
    if job is None:
        check_local_workers(n_ranks(cfg), args.allow_many_workers, "train")
    _check_faults(job.world_size if job is not None else n_ranks(cfg), cfg)
    configure_parent_logging(args.log_level)
    # Only rank 0 of a joined job writes --out: the other ranks leave it alone.
    out = cfg.out if job is None or job.rank == 0 else ""
    with _claimed(out, args.overwrite, cfg.resume):
        if job is not None:
            run_training_joined(cfg, progress=not args.no_progress, bind=args.bind)
        else:
            run_training(cfg, progress=not args.no_progress)
    return 0


def _train_mpi(args: argparse.Namespace, cfg: TrainConfig) -> int:
    """`pipesgd train --comm mpi`: under mpirun or srun, this process is one rank of the job
    (MPI_COMM_WORLD says which); run alone, it starts the job through mpirun, n_ranks(cfg)
    ranks of this very command, and returns mpirun's exit code (comm/mpi.py)."""
    from pipesgd_ref.comm import mpi
    from pipesgd_ref.commands.train import n_ranks
    from pipesgd_ref.logs import configure_parent_logging
    from pipesgd_ref.runtime import faults

    def check_faults(n: int) -> None:
        _check_faults(n, cfg)
        wire = [f for f in faults.planned() if f.action in faults.WIRE_ACTIONS]
        if wire:  # they act on a socket, and MPI moves whole messages
            raise ConfigError(f"{faults.ENV}: {wire[0].action} is a fault of the sockets' wire; "
                              f"under --comm mpi only kill, stop, nan and inf are "
                              f"injected")  # fmt: skip

    if not mpi.launched():
        check_local_workers(n_ranks(cfg), args.allow_many_workers, "train")
        check_faults(n_ranks(cfg))
        with _claimed(cfg.out, args.overwrite, cfg.resume):
            pass  # a bad --out is one line here; rank 0 claims the folder for the run
        return mpi.run_under_mpirun(n_ranks(cfg), args.argv)
    job = mpi.mpi_job()
    check_faults(job.world_size)
    configure_parent_logging(args.log_level)
    with _claimed(cfg.out if job.rank == 0 else "", args.overwrite, cfg.resume):
        run_training_joined(cfg, progress=not args.no_progress)
    return 0


def _end_mpi_job(rc: int) -> int:
    """After a failed rank of an MPI job has printed its line: end every rank now (MPI_Abort),
    rather than leave the others waiting out --timeout for it. Nothing outside an MPI job."""
    if rc and "pipesgd_ref.comm.mpi" in sys.modules:
        sys.modules["pipesgd_ref.comm.mpi"].abort_job(rc)
    return rc


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace, rest: list[str]) -> int:
    """The command of `args`; raises the errors main() prints as one line."""
    if args.command in ("bench", "predict"):
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        if args.command == "predict":
            from pipesgd_ref.commands.predict import cmd_predict

            if args.this_machine:  # it starts --world-size processes here to measure them
                check_local_workers(args.world_size, args.allow_many_workers, "predict")
            return cmd_predict(args)
        return cmd_bench(args)
    cfg = resolve_config(args, rest)
    if args.command == "config":
        import json

        print(json.dumps(cfg.to_dict(), indent=2))
        return 0
    if args.command == "reference":
        with _claimed(cfg.out, args.overwrite, cfg.resume):
            run_reference(cfg, progress=not args.no_progress)
        return 0
    if args.command == "train":
        return cmd_train(args, cfg)
    return cmd_compare(args, cfg)


USER_ERRORS = (ConfigError, DataError, TrainingDiverged, JobError, LaunchError, CommError)


def _error(message: object) -> int:
    print(f"pipesgd: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    first = (sys.argv[1:] if argv is None else argv)[:1]
    if first and first[0].startswith("-") and first[0] not in ("-h", "--help"):
        # argparse would only say that the command is missing, not what it could not read
        return _error(f"unknown option {first[0]!r} before the command; write `pipesgd COMMAND "
                      f"[options]` (see `pipesgd --help`)")  # fmt: skip
    args, rest = parser.parse_known_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # `train --comm mpi` re-runs it
    try:
        return _run(parser, args, rest)
    except USER_ERRORS as e:
        return _end_mpi_job(_error(e))
    except JobStopped as e:  # a signal stopped the job: one line, and 128 + its number
        print(f"pipesgd: {e}", file=sys.stderr)
        return e.exit_code
    except OSError as e:
        # The last resort for a path the checks before the work could not foresee (a disk
        # that filled up, a folder removed under the run); any other OSError is a bug.
        if e.errno not in PATH_ERRNOS or e.filename is None:
            raise
        return _end_mpi_job(_error(f"{e.filename}: {e.strerror}"))
    except KeyboardInterrupt:
        print("pipesgd: interrupted", file=sys.stderr)
        return 130
    except Exception:  # a bug: its traceback, and in an MPI job the end of every rank
        if "pipesgd_ref.comm.mpi" in sys.modules:
            import traceback

            traceback.print_exc()
            _end_mpi_job(1)
        raise


if __name__ == "__main__":
    raise SystemExit(main())
