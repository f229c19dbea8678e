"""The preflight: every check of a run that needs more than one config field, before any
worker starts, made once in the process that starts the job.

TrainConfig (config.py) checks each field on its own: a range, a choice from a plain list. What
depends on the rest of the package is checked here, where the package is at hand:

    check_config(cfg)          the config alone: the method exists and takes the options given
                               (asked from its row in methods/table.py), the transport, the
                               AllReduce, the server's pull order and the codecs are among
                               their modules' own lists, the link parses, --comm mpi leaves
                               the wire to MPI, the AllReduce asked for can run this job
    check_idle_options(cfg)    options that would do nothing in this one training run
    check_bind(...)            --bind where no listener of a joined rank is placed
    check_run(cfg, n_params)   once the model's size is known: the weights fit in memory and
                               the emulated link delivers the run's slowest frame in time

Each raises ConfigError, one line naming every problem found. The commands call check_config
where a config comes in from the user (commands/cli.py), and the entry points that start
workers (commands/train.py) call check_config and check_run before the first one starts: a
config built in code, or derived from the user's (compare's runs), is checked there too.
"""

from __future__ import annotations

from pipesgd_ref import data as datasets
from pipesgd_ref.codecs import CODECS, get_codec
from pipesgd_ref.comm.netem import link_of, too_slow_advice
from pipesgd_ref.comm.ps import PULL_ORDERS
from pipesgd_ref.comm.rendezvous import ALLREDUCE, TRANSPORTS
from pipesgd_ref.comm.wire import HEADER_BYTES
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.errors import ConfigError
from pipesgd_ref.methods.table import METHODS, Method, method
from pipesgd_ref.models import model_for
from pipesgd_ref.timing.emulated import SEGMENT_VALUES
from pipesgd_ref.units import format_bandwidth, format_bytes, format_seconds

__all__ = [
    "check_bind",
    "check_config",
    "check_idle_options",
    "check_link_against_timeout",
    "check_memory",
    "check_run",
    "n_params_of",
    "slowest_frame",
]


def check_config(cfg: TrainConfig) -> None:
    """Refuse a config whose fields are each valid but do not make a run together, or name
    what another module does not have; every problem in one ConfigError."""
    problems = _choice_problems(cfg) + _wire_problems(cfg) + _allreduce_problems(cfg)
    try:
        row = method(cfg.algo)
    except ConfigError as e:  # an unknown method: none of its options can be checked
        problems.insert(0, str(e))
    else:
        problems += _method_problems(cfg, row)
    if problems:
        raise ConfigError("invalid configuration: " + "; ".join(problems))


def _one_of(names: tuple[str, ...]) -> str:
    return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]


def _choice_problems(cfg: TrainConfig) -> list[str]:
    """Names that another module lists: the codecs, the server's pull orders, the transports,
    the AllReduce algorithms."""
    problems = []
    if cfg.codec not in CODECS:
        problems.append(f"codec must be {_one_of(CODECS)}, got {cfg.codec!r}")
    if cfg.codec_pull not in CODECS:
        problems.append(f"codec_pull must be {_one_of(CODECS)}, got {cfg.codec_pull!r}")
    if cfg.ps_pulls not in PULL_ORDERS:
        problems.append(f"ps_pulls must be {' or '.join(PULL_ORDERS)}, got {cfg.ps_pulls!r}")
    if cfg.transport not in TRANSPORTS:
        problems.append(f"transport must be one of {', '.join(TRANSPORTS)}, got {cfg.transport!r}")
    if cfg.allreduce not in ALLREDUCE:
        problems.append(f"allreduce must be one of {', '.join(ALLREDUCE)}, got {cfg.allreduce!r}")
    return problems


