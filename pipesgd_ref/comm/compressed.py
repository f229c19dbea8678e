"""Ring AllReduce with a codec on every hop (shared/PAPER.md section 3: compression inside the
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
"""

from __future__ import annotations

import numpy as np

from pipesgd_ref.comm.rendezvous import Communicator
from pipesgd_ref.comm.ring import (
    SEGMENT_BYTES,
    _at,
    _recv_checked,
    all_gather_chunks,
    chunk_bounds,
    reduce_scatter_chunks,
    segments,
)
from pipesgd_ref.comm.transport import CODE_OF_DTYPE, Frame, Kind, Op


def compressed_ring_reduce(
    comm: Communicator, flat: np.ndarray, op: Op, codec, segment_bytes: int
) -> None:
    p, rank = comm.world_size, comm.rank
    seq = comm.next_seq()
    if p == 1:
        return  # nothing crosses a wire: nothing is compressed
    if flat.dtype != np.float32:
        raise ValueError(f"codec {codec.name!r} compresses float32 gradients, got {flat.dtype}")
    bounds = chunk_bounds(flat.size, p)
    per = max(1, segment_bytes // 4)
    scratch = np.empty(codec.wire_bytes(per), np.uint8)  # one received segment's codes
    header = Frame(kind=Kind.DATA, op=op, dtype=CODE_OF_DTYPE[np.dtype(np.uint8)], seq=seq,
                   src=rank, total_len=flat.size)  # fmt: skip
    sender = comm.right.start_sender()
    kept: list[np.ndarray] = []  # codes queued for sending: alive until the sender is done
    name = f"allreduce[{codec.name}] #{seq}"

    def send_codes(step: int, part: int, codes: np.ndarray) -> None:
        kept.append(codes)
        sender.put(_at(header, step, part), memoryview(codes), name)

    def encode(values: np.ndarray) -> np.ndarray:
        codes = np.empty(codec.wire_bytes(values.size), np.uint8)
        codec.encode(values, codes)
        return codes

    first = reduce_scatter_chunks(rank, 0, p)[0]
    for part, (s, e) in enumerate(segments(*bounds[first], per)):
        send_codes(0, part, encode(flat[s:e]))
    for step in range(p - 1):  # reduce-scatter: decode, add, re-encode
        _, chunk = reduce_scatter_chunks(rank, step, p)
        doing = f"{name} step {step} (reduce-scatter)"
        last = step == p - 2
        for part, (s, e) in enumerate(segments(*bounds[chunk], per)):
            codes = scratch[: codec.wire_bytes(e - s)]
            _recv_checked(comm, header, step, part, codes, doing, sender)
            dst = flat[s:e]
            codec.add_decoded_into(codes, dst)  # dst = local + decode(partial sum so far)
            if last and op == Op.ALLREDUCE_MEAN:
                dst /= np.float32(p)
            out = encode(dst)
            if last:  # the owner keeps exactly what everyone else will decode
                codec.decode(out, dst)
            send_codes(step + 1, part, out)
    for step in range(p - 1, 2 * p - 2):  # all-gather: decode, forward the same bytes
        _, chunk = all_gather_chunks(rank, step - (p - 1), p)
        doing = f"{name} step {step} (all-gather)"
        for part, (s, e) in enumerate(segments(*bounds[chunk], per)):
            codes = np.empty(codec.wire_bytes(e - s), np.uint8)
            _recv_checked(comm, header, step, part, codes, doing, sender)
            codec.decode(codes, flat[s:e])
            if step < 2 * p - 3:
                send_codes(step + 1, part, codes)
    sender.flush(comm.timeout)


def simulate_compressed_allreduce(
    arrays: list[np.ndarray], codec, op: str = "sum", segment_bytes: int = SEGMENT_BYTES
) -> list[np.ndarray]:
    """The compressed ring by hand, in one process: the same segments, codes and order of
    operations as `compressed_ring_reduce`, so the results are bitwise the real ones."""
    p = len(arrays)
    bufs = [np.array(a, np.float32, copy=True) for a in arrays]
    if p == 1:
        return bufs
    bounds = chunk_bounds(bufs[0].size, p)
    per = max(1, segment_bytes // 4)

    def encode(values):
        codes = np.empty(codec.wire_bytes(values.size), np.uint8)
        codec.encode(values, codes)
        return codes

    # in_flight[r]: the codes rank r sends next, one entry per segment
    in_flight = []
    for r in range(p):
        first = reduce_scatter_chunks(r, 0, p)[0]
        in_flight.append([encode(bufs[r][s:e]) for s, e in segments(*bounds[first], per)])
    for step in range(p - 1):
        nxt = []
        for r in range(p):
            chunk = reduce_scatter_chunks(r, step, p)[1]
            out = []
            for part, (s, e) in enumerate(segments(*bounds[chunk], per)):
                dst = bufs[r][s:e]
                codec.add_decoded_into(in_flight[(r - 1) % p][part], dst)
                if step == p - 2 and op == "mean":
                    dst /= np.float32(p)
                codes = encode(dst)
                if step == p - 2:
                    codec.decode(codes, dst)
                out.append(codes)
            nxt.append(out)
        in_flight = nxt
    for step in range(p - 1):
        nxt = []
        for r in range(p):
            chunk = all_gather_chunks(r, step, p)[1]
            got = in_flight[(r - 1) % p]
            for part, (s, e) in enumerate(segments(*bounds[chunk], per)):
                codec.decode(got[part], bufs[r][s:e])
            nxt.append(got)
        in_flight = nxt
    return bufs
