"""Each field of config.TrainConfig on its own: its range or its choice, checked when a config
is made (TrainConfig.__post_init__), each problem one phrase; the config lists them all in one
ConfigError. Whether the fields make a run together (the options the method takes, the
transport, the codecs, the emulated link) is runtime/preflight.py's, which knows the rest of
the package. The optimiser's own options are checked beside the optimiser
(methods/optimizer.py `optimizer_problems`).
"""

from __future__ import annotations

import dataclasses
import math

from pipesgd_ref.methods.optimizer import optimizer_problems
from pipesgd_ref.units import MAX_SECONDS, parse_size

COMPENSATIONS = ("none", "dc", "dc-adaptive", "predict")  # methods/compensation.py
DEVICES = ("cpu", "cuda")
COMMS = ("sockets", "mpi")  # how the ranks talk (TrainConfig.comm)
BACKENDS = ("numpy", "numba")  # the host ops (ops/), and the codecs' kernels
MODELS = ("softmax", "mlp", "cnn", "resnet")
DEFAULT_CHANNELS = {"resnet": (16, 32, 64)}  # every other model's: (6, 16), LeNet-5's

# --- the checks of each field on its own ------------------------------------------------------
# Ranges and choices from the lists above, each problem one phrase.


def run_size_problems(cfg) -> list[str]:
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


def schedule_problems(cfg) -> list[str]:
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


def reporting_problems(cfg) -> list[str]:
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


def model_problems(cfg) -> list[str]:
    """The model's shape and where it computes."""
    problems = []
    if any(h < 1 for h in cfg.hidden):
        problems.append(f"hidden widths must be >= 1, got {cfg.hidden}")
    if cfg.backend not in BACKENDS:
        problems.append(f"backend must be numpy or numba, got {cfg.backend!r}")
    if cfg.device not in DEVICES:
        problems.append(f"device must be {' or '.join(DEVICES)}, got {cfg.device!r}")
    if cfg.model not in MODELS:
        problems.append(f"model must be one of {', '.join(MODELS)}, got {cfg.model!r}")
    if cfg.depth < 8 or (cfg.depth - 2) % 6:
        problems.append(f"depth must be 6n + 2 with n >= 1 (8, 14, 20, ...), got {cfg.depth}")
    channels, kernels = ",".join(map(str, cfg.channels)), ",".join(map(str, cfg.kernels))
    if cfg.model == "resnet":  # 3x3 convs whatever --kernels says: one width per stage
        if len(cfg.channels) != 3 or min(cfg.channels) < 1:
            problems.append(f"--channels {channels}: resnet takes 3 widths >= 1, one per stage")
    elif len(cfg.kernels) != len(cfg.channels) or not cfg.channels:
        problems.append(
            f"--channels {channels} and --kernels {kernels}: one kernel size per conv layer"
        )
    elif min(cfg.channels) < 1 or any(k < 1 or k % 2 == 0 for k in cfg.kernels):
        problems.append(
            f"channels must be >= 1 and kernels odd (1, 3, 5, ...), got channels "
            f"{cfg.channels}, kernels {cfg.kernels}"
        )
    return problems


def wire_problems(cfg) -> list[str]:
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


def staleness_problems(cfg) -> list[str]:
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


def size_bound_problems(cfg) -> list[str]:
    """Every integer field (each of a list's) and epochs within its bound: a JSON 1e308 is whole."""
    problems = []
    for f in dataclasses.fields(cfg):
        if f.type not in ("int", "tuple[int, ...]") and f.name != "epochs":
            continue
        bound, value = INT_BOUNDS.get(f.name, MAX_COUNT), getattr(cfg, f.name)
        too_big = [v for v in (value if isinstance(value, tuple) else (value,)) if v > bound]
        if too_big:
            problems.append(f"{f.name} must be at most {bound:,}, got {too_big[0]:.4g}")
    return problems


def field_problems(cfg) -> list[str]:
    """Every field's problem (a config.TrainConfig's), one phrase each; [] when none."""
    return [
        *run_size_problems(cfg),
        *schedule_problems(cfg),
        *optimizer_problems(cfg),
        *reporting_problems(cfg),
        *model_problems(cfg),
        *wire_problems(cfg),
        *staleness_problems(cfg),
        *size_bound_problems(cfg),
    ]
