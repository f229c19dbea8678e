"""Checkpoints: enough state to continue a run exactly where it stopped.

A checkpoint taken after step t holds the weights w_{t+1}, the next step t+1, for Pipe-SGD the
averaged gradients still in flight (computed at steps t-s+1 .. t, not yet applied), and with
--momentum the optimiser's velocity v_{t+1} (methods/optimizer.py; rank 0's: every replica's
is the same, and a parameter server's is the server's). Data order, learning rate and
everything else are functions of (seed, rank, step), so nothing more is needed: a resumed
sync, ddp, pipe or ps-sync run ends with the same weights as an uninterrupted one (ps-sync:
the server writes its weights and velocity). A checkpoint written before the velocity existed
(an older version, or no update yet) has none: v starts at 0, as it would have. ps-async's
server writes its weights (and velocity) after every `checkpoint_every` rounds of p updates; a
resumed ps-async run continues from them with each worker's remaining pushes, but its result
depends on the order pushes arrive in, so it is not the uninterrupted run's, only another run
of the same method. Cosine's horizon is the run's steps: a resume that raises --steps
stretches its schedule.
The checkpoint written at the end of a run comes after the drain (nothing in flight): resuming
it with a larger --steps continues training with a fresh pipeline fill.

A model with batch norm (the ResNet) has running statistics beside its weights, `buffers`:
the job's are worker 0's (runtime/worker.py), so the checkpoint holds rank 0's (ring methods)
or the server's copy of worker 0's (ps), and every rank of a resumed run starts from them:
the statistics continue as in the uninterrupted run, bitwise. Other models have none, and
older checkpoints lack them (a resumed run then starts them afresh).

Written atomically: a temporary file in the same folder, then os.replace, so a crash (or a run
that diverges) leaves the previous checkpoint whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import zipfile
import zlib
from pathlib import Path
from typing import NamedTuple

import numpy as np

from pipesgd_ref.config import TrainConfig, kernel_file
from pipesgd_ref.errors import ConfigError, OutputError
from pipesgd_ref.models import MODEL_FIELDS
from pipesgd_ref.outputs import space_needed

FILE = "checkpoint.npz"
KEYS = ("params", "next_step", "pending_steps", "pending", "config")  # what every one holds
OPTIONAL = ("velocity", "buffers")  # what save writes beside them (momentum, batch norm's
# running statistics), absent from older files


class Restored(NamedTuple):
    """What `load` reads back: the state a resumed run continues from."""

    params: np.ndarray  # w_{next_step}
    next_step: int
    pending: dict[int, np.ndarray]  # pipe: averaged gradients in flight, by step
    velocity: np.ndarray | None  # momentum's v (None: plain SGD, or none yet: zeros)
    buffers: np.ndarray | None  # the model's running statistics (None: none, or an older file)


# Keys that must match between the checkpoint and the run that resumes it: anything that
# changes w_0, the data order or the schedule would make "the same run" meaningless, and every
# field the model is built from (MODEL_FIELDS, taken from the models so that a new model option
# is checked too): the same number of parameters can have another layout (a CNN's channels and
# kernels traded against each other), and weights read into the wrong slots train on as noise.
# The codec settings too: the gradients in flight were averaged through the checkpoint's codec,
# and a run that changes codec mid-way is no longer the run the checkpoint belongs to (its
# result matches neither the uninterrupted run nor a fresh one with the new codec).
MUST_MATCH = (
    "dataset",
    *MODEL_FIELDS,
    "algo",
    "world_size",
    "width",
    "warmup_steps",
    "batch_size",
    "lr",
    "lr_schedule",
    "lr_decay",
    "lr_milestones",
    "lr_gamma",
    "lr_warmup",
    "momentum",
    "nesterov",
    "weight_decay",
    "seed",
    "codec",
    "error_feedback",
    "codec_pull",
    "compensation",
    "dc_lambda",
    "max_staleness",
)


def save(
    folder: str | Path,
    cfg: TrainConfig,
    params: np.ndarray,
    next_step: int,
    pending: dict[int, np.ndarray],
    velocity: np.ndarray | None = None,
    buffers: np.ndarray | None = None,
) -> Path:
    """Write folder/checkpoint.npz (module docstring); `velocity`: the optimiser's, if any;
    `buffers`: the model's running statistics, if it has any."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / FILE
    tmp = folder / (FILE + ".tmp")
    steps = sorted(pending)
    arrays = dict(
        params=params,
        next_step=np.int64(next_step),
        pending_steps=np.array(steps, np.int64),
        pending=np.array([pending[t] for t in steps], params.dtype).reshape(
            len(steps), params.size
        ),
        config=np.array(json.dumps(cfg.to_dict())),
        velocity=np.zeros(0, params.dtype) if velocity is None else velocity,
        buffers=np.zeros(0, np.float32) if buffers is None else buffers,
    )
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)  # atomic on POSIX: readers see the old file or the new one
    except OSError as e:
        # A full disk, or a folder named checkpoint.npz: the half-written file goes, the
        # previous checkpoint stays whole, and the run ends in one line (a restart would
        # meet the same disk: OutputError is not retried).
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        needed = sum(a.nbytes for a in arrays.values())
        raise OutputError(
            f"cannot write the checkpoint {str(path)!r} ({space_needed(path, needed, e)}); "
            f"free some space there, or give another --out"
        ) from None
    return path


