"""Ring AllReduce, all-gather, broadcast and barrier over a Communicator's ring links.

The schedule (comm/schedule.py): the flat array cut into p chunks; p-1 reduce-scatter steps,
after which each rank holds the complete sum of one chunk, then p-1 all-gather steps that copy
each complete chunk round the ring.

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
collectives get an error naming both, never a hang or wrong numbers (comm/frames.py).
"""

from __future__ import annotations

import numpy as np

from pipesgd_ref.comm.compressed import CompressedRingReduce
from pipesgd_ref.comm.frames import aborting_on_error, frame_at, recv_checked
from pipesgd_ref.comm.rendezvous import Communicator
from pipesgd_ref.comm.schedule import SEGMENT_BYTES, RingReduce, segments
from pipesgd_ref.comm.transport import CODE_OF_DTYPE, DTYPE_CODES, Frame, Kind, Op, as_bytes

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
        ring = CompressedRingReduce(comm, array, code, segment_bytes, codec)
    else:
        ring = RingReduce(comm, array, code, segment_bytes)
    aborting_on_error(comm, ring.run)
    return array


def barrier(comm: Communicator) -> None:
    """Return only when every rank has called barrier: an allreduce of nothing (after the
    reduce-scatter every rank has heard, through the ring, from every other)."""
    empty = np.empty(0, np.float32)
    aborting_on_error(comm, RingReduce(comm, empty, Op.BARRIER, SEGMENT_BYTES).run)


def broadcast(
    comm: Communicator, array: np.ndarray, root: int = 0, segment_bytes: int = SEGMENT_BYTES
) -> np.ndarray:
    """Copy root's `array` into every rank's `array`, in place, along the ring (pipelined by
    segments: time ~ (p-1) * alpha + M / B for large M)."""
    p = comm.world_size
    if not 0 <= root < p:
        raise ValueError(f"broadcast root {root} is outside 0..{p - 1}")
    _check_array(array, tuple(DTYPE_CODES.values()))
    aborting_on_error(comm, _ring_broadcast, comm, array, root, segment_bytes)
    return array


def allgather(comm: Communicator, mine: np.ndarray) -> list[np.ndarray]:
    """Every rank's 1-D float64 array (any length, possibly 0), on every rank, without
    pickle: two ring AllReduces of zero-padded arrays. First the lengths (rank r writes its
    length at index r, the others zeros), then the arrays laid end to end, each rank writing
    only its own slice. x + 0 = x exactly in floating point (infinities too), so each sum is
    the concatenation, bit for bit, whatever order the ring adds in."""
    p, r = comm.world_size, comm.rank
    lengths = np.zeros(p)
    lengths[r] = mine.size
    allreduce(comm, lengths)
    bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    flat = np.zeros(int(bounds[-1]))
    flat[bounds[r] : bounds[r + 1]] = mine
    allreduce(comm, flat)
    return [flat[bounds[i] : bounds[i + 1]] for i in range(p)]


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
            recv_checked(comm, header, 0, part, piece, doing, sender)
        if sender is not None:
            sender.put(frame_at(header, 0, part), as_bytes(piece), doing)
    if sender is not None:
        sender.flush(comm.timeout)


def _check_array(array: np.ndarray, dtypes: tuple) -> None:
    if not isinstance(array, np.ndarray) or array.ndim != 1 or not array.flags.c_contiguous:
        raise ValueError("collectives take a contiguous 1-D numpy array (the flat buffer)")
    if array.dtype not in [np.dtype(d) for d in dtypes]:
        names = ", ".join(str(np.dtype(d)) for d in dtypes)
        raise ValueError(f"dtype {array.dtype} is not supported here; use one of: {names}")
