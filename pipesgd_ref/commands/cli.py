"""The `pipesgd` command (also `python -m pipesgd_ref`).

    pipesgd compare [--quick] [--out DIR] [config options]   the main job (see below)
    pipesgd train [config options] [--bind IFACE]             --algo in worker processes
    pipesgd reference [config options]                        one run of a one-process oracle
    pipesgd config [config options]                           print the resolved configuration
    pipesgd predict [--world-size P] [--hidden ...] [--bandwidth B] [--sweep KEY=LO..HI]
                                                              predicted iteration times
    pipesgd bench allreduce [--world-size P] [--sizes ...] [--transport tcp,unix,shm,auto]
                            [--peers gloo,mpi,mpi-tcp] [--latency L] [--bandwidth B]
                                                              ring AllReduce benchmark

Config options, applied in order: --preset NAME (laptop, compare, compare-cnn,
compare-cnn-compute, compare-resnet, tiny), --config FILE (.toml/.json), then any --key=value
(or --key value) naming a TrainConfig field, e.g. --lr=0.05 --hidden=128,64. `compare --model
cnn` starts from the compare-cnn preset, `--model resnet` (and `--study staleness` without a
model) from compare-resnet. Among them --transport (auto, the default: shared memory between ranks
on one host, tcp across; or tcp, unix, shm) and --allreduce (auto, the default: per message,
the fastest by the calibrated models; or ring, rd, rab, oneshot, twoshot).

`compare` (pipesgd_ref/commands/compare.py) trains ps-sync, ps-async, sync, pipe, pipe+trunc16 and
pipe+q8 on the same problem (the `compare` preset) through one emulated network, each twice
(--repeats), and prints measured against predicted iteration times and the wall-clock time to
the target accuracy (of each method's repeat that reached it soonest). Its bandwidth is chosen
for this machine (the ring AllReduce of the gradient as long as a step's compute,
compare_link.py) unless --bandwidth, --config's file or the preset names one. With --comm mpi every
run is a job of world size + 1 MPI ranks instead (compare_mpi.py; run alone it starts them
through mpirun), on MPI's own wire: the preset's emulated link is dropped.

`train` starts cfg.world_size local workers, or, when the environment describes a job (torchrun's
RANK/WORLD_SIZE, mpirun's or srun's variables, with MASTER_ADDR/MASTER_PORT; see launch.py),
runs as that one rank of it: every rank runs the same command, rank 0 prints and writes --out.

Bad input (unknown key, wrong type, impossible value, missing data file, an unusable output
path) prints one line that says what is wrong and exits with status 2, never a traceback.
A stdout whose reader went away (`pipesgd train ... | head -1`) costs nothing: the rest of
the output is dropped and the command goes on to write its results (_QuietStdout).

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
import os
import sys
from typing import Any

from pipesgd_ref.commands.parser import EXIT_USAGE, build_parser, resolve_named
from pipesgd_ref.commands.reference import run_reference
from pipesgd_ref.commands.train import run_training
from pipesgd_ref.commands.train_joined import run_training_joined, stopped_mpi_job
from pipesgd_ref.commands.tutorials import cmd_tutorials
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.errors import (
    CommError,
    ConfigError,
    DataError,
    JobError,
    JobStopped,
    LaunchError,
    TrainingDiverged,
)
from pipesgd_ref.methods.table import method
from pipesgd_ref.runtime.jobenv import detect_env
from pipesgd_ref.runtime.launch import check_local_workers
from pipesgd_ref.runtime.preflight import check_bind, check_config, check_idle_options

# OSErrors that a path the user gave causes (a last resort: outputs.py checks paths before the
# work); any other OSError is a bug or a network fault and keeps its traceback.
PATH_ERRNOS = frozenset(
    {errno.EACCES, errno.EPERM, errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EEXIST}
    | {errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EFBIG}  # a full or read-only disk
    | {errno.ENAMETOOLONG, errno.ELOOP, errno.ETXTBSY}  # a bad name, a busy file
)


def _claimed(path: str, overwrite: bool, resume: str | None = None, flag: str = "--out"):
    """The results folder of this command, checked, created and locked for the whole command
    (outputs.claim_out_dir); nothing when there is none. `resume`: train's --resume ("" when
    not given); None for the commands that cannot resume."""
    if not path:
        return contextlib.nullcontext()
    from pipesgd_ref.outputs import claim_out_dir

    return claim_out_dir(path, overwrite=overwrite, resume=resume, flag=flag)


def _check_faults(n_ranks: int, cfg: TrainConfig | None) -> None:
    """PIPESGD_FAULT, parsed and checked against the job here, in one line (each worker would
    otherwise fail on its own, or a fault for a rank outside the job would never fire)."""
    from pipesgd_ref.runtime import faults

    try:
        # a server that counts pushes, p to a round (ps-async's), runs steps x p of them
        rounds = cfg is not None and method(cfg.algo).checkpoint_rounds
        server = cfg.algo if cfg is not None and method(cfg.algo).server else ""
        steps = None if cfg is None else _fixed_steps(cfg)
        faults.check(n_ranks, steps=steps, ps_async=rounds, server=server)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    local = cfg is not None and cfg.comm != "mpi" and detect_env() is None  # (mpi: no group)
    if local and cfg is not None and _forms_a_group(cfg, n_ranks):
        why = faults.wire_fault_refusal()
        if why:
            raise ConfigError(why)


def _forms_a_group(cfg: TrainConfig, n_ranks: int) -> bool:
    """Whether a local job of cfg forms one host's shared-memory group (comm/shm_group.py's
    `wanted`, as the rendezvous will decide it): its AllReduce may use the group, its links
    are shm and not emulated, on a machine that has it."""
    from pipesgd_ref.comm import shm_group
    from pipesgd_ref.comm.netem import link_of
    from pipesgd_ref.runtime.job import job_allreduce

    return (
        n_ranks > 1
        and job_allreduce(cfg) in ("auto", *shm_group.ALGORITHMS)
        and cfg.transport in ("auto", "shm")
        and not link_of(cfg).enabled
        and shm_group.supported()
    )


def _fixed_steps(cfg: TrainConfig) -> int | None:
    """The run's steps when they are known without loading the data (no --epochs, no --resume)."""
    return cfg.steps if cfg.epochs <= 0 and not cfg.resume else None


