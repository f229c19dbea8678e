"""TrainConfig: every knob of a training run, in one frozen dataclass.

Three ways to set it, applied in this order (later wins):
    1. a preset:              TrainConfig.preset("laptop")
    2. a TOML or JSON file:   load_config_file("run.toml")   (flat keys, or under a [train] table)
    3. --key=value overrides: apply_overrides(cfg, ["--lr=0.05", "--hidden=128,64"])
Every value is type-checked against the field's annotation; an unknown key is rejected with the
list of valid ones (a typo must never silently fall back to a default).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from pipesgd_ref.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


@dataclass(frozen=True)
class TrainConfig:
    # --- problem ---
    dataset: str = "digits"  # digits | synthetic[:samples=N,...,seed=S] | mnist:PATH
    model: str = "mlp"  # softmax | mlp | cnn (images: digits, mnist5k, mnist:PATH)
    hidden: tuple[int, ...] = (64,)  # MLP (and CNN head) hidden widths, e.g. --hidden=128,64
    channels: tuple[int, ...] = (6, 16)  # cnn: output channels of each conv layer (LeNet-5's)
    kernels: tuple[int, ...] = (5, 5)  # cnn: odd kernel size of each conv layer ("same" padding)
    backend: str = "numpy"  # ops backend: numpy (the reference) | numba (njit CPU kernels)
    # Where training runs. cuda: params, grads and activations on a GPU, the model's ops on the
    # cuda backend whatever --backend says (--backend then picks the host ops of evaluation);
    # only ring chunks cross to the host. Rank r uses GPU r mod the visible GPUs.
    device: str = "cpu"  # cpu | cuda (sync and pipe; a GPU, or NUMBA_ENABLE_CUDASIM=1)
    # --- method ---
    algo: str = "pipe"  # sync | pipe | ps-sync | ps-async (distributed runs: `pipesgd train`)
    # --- parallelism ---
    world_size: int = 4  # p: number of workers, each with its own shard of the training set
    width: int = 2  # K: pipeline width; staleness = K - 1 (1 = synchronous, 2 = Pipe-SGD)
    warmup_steps: int = 0  # synchronous steps before the pipeline starts (0 = none)
    # --- staleness (methods/compensation.py) ---
    compensation: str = "none"  # none | dc | dc-adaptive | predict (pipe); dc too for ps-async
    dc_lambda: float = 0.04  # lam of dc (lam0 of dc-adaptive); MXNet's dcasgd default
    max_staleness: int = -1  # ps-async: hold a worker back past S steps ahead (-1: no bound)
    # --- optimisation ---
    batch_size: int = 32  # per-worker minibatch; the effective batch is world_size * batch_size
    lr: float = 0.1  # learning rate of plain SGD on the averaged gradient
    lr_decay: float = 0.0  # lr_t = lr / (1 + lr_decay * t); 0 keeps lr constant
    steps: int = 600  # gradient computations per worker (ignored when epochs > 0)
    epochs: float = 0.0  # if > 0, run this many passes over each worker's shard instead of steps
    seed: int = 0  # seeds the initial weights and every worker's minibatch order
    # --- compression inside the AllReduce ---
    codec: str = "none"  # none | trunc16 | bf16 | q8: how gradients travel the ring
    codec_backend: str = "numba"  # codec kernels: numba (bitwise = numpy, faster) | numpy
    error_feedback: bool = False  # add what the codec dropped to the next step's gradient
    codec_pull: str = "none"  # parameter server: codec of pulled weights (none = full precision)
    # ps-sync's server sends a step's p pulls one after another (worker i has its weights after
    # (i+1) M/B) or all at once sharing its link (all after p M/B: the conventional server,
    # PAPER.md's model)
    ps_pulls: str = "sequential"  # sequential | shared
    # --- network ---
    latency: str = "0"  # emulated per-message latency per link, e.g. 50us, 1ms (0 = none)
    bandwidth: str = "inf"  # emulated bandwidth per link and direction, e.g. 1Gbit, 125MB
    timeout: float = 60.0  # seconds any wait on a peer may take before it is an error
    # unix: AF_UNIX sockets; shm: shared-memory slots, the headers on a unix socket
    transport: str = "tcp"  # data links: tcp | unix | shm | auto (shm on one host, tcp across)
    master_port: int = 0  # local runs: the rendezvous store's port (0 = pick a free one)
    # How the ranks talk. sockets: the project's own framed TCP links (comm/transport.py), for
    # local workers and for ranks that torchrun, mpirun or srun start (rendezvous on
    # MASTER_ADDR). mpi: the same ring and PS frames as MPI messages (comm/mpi.py), for clusters
    # whose fast wire MPI reaches; under mpirun or srun each process joins MPI_COMM_WORLD, and
    # run alone `pipesgd train` starts itself through mpirun. No link emulation: MPI owns the wire.
    comm: str = "sockets"  # sockets | mpi
    # Workers sharing CPU cores: compute at the lowest CPU priority (Linux SCHED_IDLE), so a
    # communication thread that wakes up runs at once instead of waiting for another worker's
    # computation to yield the core (on a cluster the NIC does not wait for the GPU either).
    comm_first: bool = True  # compute yields the cores to communication (SCHED_IDLE)
    # --- reporting ---
    eval_every: int = 100  # steps between test-accuracy evaluations (0 = only at the end)
    target_accuracy: float = 0.95  # test accuracy whose first crossing is reported (time/steps)
    out: str = ""  # folder for results (summary.json, trace.json, checkpoint.npz); "" = none
    checkpoint_every: int = 0  # also checkpoint every N steps (0 = only at the end)
    resume: str = ""  # folder of a checkpoint.npz to continue from (same run settings)
    # after a worker fails, restart the whole job from the last checkpoint in `out` (from the
    # start without one), at most this many times (as torchrun's --max-restarts)
    max_restarts: int = 0  # whole-job restarts after a worker fails (0 = none)
    # --- numerical faults ---
    # A NaN or Inf in a worker's gradient stops the run naming the rank and step; with
    # skip_nonfinite that gradient is left out of the step's average instead (a step where
    # every worker's is bad makes no update) and counted in summary.json's nonfinite_skipped.
    skip_nonfinite: bool = False  # leave NaN/Inf gradients out (and count them) instead of stopping

    def __post_init__(self):
        for name in ("hidden", "channels", "kernels"):  # a list (JSON, to_dict) as a tuple
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        problems = []
        if self.world_size < 1:
            problems.append(f"world_size must be >= 1, got {self.world_size}")
        if self.width < 1:
            problems.append(f"width must be >= 1 (1 = synchronous), got {self.width}")
        if self.warmup_steps < 0:
            problems.append(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.batch_size < 1:
            problems.append(f"batch_size must be >= 1, got {self.batch_size}")
        if not self.lr > 0 or self.lr == float("inf"):
            problems.append(f"lr must be a positive finite number, got {self.lr}")
        if not 0 <= self.lr_decay < float("inf"):  # NaN fails too (a NaN lr at every step)
            problems.append(f"lr_decay must be a finite number >= 0, got {self.lr_decay}")
        if self.steps < 1 and not self.epochs > 0:
            problems.append(f"steps must be >= 1 (or set epochs > 0), got {self.steps}")
        if not 0 <= self.epochs < float("inf"):  # NaN once meant 0 silently, inf a traceback
            problems.append(f"epochs must be a finite number >= 0, got {self.epochs}")
        if self.seed < 0:
            problems.append(f"seed must be >= 0 (it seeds NumPy generators), got {self.seed}")
        if self.checkpoint_every < 0:
            problems.append(f"checkpoint_every must be >= 0, got {self.checkpoint_every}")
        if self.max_restarts < 0:
            problems.append(f"max_restarts must be >= 0, got {self.max_restarts}")
        if self.eval_every < 0:
            problems.append(f"eval_every must be >= 0, got {self.eval_every}")
        if not 0 <= self.target_accuracy <= 1:
            problems.append(f"target_accuracy must be in [0, 1], got {self.target_accuracy}")
        if any(h < 1 for h in self.hidden):
            problems.append(f"hidden widths must be >= 1, got {self.hidden}")
        if self.backend not in ("numpy", "numba"):
            problems.append(f"backend must be numpy or numba, got {self.backend!r}")
        if self.device not in DEVICES:
            problems.append(f"device must be {' or '.join(DEVICES)}, got {self.device!r}")
        elif self.device == "cuda" and self.algo not in ("sync", "pipe"):
            problems.append(
                f"--device cuda trains with the ring methods (sync, pipe); {self.algo} runs on "
                f"the CPU: pass --device cpu, or --algo sync or pipe"
            )
        if self.model not in ("softmax", "mlp", "cnn"):
            problems.append(f"model must be softmax, mlp or cnn, got {self.model!r}")
        if len(self.kernels) != len(self.channels) or not self.channels:
            problems.append(f"--channels {','.join(map(str, self.channels))} and --kernels "
                            f"{','.join(map(str, self.kernels))}: one kernel size per conv "
                            f"layer")  # fmt: skip
        elif min(self.channels) < 1 or any(k < 1 or k % 2 == 0 for k in self.kernels):
            problems.append(f"channels must be >= 1 and kernels odd (1, 3, 5, ...), got "
                            f"channels {self.channels}, kernels {self.kernels}")  # fmt: skip
        if self.codec not in ("none", "trunc16", "bf16", "q8"):
            problems.append(f"codec must be none, trunc16, bf16 or q8, got {self.codec!r}")
        if self.codec_backend not in ("numpy", "numba"):
            problems.append(f"codec_backend must be numpy or numba, got {self.codec_backend!r}")
        if self.codec_pull not in ("none", "trunc16", "bf16", "q8"):
            problems.append(
                f"codec_pull must be none, trunc16, bf16 or q8, got {self.codec_pull!r}"
            )
        from pipesgd_ref.comm.ps import PULL_ORDERS  # the server's own list

        if self.ps_pulls not in PULL_ORDERS:
            problems.append(f"ps_pulls must be {' or '.join(PULL_ORDERS)}, got {self.ps_pulls!r}")
        from pipesgd_ref.comm.rendezvous import TRANSPORTS  # the links' own list

        if self.transport not in TRANSPORTS:
            problems.append(
                f"transport must be one of {', '.join(TRANSPORTS)}, got {self.transport!r}"
            )
        if self.algo not in ALGOS:
            problems.append(f"algo must be one of {', '.join(ALGOS)}, got {self.algo!r}")
        if not 0 <= self.master_port <= 65535:
            problems.append(f"master_port must be 0..65535 (0 = any free), got {self.master_port}")
        from pipesgd_ref.units import MAX_SECONDS

        if not 0 < self.timeout <= MAX_SECONDS:  # NaN fails too
            problems.append(
                f"timeout must be > 0 and <= {MAX_SECONDS:.0e} seconds (11.6 days), got "
                f"{self.timeout:g}"
            )
        if self.comm not in COMMS:
            problems.append(f"comm must be {' or '.join(COMMS)}, got {self.comm!r}")
        elif self.comm == "mpi" and self.transport != "tcp":
            problems.append(
                f"--comm mpi with --transport {self.transport}: the transports are the "
                f"project's own sockets' paths, and under MPI the MPI library picks its own "
                f"(shared memory on one host); drop --transport, or use --comm sockets"
            )
        elif self.comm == "mpi" and (self.latency, self.bandwidth) != ("0", "inf"):
            try:
                emulated = link_model(self).enabled
            except ValueError:
                emulated = False  # reported below
            if emulated:
                problems.append(
                    f"--comm mpi with --latency {self.latency} --bandwidth {self.bandwidth}: "
                    f"link emulation paces the project's own sockets, and under MPI the MPI "
                    f"library owns the wire; drop --latency and --bandwidth, or use --comm "
                    f"sockets"
                )
        # A link slower than the timeout is check_link_against_timeout's (the frame sizes need
        # the model), not refused here: `pipesgd predict` asks what-ifs of any link.
        try:
            link_model(self)
        except ValueError as e:
            problems.append(str(e))
        if self.compensation not in COMPENSATIONS:
            problems.append(f"compensation must be one of {', '.join(COMPENSATIONS)}, got "
                            f"{self.compensation!r}")  # fmt: skip
        elif self.compensation != "none" and self.algo in ALGOS:
            if self.algo not in ("pipe", "ps-async"):
                problems.append(
                    f"--compensation {self.compensation} pays back stale gradients, and --algo "
                    f"{self.algo} has none: use --algo pipe (or ps-async for dc)"
                )
            elif self.compensation == "predict" and self.algo == "ps-async":
                problems.append(
                    "--compensation predict is Pipe-SGD's (each worker predicts the weights its "
                    "gradient will meet from its own gradients in flight); with ps-async use dc "
                    "or dc-adaptive"
                )
            elif self.algo == "pipe" and self.width == 1:
                problems.append(
                    f"--compensation {self.compensation} with --width 1: a pipe of width 1 is "
                    f"synchronous, nothing is stale; use --width 2 or more"
                )
            elif self.device == "cuda":
                problems.append(
                    f"--compensation {self.compensation} with --device cuda: the compensations "
                    f"run on host arrays; train on the CPU, or drop --compensation"
                )
        if not (math.isfinite(self.dc_lambda) and self.dc_lambda >= 0):
            problems.append(f"dc_lambda must be finite and >= 0, got {self.dc_lambda:g}")
        if self.max_staleness < -1:
            problems.append(f"max_staleness must be >= 0, or -1 for no bound, got "
                            f"{self.max_staleness}")  # fmt: skip
        elif self.max_staleness >= 0 and self.algo in ALGOS and self.algo != "ps-async":
            problems.append(
                f"--max-staleness {self.max_staleness} bounds how far ps-async's workers run "
                f"ahead; --algo {self.algo} has no such freedom: use --algo ps-async"
            )
        if self.algo in ALGOS and self.algo != "pipe" and self.width not in (1, 2):
            # 2 is the default, so it cannot mean that someone asked; 1 is what compare sets
            problems.append(
                f"width {self.width} does nothing with --algo {self.algo}: the pipeline width "
                f"is Pipe-SGD's (--algo pipe); drop --width, or use --algo pipe"
            )
        if problems:
            raise ConfigError("invalid configuration: " + "; ".join(problems))

    @property
    def staleness(self) -> int:
        """K - 1: how many steps old the applied gradient is."""
        return self.width - 1

    def lr_at(self, step: int) -> float:
        """The learning rate of update `step`: lr / (1 + lr_decay * step)."""
        return self.lr / (1.0 + self.lr_decay * step)

    @classmethod
    def preset(cls, name: str) -> TrainConfig:
        if name not in PRESETS:
            raise ConfigError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")
        return cls(**PRESETS[name])

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with `changes` applied, each type-checked like an override."""
        return apply_dict(self, changes)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: _jsonable(getattr(self, f.name)) for f in fields(self)}


