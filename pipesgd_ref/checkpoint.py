"""Checkpoints: enough state to continue a run exactly where it stopped.

A checkpoint taken after step t holds the weights w_{t+1}, the next step t+1, and, for Pipe-SGD,
the averaged gradients still in flight (computed at steps t-s+1 .. t, not yet applied). Data
order, learning rate and everything else are functions of (seed, rank, step), so nothing more
is needed: a resumed sync, pipe or ps-sync run ends with the same weights as an uninterrupted
one (ps-sync: the server writes its weights). ps-async's server writes its weights after every
`checkpoint_every` rounds of p updates; a resumed ps-async run continues from them with each
worker's remaining pushes, but its result depends on the order pushes arrive in, so it is not
the uninterrupted run's, only another run of the same method.
The checkpoint written at the end of a run comes after the drain (nothing in flight): resuming
it with a larger --steps continues training with a fresh pipeline fill.

Written atomically: a temporary file in the same folder, then os.replace, so a crash (or a run
that diverges) leaves the previous checkpoint whole.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from pipesgd_ref.config import ConfigError, TrainConfig

FILE = "checkpoint.npz"
# Keys that must match between the checkpoint and the run that resumes it: anything that
# changes w_0, the data order or the schedule would make "the same run" meaningless.
MUST_MATCH = ("dataset", "model", "hidden", "algo", "world_size", "width", "warmup_steps",
              "batch_size", "lr", "lr_decay", "seed")  # fmt: skip


def save(folder: str | Path, cfg: TrainConfig, params: np.ndarray, next_step: int,
         pending: dict[int, np.ndarray]) -> Path:  # fmt: skip
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / FILE
    tmp = folder / (FILE + ".tmp")
    steps = sorted(pending)
    with open(tmp, "wb") as f:
        np.savez(
            f,
            params=params,
            next_step=np.int64(next_step),
            pending_steps=np.array(steps, np.int64),
            pending=np.array([pending[t] for t in steps], params.dtype).reshape(
                len(steps), params.size
            ),
            config=np.array(json.dumps(cfg.to_dict())),
        )
    os.replace(tmp, path)  # atomic on POSIX: readers see the old file or the new one
    return path


def load(folder: str | Path, cfg: TrainConfig) -> tuple[np.ndarray, int, dict[int, np.ndarray]]:
    """(params, next_step, pending gradients by step) from folder/checkpoint.npz, after
    checking that it belongs to a run like `cfg`."""
    path = Path(folder) / FILE
    if not path.is_file():
        raise ConfigError(
            f"--resume {folder}: no {FILE} there (did the run write one? use --out=DIR to save, "
            f"--checkpoint-every=N for periodic ones)"
        )
    with np.load(path) as z:
        saved = json.loads(str(z["config"]))
        params = z["params"].copy()
        next_step = int(z["next_step"])
        pending = {int(t): z["pending"][i].copy() for i, t in enumerate(z["pending_steps"])}
    now = cfg.to_dict()
    differ = [f"{k}: {saved.get(k)!r} in the checkpoint, {now[k]!r} now" for k in MUST_MATCH
              if saved.get(k) != now[k]]  # fmt: skip
    if differ:
        raise ConfigError(f"--resume {folder}: the checkpoint is from a different run ("
                          + "; ".join(differ) + ")")  # fmt: skip
    return params, next_step, pending


def due(cfg: TrainConfig, step: int) -> bool:
    """Whether a periodic checkpoint is due after `step` (0-based)."""
    return bool(cfg.out) and cfg.checkpoint_every > 0 and (step + 1) % cfg.checkpoint_every == 0
