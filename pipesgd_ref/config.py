"""TrainConfig: every knob of a training run, in one frozen dataclass.

Three ways to set it, applied in this order (later wins):
    1. a preset:              TrainConfig.preset("laptop")
    2. a TOML or JSON file:   load_config_file("run.toml")   (flat keys, or under a [train] table)
    3. --key=value overrides: apply_overrides(cfg, ["--lr=0.05", "--hidden=128,64"])
Every value is type-checked against the field's annotation; an unknown key is rejected with the
list of valid ones (a typo must never silently fall back to a default). Each field's range or
choice is checked on construction; whether the fields make a run together (the options the
method takes, the transport, the codecs, the emulated link) is runtime/preflight.py's, which
knows the rest of the package: this module imports nothing of it above units and errors.
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
from pipesgd_ref.presets import PRESETS
from pipesgd_ref.units import MAX_SECONDS, parse_size

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
    device: str = "cpu"  # cpu | cuda (ring methods; a GPU or NUMBA_ENABLE_CUDASIM=1)
    # --- method ---
    algo: str = "pipe"  # sync | ddp | pipe | ps-sync | ps-async (distributed runs: `pipesgd train`)
    # ddp: the gradient leaves in buckets of at least this many bytes, each all-reduced as soon
    # as the backward has written it (models/layout.py `buckets`; why 32KB: methods/ddp.py)
    bucket_size: str = "32KB"  # ddp's bucket, e.g. 32KB, 1MB (0: one bucket per layer)
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
    # equation (6) of docs/paper.md)
    ps_pulls: str = "sequential"  # sequential | shared
    # --- network ---
    latency: str = "0"  # emulated per-message latency per link, e.g. 50us, 1ms (0 = none)
    bandwidth: str = "inf"  # emulated bandwidth per link and direction, e.g. 1Gbit, 125MB
    timeout: float = 60.0  # seconds any wait on a peer may take before it is an error
    # unix: AF_UNIX sockets; shm: shared-memory slots, the headers on a unix socket; tcp: the
    # sockets the tutorials teach. auto, as NCCL and Open MPI choose theirs: the fastest path
    transport: str = "auto"  # data links: auto (shm on one host, tcp across) | tcp | unix | shm
    # The AllReduce algorithm. ring: the paper's; rd, rab: recursive doubling, Rabenseifner over
    # links; oneshot, twoshot: one host's shared-memory group; auto: per message, the fastest by
    # the calibrated models. A codec, --comm mpi and --device cuda run the ring (auto: ring).
    allreduce: str = "auto"  # auto | ring | rd | rab | oneshot | twoshot (comm/rendezvous.py)
    master_port: int = 0  # local runs: the rendezvous store's port (0 = pick a free one)
    # How the ranks talk. sockets: the project's own framed TCP links (comm/links.py), for
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
        problems = [
            *_run_size_problems(self),
            *_schedule_problems(self),
            *_reporting_problems(self),
            *_model_problems(self),
            *_wire_problems(self),
            *_staleness_problems(self),
            *_size_bound_problems(self),
        ]
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


COMPENSATIONS = ("none", "dc", "dc-adaptive", "predict")  # methods/compensation.py
DEVICES = ("cpu", "cuda")
COMMS = ("sockets", "mpi")  # how the ranks talk (TrainConfig.comm)
BACKENDS = ("numpy", "numba")  # the host ops (ops/), and the codecs' kernels
MODELS = ("softmax", "mlp", "cnn")

# --- the checks of each field on its own ------------------------------------------------------
# Ranges and choices from the lists above, each problem one phrase. What needs the rest of the
# package (the method's options, the transports, codecs, the link) is runtime/preflight.py's.


def _run_size_problems(cfg: TrainConfig) -> list[str]:
    """The job's shape: workers, pipeline width, warm-up, minibatch."""
    problems = []
    if cfg.world_size < 1:
        problems.append(f"world_size must be >= 1, got {cfg.world_size}")
    if cfg.width < 1:
        problems.append(f"width must be >= 1 (1 = synchronous), got {cfg.width}")
    if cfg.warmup_steps < 0:
        problems.append(f"warmup_steps must be >= 0, got {cfg.warmup_steps}")
    if cfg.batch_size < 1:
        problems.append(f"batch_size must be >= 1, got {cfg.batch_size}")
    try:
        parse_size(cfg.bucket_size)
    except ValueError as e:
        problems.append(f"bucket_size: {e}")
    return problems


