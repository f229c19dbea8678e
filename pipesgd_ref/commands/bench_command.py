"""`pipesgd bench allreduce` from its flags: every flag checked before any rank starts (bad input
is one line and exit status 2), then the benchmark (bench.py) as local ranks, as one rank of a
job from the environment, or under mpirun with --comm mpi.
"""

from __future__ import annotations

import argparse
import os

from pipesgd_ref.comm.netem import LinkSpec
from pipesgd_ref.commands import bench_algorithms
from pipesgd_ref.errors import ConfigError
from pipesgd_ref.runtime.jobenv import detect_env
from pipesgd_ref.runtime.launch import check_local_workers
from pipesgd_ref.runtime.preflight import check_bind

CODECS = ("none", "trunc16", "bf16", "q8")
ALL = bench_algorithms.ALGORITHMS  # --allreduce's default on local ranks: a row each


def cmd_bench(args: argparse.Namespace) -> int:
    """Check, then run the benchmark; 0, or mpirun's exit code when it starts the MPI job."""
    from pipesgd_ref.commands.bench import bench_allreduce, bench_allreduce_joined
    from pipesgd_ref.logs import configure_parent_logging

    sizes, link, transports, peers = bench_flags(args)
    if os.environ.get("PIPESGD_FAULT"):
        raise ConfigError(
            "PIPESGD_FAULT is set, but bench allreduce injects no faults (only "
            "`pipesgd train` does); unset it"
        )
    joined = args.comm == "mpi" or detect_env() is not None
    check_bind(args.bind, joined, args.comm)
    if joined:
        _check_no_fit(args)
    if args.comm == "mpi":
        from pipesgd_ref.comm import mpi

        _check_mpi_flags(args, link)
        if not mpi.launched():
            check_local_workers(args.world_size, args.allow_many_workers, "bench allreduce")
            _prepare_json(args)
            return mpi.run_under_mpirun(args.world_size, args.argv)
        job = mpi.mpi_job()
    else:
        job = detect_env()  # one rank of a job started by torchrun, mpirun or srun, or None
    _check_job(args, job, sizes, link, transports)
    if job is None or job.rank == 0:  # a joined job: rank 0 writes the JSON
        _prepare_json(args)
    configure_parent_logging(args.log_level)
    kwargs = dict(
        link=link,
        reps=args.reps,
        warmup=args.warmup,
        timeout=args.timeout,
        json_path=args.json_path,
    )
    algorithms = names("--allreduce", args.allreduce or ",".join(ALL), bench_algorithms.ALGORITHMS)
    if job is None:
        _check_local(args, algorithms, transports, peers, sizes, link)
    if job is not None:
        if args.allreduce is None:
            algorithms = ["auto"]
        if len(algorithms) > 1:
            raise ConfigError(
                f"--allreduce {args.allreduce}: a rank of a job from the environment runs one "
                f"algorithm; give one"
            )
        bench_allreduce_joined(
            sizes,
            bind=args.bind,
            transport=transports[0],
            comm_kind=args.comm,
            allreduce=algorithms[0],
            **kwargs,
        )
    else:
        bench_allreduce(
            args.world_size,
            sizes,
            transports=transports,
            peers=peers,
            codec=args.codec,
            algorithms=algorithms,
            fit_path=_fit_path(args),
            rounds=args.rounds,
            argv=" ".join(["pipesgd", *args.argv]) if getattr(args, "argv", None) else "",
            **kwargs,
        )
    return 0


def _check_local(args, algorithms, transports, peers, sizes: list[int], link: LinkSpec) -> None:
    """All of it before any rank starts, nothing measured for nothing: some row runs, --fit
    can fit and write, and auto's figures (and each row's model) read from a valid file."""
    _check_something_runs(algorithms, transports, peers, link)
    _check_fit(args, sizes, link, algorithms, transports)
    if "auto" in algorithms or (args.codec == "none" and not link.enabled):
        from pipesgd_ref.comm.choose import launcher_models

        launcher_models()  # a broken models file: one line here, not one per rank


