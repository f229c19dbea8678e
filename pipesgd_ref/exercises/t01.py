"""Tutorial 01's checkable exercises (data-parallel SGD)."""

from __future__ import annotations

import numpy as np

from pipesgd_ref.config import TrainConfig
from pipesgd_ref.exercises import close, equal, exercise

ALPHA = 50e-6  # the tutorial's assumed LAN latency, s per message
BANDWIDTH = 1e9 / 8  # 1 Gb/s in bytes/s


@exercise(
    "01.1",
    "the weight of rank 0's gradient when its batch is 8 and the other 3 ranks' are 32",
    "each rank's mean gradient stands for B_r samples of the N = sum_r B_r: weight it B_r / N",
    judge=close(rel=1e-3),
)
def unequal_batch_weight() -> float:
    cfg = TrainConfig.preset("laptop")  # p = 4, B = 32
    batches = [8] + [cfg.batch_size] * (cfg.world_size - 1)
    return batches[0] / sum(batches)


@exercise(
    "01.2",
    "the training rows shared by step 0's 128 samples with p = 4, B = 32 and with p = 8, B = 16",
    "concatenate each set-up's batch_indices(rank, 0) over its ranks, then np.intersect1d",
    judge=equal,
    wrong=lambda: 128,  # "the same 128 samples": the guess the exercise is there to refute
)
def shared_rows_at_step_zero() -> int:
    from pipesgd_ref.data import MinibatchSampler, load_dataset

    cfg = TrainConfig.preset("laptop")
    n_train = load_dataset(cfg.dataset).n_train
    rows = []
    for p, b in ((cfg.world_size, cfg.batch_size), (8, 16)):
        sampler = MinibatchSampler(n_train, p, b, seed=cfg.seed)
        rows.append(np.concatenate([sampler.batch_indices(r, 0) for r in range(p)]))
    return int(len(np.intersect1d(rows[0], rows[1])))


@exercise(
    "01.3",
    "the gradient size M (bytes) at which the ring's latency term equals its bandwidth term",
    "2(p-1) alpha = 2(p-1)/p M/B gives M = p alpha B; with p = 4, alpha = 50 us, B = 125e6 B/s",
    judge=close(rel=0.01),
)
def latency_equals_bandwidth_bytes() -> float:
    from pipesgd_ref.timing import ring_allreduce_time

    p = TrainConfig.preset("laptop").world_size
    latency_term = ring_allreduce_time(p, 0, ALPHA, BANDWIDTH)  # no bytes: 2(p-1) alpha
    per_byte = ring_allreduce_time(p, 1.0, 0.0, BANDWIDTH)  # no latency: 2(p-1)/p / B per byte
    return latency_term / per_byte
