"""The ring's schedule, written once: which chunk a rank sends and receives at each step, and
the same schedule simulated in one process.

p ranks, the flat array of n elements cut into p chunks, chunk c = `chunk_bounds(n, p)[c]`:

    reduce-scatter, steps s = 0 .. p-2:
        rank r sends chunk (r - s) mod p to rank r+1,
        receives chunk (r - s - 1) mod p from rank r-1 and adds it into its own copy.
        After p-1 steps rank r holds the complete sum of chunk (r + 1) mod p.
    all-gather, steps s = 0 .. p-2:
        rank r sends chunk (r + 1 - s) mod p (complete) to rank r+1,
        receives chunk (r - s) mod p from rank r-1 and overwrites its own copy.

Frames number the whole schedule: reduce-scatter steps 0 .. p-2, all-gather p-1 .. 2p-3. Each
chunk travels as segments of at most `SEGMENT_BYTES` (`segments`), and a segment is forwarded
to the next step as soon as it has been received and reduced: the steps overlap, segment by
segment (comm/ring.py, "Pipelining").

What lives here:
    chunk_bounds, reduce_scatter_chunks,     the index math, plain functions, property-tested
    all_gather_chunks, segments              (tests/test_schedule.py) and used by every ring
    simulate_allreduce,                      the schedule by hand in one process, p copies in
    simulate_compressed_allreduce            lock step: the oracles of the real rings (bitwise)

The loop one rank runs over its links, walking this schedule: comm/ring.py's `RingReduce`.
"""

from __future__ import annotations

import numpy as np

SEGMENT_BYTES = 2 << 20  # 2 MiB: amortises a frame and a wake-up, small enough to pipeline


# --- index math ------------------------------------------------------------------------------


def chunk_bounds(n: int, p: int) -> list[tuple[int, int]]:
    """[start, stop) of each of p chunks of n elements; sizes differ by at most one, the larger
    chunks first (n = 10, p = 4 -> 3, 3, 2, 2)."""
    base, extra = divmod(n, p)
    bounds, start = [], 0
    for c in range(p):
        stop = start + base + (1 if c < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def reduce_scatter_chunks(rank: int, step: int, p: int) -> tuple[int, int]:
    """(chunk sent, chunk received) by `rank` at reduce-scatter step `step`."""
    return (rank - step) % p, (rank - step - 1) % p


def all_gather_chunks(rank: int, step: int, p: int) -> tuple[int, int]:
    """(chunk sent, chunk received) by `rank` at all-gather step `step`."""
    return (rank + 1 - step) % p, (rank - step) % p


def segments(start: int, stop: int, per_segment: int) -> list[tuple[int, int]]:
    """Cut [start, stop) into pieces of at most per_segment elements; an empty range is one
    empty piece (a frame still travels, so every rank takes every step)."""
    if stop <= start:
        return [(start, start)]
    return [(s, min(s + per_segment, stop)) for s in range(start, stop, per_segment)]


# --- the same schedules in one process -------------------------------------------------------


def simulate_allreduce(arrays: list[np.ndarray], op: str = "sum") -> list[np.ndarray]:
    """The ring schedule by hand, in one process: p copies, the same chunks, steps and order of
    additions as `ring.ring_allreduce`, so its results are bitwise what the real ring produces."""
    p = len(arrays)
    bufs = [np.array(a, copy=True) for a in arrays]
    bounds = chunk_bounds(bufs[0].size, p)
    for step in range(p - 1):  # reduce-scatter: all ranks send at once, then all receive
        outgoing = [reduce_scatter_chunks(r, step, p)[0] for r in range(p)]
        sent = [bufs[r][slice(*bounds[c])].copy() for r, c in enumerate(outgoing)]
        for r in range(p):
            chunk = reduce_scatter_chunks(r, step, p)[1]
            dst = bufs[r][slice(*bounds[chunk])]
            np.add(sent[(r - 1) % p], dst, out=dst)
            if step == p - 2 and op == "mean":
                dst /= dst.dtype.type(p)
    for step in range(p - 1):  # all-gather
        sent = [bufs[r][slice(*bounds[all_gather_chunks(r, step, p)[0]])].copy() for r in range(p)]
        for r in range(p):
            bufs[r][slice(*bounds[all_gather_chunks(r, step, p)[1]])] = sent[(r - 1) % p]
    return bufs


def simulate_compressed_allreduce(
    arrays: list[np.ndarray], codec, op: str = "sum", segment_bytes: int = SEGMENT_BYTES
) -> list[np.ndarray]:
    """The compressed ring by hand, in one process: the same segments, codes and order of
    operations as the compressed ring (comm/compressed_ring.py), so the results are bitwise the
    real ones."""
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