def _check_no_fit(args: argparse.Namespace) -> None:
    """The joined benchmark (--comm mpi, a job from the environment) fits nothing: a --fit
    there is refused, not ignored."""
    if args.fit is None:
        return
    how = (
        "--comm mpi times the ring over MPI alone"
        if args.comm == "mpi"
        else "a rank of a job from the environment times one algorithm"
    )
    raise ConfigError(
        f"--fit fits the rows of local ranks, and {how}; drop --fit (a fit is made on one "
        f"host: `pipesgd bench allreduce --fit`)"
    )


def _check_something_runs(algorithms, transports, peers, link: LinkSpec) -> None:
    """bench with every row skipped says so, in one line, before any rank starts."""
    from pipesgd_ref.commands.bench import skipped_peers

    ours, not_run = bench_algorithms.row_names(list(algorithms), list(transports), link)
    gone = skipped_peers(peers, link, lambda *_: None)
    if ours or len(gone) < len(peers):
        return
    why = [f"{name} ({reason})" for name, reason in not_run.items()]
    why += [f"{peer} ({reason})" for peer, reason in gone.items()]
    raise ConfigError(
        f"bench allreduce has nothing to run, every row is skipped: {'; '.join(why)}; choose "
        f"another --allreduce, --transport or --peers"
    )


def _check_fit(args, sizes: list[int], link: LinkSpec, algorithms, transports) -> None:
    """--fit: a fit the measurement can make, to a target it can write, checked before any
    rank starts (an existing models file there must be valid: the fit is merged into it)."""
    from pipesgd_ref.comm.choose import NAMES, read_models

    path = _fit_path(args)
    if path is None:
        return
    if args.world_size < 2:
        raise ConfigError(
            "--fit needs --world-size >= 2: one rank's AllReduce moves nothing, so every "
            "model would be alpha = beta = 0 and auto would choose blindly"
        )
    if len(set(sizes)) < 2:
        raise ConfigError(
            f"--fit needs at least 2 different --sizes to fit a latency and a bandwidth per "
            f"algorithm, got {args.sizes}; e.g. --sizes 4KB,64KB,1MB,16MB"
        )
    if args.codec != "none" or link.enabled:
        raise ConfigError(
            "--fit fits the plain links auto chooses over; drop --codec, --latency and "
            "--bandwidth (they change what is timed)"
        )
    rows, skipped = bench_algorithms.row_names(list(algorithms), list(transports), link)
    if not [r for r in rows if bench_algorithms.split_name(r)[0] in NAMES]:
        on = f" on --transport {args.transport}" if skipped else ""  # what skipped them
        raise ConfigError(
            f"--fit fits the rows of the algorithms auto chooses among ({', '.join(NAMES)}), "
            f"and --allreduce {args.allreduce}{on} runs none; leave --allreduce out, or name "
            f"them, e.g. --allreduce ring,rd,rab"
        )
    where = f"--fit {path}"
    if path.is_dir():
        raise ConfigError(f"{where} is a folder; give a file path, e.g. {path / 'models.json'}")
    parent = next((a for a in path.parents if a.exists()), None)
    if parent is not None and not parent.is_dir():
        raise ConfigError(f"{where}: {parent} is a file, not a folder; choose another path")
    if parent is not None and not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{where}: {parent} is not writable; choose another path")
    if path.exists() and not os.access(path, os.W_OK):
        raise ConfigError(f"{where} is not writable; choose another path")
    if path.exists() or path.is_symlink():
        read_models(path)  # ConfigError naming the file: the fit would merge into it


def _fit_path(args: argparse.Namespace):
    """Where --fit writes (None: no fit)."""
    from pathlib import Path

    from pipesgd_ref.comm.choose import user_models_path

    if args.fit is None:
        return None
    return Path(args.fit) if args.fit else user_models_path()