def cmd_compare(args: argparse.Namespace, cfg: TrainConfig, named=frozenset()) -> int:
    """`pipesgd compare`; `named`: the config keys the command line named (its preset's, its
    file's, its --key=value ones): without a bandwidth among them, the link is chosen for this
    machine (compare_link.py), except under --comm mpi, where MPI owns the wire."""
    from pipesgd_ref.commands.compare import (
        QUICK_CALIBRATION_REPS,
        QUICK_CALIBRATION_TRIES,
        REPEATS,
        check_compare_options,
        quick_config,
        run_compare,
    )
    from pipesgd_ref.commands.compare_peers import peers_of
    from pipesgd_ref.logs import configure_parent_logging

    if args.repeats is not None and args.repeats < 1:
        raise ConfigError(f"--repeats must be at least 1, got {args.repeats}")
    peers = peers_of(args.peers, args.study, cfg)  # --peers torch: compare_peers.py
    if args.study is not None:
        return _study(args, cfg)
    if args.lrs is not None:
        raise ConfigError(
            "--lrs sets the learning rates of --study staleness; add --study staleness, or "
            "set one rate with --lr"
        )
    check_compare_options(cfg, named=named, preset=args.preset)
    args.out_dir = args.out_dir or "runs/compare"
    more: dict[str, Any] = {"repeats": REPEATS}  # run_compare's keywords
    if args.quick:
        cfg = quick_config(cfg)
        more = {
            "calibration_reps": QUICK_CALIBRATION_REPS,
            "calibration_tries": QUICK_CALIBRATION_TRIES,
            "repeats": 1,
        }
    if args.repeats is not None:
        more["repeats"] = args.repeats
    if cfg.comm == "mpi":
        return _compare_mpi(args, cfg, more)
    check_local_workers(cfg.world_size + 1, args.allow_many_workers, "compare")  # ps: + server
    _check_faults(cfg.world_size + 1, None)
    configure_parent_logging("WARNING")
    with _claimed(args.out_dir, args.overwrite):
        choose = "bandwidth" not in named
        run_compare(cfg, args.out_dir, not args.no_progress, choose=choose, peers=peers, **more)
    return 0