def _check_folder(folder: Path, path: Path) -> None:
    """--resume's folder holds a checkpoint file that can be read (ConfigError naming it)."""
    where = "point --resume at the folder of a run that wrote one (its --out)"
    if not (folder.exists() or folder.is_symlink()):
        raise ConfigError(f"--resume {folder}: no such folder; {where}")
    real = kernel_file(folder)
    if real is not None:
        raise ConfigError(
            f"--resume {folder}: that is {real}, which the kernel makes up as it is read, "
            f"not a run's folder; {where}"
        )
    if not (folder.is_dir() or folder.is_file()):
        raise ConfigError(f"--resume {folder}: that is not a folder (a FIFO or a device); {where}")
    if folder.is_file():
        raise ConfigError(
            f"--resume {folder}: that is a file; --resume takes the run's folder (the --out of "
            f"the run, the one holding {FILE}), e.g. --resume {folder.parent}"
        )
    if path.exists() and not path.is_file():  # a folder or a FIFO: np.load would fail or block
        raise ConfigError(
            f"--resume {folder}: its {FILE} is not a regular file (a folder, a FIFO or a "
            f"device); point --resume at the folder of a run that wrote its checkpoint"
        )
    real = kernel_file(path)
    if real is not None:
        raise ConfigError(
            f"--resume {folder}: its {FILE} is {real}, a file the kernel makes up as it is "
            f"read, not a checkpoint; point --resume at the folder of a run that wrote one"
        )
    if not path.is_file():
        raise ConfigError(
            f"--resume {folder}: no {FILE} there (did the run write one? use --out=DIR to save, "
            f"--checkpoint-every=N for periodic ones)"
        )


def load(
    folder: str | Path, cfg: TrainConfig, n_params: int | None = None, n_buffers: int | None = None
) -> Restored:
    """(params, next_step, pending gradients by step, velocity, buffers) from
    folder/checkpoint.npz, after checking that it belongs to a run like `cfg` (and, given
    n_params and n_buffers, to its model).

    Every way a checkpoint can be unusable (not there, empty, truncated, not an .npz, a key
    missing, a vector of the wrong size, NaN or Inf weights or statistics, another run's
    settings) is a
    ConfigError naming the file, what is wrong and what to do: a bad --resume is a user error,
    found before any worker starts, never a traceback."""
    folder = Path(folder)
    path = folder / FILE
    _check_folder(folder, path)
    saved, params, next_step, pending, velocity, buffers = _read(path, n_params)
    _check_contents(path, params, next_step, pending, n_params)
    _check_velocity(path, velocity, params.size)
    _check_buffers(path, buffers, n_buffers)
    now = cfg.to_dict()
    defaults = TrainConfig().to_dict()  # a key an older version did not write had its default
    differ = [
        f"{k}: {saved.get(k, defaults[k])!r} in the checkpoint, {now[k]!r} now"
        for k in MUST_MATCH
        if saved.get(k, defaults[k]) != now[k]
    ]
    if differ:
        raise ConfigError(
            f"--resume {folder}: the checkpoint is from a different run ("
            + "; ".join(differ)
            + "); resume with the checkpoint's settings, or start without --resume"
        )
    if pending and cfg.compensation != "none":
        raise ConfigError(
            f"--resume {folder}: a checkpoint taken mid-run with gradients in flight, and "
            f"--compensation {cfg.compensation} would need what it kept of them (weights or "
            f"local gradients), which checkpoints do not hold; resume the run's final "
            f"checkpoint (nothing in flight), or one without compensation"
        )
    return Restored(params, next_step, pending, velocity, buffers)


