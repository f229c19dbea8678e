"""The `pipesgd` command (also `python -m pipesgd_ref`).

    pipesgd compare [--quick] [--out DIR] [config options]   the main job (see below)
    pipesgd train [config options] [--bind IFACE]             --algo in worker processes over TCP
    pipesgd reference [config options]                        one run of a one-process oracle
    pipesgd config [config options]                           print the resolved configuration
    pipesgd predict [--world-size P] [--hidden ...] [--bandwidth B] [--sweep KEY=LO..HI]
                                                              predicted iteration times
    pipesgd bench allreduce [--world-size P] [--sizes ...] [--latency L] [--bandwidth B]
                                                              ring AllReduce benchmark

Config options, applied in order: --preset NAME (laptop, compare, tiny), --config FILE
(.toml/.json), then any --key=value (or --key value) naming a TrainConfig field, e.g.
--lr=0.05 --hidden=128,64.

`compare` (pipesgd_ref/compare.py) trains ps-sync, ps-async, sync, pipe, pipe+trunc16 and
pipe+q8 on the same problem (the `compare` preset) through one emulated network, each twice
(--repeats), and prints measured against predicted iteration times and the wall-clock time to
the target accuracy (of each method's repeat that reached it soonest).

`train` starts cfg.world_size local workers, or, when the environment describes a job (torchrun's
RANK/WORLD_SIZE, mpirun's or srun's variables, with MASTER_ADDR/MASTER_PORT; see launch.py),
runs as that one rank of it: every rank runs the same command, rank 0 prints and writes --out.

Bad input (unknown key, wrong type, impossible value, missing data file) prints one line that
says what is wrong and exits with status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys

from pipesgd_ref.comm.transport import CommError
from pipesgd_ref.config import (
    ConfigError,
    TrainConfig,
    apply_overrides,
    field_names,
    load_config_file,
)
from pipesgd_ref.data import DataError
from pipesgd_ref.launch import JobError, LaunchError, detect_env
from pipesgd_ref.lifetime import JobStopped
from pipesgd_ref.train import TrainingDiverged, run_reference, run_training, run_training_joined

EXIT_USAGE = 2
BIND_HELP = (
    "interface for this rank's listeners when joining a job from the environment "
    "(default: loopback for a loopback MASTER_ADDR, else all interfaces)"
)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pipesgd",
        description="Pipe-SGD reference implementation: train, compare, predict.",
        epilog="Config keys (as --key=value): " + ", ".join(field_names()),
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--preset", default="laptop", help="laptop, compare or tiny")
        sp.add_argument("--config", help="a .toml or .json file of config keys")
        sp.add_argument("--no-progress", action="store_true", help="no progress bar")

    c = sub.add_parser("compare", help="the paper's comparison in miniature (the main job)")
    common(c)
    c.set_defaults(preset="compare")
    c.add_argument("--quick", action="store_true", help="a short run (CI, tutorials)")
    c.add_argument("--repeats", type=int, default=None,
                   help="runs of each method, the one that reaches the target soonest kept "
                   "(default 2, 1 with --quick)")  # fmt: skip
    c.add_argument("--out", dest="out_dir", default="runs/compare", help="where to write results")
    t = sub.add_parser(
        "train",
        help="train with --algo in worker processes over TCP (local, or one rank of a job "
        "that torchrun, mpirun or srun started)",
    )
    common(t)
    t.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    t.add_argument("--bind", default=None, help=BIND_HELP)
    r = sub.add_parser("reference", help="train with a one-process oracle")
    common(r)
    g = sub.add_parser("config", help="print the resolved configuration as JSON")
    common(g)
    from pipesgd_ref.predict import add_parser as add_predict_parser

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
    ar.add_argument("--timeout", type=float, default=60.0, help="communication timeout, s")
    ar.add_argument("--json", dest="json_path", default=None, help="also write results here")
    ar.add_argument("--no-gloo", action="store_true", help="skip torch/gloo even if installed")
    ar.add_argument("--codec", default="none", help="none, trunc16, bf16, q8: compress each hop")
    ar.add_argument("--log-level", default="WARNING", help="DEBUG, INFO, WARNING, ERROR")
    ar.add_argument("--bind", default=None, help=BIND_HELP)
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
    cfg = TrainConfig.preset(args.preset)
    if args.config:
        cfg = load_config_file(args.config, base=cfg)
    return apply_overrides(cfg, _split_overrides(rest))


def cmd_compare(args: argparse.Namespace, cfg: TrainConfig) -> int:
    from pipesgd_ref.compare import (
        QUICK_CALIBRATION_REPS,
        QUICK_CALIBRATION_TRIES,
        REPEATS,
        quick_config,
        run_compare,
    )
    from pipesgd_ref.logs import configure_parent_logging

    if args.repeats is not None and args.repeats < 1:
        raise ConfigError(f"--repeats must be at least 1, got {args.repeats}")
    configure_parent_logging("WARNING")
    more = {"repeats": REPEATS}
    if args.quick:
        cfg, more = quick_config(cfg), {"calibration_reps": QUICK_CALIBRATION_REPS,
                                        "calibration_tries": QUICK_CALIBRATION_TRIES,
                                        "repeats": 1}  # fmt: skip
    if args.repeats is not None:
        more["repeats"] = args.repeats
    run_compare(cfg, out=args.out_dir, progress=not args.no_progress, **more)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from pipesgd_ref.bench import bench_allreduce, bench_allreduce_joined
    from pipesgd_ref.comm.netem import LinkModel, parse_size
    from pipesgd_ref.launch import detect_env
    from pipesgd_ref.logs import configure_parent_logging

    configure_parent_logging(args.log_level)
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
    kwargs = dict(model=model, reps=args.reps, warmup=args.warmup, timeout=args.timeout,
                  json_path=args.json_path)  # fmt: skip
    if detect_env() is not None:  # one rank of a job started by torchrun, mpirun or srun
        bench_allreduce_joined(sizes, bind=args.bind, **kwargs)
    else:
        bench_allreduce(args.world_size, sizes, with_gloo=not args.no_gloo, codec=args.codec,
                        **kwargs)  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    if args.command in ("bench", "predict"):
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        try:
            if args.command == "predict":
                from pipesgd_ref.predict import cmd_predict

                return cmd_predict(args)
            return cmd_bench(args)
        except (ConfigError, LaunchError, CommError) as e:
            print(f"pipesgd: error: {e}", file=sys.stderr)
            return EXIT_USAGE
    try:
        cfg = resolve_config(args, rest)
        if args.command == "config":
            import json

            print(json.dumps(cfg.to_dict(), indent=2))
            return 0
        if args.command == "reference":
            run_reference(cfg, progress=not args.no_progress)
            return 0
        if args.command == "train":
            from pipesgd_ref.logs import configure_parent_logging

            configure_parent_logging(args.log_level)
            if detect_env() is not None:  # one rank of a job started by torchrun, mpirun or srun
                run_training_joined(cfg, progress=not args.no_progress, bind=args.bind)
            else:
                run_training(cfg, progress=not args.no_progress)
            return 0
        return cmd_compare(args, cfg)
    except (ConfigError, DataError, TrainingDiverged, JobError, LaunchError, CommError) as e:
        print(f"pipesgd: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except JobStopped as e:  # a signal stopped the job: one line, and 128 + its number
        print(f"pipesgd: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("pipesgd: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
