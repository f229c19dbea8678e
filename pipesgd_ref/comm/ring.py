"""Ring AllReduce: the loop one rank runs over its two ring links, and the collectives on it.

p ranks in a ring, each holding a flat array of M bytes. The array is cut into p chunks (the
index math: comm/schedule.py); each rank sends to its right neighbour and receives from its
left one:

    reduce-scatter, p-1 steps: at step s rank r sends chunk (r - s) mod p and receives chunk
        (r - s - 1) mod p, adding it into its own copy; after p-1 steps rank r holds the
        complete sum of chunk (r + 1) mod p
    all-gather, p-1 steps: each complete chunk is copied once round the ring, overwriting

`RingReduce` below is that loop, for one rank, over its links.

Cost per rank, in the alpha-beta model (alpha the latency of a message, B the bandwidth of a
link, gamma the time of one addition per byte):

    steps             2(p-1)
    bytes sent        2(p-1)/p * M each way: independent of p (bandwidth-optimal)
    additions         (p-1)/p * M bytes
    time              T_ring = 2(p-1) * (alpha + M/(pB)) + (p-1)/p * M * gamma

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

Variants beside this file: the compressed ring (compressed_ring.py: codes on the wire), the
device ring (device_ring.py: a GPU array, staged through pinned host buffers), and the
shared-memory hop (shm_hop.py: a reduce-scatter hop added straight into the right neighbour's
slot, when both links are shared memory). `ring_reducer` picks the one a call runs.

This file is the ring alone. The job's AllReduce, which may run another algorithm (recursive
doubling, Rabenseifner, one host's shared-memory group) chosen per message, is
comm/collectives.py's `allreduce`; `ring_allreduce` here always runs the ring.
"""

from __future__ import annotations

import numpy as np

from pipesgd_ref.comm.activity import doing
from pipesgd_ref.comm.communicator import Communicator
from pipesgd_ref.comm.compressed_ring import CompressedHops
from pipesgd_ref.comm.frames import aborting_on_error, frame_at, recv_checked
from pipesgd_ref.comm.schedule import (
    SEGMENT_BYTES,
    all_gather_chunks,
    chunk_bounds,
    reduce_scatter_chunks,
    segments,
)
from pipesgd_ref.comm.shm_hop import SlotHops
from pipesgd_ref.comm.wire import CODE_OF_DTYPE, DTYPE_CODES, Frame, Kind, Op, as_bytes
from pipesgd_ref.logs import trace, trace_enabled

# --- one rank's loop over its links ---------------------------------------------------------