def _schedule_problems(cfg: TrainConfig) -> list[str]:
    """The optimisation's schedule: a NaN or an inf would reach every step's update."""
    problems = []
    if not cfg.lr > 0 or cfg.lr == float("inf"):
        problems.append(f"lr must be a positive finite number, got {cfg.lr}")
    if not 0 <= cfg.lr_decay < float("inf"):  # NaN fails too (a NaN lr at every step)
        problems.append(f"lr_decay must be a finite number >= 0, got {cfg.lr_decay}")
    if cfg.steps < 1 and not cfg.epochs > 0:
        problems.append(f"steps must be >= 1 (or set epochs > 0), got {cfg.steps}")
    if not 0 <= cfg.epochs < float("inf"):  # NaN fails too
        problems.append(f"epochs must be a finite number >= 0, got {cfg.epochs}")
    if cfg.seed < 0:
        problems.append(f"seed must be >= 0 (it seeds NumPy generators), got {cfg.seed}")
    return problems


def _reporting_problems(cfg: TrainConfig) -> list[str]:
    problems = []
    if cfg.checkpoint_every < 0:
        problems.append(f"checkpoint_every must be >= 0, got {cfg.checkpoint_every}")
    if cfg.max_restarts < 0:
        problems.append(f"max_restarts must be >= 0, got {cfg.max_restarts}")
    if cfg.eval_every < 0:
        problems.append(f"eval_every must be >= 0, got {cfg.eval_every}")
    if not 0 <= cfg.target_accuracy <= 1:
        problems.append(f"target_accuracy must be in [0, 1], got {cfg.target_accuracy}")
    return problems


def _model_problems(cfg: TrainConfig) -> list[str]:
    """The model's shape and where it computes."""
    problems = []
    if any(h < 1 for h in cfg.hidden):
        problems.append(f"hidden widths must be >= 1, got {cfg.hidden}")
    if cfg.backend not in BACKENDS:
        problems.append(f"backend must be numpy or numba, got {cfg.backend!r}")
    if cfg.device not in DEVICES:
        problems.append(f"device must be {' or '.join(DEVICES)}, got {cfg.device!r}")
    if cfg.model not in MODELS:
        problems.append(f"model must be softmax, mlp or cnn, got {cfg.model!r}")
    channels, kernels = ",".join(map(str, cfg.channels)), ",".join(map(str, cfg.kernels))
    if len(cfg.kernels) != len(cfg.channels) or not cfg.channels:
        problems.append(
            f"--channels {channels} and --kernels {kernels}: one kernel size per conv layer"
        )
    elif min(cfg.channels) < 1 or any(k < 1 or k % 2 == 0 for k in cfg.kernels):
        problems.append(
            f"channels must be >= 1 and kernels odd (1, 3, 5, ...), got channels "
            f"{cfg.channels}, kernels {cfg.kernels}"
        )
    return problems


def _wire_problems(cfg: TrainConfig) -> list[str]:
    """How the ranks talk: the codecs' kernels, the rendezvous port, the timeout, the comm."""
    problems = []
    if cfg.codec_backend not in BACKENDS:
        problems.append(f"codec_backend must be numpy or numba, got {cfg.codec_backend!r}")
    if not 0 <= cfg.master_port <= 65535:
        problems.append(f"master_port must be 0..65535 (0 = any free), got {cfg.master_port}")
    if not MIN_TIMEOUT <= cfg.timeout <= MAX_SECONDS:  # NaN fails too
        problems.append(
            f"timeout must be at least {MIN_TIMEOUT:g} s (a frame, or a peer's start, can take "
            f"that long on a busy host) and at most {MAX_SECONDS:.0e} s (11.6 days), got "
            f"{cfg.timeout:g}"
        )
    if cfg.comm not in COMMS:
        problems.append(f"comm must be {' or '.join(COMMS)}, got {cfg.comm!r}")
    return problems


def _staleness_problems(cfg: TrainConfig) -> list[str]:
    """The compensation's kind and weight, and the bound on how far ahead a worker runs."""
    problems = []
    if cfg.compensation not in COMPENSATIONS:
        problems.append(
            f"compensation must be one of {', '.join(COMPENSATIONS)}, got {cfg.compensation!r}"
        )
    if not (math.isfinite(cfg.dc_lambda) and cfg.dc_lambda >= 0):
        problems.append(f"dc_lambda must be finite and >= 0, got {cfg.dc_lambda:g}")
    if cfg.max_staleness < -1:
        problems.append(f"max_staleness must be >= 0, or -1 for no bound, got {cfg.max_staleness}")
    return problems