def _wire_problems(cfg: TrainConfig) -> list[str]:
    """The link parses; under --comm mpi the MPI library owns the wire, so neither the
    project's transports nor its link emulation apply. (A link slower than the timeout is
    check_link_against_timeout's, which needs the frame sizes: `pipesgd predict` asks
    what-ifs of any link.)"""
    try:
        emulated = link_of(cfg).enabled
    except ValueError as e:
        return [str(e)]
    if cfg.comm != "mpi":
        return []
    if cfg.transport not in ("auto", "tcp"):  # auto: MPI's choice; tcp: the default until now
        return [
            f"--comm mpi with --transport {cfg.transport}: the transports are the project's own "
            f"sockets' paths, and under MPI the MPI library picks its own (shared memory on one "
            f"host); drop --transport, or use --comm sockets"
        ]
    if emulated:
        return [
            f"--comm mpi with --latency {cfg.latency} --bandwidth {cfg.bandwidth}: link "
            f"emulation paces the project's own sockets, and under MPI the MPI library owns the "
            f"wire; drop --latency and --bandwidth, or use --comm sockets"
        ]
    return []


# The AllReduce algorithms of one host's shared-memory group (comm/shm_group.py): they reduce
# in shared memory, bypassing the links and so their emulation.
GROUP_ALLREDUCE = ("oneshot", "twoshot")


def _allreduce_problems(cfg: TrainConfig) -> list[str]:
    """--allreduce other than ring (or auto, which then means ring) where only the ring runs:
    under --comm mpi, with a codec (the compressed ring), on --device cuda (the device ring);
    and a shared-memory group's algorithm over tcp or unix links, or on an emulated link,
    which it would bypass."""
    name = cfg.allreduce
    if name in ("auto", "ring") or name not in ALLREDUCE:
        return []
    fix = "use --allreduce ring (or auto, which is the ring there)"
    if cfg.comm == "mpi":
        return [
            f"--allreduce {name} with --comm mpi: the MPI path runs the project's ring over "
            f"MPI point-to-point, and no other algorithm; {fix}, or --comm sockets"
        ]
    problems = []
    if cfg.codec != "none":
        problems.append(
            f"--allreduce {name} with --codec {cfg.codec}: a codec compresses every hop of the "
            f"ring (the compressed ring), and {name} has no compressed form; {fix}, or drop "
            f"--codec"
        )
    if cfg.device == "cuda":
        problems.append(
            f"--allreduce {name} with --device cuda: GPU arrays travel the device ring "
            f"(comm/device_ring.py), and no other algorithm; {fix}, or --device cpu"
        )
    try:
        emulated = link_of(cfg).enabled
    except ValueError:  # a link that does not parse: _wire_problems says so
        emulated = False
    if name in GROUP_ALLREDUCE and cfg.transport in ("tcp", "unix"):
        problems.append(
            f"--allreduce {name} with --transport {cfg.transport}: {name} reduces through the "
            f"shared memory of the ranks' shm links; use --transport shm or auto"
        )
    if name in GROUP_ALLREDUCE and emulated:
        problems.append(
            f"--allreduce {name} with --latency {cfg.latency} --bandwidth {cfg.bandwidth}: "
            f"{name} reduces through one host's shared memory, bypassing the links, so the "
            f"emulated link would pace nothing; drop --latency and --bandwidth, or use "
            f"--allreduce ring, rd or rab"
        )
    return problems


def _method_problems(cfg: TrainConfig, row: Method) -> list[str]:
    """The options cfg gives that its method does not take (its row in methods/table.py)."""
    problems = []
    if cfg.device == "cuda" and not row.on_device:
        ring = [m.name for m in METHODS.values() if m.on_device]
        problems.append(
            f"--device cuda trains with the ring methods ({', '.join(ring)}); {cfg.algo} runs "
            f"on the CPU: pass --device cpu, or --algo {' or '.join(ring)}"
        )
    if cfg.compensation != "none":
        problems += _compensation_problems(cfg, row)
    if cfg.max_staleness >= 0 and not row.bounded_staleness:
        problems.append(
            f"--max-staleness {cfg.max_staleness} bounds how far ps-async's workers run ahead; "
            f"--algo {cfg.algo} has no such freedom: use --algo ps-async"
        )
    if cfg.skip_nonfinite and not row.skips_nonfinite:
        problems.append(
            f"--skip-nonfinite leaves a rank's whole gradient out of a step's mean, and --algo "
            f"{cfg.algo} sends each bucket during the backward, before the whole gradient is "
            f"known: use --algo sync (the same updates, without the overlap), or drop "
            f"--skip-nonfinite"
        )
    if not row.pipelined and cfg.width not in (1, 2):
        # 2 is the default, so it cannot mean that someone asked; 1 is what compare sets
        problems.append(
            f"width {cfg.width} does nothing with --algo {cfg.algo}: the pipeline width is "
            f"Pipe-SGD's (--algo pipe); drop --width, or use --algo pipe"
        )
    return problems


