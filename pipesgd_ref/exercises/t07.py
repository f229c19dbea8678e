"""Tutorial 07's checkable exercises (compression inside the AllReduce)."""

from __future__ import annotations

import numpy as np

from pipesgd_ref.config import TrainConfig
from pipesgd_ref.exercises import close, exercise


def _first_gradients(p: int) -> list[np.ndarray]:
    """Each of p digits workers' gradient on its first minibatch (laptop preset, same w_0): the
    tutorial's `worker_gradients(p)`."""
    from pipesgd_ref.runtime.worker import Worker

    cfg = TrainConfig.preset("laptop").replace(world_size=p)
    grads = []
    for rank in range(p):
        worker = Worker.build(cfg, rank, p)
        g = np.empty_like(worker.params)
        worker.loss_and_grad(0, g)
        grads.append(g)
    return grads


def _roundtrip(codec, x: np.ndarray) -> np.ndarray:
    codes = np.empty(codec.wire_bytes(x.size), np.uint8)
    codec.encode(x, codes)
    out = np.empty_like(x)
    codec.decode(codes, out)
    return out


@exercise(
    "07.1",
    "trunc16's mean(sign(S) * (R - S)) / max|S| after the compressed ring with p = 8",
    "S = the float64 sum of the 8 gradients, R = simulate_compressed_allreduce(grads8, "
    "get_codec('trunc16'))[0]; the mean is negative: truncation shrinks every magnitude",
    judge=close(rel=0.02),
)
def trunc16_mean_signed_error() -> float:
    from pipesgd_ref.codecs import get_codec
    from pipesgd_ref.comm.schedule import simulate_compressed_allreduce

    grads = _first_gradients(8)
    exact = np.sum(np.array(grads, np.float64), axis=0)
    result = simulate_compressed_allreduce(grads, get_codec("trunc16"))[0]
    return float(np.mean(np.sign(exact) * (result - exact)) / np.abs(exact).max())


@exercise(
    "07.2",
    "the bandwidth (Mbit/s) above which q8 stops saving time when its passes add 5 ms to a "
    "4 MB AllReduce at p = 4",
    "the wire time saved is (1 - 1/r) * 2(p-1)/p * M/B; set it equal to c = 5 ms and solve for "
    "B, then convert bytes/s to Mbit/s (x 8 / 1e6)",
    judge=close(rel=0.01),
)
def q8_break_even_bandwidth() -> float:
    from pipesgd_ref.codecs import get_codec
    from pipesgd_ref.timing import ring_allreduce_time

    p, nbytes, codec_cost = 4, 4e6, 5e-3
    r = get_codec("q8").ratio
    # the wire terms of Eq. (1) at 1 byte/s; at bandwidth B both scale as 1/B
    saved_at_one = ring_allreduce_time(p, nbytes, 0.0, 1.0) - ring_allreduce_time(
        p, nbytes, 0.0, 1.0, ratio=r
    )
    return saved_at_one / codec_cost * 8 / 1e6


@exercise(
    "07.4",
    "how many nonzero entries of the digits gradient decode to 0 with one q8 scale per layer",
    "roundtrip each of worker.model.layout.slots on its own (grad[s.offset : s.offset + "
    "s.size]), then count (decoded == 0) & (grad != 0)",
    judge=close(rel=0.0, abs_=0.5),
)
def q8_per_layer_zeroed() -> int:
    from pipesgd_ref.codecs import get_codec
    from pipesgd_ref.runtime.worker import Worker

    cfg = TrainConfig.preset("laptop")
    worker = Worker.build(cfg, 0, cfg.world_size)
    grad = np.empty_like(worker.params)
    worker.loss_and_grad(0, grad)
    q8 = get_codec("q8")
    decoded = np.empty_like(grad)
    for slot in worker.model.layout.slots:
        part = slice(slot.offset, slot.offset + slot.size)
        decoded[part] = _roundtrip(q8, grad[part])
    return int(((decoded == 0) & (grad != 0)).sum())
