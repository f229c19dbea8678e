"""The deterministic per-rank sharding of the training set, and each rank's minibatches.

Rank r of p owns training rows r, r+p, r+2p, ... (`shard_indices`). Each rank draws its
minibatches from its own shard, a fresh permutation per epoch from (seed, rank, epoch)
(`MinibatchSampler`). A batch is a pure function of (seed, rank, step): random access by step
lets a run resume mid-epoch and lets a one-process oracle replay the batches of p workers
without running them.
"""

from __future__ import annotations

import numpy as np

from pipesgd_ref.data.dataset import Dataset
from pipesgd_ref.errors import DataError


def _check_world(n_train: int, rank: int | None, world_size: int) -> None:
    if world_size < 1:
        raise DataError(f"world size must be at least 1, got {world_size}")
    if rank is not None and not 0 <= rank < world_size:
        raise DataError(f"rank {rank} is outside [0, {world_size}) for world size {world_size}")
    if world_size > n_train:
        raise DataError(
            f"world size {world_size} is larger than the training set ({n_train} samples): "
            "every rank needs at least one sample"
        )


def shard_indices(n_train: int, rank: int, world_size: int) -> np.ndarray:
    """Rank r of p owns rows r, r+p, r+2p, ...: (ceil or floor of n_train / p,) int64.

    Strided rather than contiguous blocks: shard sizes differ by at most one, and a dataset
    stored sorted by class still gives every rank a mix of classes.
    """
    _check_world(n_train, rank, world_size)
    return np.arange(rank, n_train, world_size, dtype=np.int64)


class MinibatchSampler:
    """Rank r of p draws its minibatches from its own shard, reproducibly from the seed,
    with random access by step.

    Epoch e of rank r is the permutation np.random.default_rng((seed, r, e)) of r's shard,
    cut into steps_per_epoch batches of batch_size; the remainder is dropped. Step s falls in
    epoch s // steps_per_epoch, so any step is computed without replaying earlier ones.
    """

    def __init__(self, n_train: int, world_size: int, batch_size: int, seed: int) -> None:
        _check_world(n_train, None, world_size)
        smallest = n_train // world_size  # shards differ by at most one row
        if batch_size < 1:
            raise DataError(f"batch size must be at least 1, got {batch_size}")
        if batch_size > smallest:
            raise DataError(
                f"batch size {batch_size} (per worker) is larger than the smallest shard "
                f"({smallest} samples = {n_train} training samples // world size {world_size}); "
                f"use a batch size <= {smallest}, fewer ranks, or a larger dataset"
            )
        if seed < 0:
            raise DataError(f"seed must be a non-negative integer, got {seed}")
        self.n_train, self.world_size = n_train, world_size
        self.batch_size, self.seed = batch_size, seed
        # The same on every rank (from the SMALLEST shard), so all ranks agree on epoch
        # boundaries and take the same number of steps: the ring needs every rank each step.
        self.steps_per_epoch = smallest // batch_size

    def batch_indices(self, rank: int, step: int) -> np.ndarray:
        """(batch_size,) int64 rows of the training set, all in rank's shard."""
        shard = shard_indices(self.n_train, rank, self.world_size)
        if step < 0:
            raise DataError(f"rank {rank}: step must be >= 0, got {step}")
        epoch, i = divmod(step, self.steps_per_epoch)
        # Redrawn on every call (O(shard) work, small beside a gradient) rather than cached, so
        # the sampler holds no state and any step can be asked in any order.
        perm = np.random.default_rng((self.seed, rank, epoch)).permutation(len(shard))
        return shard[perm[i * self.batch_size : (i + 1) * self.batch_size]]

    def batch(self, dataset: Dataset, rank: int, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(X, y): (batch_size, n_features) float32 and (batch_size,) int64 for that step."""
        if dataset.n_train != self.n_train:
            raise DataError(
                f"rank {rank}: the sampler was built for {self.n_train} training samples but "
                f"dataset {dataset.name!r} has {dataset.n_train}; build it from this dataset"
            )
        idx = self.batch_indices(rank, step)
        return dataset.X_train[idx], dataset.y_train[idx]