class RingReduce:
    """One rank's part of a ring reduce (sum, mean or barrier) of `flat`, over comm's links.

    `run()` walks the schedule above: it sends its own first chunk, then at every reduce-scatter
    step receives each segment of the chunk due, folds it into its own copy and forwards it at
    once; at every all-gather step receives each complete segment, puts it into place and
    forwards it unless the right neighbour already has it. Every frame carries its (step,
    segment) and is checked on arrival (frames.recv_checked); sending runs on the link's
    sending thread, receiving on this one. One object per call: `run()` once.

    A variant says what a segment is between the wire and `flat`, by overriding:

        prepare(largest, per)        allocate its buffers (largest chunk, elements a segment)
        outgoing(s, e)               step 0: the buffer that carries our own [s, e)
        inbox(s, e, gathering)       where the frame of segment [s, e) is received
        reduce(got, s, e, last)      fold the partial sum `got` into [s, e) (and, `last`, the
                                     owner's final touch: the mean); return what to forward
        hop(step, chunk, part, s, e, last)   one whole reduce-scatter hop: receive, reduce,
                                     forward (the shared-memory hop replaces it: shm_hop.py)
        place(got, s, e)             all-gather: put the complete `got` into [s, e); return
                                     what to forward
        wire_dtype                   the dtype of the frames' payload

    The defaults are the host ring's: frames of flat's own dtype, received into a reused
    scratch segment (reduce-scatter) or straight into place (all-gather), np.add in a fixed
    order (the running sum arrives, our term joins), the mean divided once by the owner.
    """

    where = ""  # where the reduction runs, when not the host: named in errors and traces

    def __init__(self, comm, flat, op: Op, segment_bytes: int, name: str | None = None):
        self.comm, self.flat, self.op = comm, flat, op
        self.dtype = np.dtype(flat.dtype)
        self.per = max(1, segment_bytes // self.dtype.itemsize)  # elements per segment
        if name is None:
            name = "barrier" if op == Op.BARRIER else "allreduce"
        self.name = name
        self.queued = 0  # frames handed to the sending thread so far in this call
        self.sent = 0  # payload bytes handed to the right neighbour so far in this call

    # --- the per-variant parts (defaults: the host ring) ---

    @property
    def wire_dtype(self) -> np.dtype:
        return self.dtype

    def prepare(self, largest: int, per: int) -> None:
        # One segment: each is received here, added into place and forwarded from there, so
        # the next one can reuse it (and it stays in cache). At most O(M/p).
        self.scratch = self.comm.scratch(min(per, largest), self.dtype)

    def outgoing(self, s: int, e: int):
        return self.flat[s:e]

    def inbox(self, s: int, e: int, gathering: bool):
        return self.flat[s:e] if gathering else self.scratch[: e - s]

    def reduce(self, got, s: int, e: int, last: bool):
        dst = self.flat[s:e]
        np.add(got, dst, out=dst)  # fixed order: the running sum arrives, our term joins
        if last and self.op == Op.ALLREDUCE_MEAN:
            dst /= dst.dtype.type(self.comm.world_size)  # the owner scales once
        return dst

    def place(self, got, s: int, e: int):
        return got  # received straight into place

    def chunk_bytes(self, n: int) -> int:
        """Bytes of a chunk of n elements on the wire (for the trace)."""
        return n * self.dtype.itemsize

    # --- the schedule, the same for every variant ---

    def phase(self, step: int) -> str:
        """The phase of frame step `step` ("reduce-scatter" or "all-gather")."""
        return "reduce-scatter" if step < self.comm.world_size - 1 else "all-gather"

    def describe(self, step: int) -> str:
        """What this rank is doing at `step`, for errors and traces."""
        where = f", {self.where}" if self.where else ""
        return f"{self.name} #{self.seq} step {step} ({self.phase(step)}{where})"

    def send(self, step: int, chunk: int, part: int, payload) -> None:
        """Queue `payload` (segment `part` of `chunk`) as frame (step, part) to the right."""
        with doing(self.sending_as[self.phase(step)]):  # the sending side's name (run())
            self.sender.put(frame_at(self.header, step, part), as_bytes(payload))
        self.queued += 1
        self.sent += payload.nbytes
        self.trace(step, chunk, part)

    def trace(self, step: int, chunk: int, part: int) -> None:
        if self.tracing and part == 0:  # one line per chunk and step (PIPESGD_TRACE=1)
            a, b = self.bounds[chunk]
            trace(
                "%s | rank %d -> %d | chunk %d | %d bytes",
                self.describe(step),
                self.comm.rank,
                self.comm.right.peer,
                chunk,
                self.chunk_bytes(b - a),
            )

    def run(self) -> None:
        """This rank's part of the collective: the reduce-scatter, then the all-gather."""
        comm = self.comm
        self.seq = comm.next_seq()  # every rank numbers every collective, even alone
        if comm.world_size == 1:
            return  # the sum of one array is itself; the mean divides by 1
        self.bounds = chunk_bounds(self.flat.size, comm.world_size)
        self.prepare(max(b - a for a, b in self.bounds), self.per)
        self.header = Frame(
            kind=Kind.DATA,
            op=self.op,
            seq=self.seq,
            src=comm.rank,
            dtype=CODE_OF_DTYPE[np.dtype(self.wire_dtype)],
            total_len=self.flat.size,
        )
        self.sender = comm.right.start_sender()
        self.tracing = trace_enabled()
        # What a send is named (comm/activity.py), per phase: made once here, not per frame.
        where = f" ({self.where})" if self.where else ""
        self.sending_as = {
            phase: f"{self.name} #{self.seq} {phase}{where}"
            for phase in ("reduce-scatter", "all-gather")
        }
        self.reduce_scatter()
        self.all_gather()
        self.sender.flush(comm.timeout)

    def segments_of(self, chunk: int) -> list[tuple[int, int]]:
        """[s, e) of each segment of `chunk`: what travels as one frame."""
        return segments(*self.bounds[chunk], self.per)

    def reduce_scatter(self) -> None:
        """Steps 0 .. p-2. Step 0's chunk is ready now; every later chunk is sent segment by
        segment as soon as it has been reduced: after step p-2 this rank holds the complete
        sum of one chunk."""
        p, rank = self.comm.world_size, self.comm.rank
        first = reduce_scatter_chunks(rank, 0, p)[0]
        for part, (s, e) in enumerate(self.segments_of(first)):
            self.send(0, first, part, self.outgoing(s, e))
        for step in range(p - 1):
            _, chunk = reduce_scatter_chunks(rank, step, p)
            last = step == p - 2  # after this step, `chunk` is complete on this rank
            with doing(self.describe(step)):
                for part, (s, e) in enumerate(self.segments_of(chunk)):
                    self.hop(step, chunk, part, s, e, last)

    def hop(self, step: int, chunk: int, part: int, s: int, e: int, last: bool) -> None:
        """One reduce-scatter hop of segment `part` ([s, e) of `chunk`): receive the running
        sum from the left, fold our term in, and forward it to the right at once."""
        got = self.inbox(s, e, gathering=False)
        recv_checked(self.comm, self.header, step, part, got, self.sender)
        self.send(step + 1, chunk, part, self.reduce(got, s, e, last))

    def all_gather(self) -> None:
        """Steps p-1 .. 2p-3: each complete chunk goes into place and on, unless the right
        neighbour already has it."""
        p, rank = self.comm.world_size, self.comm.rank
        for step in range(p - 1, 2 * p - 2):
            _, chunk = all_gather_chunks(rank, step - (p - 1), p)
            with doing(self.describe(step)):
                for part, (s, e) in enumerate(self.segments_of(chunk)):
                    got = self.inbox(s, e, gathering=True)
                    recv_checked(self.comm, self.header, step, part, got, self.sender)
                    ahead = self.place(got, s, e)
                    if step < 2 * p - 3:
                        self.send(step + 1, chunk, part, ahead)


class CompressedRingReduce(CompressedHops, RingReduce):
    """The ring's loop with a codec on every hop: comm/compressed_ring.py says what a segment
    is on the wire (codes) and how a hop reduces it."""


class SlotRingReduce(SlotHops, RingReduce):
    """The ring's loop whose reduce-scatter hops add straight into the right neighbour's
    shared-memory slot (comm/shm_hop.py): both links are shared memory. The same operands in
    the same order as RingReduce's: the same bits."""


def ring_reducer(comm: Communicator, flat: np.ndarray, code: Op, segment_bytes: int, codec=None):
    """The RingReduce a call of the ring runs (`run()` once; its `sent`: the payload bytes it
    handed to the right neighbour): the compressed ring with a codec other than none, the
    shared-memory hop when both ring links are shared memory, else the host ring."""
    if codec is not None and codec.name != "none":
        return CompressedRingReduce(comm, flat, code, segment_bytes, codec)
    left, right = comm.left, comm.right
    if left is not None and right is not None and left.transport == right.transport == "shm":
        return SlotRingReduce(comm, flat, code, segment_bytes)
    return RingReduce(comm, flat, code, segment_bytes)


# --- the collectives on the ring -------------------------------------------------------------


def checked(array: np.ndarray, op: str, out: np.ndarray | None) -> tuple[np.ndarray, Op]:
    """An AllReduce's arguments, checked (`ring_allreduce` says what they may be): the array to
    reduce in place (`out`, now holding a copy of `array`, when given) and the op's code."""
    if op not in ("sum", "mean"):
        raise ValueError(f"allreduce op must be 'sum' or 'mean', got {op!r}")
    check_array(array, (np.float32, np.float64))
    if out is not None:
        check_array(out, (array.dtype,))
        if out.shape != array.shape:
            raise ValueError(f"out has shape {out.shape}, array {array.shape}")
        np.copyto(out, array)
        array = out
    return array, Op.ALLREDUCE_SUM if op == "sum" else Op.ALLREDUCE_MEAN


def ring_allreduce(
    comm: Communicator,
    array: np.ndarray,
    op: str = "sum",
    out: np.ndarray | None = None,
    segment_bytes: int = SEGMENT_BYTES,
    codec=None,
) -> np.ndarray:
    """Sum (or mean) `array` across all ranks by the ring, whatever the job's AllReduce
    (comm/collectives.py's `allreduce` runs the one the job asked for): in place, or into
    `out` when given (then `array` is left as it was). Returns the reduced array.

    `array` must be a contiguous 1-D float32 or float64 array of the same length and dtype on
    every rank (checked). Any length works, 0 and fewer than p included. With a `codec`
    (pipesgd_ref.codecs) other than "none", every hop is compressed: see comm/compressed_ring.py.
    """
    array, code = checked(array, op, out)
    aborting_on_error(comm, ring_reducer(comm, array, code, segment_bytes, codec).run)
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
    check_array(array, tuple(DTYPE_CODES.values()))
    aborting_on_error(comm, _ring_broadcast, comm, array, root, segment_bytes)
    return array


def _ring_broadcast(comm: Communicator, array: np.ndarray, root: int, segment_bytes: int):
    p, rank = comm.world_size, comm.rank
    seq = comm.next_seq()
    if p == 1:
        return
    flat = array.reshape(-1)
    per = max(1, segment_bytes // flat.itemsize)
    dtype = CODE_OF_DTYPE[flat.dtype]
    header = Frame(Kind.DATA, Op.BROADCAST, dtype, seq=seq, src=rank, total_len=flat.size)
    forward = (rank + 1) % p != root  # the last rank before the root keeps what it gets
    assert comm.right is not None  # p > 1: every rank has a right neighbour
    sender = comm.right.start_sender() if (rank == root or forward) else None
    with doing(f"broadcast #{seq} from rank {root}"):
        for part, (a, b) in enumerate(segments(0, flat.size, per)):
            piece = flat[a:b]
            if rank != root:
                recv_checked(comm, header, 0, part, piece, sender)
            if sender is not None:
                sender.put(frame_at(header, 0, part), as_bytes(piece))
    if sender is not None:
        sender.flush(comm.timeout)


def check_array(array: np.ndarray, dtypes: tuple) -> None:
    """A collective's array: contiguous, 1-D, of one of `dtypes` (a ValueError otherwise)."""
    if not isinstance(array, np.ndarray) or array.ndim != 1 or not array.flags.c_contiguous:
        raise ValueError("collectives take a contiguous 1-D numpy array (the flat buffer)")
    if array.dtype not in [np.dtype(d) for d in dtypes]:
        names = ", ".join(str(np.dtype(d)) for d in dtypes)
        raise ValueError(f"dtype {array.dtype} is not supported here; use one of: {names}")