def _compensation_problems(cfg: TrainConfig, row: Method) -> list[str]:
    """--compensation pays back stale gradients: the method must have some, of a kind the
    compensation knows, and the compensations run on host arrays."""
    c = cfg.compensation
    if not row.compensations:
        return [
            f"--compensation {c} pays back stale gradients, and --algo {cfg.algo} has none: "
            f"use --algo pipe (or ps-async for dc)"
        ]
    if c not in row.compensations:
        return [
            f"--compensation {c} is Pipe-SGD's (each worker predicts the weights its gradient "
            f"will meet from its own gradients in flight); with {cfg.algo} use "
            f"{' or '.join(row.compensations)}"
        ]
    if row.pipelined and cfg.width == 1:
        return [
            f"--compensation {c} with --width 1: a pipe of width 1 is synchronous, nothing is "
            f"stale; use --width 2 or more"
        ]
    if cfg.device == "cuda":
        return [
            f"--compensation {c} with --device cuda: the compensations run on host arrays; "
            f"train on the CPU, or drop --compensation"
        ]
    return []


def check_idle_options(cfg: TrainConfig, preset: TrainConfig | None = None) -> None:
    """Refuse options that would do nothing in a training run of cfg, naming why. `preset`:
    the config cfg started from (its --preset), whose values nobody asked for on this run.

    Not in check_config: `pipesgd compare` derives one config per method from the same base
    (and timing.calibrate.calibrate one per codec), where e.g. --error-feedback matters for the
    compressed runs only and --codec-pull for the parameter servers only. Call it on the
    config of one `pipesgd train` (local or a joined rank), before any worker starts."""
    row = method(cfg.algo)
    problems = []
    if cfg.ps_pulls != (preset or TrainConfig()).ps_pulls and not row.server:
        problems.append(
            f"--ps-pulls {cfg.ps_pulls} orders a parameter server's pulls, and --algo "
            f"{cfg.algo} has no server: use --algo ps-sync, or drop --ps-pulls"
        )
    if cfg.bucket_size != TrainConfig.bucket_size and not row.bucketed:
        bucketed = [m.name for m in METHODS.values() if m.bucketed]
        problems.append(
            f"--bucket-size {cfg.bucket_size} sizes the buckets {', '.join(bucketed)} "
            f"all-reduces during the backward, and --algo {cfg.algo} sends its gradient "
            f"whole: use --algo {bucketed[0]}, or drop --bucket-size"
        )
    if cfg.error_feedback and cfg.codec == "none":
        problems.append(
            "--error-feedback adds back what the codec dropped, and --codec none drops nothing: "
            "pick a codec (--codec q8, bf16 or trunc16), or drop --error-feedback"
        )
    if cfg.codec_pull != "none" and not row.server:
        problems.append(
            f"--codec-pull {cfg.codec_pull} compresses a parameter server's pulls, and --algo "
            f"{cfg.algo} has no server: use --codec for the ring, or --algo ps-sync / ps-async"
        )
    if cfg.allreduce not in ("auto", "ring") and row.server:
        problems.append(
            f"--allreduce {cfg.allreduce} picks the AllReduce of the ring methods, and --algo "
            f"{cfg.algo} has none (its workers push to a server): drop --allreduce"
        )
    problems += _pipeline_idle(cfg, row)
    if cfg.dc_lambda != TrainConfig.dc_lambda and not cfg.compensation.startswith("dc"):
        problems.append(
            f"--dc-lambda {cfg.dc_lambda:g} weighs delay compensation, and --compensation is "
            f"{cfg.compensation}: add --compensation dc (or dc-adaptive), or drop --dc-lambda"
        )
    if cfg.checkpoint_every > 0 and not cfg.out:
        problems.append(
            f"--checkpoint-every {cfg.checkpoint_every} writes checkpoints into --out, and no "
            f"--out is set: add --out DIR, or drop --checkpoint-every"
        )
    if cfg.model == "softmax" and cfg.hidden not in ((), TrainConfig.hidden):
        # the default (64,) cannot mean that someone asked; () is what the presets set
        problems.append(
            f"--hidden {','.join(map(str, cfg.hidden))} does nothing with --model softmax (no "
            f"hidden layer): use --model mlp, or drop --hidden"
        )
    if problems:
        raise ConfigError("options that would do nothing: " + "; ".join(problems))


