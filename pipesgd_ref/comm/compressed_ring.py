"""The compressed ring: ring AllReduce with a codec on every hop (compression inside the
AllReduce).

Codes cannot be added: a truncated or quantized number plus another is not the code of their
sum. So each reduce-scatter hop decodes what arrives, adds it to the local chunk, and encodes
the partial sum again for the next hop; the rank that completes a chunk encodes it one last
time, and the all-gather forwards those final codes unchanged. Every rank (the owner too, which
replaces its copy with the decoded final codes) decodes the same bytes: bitwise identical
results, as in the uncompressed ring.

Cost per rank, with compression ratio r and M bytes of float32 gradient:
    bytes sent     2(p-1)/p * M / r                       (plus a 48-byte header per segment)
    codec passes   (p-1) decode-add + (p-1) encode over M/p bytes in the reduce-scatter,
                   (p-1) decodes over M/p in the all-gather (one more encode + decode by the
                   owner of each chunk)
Error: each of the p-1 re-encodings of a partial sum S_k (k = 1..p terms) rounds it once, so
    trunc16: |result - exact| <= 2^-7 * sum_k |S_k|       per element (relative 2^-7 per pass)
    q8:      |result - exact| <= sum_k max|S_k| / 254      per element (half a step per pass,
                                                            step = the chunk's max-abs / 127)
and the mean divides the same error by p.

Memory: the codes of every segment this rank sends are kept until the sending thread has sent
them, about 2(p-1)/p * M / r bytes per collective.

The loop is the host ring's (comm/ring.py's `RingReduce`); `CompressedHops` says what a segment
is on the wire (codes) and how a hop reduces it, and comm/ring.py joins the two as
`CompressedRingReduce`. Its one-process oracle, bitwise: comm/schedule.py's
`simulate_compressed_allreduce`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from pipesgd_ref.comm.wire import Op


class CompressedHops:
    """What a segment is in the compressed ring, as RingReduce's hooks (comm/ring.py): codes on
    the wire, decode-add-encode on every reduce-scatter hop, decode-and-forward-the-same-bytes
    in the all-gather. Mixed in before RingReduce (ring.py's `CompressedRingReduce`)."""

    wire_dtype = np.dtype(np.uint8)  # the frames carry codes

    if TYPE_CHECKING:  # RingReduce's, after this mixin in the MRO (comm/ring.py, not imported)
        comm: Any
        flat: np.ndarray
        dtype: np.dtype
        op: Op

    def __init__(self, comm, flat: np.ndarray, op, segment_bytes: int, codec):
        super().__init__(  # type: ignore[call-arg]  # a mixin: super() is RingReduce's
            comm, flat, op, segment_bytes, name=f"allreduce[{codec.name}]"
        )
        self.codec = codec
        self.kept: list[np.ndarray] = []  # codes queued for sending: alive until sent

    def prepare(self, largest: int, per: int) -> None:
        if self.dtype != np.float32:  # checked once p > 1: a lone rank compresses nothing
            raise ValueError(
                f"codec {self.codec.name!r} compresses float32 gradients, got {self.dtype}"
            )
        self.scratch = np.empty(self.codec.wire_bytes(per), np.uint8)  # one segment's codes

    def encode(self, values: np.ndarray) -> np.ndarray:
        codes = np.empty(self.codec.wire_bytes(values.size), np.uint8)
        self.codec.encode(values, codes)
        return codes

    def send(self, step: int, chunk: int, part: int, codes: np.ndarray) -> None:
        self.kept.append(codes)
        super().send(step, chunk, part, codes)  # type: ignore[misc]  # a mixin: RingReduce's

    def outgoing(self, s: int, e: int) -> np.ndarray:
        return self.encode(self.flat[s:e])

    def inbox(self, s: int, e: int, gathering: bool) -> np.ndarray:
        n = self.codec.wire_bytes(e - s)
        # The all-gather forwards what it receives: fresh codes, the scratch would be reused.
        return np.empty(n, np.uint8) if gathering else self.scratch[:n]

    def reduce(self, codes: np.ndarray, s: int, e: int, last: bool) -> np.ndarray:
        dst = self.flat[s:e]
        self.codec.add_decoded_into(codes, dst)  # dst = local + decode(partial sum so far)
        if last and self.op == Op.ALLREDUCE_MEAN:
            dst /= np.float32(self.comm.world_size)
        out = self.encode(dst)
        if last:  # the owner keeps exactly what everyone else will decode
            self.codec.decode(out, dst)
        return out

    def place(self, codes: np.ndarray, s: int, e: int) -> np.ndarray:
        self.codec.decode(codes, self.flat[s:e])
        return codes  # forwarded as they came

    def chunk_bytes(self, n: int) -> int:
        return self.codec.wire_bytes(n)