# The shortest --timeout: any wait on a peer shorter than a scheduler's delay on a busy host, a
# page fault or a peer's start fails a healthy job, blaming a rank that did nothing wrong.
MIN_TIMEOUT = 1.0
# The largest whole number each integer field takes: a count past MAX_COUNT (steps, a width, a
# period) is a typo or a run that never ends; a seed fits an int64, as any reader of
# summary.json or another tool's generator takes it. (master_port has its own range above.)
MAX_COUNT = 10**9
INT_BOUNDS = {"seed": 2**63 - 1, "max_restarts": 1000, "master_port": math.inf}


def _size_bound_problems(cfg: TrainConfig) -> list[str]:
    """Every integer field (each of a list's) and epochs within its bound: a JSON 1e308 is whole."""
    problems = []
    for f in fields(cfg):
        if f.type not in ("int", "tuple[int, ...]") and f.name != "epochs":
            continue
        bound, value = INT_BOUNDS.get(f.name, MAX_COUNT), getattr(cfg, f.name)
        too_big = [v for v in (value if isinstance(value, tuple) else (value,)) if v > bound]
        if too_big:
            problems.append(f"{f.name} must be at most {bound:,}, got {too_big[0]:.4g}")
    return problems


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
    want = {
        "int": "an integer",
        "float": "a number",
        "str": "a string",
        "bool": "true or false",
        "tuple[int, ...]": "a comma-separated list of integers",
    }[kind]

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
    return apply_dict(base or TrainConfig(), read_config_file(path))


MAX_CONFIG_BYTES = 1 << 20  # a config file is a few hundred bytes; past 1 MiB it is not one
KERNEL_ROOTS = ("/proc", "/sys", "/dev")  # files the kernel makes up as they are read


def kernel_file(path: Path) -> Path | None:
    """Where `path` really is, when that is a file the kernel makes up as it is read (/proc,
    /sys, /dev, or a symlink into them: a read may block or never end); else None."""
    try:
        real = path.resolve()
    except (OSError, RuntimeError):  # a symlink loop: the open below says so
        return None
    return real if any(real.is_relative_to(root) for root in KERNEL_ROOTS) else None


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The keys of a .toml or .json config file (flat, or inside a [train] table), each a key
    of TrainConfig with a value of its type. Every way the file can be wrong (missing, a
    folder, not a regular file, a file of the kernel's, over 1 MiB, empty, not UTF-8, not
    TOML/JSON, an unknown key, a value of the wrong type) is one line naming the file."""
    path = Path(path)
    where = f"config file {str(path)!r}"
    if path.is_dir():
        raise ConfigError(f"{where} is a directory; --config takes a .toml or .json file")
    if path.exists() and not path.is_file():  # /dev/zero, a FIFO: reading might never end
        raise ConfigError(f"{where} is not a regular file; --config takes a .toml or .json file")
    if not path.is_file():
        raise ConfigError(f"{where} does not exist")
    real = kernel_file(path)
    if real is not None:
        raise ConfigError(
            f"{where} is {real}, a file the kernel makes up as it is read, not a config file; "
            f"--config takes a .toml or .json file"
        )
    if path.suffix not in (".toml", ".json"):
        raise ConfigError(f"{where}: expected a .toml or .json suffix")
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"{where} cannot be read: {e.strerror}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"{where} is over {MAX_CONFIG_BYTES >> 20} MiB: not a config file (one is a few "
            f"lines of keys); is it the wrong file?"
        )
    try:
        text = raw.decode("utf-8")  # TOML is UTF-8 by definition; JSON too
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{where} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at "
            f"offset {e.start}); save it as UTF-8, or is it the wrong file?"
        ) from None
    if not text.strip():
        raise ConfigError(f"{where} is empty; write the keys to set in it, or drop --config")
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{where} is not valid {path.suffix[1:]}: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a table of keys at the top")
    if set(data) == {"train"} and isinstance(data["train"], dict):
        data = data["train"]
    elif isinstance(data.get("train"), dict):
        others = ", ".join(repr(k) for k in data if k != "train")
        raise ConfigError(
            f"{where}: a [train] table and other keys beside it ({others}); "
            f"put every key inside [train], or write them all flat without it"
        )
    try:
        for key, value in data.items():
            _coerce(_field(key), value)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    return data


__all__ = [
    "COMPENSATIONS",
    "MAX_COUNT",
    "MIN_TIMEOUT",
    "PRESETS",
    "TrainConfig",
    "apply_dict",
    "apply_overrides",
    "field_names",
    "kernel_file",
    "load_config_file",
    "model_label",
    "parse_overrides",
    "read_config_file",
]
