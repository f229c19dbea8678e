"""Ring AllReduce, broadcast and barrier over a Communicator's ring links.

The schedule (p ranks, the flat array cut into p chunks, chunk c = `chunk_bounds(n, p)[c]`):

    reduce-scatter, steps s = 0 .. p-2:
        rank r sends chunk (r - s) mod p to rank r+1,
        receives chunk (r - s - 1) mod p from rank r-1 and adds it into its own copy.
        After p-1 steps rank r holds the complete sum of chunk (r + 1) mod p.
    all-gather, steps s = 0 .. p-2:
        rank r sends chunk (r + 1 - s) mod p (complete) to rank r+1,
        receives chunk (r - s) mod p from rank r-1 and overwrites its own copy.

Cost per rank: 2(p-1) steps, each sending and receiving one chunk of M/p bytes: 2(p-1)/p * M
bytes each way, independent of p (bandwidth-optimal), plus (p-1)/p * M bytes of additions.
In the alpha-beta model (shared/PAPER.md section 3):

    T_ring = 2(p-1) * alpha + 2(p-1)/p * M / B + (p-1)/p * M * gamma

Determinism: chunk c is summed in one fixed order, x_c + x_{c+1} + ... + x_{c-1} (by rank,
starting at c and going round the ring), by one rank, and the all-gather copies its bytes to
everyone: every rank ends with bitwise identical results, whatever the timing.

Pipelining inside a step: each chunk travels as segments of at most `segment_bytes`. A segment
is forwarded (next step) as soon as it has been received and reduced, by a sending thread,
while the main thread receives the next segment. Extra memory per rank: one segment-sized
receive buffer (at most a chunk, O(M/p)), kept by the communicator for the next call.

Agreement: every frame carries (sequence number, op, dtype, total length, step, segment); the
receiver checks them against its own call before reading the payload, so two ranks in different
collectives get an error naming both, never a hang or wrong numbers.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from pipesgd_ref.comm.rendezvous import Communicator
from pipesgd_ref.comm.transport import (
    ABORT_LINGER_SECONDS,
    CODE_OF_DTYPE,
    DTYPE_CODES,
    Frame,
    Kind,
    Op,
    as_bytes,
)
from pipesgd_ref.errors import CollectiveMismatch, CommError, PeerAborted
from pipesgd_ref.logs import trace, trace_enabled

SEGMENT_BYTES = 2 << 20  # 2 MiB: amortises a frame and a wake-up, small enough to pipeline


# --- index math, written once (property-tested in tests/test_ring.py) -------------------------


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


def simulate_allreduce(arrays: list[np.ndarray], op: str = "sum") -> list[np.ndarray]:
    """The ring schedule by hand, in one process: p copies, the same chunks, steps and order of
    additions as `allreduce`, so its results are bitwise what the real ring produces."""
    p = len(arrays)
    bufs = [np.array(a, copy=True) for a in arrays]
    bounds = chunk_bounds(bufs[0].size, p)
    for step in range(p - 1):  # reduce-scatter: all ranks send at once, then all receive
        sent = [bufs[r][slice(*bounds[reduce_scatter_chunks(r, step, p)[0]])].copy()
                for r in range(p)]  # fmt: skip
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


# --- the collectives -------------------------------------------------------------------------


def allreduce(
    comm: Communicator,
    array: np.ndarray,
    op: str = "sum",
    out: np.ndarray | None = None,
    segment_bytes: int = SEGMENT_BYTES,
    codec=None,
) -> np.ndarray:
    """Sum (or mean) `array` across all ranks: in place, or into `out` when given (then
    `array` is left as it was). Returns the reduced array.

    `array` must be a contiguous 1-D float32 or float64 array of the same length and dtype on
    every rank (checked). Any length works, 0 and fewer than p included. With a `codec`
    (pipesgd_ref.codecs) other than "none", every hop is compressed: see comm/compressed.py.
    """
    if op not in ("sum", "mean"):
        raise ValueError(f"allreduce op must be 'sum' or 'mean', got {op!r}")
    _check_array(array, (np.float32, np.float64))
    if out is not None:
        _check_array(out, (array.dtype,))
        if out.shape != array.shape:
            raise ValueError(f"out has shape {out.shape}, array {array.shape}")
        np.copyto(out, array)
        array = out
    code = Op.ALLREDUCE_SUM if op == "sum" else Op.ALLREDUCE_MEAN
    if codec is not None and codec.name != "none":
        from pipesgd_ref.comm.compressed import compressed_ring_reduce

        _aborting_on_error(comm, compressed_ring_reduce, comm, array, code, codec, segment_bytes)
    else:
        _aborting_on_error(comm, _ring_reduce, comm, array, code, segment_bytes)
    return array


def barrier(comm: Communicator) -> None:
    """Return only when every rank has called barrier: an allreduce of nothing (after the
    reduce-scatter every rank has heard, through the ring, from every other)."""
    empty = np.empty(0, np.float32)
    _aborting_on_error(comm, _ring_reduce, comm, empty, Op.BARRIER, SEGMENT_BYTES)


def broadcast(
    comm: Communicator, array: np.ndarray, root: int = 0, segment_bytes: int = SEGMENT_BYTES
) -> np.ndarray:
    """Copy root's `array` into every rank's `array`, in place, along the ring (pipelined by
    segments: time ~ (p-1) * alpha + M / B for large M)."""
    p = comm.world_size
    if not 0 <= root < p:
        raise ValueError(f"broadcast root {root} is outside 0..{p - 1}")
    _check_array(array, tuple(DTYPE_CODES.values()))
    _aborting_on_error(comm, _ring_broadcast, comm, array, root, segment_bytes)
    return array


def _aborting_on_error(comm: Communicator, fn, *args) -> None:
    """Run a collective; on a communication failure tell both neighbours before raising (the
    cause, once a neighbour's close is told apart from the failure it passed on)."""
    try:
        fn(*args)
    except CommError as e:
        cause = comm.explain(e)
        if comm.abort(cause):
            # Keep our sockets open a moment: the news goes round the ring in milliseconds,
            # while closing now would make a neighbour see a reset instead of the reason.
            time.sleep(ABORT_LINGER_SECONDS)
        if cause is e:
            raise
        raise cause from None


def _ring_broadcast(comm: Communicator, array: np.ndarray, root: int, segment_bytes: int):
    p, rank = comm.world_size, comm.rank
    seq = comm.next_seq()
    if p == 1:
        return
    flat = array.reshape(-1)
    per = max(1, segment_bytes // flat.itemsize)
    header = Frame(kind=Kind.DATA, op=Op.BROADCAST, dtype=CODE_OF_DTYPE[flat.dtype], seq=seq,
                   src=rank, total_len=flat.size)  # fmt: skip
    forward = (rank + 1) % p != root  # the last rank before the root keeps what it gets
    sender = comm.right.start_sender() if (rank == root or forward) else None
    doing = f"broadcast #{seq} from rank {root}"
    for part, (a, b) in enumerate(segments(0, flat.size, per)):
        piece = flat[a:b]
        if rank != root:
            _recv_checked(comm, header, 0, part, piece, doing, sender)
        if sender is not None:
            sender.put(_at(header, 0, part), as_bytes(piece), doing)
    if sender is not None:
        sender.flush(comm.timeout)


def _check_array(array: np.ndarray, dtypes: tuple) -> None:
    if not isinstance(array, np.ndarray) or array.ndim != 1 or not array.flags.c_contiguous:
        raise ValueError("collectives take a contiguous 1-D numpy array (the flat buffer)")
    if array.dtype not in [np.dtype(d) for d in dtypes]:
        names = ", ".join(str(np.dtype(d)) for d in dtypes)
        raise ValueError(f"dtype {array.dtype} is not supported here; use one of: {names}")


def _at(header: Frame, step: int, part: int) -> Frame:
    return dataclasses.replace(header, step=step, part=part)


def _recv_checked(comm, want: Frame, step: int, part: int, out: np.ndarray, doing, sender):
    """Receive the next frame from the left into `out`, after checking it belongs here."""

    def stop() -> None:  # each idle slice of the wait: raise if this rank should stop waiting
        if sender is not None:
            sender.heartbeat()  # raises the sending thread's error, if it had one
        comm.check_news(doing)  # news of a failure may come from the right, too

    got = comm.left.recv_header(doing, stop)
    while got.kind == Kind.HEARTBEAT:  # the left neighbour is alive and waiting: keep waiting
        got = comm.left.recv_header(doing, stop)
    if got.kind == Kind.ABORT:  # a rank upstream failed: pass its story on
        origin, reason = comm.left.read_abort(got, doing)
        raise PeerAborted(
            f"rank {comm.rank}: rank {origin} failed, so {doing} cannot finish "
            f"(news from rank {comm.left.peer}): {reason}",
            origin=origin,
        )
    if (got.kind, got.seq, got.op, got.dtype, got.total_len) != (
        want.kind, want.seq, want.op, want.dtype, want.total_len,
    ) or (got.step, got.part) != (step, part):  # fmt: skip
        raise CollectiveMismatch(
            f"rank {comm.rank}: rank {comm.left.peer} sent a frame of {got.describe()} "
            f"(step {got.step}, segment {got.part}) while this rank is in {want.describe()} "
            f"(step {step}, segment {part}): every rank must call the same collectives in the "
            f"same order, with the same dtype and length",
            origin=comm.left.peer,
        )
    comm.left.recv_payload_into(got, as_bytes(out), doing, stop)


def _ring_reduce(comm: Communicator, array: np.ndarray, op: Op, segment_bytes: int) -> None:
    p, rank = comm.world_size, comm.rank
    seq = comm.next_seq()
    if p == 1:
        return  # the sum of one array is itself; the mean divides by 1
    flat = array
    bounds = chunk_bounds(flat.size, p)
    per = max(1, segment_bytes // flat.itemsize)
    # One segment: each is received here, added into place and forwarded from there, so the
    # next one can reuse it (and it stays in cache). At most O(M/p).
    scratch = comm.scratch(min(per, max(b - a for a, b in bounds)), flat.dtype)
    header = Frame(kind=Kind.DATA, op=op, dtype=CODE_OF_DTYPE[flat.dtype], seq=seq, src=rank,
                   total_len=flat.size)  # fmt: skip
    sender = comm.right.start_sender()
    name = {Op.ALLREDUCE_SUM: "allreduce", Op.ALLREDUCE_MEAN: "allreduce",
            Op.BARRIER: "barrier"}[op]  # fmt: skip
    tracing = trace_enabled()

    def forward(step: int, chunk: int, part: int, s: int, e: int) -> None:
        """Queue segment [s, e) of `chunk` as frame (step, part) to the right neighbour."""
        phase = "reduce-scatter" if step < p - 1 else "all-gather"
        sender.put(_at(header, step, part), as_bytes(flat[s:e]), f"{name} #{seq} {phase}")
        if tracing and part == 0:  # one line per chunk and step (PIPESGD_TRACE=1)
            a, b = bounds[chunk]
            trace("%s #%d step %d (%s) | rank %d -> %d | chunk %d | %d bytes", name, seq, step,
                  phase, rank, comm.right.peer, chunk, (b - a) * flat.itemsize)  # fmt: skip

    # Reduce-scatter. Step 0's chunk is ready now; every later chunk is sent segment by
    # segment as soon as it has been reduced (see the module docstring). Frame steps number
    # the whole schedule: reduce-scatter 0 .. p-2, all-gather p-1 .. 2p-3.
    first = reduce_scatter_chunks(rank, 0, p)[0]
    for part, (s, e) in enumerate(segments(*bounds[first], per)):
        forward(0, first, part, s, e)
    for step in range(p - 1):
        _, chunk = reduce_scatter_chunks(rank, step, p)
        doing = f"{name} #{seq} step {step} (reduce-scatter)"
        last = step == p - 2  # after this step, `chunk` is complete on this rank
        for part, (s, e) in enumerate(segments(*bounds[chunk], per)):
            tmp = scratch[: e - s]
            _recv_checked(comm, header, step, part, tmp, doing, sender)
            dst = flat[s:e]
            np.add(tmp, dst, out=dst)  # fixed order: the running sum arrives, our term joins
            if last and op == Op.ALLREDUCE_MEAN:
                dst /= dst.dtype.type(p)  # the owner scales once; everyone copies its bytes
            forward(step + 1, chunk, part, s, e)  # at once: the next hop needs it now
    # All-gather: receive each complete chunk straight into place, forward it unless the
    # right neighbour already has it.
    for step in range(p - 1, 2 * p - 2):
        _, chunk = all_gather_chunks(rank, step - (p - 1), p)
        doing = f"{name} #{seq} step {step} (all-gather)"
        for part, (s, e) in enumerate(segments(*bounds[chunk], per)):
            _recv_checked(comm, header, step, part, flat[s:e], doing, sender)
            if step < 2 * p - 3:
                forward(step + 1, chunk, part, s, e)
    sender.flush(comm.timeout)
