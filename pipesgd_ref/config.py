"""TrainConfig: every knob of a training run, in one frozen dataclass.

Three ways to set it, applied in this order (later wins):
    1. a preset:              TrainConfig.preset("laptop")
    2. a TOML or JSON file:   load_config_file("run.toml")   (flat keys, or under a [train] table)
    3. --key=value overrides: apply_overrides(cfg, ["--lr=0.05", "--hidden=128,64"])
Every value is type-checked against the field's annotation; an unknown key is rejected with the
list of valid ones (a typo must never silently fall back to a default). Each field's range or
choice is checked on construction (runtime/field_checks.py; the optimiser's beside it, in
methods/optimizer.py); whether the fields make a run together (the options the method takes,
the transport, the codecs, the emulated link) is runtime/preflight.py's, which knows the rest
of the package: this module imports nothing of it but those two leaves, errors and presets.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from pipesgd_ref.errors import ConfigError
from pipesgd_ref.methods.optimizer import learning_rate
from pipesgd_ref.presets import PRESETS
from pipesgd_ref.runtime.field_checks import (  # the checks, and the choices they allow
    COMPENSATIONS,
    DEFAULT_CHANNELS,
    MAX_COUNT,
    MIN_TIMEOUT,
    MODELS,
    field_problems,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


@dataclass(frozen=True)
class TrainConfig:
    # --- problem ---
    dataset: str = "digits"  # digits | synthetic[:samples=N,...,seed=S] | mnist:PATH
    model: str = "mlp"  # softmax | mlp | cnn | resnet (images: digits, mnist5k, mnist:PATH)
    hidden: tuple[int, ...] = (64,)  # MLP (and CNN head) hidden widths, e.g. --hidden=128,64
    # () = the model's default (DEFAULT_CHANNELS: LeNet-5's 6,16; the CIFAR ResNet's 16,32,64)
    channels: tuple[int, ...] = ()  # cnn: channels of each conv layer; resnet: of its 3 stages
    kernels: tuple[int, ...] = (5, 5)  # cnn: odd kernel size of each conv layer ("same" padding)
    depth: int = 8  # resnet: layers with weights, 6n + 2 (8, 14, 20, ...): n blocks per stage
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
    # pipe's warm-up: synchronous steps before the pipeline starts (not the lr's: lr_warmup)
    warmup_steps: int = 0  # synchronous steps before the pipeline starts (0 = none)
    # --- staleness (methods/compensation.py) ---
    compensation: str = "none"  # none | dc | dc-adaptive | predict (pipe); dc too for ps-async
    dc_lambda: float = 0.04  # lam of dc (lam0 of dc-adaptive); MXNet's dcasgd default
    max_staleness: int = -1  # ps-async: hold a worker back past S steps ahead (-1: no bound)
    # --- optimisation ---
    batch_size: int = 32  # per-worker minibatch; the effective batch is world_size * batch_size
    # The optimiser (methods/optimizer.py, torch.optim.SGD's rule) and lr_t's schedule
    lr: float = 0.1  # learning rate (lr_t's base) applied to the averaged gradient
    lr_schedule: str = "constant"  # constant | inverse | step | cosine (over the run's steps)
    lr_decay: float = 0.0  # inverse: lr_t = lr / (1 + lr_decay * t)
    lr_milestones: tuple[int, ...] = ()  # step: lr_t = lr * lr_gamma ** (milestones <= t)
    lr_gamma: float = 0.1  # step: the factor at each milestone
    lr_warmup: int = 0  # the lr's linear warm-up: lr_t * (t + 1) / lr_warmup for t < lr_warmup
    momentum: float = 0.0  # heavy ball M in [0, 1): v = M v + d, w -= lr_t v (0: plain SGD)
    nesterov: bool = False  # Nesterov's form: w -= lr_t (d + M v) (needs momentum > 0)
    weight_decay: float = 0.0  # L2: d = g + weight_decay * w
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
        for name in ("hidden", "channels", "kernels", "lr_milestones"):  # JSON lists as tuples
            if isinstance(getattr(self, name), list):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        if not self.channels:  # the model's own default (to_dict writes it: (6, 16) as before)
            object.__setattr__(self, "channels", DEFAULT_CHANNELS.get(self.model, (6, 16)))
        problems = field_problems(self)  # runtime/field_checks.py: each field's range or choice
        if problems:
            raise ConfigError("invalid configuration: " + "; ".join(problems))

    @property
    def staleness(self) -> int:
        """K - 1: how many steps old the applied gradient is."""
        return self.width - 1

    def lr_at(self, step: int, total_steps: int | None = None) -> float:
        """The learning rate of update `step` (methods/optimizer.py's schedule) in a run of
        `total_steps` (default cfg.steps; cosine's horizon: a run of --epochs gives it)."""
        if total_steps is None and self.epochs > 0 and self.lr_schedule == "cosine":
            raise ValueError("cosine's horizon: pass the run's steps (runtime/inputs steps_for)")
        return learning_rate(self, step, self.steps if total_steps is None else total_steps)

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


def model_label(cfg: TrainConfig) -> str:
    """cfg's model in a few words: "softmax", "mlp 1024-1024", "cnn 6,16 (5x5, 5x5) + 120-84"."""
    head = "-".join(map(str, cfg.hidden))
    if cfg.model == "mlp":
        return f"mlp {head}"
    if cfg.model == "resnet":
        return f"resnet-{cfg.depth} {','.join(map(str, cfg.channels))}"
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
    if "channels" not in changes and cfg.channels == DEFAULT_CHANNELS.get(cfg.model, (6, 16)):
        changes["channels"] = ()  # default widths follow --model (resnet's, not LeNet-5's)
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
    "DEFAULT_CHANNELS",
    "MAX_COUNT",
    "MIN_TIMEOUT",
    "MODELS",
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