def _pipeline_idle(cfg: TrainConfig, row: Method) -> list[str]:
    """A warm-up without a pipeline to fill, or a pipeline that never fills."""
    problems = []
    if cfg.warmup_steps > 0 and not row.pipelined:
        problems.append(
            f"--warmup-steps {cfg.warmup_steps}: the synchronous warm-up is Pipe-SGD's (--algo "
            f"pipe); {cfg.algo} has no pipeline to warm up: drop --warmup-steps"
        )
    elif cfg.warmup_steps > 0 and cfg.width == 1:
        problems.append(
            f"--warmup-steps {cfg.warmup_steps} with --width 1: a pipe of width 1 is synchronous "
            f"throughout; drop --warmup-steps, or use --width 2 or more"
        )
    if row.pipelined and cfg.epochs == 0 and 0 < cfg.steps <= cfg.warmup_steps:
        problems.append(
            f"--warmup-steps {cfg.warmup_steps} with --steps {cfg.steps}: every step is a "
            f"synchronous warm-up step, the pipeline never starts; use fewer warm-up steps "
            f"than --steps, or --algo sync"
        )
    # (the default width 2 stays allowed with --steps 1: a one-step run is a run)
    if row.pipelined and cfg.epochs == 0 and cfg.width > max(cfg.steps, 2):
        problems.append(
            f"--width {cfg.width} with --steps {cfg.steps}: the pipeline never fills (every "
            f"update would wait until after the last step); use --width <= --steps"
        )
    return problems


def check_bind(bind: str | None, joined: bool, comm: str) -> None:
    """--bind picks the interface of a joined rank's listeners (a rank that torchrun, mpirun
    or srun started, on the project's sockets): refuse it where there are none to place."""
    if not bind or (joined and comm != "mpi"):
        return
    where = (
        "under --comm mpi the MPI library picks its own interfaces"
        if comm == "mpi"
        else "this run starts its own local workers, which talk over loopback"
    )
    raise ConfigError(
        f"--bind {bind} places the listeners of a rank joining a job from the environment "
        f"(torchrun, mpirun, srun), and {where}: drop --bind"
    )


# --- once the model's size is known -----------------------------------------------------------


def n_params_of(cfg: TrainConfig, data: datasets.Dataset) -> int:
    """Parameters of cfg's model on `data`, without building any weights."""
    return model_for(cfg, data).n_params


def check_run(cfg: TrainConfig, n_params: int) -> None:
    """What needs the model's size (n_params, `n_params_of`), before any worker starts: the
    model fits in memory (`check_memory`) and the emulated link delivers the run's slowest
    frame within --timeout (`check_link_against_timeout`). Safe for every run, compare's too
    (unlike `check_idle_options`)."""
    check_memory(cfg, n_params)
    check_link_against_timeout(cfg, n_params)