def _read(path: Path, n_params: int | None) -> tuple:
    """The raw contents of a checkpoint file, or a ConfigError saying why it cannot be read."""
    what_to_do = (
        "start without --resume, or point --resume at the folder of a run that "
        "finished writing its checkpoint"
    )

    def bad(problem: str) -> ConfigError:
        return ConfigError(f"--resume: {path} {problem}; {what_to_do}")

    if path.stat().st_size == 0:
        raise bad("is empty (0 bytes)")
    try:
        # Only the headers first: a crafted header can declare 10^13 numbers, which np.load
        # would try to allocate before reading a byte of them.
        _check_headers(path, n_params, bad)
        # allow_pickle=False (the default, said aloud): a checkpoint is data, never code to run.
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in KEYS if k not in z.files]
            if missing:
                raise bad(
                    f"has no {', '.join(missing)} (it holds {', '.join(z.files) or 'nothing'}"
                    f"; a checkpoint holds {', '.join(KEYS)})"
                )
            config_text = str(z["config"])
            params = np.array(z["params"])
            next_step = np.array(z["next_step"])
            pending_steps = np.array(z["pending_steps"])
            pending_arr = np.array(z["pending"])
            velocity = np.array(z["velocity"]) if "velocity" in z.files else None
            buffers = np.array(z["buffers"]) if "buffers" in z.files else None
    except ConfigError:
        raise
    except ValueError as e:  # an .npy header numpy cannot parse
        raise bad(f"is not a checkpoint ({e}): garbage, or another kind of file") from None
    except PermissionError as e:
        raise ConfigError(
            f"--resume: {path} cannot be read ({e.strerror}); check its permissions"
        ) from None
    except (OSError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as e:
        # BadZipFile: an archive cut short (no central directory at its end); EOFError, OSError
        # or zlib.error: a member cut or corrupted inside.
        raise bad(f"is truncated or corrupt ({type(e).__name__}: {e})") from None
    try:
        saved = json.loads(config_text)
    except json.JSONDecodeError as e:
        raise bad(f"has an unreadable config ({e})") from None
    if not isinstance(saved, dict):
        raise bad("has a config that is not a table of keys")
    if next_step.shape != () or not np.issubdtype(next_step.dtype, np.integer):
        raise bad(f"has next_step of {next_step.dtype} {next_step.shape}; want one integer")
    if params.ndim != 1 or not np.issubdtype(params.dtype, np.floating):
        raise bad(f"has params of {params.dtype} {params.shape}; want a flat float vector")
    if pending_steps.ndim != 1 or not (
        pending_steps.size == 0 or np.issubdtype(pending_steps.dtype, np.integer)
    ):
        raise bad(
            f"has pending_steps of {pending_steps.dtype} {pending_steps.shape}; want "
            f"a list of integer steps"
        )
    if pending_arr.shape != (len(pending_steps), params.size):
        raise bad(
            f"has pending gradients of shape {pending_arr.shape}; want "
            f"({len(pending_steps)}, {params.size}): one per pending step"
        )
    # The weights train in float32 (the models' dtype); an older or hand-made float64 vector
    # is converted rather than changing the dtype of every buffer of the run.
    params = params.astype(np.float32)
    pending = {int(t): pending_arr[i].astype(np.float32) for i, t in enumerate(pending_steps)}
    if velocity is not None:  # an empty one: no velocity yet (plain SGD, or no update)
        velocity = velocity.astype(np.float32) if velocity.size else None
    if buffers is not None:  # an empty one: a model without running statistics
        if buffers.ndim != 1 or not np.issubdtype(buffers.dtype, np.floating):
            raise bad(f"has buffers of {buffers.dtype} {buffers.shape}; want a float vector")
        buffers = buffers.astype(np.float32) if buffers.size else None
    return saved, params, int(next_step), pending, velocity, buffers


NPY_MAGIC = b"\x93NUMPY"
DEFLATE_MAX_RATIO = 1032  # the most deflate can shrink data: a bound on a member's true size


def _npy_header(f) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype an .npy stream declares, read without reading its data."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(f)
    elif version == (2, 0):
        shape, _, dtype = np.lib.format.read_array_header_2_0(f)
    else:
        raise ValueError(f".npy format version {version[0]}.{version[1]}, which save never writes")
    return shape, dtype


def _check_headers(path: Path, n_params: int | None, bad) -> None:
    """What the file declares, checked before anything is allocated: an .npz (a zip archive) of
    number and text arrays, each holding exactly the bytes its header declares, and params of
    this run's model's size; `bad(problem)` makes the ConfigError."""
    with open(path, "rb") as f:
        start = f.read(len(NPY_MAGIC))
        if start == NPY_MAGIC:  # a bare .npy renamed: one array, no keys
            f.seek(0)
            shape, dtype = _npy_header(f)
            raise bad(f"is a single .npy array {dtype} {shape}, not a checkpoint's .npz")
    if not start.startswith(b"PK"):
        raise bad(
            "is not a checkpoint (neither a zip archive nor an .npy array): garbage, or another "
            "kind of file"
        )
    disk = path.stat().st_size
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            key = info.filename.removesuffix(".npy")
            ratio = 1 if info.compress_type == zipfile.ZIP_STORED else DEFLATE_MAX_RATIO
            if info.compress_size > disk or info.file_size > info.compress_size * ratio:
                raise bad(f"declares {key} of {info.file_size} bytes in {disk}: it is corrupt")
            with archive.open(info) as f:
                shape, dtype = _npy_header(f)
                header = f.tell()
            if dtype.hasobject:
                raise bad(
                    f"holds Python objects in {key} ({dtype}), which a checkpoint never does "
                    f"(it holds numbers and text; objects would have to be unpickled)"
                )
            declared = int(np.prod(shape, dtype=object)) * dtype.itemsize
            if key == "params" and n_params is not None and declared != n_params * dtype.itemsize:
                raise _wrong_size(path, declared // max(dtype.itemsize, 1), n_params)
            if declared != info.file_size - header:
                raise bad(
                    f"declares {key} of {dtype} {shape} ({declared} bytes) but holds "
                    f"{info.file_size - header} bytes: it is corrupt or crafted"
                )


def _wrong_size(path: Path, size, n_params: int) -> ConfigError:
    options = ", ".join("--" + k.replace("_", "-") for k in MODEL_FIELDS)
    return ConfigError(
        f"--resume: {path} holds {size} parameters but this run's model has {n_params}; it is "
        f"from another model or dataset (check {options}, --dataset), or start without --resume"
    )


def _check_contents(
    path: Path,
    params: np.ndarray,
    next_step: int,
    pending: dict[int, np.ndarray],
    n_params: int | None,
) -> None:
    """The checkpoint's numbers make sense for this run: size, finiteness, step order."""
    if n_params is not None and params.size != n_params:
        raise _wrong_size(path, params.size, n_params)
    if next_step < 0:
        raise ConfigError(
            f"--resume: {path} says next_step {next_step}; a step is >= 0 "
            f"(the file is corrupt): start without --resume"
        )
    bad_steps = sorted(t for t in pending if not 0 <= t < next_step)
    if bad_steps:
        raise ConfigError(
            f"--resume: {path} holds pending gradients of steps {bad_steps}, not before its "
            f"next_step {next_step} (the file is corrupt): start without --resume"
        )
    n_bad = int(np.count_nonzero(~np.isfinite(params)))
    if n_bad:
        first = int(np.argmax(~np.isfinite(params)))
        raise ConfigError(
            f"--resume: {path} holds {n_bad} non-finite weight(s) (NaN or Inf; the first at index "
            f"{first}, {params[first]}): training from it would diverge at once; resume from "
            f"an earlier checkpoint or start without --resume"
        )
    for t, g in pending.items():
        if not np.all(np.isfinite(g)):
            raise ConfigError(
                f"--resume: {path} holds a non-finite pending gradient of step {t} (NaN or Inf):"
                f" applying it would ruin the weights; start without --resume"
            )


def _check_velocity(path: Path, velocity: np.ndarray | None, n: int) -> None:
    """The optimiser's velocity, when there is one: a finite vector as long as the weights."""
    if velocity is None:
        return
    if velocity.shape != (n,):
        raise ConfigError(
            f"--resume: {path} holds a velocity of shape {velocity.shape} for {n} weights (the "
            f"file is corrupt): start without --resume"
        )
    if not np.all(np.isfinite(velocity)):
        raise ConfigError(
            f"--resume: {path} holds a non-finite momentum velocity (NaN or Inf): the next "
            f"update would ruin the weights; resume an earlier checkpoint or start without --resume"
        )


def _check_buffers(path: Path, buffers: np.ndarray | None, n_buffers: int | None) -> None:
    """The model's running statistics: as many as this run's model has (given n_buffers), and
    finite. None (an older checkpoint, or a model without any) is always accepted."""
    if buffers is None:
        return
    if n_buffers is not None and buffers.shape != (n_buffers,):
        raise ConfigError(
            f"--resume: {path} holds batch-norm running statistics of shape {buffers.shape}; "
            f"this run's model has {n_buffers}: it is from another model (check --model, "
            f"--depth, --channels), or start without --resume"
        )
    if not np.all(np.isfinite(buffers)):
        raise ConfigError(
            f"--resume: {path} holds non-finite batch-norm running statistics (NaN or Inf): "
            f"evaluation would fail; resume an earlier checkpoint or start without --resume"
        )


def due(cfg: TrainConfig, step: int) -> bool:
    """Whether a periodic checkpoint is due after `step` (0-based)."""
    return bool(cfg.out) and cfg.checkpoint_every > 0 and (step + 1) % cfg.checkpoint_every == 0