def _study(args: argparse.Namespace, cfg: TrainConfig) -> int:
    """`pipesgd compare --study staleness`: one process, the oracles. The deep net with
    momentum (study_momentum.py; with no model named, the compare-resnet preset is the base,
    parser.resolve_named), or for another model the plain-SGD sweep of it (study.py)."""
    from pipesgd_ref.commands.study import LRS, QUICK_LRS, parse_lrs, run_staleness_study

    if cfg.comm == "mpi" or args.repeats is not None:
        flag = "--comm mpi" if cfg.comm == "mpi" else "--repeats"
        raise ConfigError(
            f"--study {args.study} runs the one-process oracles (it measures accuracy, not "
            f"speed): {flag} does nothing there; drop it"
        )
    deep = cfg.model == "resnet"
    lrs: tuple[float, ...]
    if deep:
        from pipesgd_ref.commands.study_momentum import EFFECTIVE_LRS, QUICK_EFFECTIVE_LRS

        lrs = QUICK_EFFECTIVE_LRS if args.quick else EFFECTIVE_LRS
    else:
        lrs = QUICK_LRS if args.quick else LRS
    if args.lrs is not None:
        lrs = parse_lrs(args.lrs)
    out = args.out_dir or "runs/study"
    with _claimed(out, args.overwrite):
        if deep:
            from pipesgd_ref.commands.study_momentum import run_from_command_line

            run_from_command_line(cfg, args.argv, args.quick, tuple(sorted(lrs)), out)
        else:
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
        raise ConfigError(
            f"{faults.ENV} is not taken by compare --comm mpi (a fault would end one of its "
            f"runs, and with it the job); inject faults into `pipesgd train --comm mpi`"
        )
    if not mpi.launched():
        check_local_workers(ranks_needed(cfg), args.allow_many_workers, "compare")
        with _claimed(args.out_dir, args.overwrite):
            pass  # a bad --out is one line here; rank 0 claims the folder for the job
        return mpi.run_under_mpirun(ranks_needed(cfg), args.argv)
    configure_parent_logging("WARNING")
    rank0 = mpi.mpi_job().rank == 0
    with _claimed(args.out_dir if rank0 else "", args.overwrite):
        out = args.out_dir if rank0 else None
        run_compare_mpi(cfg, out=out, progress=not args.no_progress and rank0, **more)
    return 0


def cmd_train(args: argparse.Namespace, cfg: TrainConfig) -> int:
    from pipesgd_ref.logs import configure_parent_logging
    from pipesgd_ref.runtime.job import n_ranks

    # an option that would do nothing in this run: refused, saying why
    check_idle_options(cfg, TrainConfig.preset(args.preset))
    if args.lesson or args.lesson_threads:
        return _train_lesson(args, cfg)
    if cfg.comm == "mpi":
        check_bind(args.bind, True, cfg.comm)
        return _train_mpi(args, cfg)
    job = detect_env()  # one rank of a job started by torchrun, mpirun or srun, or None
    check_bind(args.bind, job is not None, cfg.comm)
    if job is None:
        check_local_workers(n_ranks(cfg), args.allow_many_workers, "train")
        check_models(cfg)
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


def check_models(cfg: TrainConfig) -> None:
    """A local job whose AllReduce is auto reads its figures here first (comm/choose.py), so a
    broken models file is one line before any worker starts, not one per rank. (A joined job's
    rank 0 reads them at rendezvous: comm/store.py.)"""
    from pipesgd_ref.comm.choose import launcher_models
    from pipesgd_ref.runtime.job import job_allreduce, n_ranks

    if job_allreduce(cfg) == "auto" and n_ranks(cfg) > 1:
        launcher_models()


def _train_lesson(args: argparse.Namespace, cfg: TrainConfig) -> int:
    """`pipesgd train --lesson` / `--lesson-threads`: the lesson core (commands/lesson.py)."""
    from pipesgd_ref.commands.lesson import check_lesson, run_lesson
    from pipesgd_ref.logs import configure_parent_logging
    from pipesgd_ref.runtime.job import n_ranks

    check_lesson(cfg)
    if detect_env() is not None:
        raise ConfigError(
            "--lesson starts its own ranks on this host; run it alone, not under torchrun, "
            "mpirun or srun"
        )
    check_local_workers(n_ranks(cfg), args.allow_many_workers, "train")
    configure_parent_logging(args.log_level)
    with _claimed(cfg.out, args.overwrite):  # the lesson core starts from w_0
        run_lesson(cfg, threads=args.lesson_threads)
    return 0