def check_memory(cfg: TrainConfig, n_params: int) -> None:
    """Refuse a model whose weights and gradient buffers alone, on every local rank, exceed
    this machine's physical memory (a huge --hidden): a clear line now, rather than an
    allocation failing inside a worker, or the kernel's OOM killer taking the job (or a
    neighbour's process) later. A lower bound: activations and evaluation copies come on top.
    Each rank keeps the method's weight copies (methods/table.py, Method.weight_copies)."""
    row = method(cfg.algo)
    ranks, copies = row.ranks(cfg.world_size), row.weight_copies(cfg)
    need = ranks * copies * 4 * n_params
    have = datasets.physical_memory()
    if have is None or need <= have:
        return
    hidden = f" --hidden {','.join(map(str, cfg.hidden))}" if cfg.model == "mlp" else ""
    raise ConfigError(
        f"--model {cfg.model}{hidden} on {cfg.dataset}: {n_params} parameters ("
        f"{format_bytes(4 * n_params)} a copy); {ranks} local processes keep at least "
        f"{copies} copies each, {format_bytes(need)}, more than this machine's "
        f"{format_bytes(have)} of memory; use smaller --hidden or fewer --world-size"
    )


def slowest_frame(cfg: TrainConfig, n_params: int) -> tuple[str, int, float]:
    """(what, bytes, seconds): the longest a worker of cfg waits on the emulated link for one
    frame, for a model of n_params float32 parameters.

    Ring (sync, ddp, pipe): a segment of the largest chunk, ceil(n / p) values and at most
    SEGMENT_VALUES of them (timing/emulated.py), in the codec's wire bytes, plus the header:
    alpha + b / B. Parameter server: a worker waits after its push for the pushes of all p
    workers to cross the server's one ingress wire and then for the p pulls on its egress wire
    (comm/netem.py's ServerNIC): 2 alpha + p (push + pull) / B, the push wire_bytes(n) + 4 (the
    loss), the pull the --codec-pull bytes of the weights, each with its header. None of the
    ring's frames for p = 1: ("", 0, 0.0)."""
    link, p = link_of(cfg), cfg.world_size
    codec = get_codec(cfg.codec, "numpy")  # only its wire size: no kernels are compiled
    if method(cfg.algo).server:
        push = codec.wire_bytes(n_params) + 4 + HEADER_BYTES
        pull = get_codec(cfg.codec_pull, "numpy").wire_bytes(n_params) + HEADER_BYTES
        seconds = 2 * link.latency + p * (push + pull) / link.bandwidth
        what = (
            f"a pull of the weights ({format_bytes(pull)}) behind the pushes "
            f"({format_bytes(push)} each) and pulls of all {p} workers on the server's one link"
        )
        return what, pull, seconds
    if p == 1:
        return "", 0, 0.0
    values = min(-(-n_params // p), SEGMENT_VALUES)  # ceil(n / p), capped
    nbytes = codec.wire_bytes(values) + HEADER_BYTES
    coded = f", {cfg.codec}-coded" if cfg.codec != "none" else ""
    what = f"a ring segment ({values} values: the {n_params}-value gradient in {p} chunks{coded})"
    return what, nbytes, link.message_time(nbytes)


def check_link_against_timeout(cfg: TrainConfig, n_params: int) -> None:
    """Before the first step: the slowest frame of the run (`slowest_frame`) must cross the
    emulated link within --timeout, or every wait on it would end in a timeout that blames a
    healthy peer (or a worker sleeping for hours). Raises ConfigError naming the frame, the
    latency, the bandwidth and the timeout."""
    what, nbytes, seconds = slowest_frame(cfg, n_params)
    if seconds <= cfg.timeout:
        return
    link = link_of(cfg)
    latency = link.latency * (2 if method(cfg.algo).server else 1)  # of `seconds`
    raise ConfigError(
        f"the emulated link cannot deliver a frame within --timeout: {what} takes "
        f"{format_seconds(seconds)} at --latency {format_seconds(link.latency)} and "
        f"--bandwidth {format_bandwidth(link.bandwidth)}, more than --timeout {cfg.timeout:g} "
        f"s; {too_slow_advice(latency, seconds - latency)}"
    )
