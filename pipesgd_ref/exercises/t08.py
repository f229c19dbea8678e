"""Tutorial 08's checkable exercises (GPU kernels and the device ring)."""

from __future__ import annotations

from pipesgd_ref.exercises import close, exercise
from pipesgd_ref.ops.cuda_support import TILE, ceil_div

# the tutorial's opening figures: an H200 in float32 without tensor cores, and its HBM3e
H200_FLOPS, H200_BYTES_PER_S = 67e12, 4.8e12
LAYERS = (64, 2048, 2048, 2048, 10)  # benchmarks/kernels_gpu.py --train's MLP


def step_flop(batch: int) -> float:
    """Forward 2 B sum n_in n_out, backward dW of every layer and dA of all but the first."""
    pairs = list(zip(LAYERS, LAYERS[1:], strict=False))
    forward = sum(2 * batch * n_in * n_out for n_in, n_out in pairs)
    return forward + 2 * forward - 2 * batch * LAYERS[0] * LAYERS[1]


@exercise(
    "08.1",
    "on an H200, the tiled kernel's global traffic time over its arithmetic time, batch 512",
    "naive reads are 8 bytes per multiply-add (4 per FLOP), tiled ones TILE times fewer: "
    "4 FLOPS / (TILE bandwidth), whatever the batch",
    judge=close(rel=0.01),
)
def tiled_traffic_over_arithmetic() -> float:
    flop = step_flop(512)
    tiled_bytes = flop / 2 * 8 / TILE  # two float32 operands per multiply-add, read TILE x less
    return (tiled_bytes / H200_BYTES_PER_S) / (flop / H200_FLOPS)


@exercise(
    "08.3",
    "the tiled kernel's global reads (elements) at B = 20, n_in = 18, n_out = 13",
    "output tiles ceil(20/16) x ceil(13/16), each ceil(18/16) steps of one TILE x TILE tile of X "
    "and one of W, padding included",
    judge=close(rel=1e-9),
)
def tiled_reads_small() -> int:
    b, n_in, n_out = 20, 18, 13
    return ceil_div(b, TILE) * ceil_div(n_out, TILE) * ceil_div(n_in, TILE) * 2 * TILE * TILE


@exercise(
    "08.4",
    "(chunks copied device to host, chunks host to device) per rank in one device_allreduce, p = 4",
    "D2H: this rank's own chunk at step 0 and each sum it forwards after an addition; H2D: "
    "every chunk received, p - 1 in each phase",
    judge=close(rel=0, abs_=0),
)
def device_ring_copies() -> tuple[int, int]:
    p = 4
    # D2H: step 0's own chunk, the p - 2 partial sums forwarded in the reduce-scatter, and the
    # complete chunk that starts the all-gather: p chunks, M bytes. H2D: 2(p - 1) received.
    return p, 2 * (p - 1)