def bench_flags(args: argparse.Namespace) -> tuple[list[int], LinkSpec, list[str], list[str]]:
    """(sizes in bytes, the emulated link, transports, peers) from the flags; ConfigError on a
    size, count, codec, transport or peer the benchmark cannot run."""
    from pipesgd_ref.comm.rendezvous import TRANSPORTS
    from pipesgd_ref.commands.bench_peers import PEERS
    from pipesgd_ref.units import parse_size

    try:
        sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
        link = LinkSpec.from_strings(args.latency, args.bandwidth)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if args.rounds < 1:
        raise ConfigError(f"--rounds must be >= 1, got {args.rounds}")
    if (
        args.world_size < 1
        or (args.reps is not None and args.reps < 1)
        or args.warmup < 0
        or not sizes
    ):
        raise ConfigError("need --world-size >= 1, --reps >= 1, --warmup >= 0 and some --sizes")
    twice = sorted({s for s in sizes if sizes.count(s) > 1})
    if twice:  # 1KB and 1024 too: the same row measured twice, one line each in the table
        from pipesgd_ref.units import format_bytes

        raise ConfigError(
            f"--sizes {args.sizes} names {', '.join(map(format_bytes, twice))} more than once; "
            f"give each size once"
        )
    if any(s % 4 for s in sizes):
        raise ConfigError(f"sizes must be whole float32 arrays (multiples of 4 bytes): {sizes}")
    if args.codec not in CODECS:
        raise ConfigError(f"--codec must be none, trunc16, bf16 or q8, got {args.codec!r}")
    transports = names("--transport", args.transport, TRANSPORTS)
    if not transports:
        raise ConfigError(
            f"--transport takes {', '.join(TRANSPORTS)} or a comma list of them, "
            f"got {args.transport!r}"
        )
    peers = [] if args.peers in ("none", "") else names("--peers", args.peers or "gloo", PEERS)
    if args.no_gloo and "gloo" in peers:
        peers.remove("gloo")
    return sizes, link, transports, peers


def names(flag: str, text: str, known: tuple[str, ...]) -> list[str]:
    """A comma list of names from `known` (--transport, --peers), each once, in the order
    given; anything else is a ConfigError naming it."""
    given = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in given if t not in known]
    if unknown:
        raise ConfigError(
            f"{flag}: unknown {', '.join(map(repr, unknown))}; {flag} takes "
            f"{', '.join(known)} or a comma list of them"
        )
    twice = sorted({t for t in given if given.count(t) > 1})
    if twice:
        raise ConfigError(f"{flag} names {', '.join(twice)} more than once")
    return given


def _check_mpi_flags(args: argparse.Namespace, link: LinkSpec) -> None:
    """--comm mpi times the plain ring on MPI's own wire: no emulated link, no codec."""
    if link.enabled:
        raise ConfigError(
            "bench allreduce --comm mpi with --latency or --bandwidth: link emulation paces "
            "the project's own sockets, and under MPI the MPI library owns the wire; drop "
            "them, or use --comm sockets"
        )
    if args.codec != "none":
        raise ConfigError(
            f"bench allreduce --comm mpi times the plain ring; --codec {args.codec} runs with "
            f"--comm sockets only"
        )


def _check_job(args, job, sizes: list[int], link: LinkSpec, transports: list[str]) -> None:
    """What the run needs of the job (None: local ranks) and of the machine: one transport and
    no peers in a joined job, a link that carries a ring frame in time, memory for the sizes."""
    from pipesgd_ref.commands.bench import link_problem

    if job is not None and len(transports) > 1:
        raise ConfigError(
            f"--transport {args.transport}: a rank of a job from the environment runs one "
            f"transport; give one"
        )
    if job is not None and args.peers not in (None, "none", ""):
        raise ConfigError(
            f"--peers {args.peers}: the peers run as local jobs of their own, not inside a job "
            f"from the environment; leave --peers out"
        )
    ranks = job.world_size if job is not None else args.world_size
    if job is None:
        check_local_workers(args.world_size, args.allow_many_workers, "bench allreduce")
    slow = link_problem(ranks, sizes, link, args.timeout, args.codec if job is None else "none")
    if slow is not None:  # a frame that cannot arrive in time: say so now, not after a timeout
        raise ConfigError(slow)
    _check_memory(1 if job is not None else ranks, sizes)


def _check_memory(world_size: int, sizes: list[int]) -> None:
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


def _prepare_json(args: argparse.Namespace) -> None:
    """--json checked and its folder made before any rank starts (outputs.prepare_file)."""
    if args.json_path:
        from pipesgd_ref.outputs import prepare_file

        prepare_file(args.json_path, "--json")
