"""What one ring AllReduce takes on a run's emulated link, frame by frame as the ring sends it.

timing/iteration.py predicts an iteration from the timing models (T_ar: equation (1) of
docs/paper.md); this counts the frames a ring AllReduce of cfg really puts on the wire (chunks
cut into segments, each with its header, in the codec's bytes) and times them on cfg's
alpha-beta link (comm/netem.py). The pipe's compute thread, which waits for a whole
AllReduce, allows this much beyond --timeout.
"""

from __future__ import annotations

from pipesgd_ref.codecs import get_codec
from pipesgd_ref.comm.netem import link_of
from pipesgd_ref.comm.schedule import SEGMENT_BYTES
from pipesgd_ref.comm.wire import HEADER_BYTES
from pipesgd_ref.config import TrainConfig

__all__ = ["SEGMENT_VALUES", "emulated_allreduce_seconds"]

SEGMENT_VALUES = max(1, SEGMENT_BYTES // 4)  # float32 values in one segment of a ring chunk


def emulated_allreduce_seconds(cfg: TrainConfig, n_params: int) -> float:
    """Seconds one ring AllReduce of n_params float32 values spends on cfg's emulated link:
    2 (p - 1) steps, each a chunk of ceil(n / p) values in the codec's wire bytes, cut into
    segments of at most SEGMENT_VALUES that pipeline on the wire, each with its header:
    2 (p - 1) (alpha + (wire bytes + segments x header) / B). 0 for an ideal link or p = 1.
    What a thread that waits for a whole AllReduce must allow beyond --timeout (each ring hop
    is bounded by --timeout, the sum of 2 (p - 1) of them is not)."""
    link, p = link_of(cfg), cfg.world_size
    if p == 1 or not link.enabled:
        return 0.0
    values = -(-n_params // p)  # the largest chunk: ceil(n / p)
    segments = max(1, -(-values // SEGMENT_VALUES))
    nbytes = get_codec(cfg.codec, "numpy").wire_bytes(values) + segments * HEADER_BYTES
    return 2 * (p - 1) * link.message_time(nbytes)  # 2 (p - 1) (alpha + b / B)
