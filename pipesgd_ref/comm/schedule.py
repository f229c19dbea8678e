"""The ring's schedule, written once: which chunk a rank sends and receives at each step, the
loop one rank runs over its links, and the same schedule simulated in one process.

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
    all_gather_chunks, segments              (tests/test_ring.py) and used by every ring
    RingReduce                               the reduce-scatter + all-gather loop of one rank
                                             over its links; the host ring (comm/ring.py), the
                                             compressed ring (comm/compressed.py) and the
                                             device ring (comm/device_ring.py) say only what
                                             a segment is on the wire and how it is reduced
    simulate_allreduce,                      the schedule by hand in one process, p copies in
    simulate_compressed_allreduce            lock step: the oracles of the real rings (bitwise)
"""

from __future__ import annotations

import numpy as np

from pipesgd_ref.comm.frames import checked_header, frame_at, recv_checked, waiting_check
from pipesgd_ref.comm.transport import CODE_OF_DTYPE, Frame, Kind, Op, as_bytes
from pipesgd_ref.logs import trace, trace_enabled

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


# --- one rank's loop over its links ----------------------------------------------------------


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

    def doing(self, step: int) -> str:
        """What this rank is doing at `step`, for errors and traces."""
        where = f", {self.where}" if self.where else ""
        return f"{self.name} #{self.seq} step {step} ({self.phase(step)}{where})"

    def send(self, step: int, chunk: int, part: int, payload) -> None:
        """Queue `payload` (segment `part` of `chunk`) as frame (step, part) to the right."""
        where = f" ({self.where})" if self.where else ""
        self.sender.put(frame_at(self.header, step, part), as_bytes(payload),
                        f"{self.name} #{self.seq} {self.phase(step)}{where}")  # fmt: skip
        self.queued += 1
        self.trace(step, chunk, part)

    def trace(self, step: int, chunk: int, part: int) -> None:
        if self.tracing and part == 0:  # one line per chunk and step (PIPESGD_TRACE=1)
            a, b = self.bounds[chunk]
            trace("%s | rank %d -> %d | chunk %d | %d bytes", self.doing(step), self.comm.rank,
                  self.comm.right.peer, chunk, self.chunk_bytes(b - a))  # fmt: skip

    def in_slots(self) -> bool:
        """Whether reduce-scatter hops go through shared-memory slots (comm/shm.py) both ways,
        with the host ring's own reduction (a variant's hooks take the usual path)."""
        comm, cls = self.comm, type(self)
        return (comm.left.transport == "shm" and comm.right.transport == "shm"
                and cls.reduce is RingReduce.reduce and cls.inbox is RingReduce.inbox)  # fmt: skip

    def hop_in_slots(self, step: int, chunk: int, part: int, s: int, e: int, last: bool) -> None:
        """A reduce-scatter hop over shared memory: the left neighbour's partial sum is added
        where it lies, in its slot (no copy into a scratch segment), and, unless this rank owns
        the chunk, straight into the right neighbour's next slot: one pass over the bytes,
        where a socket costs a copy in, the add, and a copy out. The same operands in the same
        order as `reduce`, so the same bits; this rank's own copy of [s, e) keeps its gradient
        (the all-gather overwrites it). When no slot is free now, the sum goes into place and
        is sent as usual."""
        comm, doing = self.comm, self.doing(step)
        frame = checked_header(comm, self.header, step, part, doing, self.sender)
        mine = self.flat[s:e]
        if not comm.left.slotted(frame):  # empty, or a segment larger than a slot
            got = self.inbox(s, e, gathering=False)
            comm.left.recv_payload_into(frame, as_bytes(got), doing,
                                        waiting_check(comm, self.sender, doing))  # fmt: skip
            self.send(step + 1, chunk, part, self.reduce(got, s, e, last))
            return
        got = comm.left.payload_view(frame, mine.nbytes, doing).view(self.dtype)
        slot = None if last else comm.right.claim(mine.nbytes)
        if slot is not None:
            np.add(got, mine, out=slot.view(self.dtype))  # as reduce: the running sum, ours
            comm.left.release()
            comm.right.send_claimed(frame_at(self.header, step + 1, part), doing)
            self.trace(step + 1, chunk, part)
            return
        np.add(got, mine, out=mine)
        comm.left.release()
        if last and self.op == Op.ALLREDUCE_MEAN:
            mine /= mine.dtype.type(comm.world_size)  # the owner scales once
        self.send(step + 1, chunk, part, mine)

    def run(self) -> None:
        comm = self.comm
        p, rank = comm.world_size, comm.rank
        self.seq = seq = comm.next_seq()  # every rank numbers every collective, even alone
        if p == 1:
            return  # the sum of one array is itself; the mean divides by 1
        per = self.per
        self.bounds = bounds = chunk_bounds(self.flat.size, p)
        self.prepare(max(b - a for a, b in bounds), per)
        self.header = header = Frame(kind=Kind.DATA, op=self.op, seq=seq, src=rank,
                                     dtype=CODE_OF_DTYPE[np.dtype(self.wire_dtype)],
                                     total_len=self.flat.size)  # fmt: skip
        self.sender = sender = comm.right.start_sender()
        self.tracing = trace_enabled()
        # Reduce-scatter. Step 0's chunk is ready now; every later chunk is sent segment by
        # segment as soon as it has been reduced.
        first = reduce_scatter_chunks(rank, 0, p)[0]
        for part, (s, e) in enumerate(segments(*bounds[first], per)):
            self.send(0, first, part, self.outgoing(s, e))
        slots = self.in_slots()
        for step in range(p - 1):
            _, chunk = reduce_scatter_chunks(rank, step, p)
            doing = self.doing(step)
            last = step == p - 2  # after this step, `chunk` is complete on this rank
            for part, (s, e) in enumerate(segments(*bounds[chunk], per)):
                if slots:
                    self.hop_in_slots(step, chunk, part, s, e, last)
                    continue
                got = self.inbox(s, e, gathering=False)
                recv_checked(comm, header, step, part, got, doing, sender)
                self.send(step + 1, chunk, part, self.reduce(got, s, e, last))  # at once
        # All-gather: each complete chunk goes into place and on, unless the right neighbour
        # already has it.
        for step in range(p - 1, 2 * p - 2):
            _, chunk = all_gather_chunks(rank, step - (p - 1), p)
            doing = self.doing(step)
            for part, (s, e) in enumerate(segments(*bounds[chunk], per)):
                got = self.inbox(s, e, gathering=True)
                recv_checked(comm, header, step, part, got, doing, sender)
                ahead = self.place(got, s, e)
                if step < 2 * p - 3:
                    self.send(step + 1, chunk, part, ahead)
        sender.flush(comm.timeout)


# --- the same schedules in one process -------------------------------------------------------


def simulate_allreduce(arrays: list[np.ndarray], op: str = "sum") -> list[np.ndarray]:
    """The ring schedule by hand, in one process: p copies, the same chunks, steps and order of
    additions as `ring.allreduce`, so its results are bitwise what the real ring produces."""
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


def simulate_compressed_allreduce(
    arrays: list[np.ndarray], codec, op: str = "sum", segment_bytes: int = SEGMENT_BYTES
) -> list[np.ndarray]:
    """The compressed ring by hand, in one process: the same segments, codes and order of
    operations as the compressed ring (comm/compressed.py), so the results are bitwise the real
    ones."""
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