ALGOS = ("sync", "pipe", "ps-sync", "ps-async")
COMPENSATIONS = ("none", "dc", "dc-adaptive", "predict")  # methods/compensation.py
DEVICES = ("cpu", "cuda")
COMMS = ("sockets", "mpi")  # how the ranks talk (TrainConfig.comm)


def link_model(cfg: TrainConfig):
    """The emulated link of cfg.latency and cfg.bandwidth (a LinkModel), bounded by cfg.timeout:
    every frame slower than that is refused when it is sent (LinkEmulator.schedule)."""
    from pipesgd_ref.comm.netem import LinkModel

    return LinkModel.from_strings(cfg.latency, cfg.bandwidth, timeout=cfg.timeout)


def slowest_frame(cfg: TrainConfig, n_params: int) -> tuple[str, int, float]:
    """(what, bytes, seconds): the longest a worker of cfg waits on the emulated link for one
    frame, for a model of n_params float32 parameters.

    Ring (sync, pipe): a segment of the largest chunk, ceil(n / p) values and at most
    SEGMENT_BYTES // 4 of them (comm/schedule.py), in the codec's wire bytes, plus the header:
    alpha + b / B. Parameter server: a worker waits after its push for the pushes of all p
    workers to cross the server's one ingress wire and then for the p pulls on its egress wire
    (comm/netem.py's ServerNIC): 2 alpha + p (push + pull) / B, the push wire_bytes(n) + 4 (the
    loss), the pull the --codec-pull bytes of the weights, each with its header. None of the
    ring's frames for p = 1: ("", 0, 0.0)."""
    from pipesgd_ref.codecs import get_codec
    from pipesgd_ref.comm.netem import LinkModel
    from pipesgd_ref.comm.schedule import SEGMENT_BYTES
    from pipesgd_ref.comm.transport import HEADER_BYTES

    model = LinkModel.from_strings(cfg.latency, cfg.bandwidth)
    p = cfg.world_size
    codec = get_codec(cfg.codec, "numpy")  # only its wire size: no kernels are compiled
    if cfg.algo.startswith("ps-"):
        push = codec.wire_bytes(n_params) + 4 + HEADER_BYTES
        pull = get_codec(cfg.codec_pull, "numpy").wire_bytes(n_params) + HEADER_BYTES
        seconds = 2 * model.latency + p * (push + pull) / model.bandwidth
        what = (f"a pull of the weights ({_size(pull)}) behind the pushes ({_size(push)} each) "
                f"and pulls of all {p} workers on the server's one link")  # fmt: skip
        return what, pull, seconds
    if p == 1:
        return "", 0, 0.0
    values = min(-(-n_params // p), max(1, SEGMENT_BYTES // 4))  # ceil(n / p), capped
    nbytes = codec.wire_bytes(values) + HEADER_BYTES
    coded = f", {cfg.codec}-coded" if cfg.codec != "none" else ""
    what = f"a ring segment ({values} values: the {n_params}-value gradient in {p} chunks{coded})"
    return what, nbytes, model.message_time(nbytes)


def emulated_allreduce_seconds(cfg: TrainConfig, n_params: int) -> float:
    """Seconds one ring AllReduce of n_params float32 values spends on cfg's emulated link:
    2 (p - 1) steps, each a chunk of ceil(n / p) values in the codec's wire bytes, cut into
    segments of at most SEGMENT_BYTES // 4 values that pipeline on the wire, each with its
    header: 2 (p - 1) (alpha + (wire bytes + segments x header) / B). 0 for an ideal link or
    p = 1. What a thread that waits for a whole AllReduce must allow beyond --timeout (each
    ring hop is bounded by --timeout, the sum of 2 (p - 1) of them is not)."""
    from pipesgd_ref.codecs import get_codec
    from pipesgd_ref.comm.netem import LinkModel
    from pipesgd_ref.comm.schedule import SEGMENT_BYTES
    from pipesgd_ref.comm.transport import HEADER_BYTES

    model, p = LinkModel.from_strings(cfg.latency, cfg.bandwidth), cfg.world_size
    if p == 1 or not model.enabled:
        return 0.0
    values = -(-n_params // p)  # the largest chunk: ceil(n / p)
    per_segment = max(1, SEGMENT_BYTES // 4)
    segments = max(1, -(-values // per_segment))
    nbytes = get_codec(cfg.codec, "numpy").wire_bytes(values) + segments * HEADER_BYTES
    return 2 * (p - 1) * model.message_time(nbytes)  # 2 (p - 1) (alpha + b / B)


def _size(nbytes: int) -> str:
    from pipesgd_ref.units import format_bytes

    return format_bytes(nbytes)


def check_link_against_timeout(cfg: TrainConfig, n_params: int) -> None:
    """Before the first step: the slowest frame of the run (`slowest_frame`) must cross the
    emulated link within --timeout, or every wait on it would end in a timeout that blames a
    healthy peer (or, before this check, in a worker sleeping for hours). Raises ConfigError
    naming the frame, the latency, the bandwidth and the timeout."""
    from pipesgd_ref.comm.netem import too_slow_advice
    from pipesgd_ref.units import format_bandwidth, format_seconds

    what, nbytes, seconds = slowest_frame(cfg, n_params)
    if seconds <= cfg.timeout:
        return
    model = link_model(cfg)
    latency = model.latency * (2 if cfg.algo.startswith("ps-") else 1)  # of `seconds`
    raise ConfigError(
        f"the emulated link cannot deliver a frame within --timeout: {what} takes "
        f"{format_seconds(seconds)} at --latency {format_seconds(model.latency)} and "
        f"--bandwidth {format_bandwidth(model.bandwidth)}, more than --timeout {cfg.timeout:g} "
        f"s; {too_slow_advice(latency, seconds - latency)}"
    )


def check_idle_options(cfg: TrainConfig) -> None:
    """Refuse options that would do nothing in a training run of cfg, naming why.

    Not in __post_init__: `pipesgd compare` derives one config per method from the same base
    (and timing.calibrate.calibrate one per codec), where e.g. --error-feedback matters for the
    compressed runs only and --codec-pull for the parameter servers only. Call it on the
    config of one `pipesgd train` (local or a joined rank), before any worker starts."""
    problems = []
    if cfg.error_feedback and cfg.codec == "none":
        problems.append(
            "--error-feedback adds back what the codec dropped, and --codec none drops nothing: "
            "pick a codec (--codec q8, bf16 or trunc16), or drop --error-feedback"
        )
    if cfg.codec_pull != "none" and not cfg.algo.startswith("ps-"):
        problems.append(
            f"--codec-pull {cfg.codec_pull} compresses a parameter server's pulls, and --algo "
            f"{cfg.algo} has no server: use --codec for the ring, or --algo ps-sync / ps-async"
        )
    if cfg.warmup_steps > 0 and cfg.algo != "pipe":
        problems.append(
            f"--warmup-steps {cfg.warmup_steps}: the synchronous warm-up is Pipe-SGD's (--algo "
            f"pipe); {cfg.algo} has no pipeline to warm up: drop --warmup-steps"
        )
    elif cfg.warmup_steps > 0 and cfg.width == 1:
        problems.append(
            f"--warmup-steps {cfg.warmup_steps} with --width 1: a pipe of width 1 is synchronous "
            f"throughout; drop --warmup-steps, or use --width 2 or more"
        )
    # (the default width 2 stays allowed with --steps 1: a one-step run is a run)
    if cfg.algo == "pipe" and cfg.epochs == 0 and cfg.width > max(cfg.steps, 2):
        problems.append(
            f"--width {cfg.width} with --steps {cfg.steps}: the pipeline never fills (every "
            f"update would wait until after the last step); use --width <= --steps"
        )
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


def weight_copies(cfg: TrainConfig) -> int:
    """Vectors of n_params float32 each rank keeps at least: the weights and one gradient
    buffer per step in flight (pipe: width K; sync: 1), one more for the AllReduce's codes or
    a push's, and the error-feedback residual; the parameter server: its weights, the sum and
    a receive buffer."""
    if cfg.algo == "pipe":
        copies = 1 + cfg.width + 1
    elif cfg.algo.startswith("ps-"):
        copies = 3
    else:
        copies = 1 + 1 + 1
    return copies + (1 if cfg.error_feedback else 0)


def check_memory(cfg: TrainConfig, n_params: int) -> None:
    """Refuse a model whose weights and gradient buffers alone, on every local rank, exceed
    this machine's physical memory (a huge --hidden): a clear line now, rather than an
    allocation failing inside a worker, or the kernel's OOM killer taking the job (or a
    neighbour's process) later. A lower bound: activations and evaluation copies come on top."""
    from pipesgd_ref.data import physical_memory

    ranks = cfg.world_size + (1 if cfg.algo.startswith("ps-") else 0)
    need = ranks * weight_copies(cfg) * 4 * n_params
    have = physical_memory()
    if have is None or need <= have:
        return
    hidden = f" --hidden {','.join(map(str, cfg.hidden))}" if cfg.model == "mlp" else ""
    raise ConfigError(
        f"--model {cfg.model}{hidden} on {cfg.dataset}: {n_params} parameters ("
        f"{_size(4 * n_params)} a copy); {ranks} local processes keep at least "
        f"{weight_copies(cfg)} copies each, {_size(need)}, more than this machine's "
        f"{_size(have)} of memory; use smaller --hidden or fewer --world-size"
    )


def check_before_run(cfg: TrainConfig, data) -> None:
    """What can only be checked once the data (so the model's size) is known, before any
    worker starts: the model fits in memory (`check_memory`) and the emulated link delivers
    the run's slowest frame within --timeout (`check_link_against_timeout`). Safe for every
    run, compare's too (unlike `check_idle_options`)."""
    n_params = n_params_of(cfg, data)
    check_memory(cfg, n_params)
    check_link_against_timeout(cfg, n_params)


def model_label(cfg: TrainConfig) -> str:
    """cfg's model in a few words: "softmax", "mlp 1024-1024", "cnn 6,16 (5x5, 5x5) + 120-84"."""
    head = "-".join(map(str, cfg.hidden))
    if cfg.model == "mlp":
        return f"mlp {head}"
    if cfg.model == "cnn":
        kernels = ", ".join(f"{k}x{k}" for k in cfg.kernels)
        return f"cnn {','.join(map(str, cfg.channels))} ({kernels})" + (
            f" + {head}" if head else ""
        )
    return cfg.model


def n_params_of(cfg: TrainConfig, data) -> int:
    """Parameters of cfg's model on `data` (a data.Dataset): what check_link_against_timeout
    needs, without building any weights."""
    from pipesgd_ref.models import model_for

    return model_for(cfg, data).n_params


# Presets: named starting points. Every field not named keeps its default above.
_COMPARE_CNN = dict(dataset="mnist5k", model="cnn", channels=(6, 16), kernels=(5, 5),
                    hidden=(120, 84), world_size=4, batch_size=32, lr=0.05, steps=200,
                    eval_every=10, target_accuracy=0.9, latency="50us", bandwidth="150Mbit",
                    ps_pulls="shared")  # fmt: skip
PRESETS: dict[str, dict[str, Any]] = {
    # digits, 4 workers, a small MLP: seconds on a laptop, ~97% test accuracy
    "laptop": dict(dataset="digits", model="mlp", hidden=(64,), world_size=4, batch_size=32,
                   lr=0.1, steps=600, eval_every=100),
    # `pipesgd compare`: digits on an MLP 64-1024-1024-10 (1.13M parameters, a 4.5 MB
    # gradient), 4 workers x batch 352 (nearly each worker's whole shard), an emulated
    # 700 Mbit/s network: a ring AllReduce of the gradient takes about as long as computing it
    # on a 2-core machine, the paper's communication-heavy regime. ps-sync is the conventional
    # server (its pulls share its link). A copy of the weights every 2 steps, evaluated after
    # the run, gives the time to the target (reached at step 28-30 of 40; ps-async about 10).
    "compare": dict(dataset="digits", model="mlp", hidden=(1024, 1024), world_size=4,
                    batch_size=352, lr=0.03, steps=40, eval_every=2, target_accuracy=0.96,
                    latency="50us", bandwidth="700Mbit", ps_pulls="shared"),
    # a LeNet-5 on 5,000 real MNIST images (the `images` extra), on a link where the ring
    # AllReduce of its 431 KB gradient takes about as long as a step's computation on this
    # machine's shared cores: the CNN, too, in the communication-heavy regime
    "compare-cnn": _COMPARE_CNN,
    # the same on a 10 Gbit/s link: compute-bound, where pipelining has little to hide
    "compare-cnn-compute": {**_COMPARE_CNN, "bandwidth": "10Gbit"},
    # the smallest run that still learns: for CI, tutorials and smoke tests
    "tiny": dict(dataset="digits", model="softmax", hidden=(), world_size=2, batch_size=16,
                 lr=0.1, steps=60, eval_every=20, target_accuracy=0.8),
}  # fmt: skip


def _jsonable(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def field_names() -> list[str]:
    return [f.name for f in fields(TrainConfig)]


def _field(key: str) -> dataclasses.Field:
    name = key.replace("-", "_")
    for f in fields(TrainConfig):
        if f.name == name:
            return f
    valid = field_names()
    close = difflib.get_close_matches(name, valid, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ConfigError(f"unknown config key {key!r}{hint}; valid keys: {', '.join(valid)}")


def _coerce(f: dataclasses.Field, value: Any) -> Any:
    """Convert `value` (a string from the command line, or a TOML/JSON value) to f's type."""
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    want = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false",
            "tuple[int, ...]": "a comma-separated list of integers"}[kind]  # fmt: skip

    def bad() -> ConfigError:
        return ConfigError(f"config key {f.name!r} expects {want}, got {value!r}")

    if kind == "tuple[int, ...]":
        if isinstance(value, str):
            parts = [p for p in value.replace(" ", "").split(",") if p]
        elif isinstance(value, (list, tuple)):
            parts = list(value)
        else:
            raise bad()
        try:
            return tuple(_coerce_int(p) for p in parts)
        except (TypeError, ValueError):
            raise bad() from None
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
            return value.lower() in ("true", "1", "yes")
        raise bad()
    if kind == "str":
        if isinstance(value, str):
            return value
        raise bad()
    try:
        if kind == "int":
            return _coerce_int(value)
        if isinstance(value, bool):
            raise ValueError
        return float(value)
    except (TypeError, ValueError):
        raise bad() from None


def _coerce_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("a bool is not an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(value)
        return int(value)
    return int(str(value).replace("_", ""), 10)


def apply_dict(cfg: TrainConfig, values: dict[str, Any]) -> TrainConfig:
    """`cfg` with the given keys replaced, each checked and converted to its field's type."""
    changes = {}
    for key, value in values.items():
        f = _field(key)
        changes[f.name] = _coerce(f, value)
    return dataclasses.replace(cfg, **changes)


def parse_overrides(args: list[str]) -> dict[str, str]:
    """["--lr=0.05", "--hidden=128,64"] -> {"lr": "0.05", "hidden": "128,64"}."""
    out = {}
    for arg in args:
        if not arg.startswith("--") or "=" not in arg:
            raise ConfigError(f"expected an override of the form --key=value, got {arg!r}")
        key, value = arg[2:].split("=", 1)
        _field(key)  # reject unknown keys before any value is converted
        out[key] = value
    return out


def apply_overrides(cfg: TrainConfig, args: list[str]) -> TrainConfig:
    return apply_dict(cfg, parse_overrides(args))


def load_config_file(path: str | Path, base: TrainConfig | None = None) -> TrainConfig:
    """Read a .toml or .json file of keys (flat, or inside a [train] table) onto `base`."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(
            f"config file {str(path)!r} is a directory; --config takes a .toml or .json file"
        )
    if path.exists() and not path.is_file():  # /dev/zero, a FIFO: reading might never end
        raise ConfigError(f"config file {str(path)!r} is not a regular file; --config takes a "
                          f".toml or .json file")  # fmt: skip
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        text = path.read_text(encoding="utf-8")  # TOML is UTF-8 by definition; JSON too
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"config file {str(path)!r} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at "
            f"offset {e.start}); save it as UTF-8, or is it the wrong file?"
        ) from None
    except OSError as e:
        raise ConfigError(f"config file {str(path)!r} cannot be read: {e.strerror}") from None
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        elif path.suffix == ".json":
            data = json.loads(text)
        else:
            raise ConfigError(f"config file {str(path)!r}: expected a .toml or .json suffix")
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"config file {str(path)!r} is not valid {path.suffix[1:]}: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r}: expected a table of keys at the top")
    if set(data) == {"train"} and isinstance(data["train"], dict):
        data = data["train"]
    elif isinstance(data.get("train"), dict):
        others = ", ".join(repr(k) for k in data if k != "train")
        raise ConfigError(
            f"config file {str(path)!r}: a [train] table and other keys beside it ({others}); "
            f"put every key inside [train], or write them all flat without it"
        )
    return apply_dict(base or TrainConfig(), data)


__all__ = [
    "PRESETS",
    "TrainConfig",
    "apply_dict",
    "apply_overrides",
    "check_before_run",
    "check_idle_options",
    "check_link_against_timeout",
    "check_memory",
    "emulated_allreduce_seconds",
    "field_names",
    "load_config_file",
    "n_params_of",
    "parse_overrides",
    "slowest_frame",
]