def _train_mpi(args: argparse.Namespace, cfg: TrainConfig) -> int:
    """`pipesgd train --comm mpi`: under mpirun or srun, this process is one rank of the job
    (MPI_COMM_WORLD says which); run alone, it starts the job through mpirun, n_ranks(cfg)
    ranks of this very command, and returns mpirun's exit code (comm/mpi.py)."""
    from pipesgd_ref.comm import mpi
    from pipesgd_ref.logs import configure_parent_logging
    from pipesgd_ref.runtime import faults
    from pipesgd_ref.runtime.job import n_ranks

    def check_faults(n: int) -> None:
        _check_faults(n, cfg)
        wire = [f for f in faults.planned() if f.action in faults.WIRE_ACTIONS]
        if wire:  # they act on a socket, and MPI moves whole messages
            raise ConfigError(
                f"{faults.ENV}: {wire[0].action} is a fault of the sockets' wire; under --comm "
                f"mpi only kill, stop, nan and inf are injected"
            )

    if not mpi.launched():
        check_local_workers(n_ranks(cfg), args.allow_many_workers, "train")
        check_faults(n_ranks(cfg))
        with _claimed(cfg.out, args.overwrite, cfg.resume):
            pass  # a bad --out is one line here; rank 0 claims the folder for the run
        stops: list[dict] = []
        rc = mpi.run_under_mpirun(n_ranks(cfg), args.argv, stops)
        if stops:  # ranks stopped on a signal: the job is stopped, not failed or done
            raise stopped_mpi_job(cfg, stops)
        return rc
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
    if args.command in ("lesson-file", "tutorials", "bench", "predict") and rest:  # no keys
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.command == "tutorials":  # copy the tutorials into a folder: tutorials.py
        return cmd_tutorials(args)
    if args.command == "lesson-file":
        from pipesgd_ref.commands.lesson import write_lesson_file

        path = write_lesson_file(args.path, args.overwrite)
        print(f"wrote {path}: the lesson core in one file; run it with `python {path}`")
        return 0
    if args.command in ("bench", "predict"):
        if args.command == "predict":
            from pipesgd_ref.commands.predict import cmd_predict

            if args.this_machine:  # it starts --world-size processes here to measure them
                check_local_workers(args.world_size, args.allow_many_workers, "predict")
            return cmd_predict(args)
        from pipesgd_ref.commands.bench_command import cmd_bench

        return cmd_bench(args)
    cfg, named = resolve_named(args, rest)
    if args.command == "compare":  # its own refusals first: they know what compare changes
        from pipesgd_ref.commands.compare import check_compare_options

        check_compare_options(cfg, named=named, preset=args.preset)
    check_config(cfg)  # every command refuses a config whose options do not make a run
    if args.command == "config":
        import json

        print(json.dumps(cfg.to_dict(), indent=2))
        return 0
    if args.command == "reference":
        with _claimed(cfg.out, args.overwrite):  # the oracle starts from w_0
            run_reference(cfg, progress=not args.no_progress)
        return 0
    if args.command == "train":
        return cmd_train(args, cfg)
    return cmd_compare(args, cfg, named)


USER_ERRORS = (ConfigError, DataError, TrainingDiverged, JobError, LaunchError, CommError)


def _error(message: object) -> int:
    print(f"pipesgd: error: {message}", file=sys.stderr)
    return EXIT_USAGE


class _QuietStdout:
    """sys.stdout for the length of a command: when its reader goes away (`pipesgd train |
    head -1`), the rest of the output goes to /dev/null and the command goes on, so its results
    are still written and it ends without a BrokenPipeError traceback (the advice of Python's
    signal docs on SIGPIPE: point the descriptor at devnull and go on quietly)."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._to_devnull()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._to_devnull()

    def _to_devnull(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())  # what is still buffered goes there too
        os.close(devnull)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextlib.contextmanager
def _quiet_stdout():
    """sys.stdout wrapped in _QuietStdout while the command runs (a stdout with a descriptor
    only: a test's captured stream is left as it is), flushed through it at the end."""
    try:
        sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        yield
        return
    saved = sys.stdout
    sys.stdout = _QuietStdout(saved)
    try:
        yield
    finally:
        sys.stdout.flush()  # the last buffered lines: their reader may be gone
        sys.stdout = saved


def main(argv: list[str] | None = None) -> int:
    with _quiet_stdout():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    first = (sys.argv[1:] if argv is None else argv)[:1]
    if first and first[0].startswith("-") and first[0] not in ("-h", "--help", "--version"):
        # argparse would only say that the command is missing, not what it could not read
        return _error(
            f"unknown option {first[0]!r} before the command; write `pipesgd COMMAND "
            f"[options]` (see `pipesgd --help`)"
        )
    args, rest = parser.parse_known_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # `train --comm mpi` re-runs it
    try:
        return _run(parser, args, rest)
    except USER_ERRORS as e:
        return _end_mpi_job(_error(e))
    except JobStopped as e:  # a signal stopped the job: one line, and 128 + its number
        if e.told_launcher:  # one rank of several: the launcher says it, once (_train_mpi)
            return 0
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
