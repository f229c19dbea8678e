"""Recursive doubling and Rabenseifner over real links: the executor of comm/algorithms.py's
schedules, one rank's part, over the mesh links rendezvous made for them (`comm.mesh`).

What it does. `schedule(algo, rank, p, n)` says, step by step, which peer this rank talks to,
which range of its array it sends, which range it receives, and whether it adds the received
elements into its own (received + own, as `simulate` does) or copies them over. Here each
step ("hop") is run over the link to that peer: the send range goes out on the link's sending
thread (comm/sender.py) as frames of at most `segment_bytes`, while this thread receives the
peer's frames. Unlike the ring's, a mesh link is used BOTH ways: both partners of a hop send
and receive on the one connection (over shm each direction has its own region of slots).

Which links. Every rank links to each peer of its rd and of its rab schedule (fold partners
included: `mesh_peers`), one connection per pair, the lower rank connecting. That is
log2(p2) + 1 links per rank at most, made only when the job asks for rd, rab or auto.

Cost (alpha-beta, module doc of comm/algorithms.py): rd takes log2(p) steps of the whole
array, rab 2 log2(p) steps and the ring's 2(p-1)/p M bytes; a non-power-of-two p adds the fold
and the copy back. Within a step the segments are pipelined: the peer's first segment is added
while later ones are still on the wire. Extra memory: one segment of scratch (comm.scratch).

Determinism: every hop adds in `simulate`'s order (np.add(received, own)), and "mean" divides
where the schedule's `finish` says, so every rank ends with the bits of
`algorithms.simulate(algo, arrays, op)`, whatever the timing.

Safety of the buffer: a range is overwritten only after the frames that read it have left.
Within a hop (rd sends and receives the whole array) the received segment waits in scratch
until this rank's own segment over that range is sent; across hops the schedule orders it: the
data that overwrites a range can only have been computed after its peer received ours.

Failure: every frame carries the collective's header (seq, op, dtype, total length, step =
hop index, part = segment index) and is checked on arrival (comm/frames.py): another collective
is a CollectiveMismatch naming both ranks, ABORT news a PeerAborted naming the rank where it
began. While it waits, a rank sends heartbeats to all its mesh peers (only the rank next to a
silent one times out; the links' timeouts bound every wait) and watches the ring's right link
for news. A rank that cannot finish tells every mesh peer and both ring neighbours why before
it raises (frames.aborting_on_error, Communicator.abort): each rank waiting on it hears the
story and passes it on, so the whole job stops with one cause.

A mesh rank also waits on its own sending thread (a hop's range is overwritten only once
sent); who is blamed when that wait times out is the sender's rule (comm/sender.py).
"""

from __future__ import annotations

import numpy as np

from pipesgd_ref.comm.activity import doing
from pipesgd_ref.comm.algorithms import ALGORITHMS, Hop, schedule
from pipesgd_ref.comm.frames import aborting_on_error, frame_at, recv_checked
from pipesgd_ref.comm.schedule import SEGMENT_BYTES, segments
from pipesgd_ref.comm.wire import CODE_OF_DTYPE, Frame, Kind, Op, as_bytes

# The jobs (JobSpec.allreduce) whose ranks make mesh links.
JOBS_WITH_MESH = ("auto", "rd", "rab")


def mesh_peers(rank: int, p: int) -> set[int]:
    """Every rank that `rank` exchanges with in rd or rab on p ranks: its mesh links. The
    relation is symmetric (each hop has its mirror), so both ends compute the same pairs."""
    if p < 2:
        return set()
    plans = (schedule(algo, rank, p, p) for algo in ALGORITHMS)  # peers do not depend on n
    return {hop.peer for plan in plans for hop in plan if hop is not None}


def reduce_by_schedule(
    comm, flat: np.ndarray, code: Op, algo: str, segment_bytes: int = SEGMENT_BYTES
) -> int:
    """Reduce `flat` (contiguous 1-D float32/float64, the same length and dtype on every rank)
    in place across all ranks by `algo` ("rd" or "rab"), over comm.mesh; `code` is
    Op.ALLREDUCE_SUM or Op.ALLREDUCE_MEAN. Returns the payload bytes this rank sent (its
    schedule's send ranges, to every peer). Takes one sequence number, as every collective
    does (p == 1: only that). ValueError when the job has no mesh links for `algo`; on a
    communication failure every peer is told before the CommError is raised."""
    if algo not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algo!r}; choose from {', '.join(ALGORITHMS)}")
    plan = schedule(algo, comm.rank, comm.world_size, flat.size)
    missing = sorted({hop.peer for hop in plan if hop is not None} - set(comm.mesh))
    if missing:
        raise ValueError(
            f"rank {comm.rank}: allreduce {algo!r} needs links to rank(s) "
            f"{', '.join(map(str, missing))}, which this job did not make; start the job "
            f"with allreduce rd, rab or auto (JobSpec.allreduce, --allreduce)"
        )
    seq = comm.next_seq()  # every rank numbers every collective, even alone
    if not plan:
        return 0  # p == 1: the sum of one array is itself; the mean divides by 1
    hops = _Hops(comm, flat, code, algo, seq, segment_bytes, plan)
    aborting_on_error(comm, hops.run)
    return hops.sent


class _Hops:
    """One call's state: the header every frame carries, the senders of the links the plan
    uses, the scratch segment. `run()` once."""

    def __init__(self, comm, flat, code: Op, algo: str, seq: int, segment_bytes: int, plan):
        self.comm, self.flat, self.code, self.algo, self.seq = comm, flat, code, algo, seq
        self.plan: list[Hop | None] = plan
        self.per = max(1, segment_bytes // flat.itemsize)  # elements per segment
        self.header = Frame(
            kind=Kind.DATA,
            op=code,
            seq=seq,
            src=comm.rank,
            dtype=CODE_OF_DTYPE[np.dtype(flat.dtype)],
            total_len=flat.size,
        )
        peers = sorted({hop.peer for hop in plan if hop is not None})
        self.senders = {q: comm.mesh[q].start_sender() for q in peers}
        self.scratch = comm.scratch(min(self.per, flat.size), flat.dtype)
        self.sent = 0  # payload bytes handed to the peers' links so far

    def run(self) -> None:
        for step, hop in enumerate(self.plan):
            if hop is None:
                continue  # folded away at this step, or idle while the others fold
            with doing(f"allreduce #{self.seq} step {step} ({self.algo}, rank {hop.peer})"):
                self.exchange(step, hop)
        for sender in self.senders.values():  # the caller may reuse `flat` once we return
            self.drain(sender, 0)

    def drain(self, sender, at_most: int) -> None:
        """Wait until at most `at_most` frames are queued on `sender`; a timeout names the rank
        that holds the frame up (comm/sender.py, `own_stall`)."""
        sender.wait_pending(at_most, self.comm.timeout)

    def waiting(self) -> None:
        """Each idle slice of a wait: tell every mesh peer this rank is alive (heartbeats; a
        sending thread's own error is raised here), and look for news on the ring's right link
        (it carries nothing else towards this rank). Mesh links are not looked at: the next
        frame on one may be data for a later step."""
        for sender in self.senders.values():
            sender.heartbeat()
        self.comm.check_news()

    def exchange(self, step: int, hop: Hop) -> None:
        """One hop: queue the send range, receive the recv range segment by segment (added or
        copied in place), then the mean's division where the schedule completes a range."""
        link, sender = self.comm.mesh[hop.peer], self.senders[hop.peer]

        def recv(part: int, out: np.ndarray) -> None:  # checked: frame (step, part) of ours
            recv_checked(self.comm, self.header, step, part, out, sender, link, self.waiting)

        outs = segments(*hop.send, self.per) if hop.send is not None else []
        for part, (s, e) in enumerate(outs):
            sender.put(frame_at(self.header, step, part), as_bytes(self.flat[s:e]))
            self.sent += (e - s) * self.flat.itemsize
        if hop.recv is not None:
            for part, (s, e) in enumerate(segments(*hop.recv, self.per)):
                busy = _last_overlap(hop.send, outs, self.per, s, e)
                dst = self.flat[s:e]
                if busy is None and not hop.add:  # copied straight into place
                    recv(part, dst)
                    continue
                got = self.scratch[: e - s]
                recv(part, got)
                if busy is not None:  # our own frame over [s, e) must have left first
                    self.drain(sender, len(outs) - 1 - busy)
                if hop.add:
                    np.add(got, dst, out=dst)  # simulate's order: received + own
                else:
                    dst[...] = got
        if hop.finish is not None and self.code == Op.ALLREDUCE_MEAN:
            done = self.flat[slice(*hop.finish)]
            done /= done.dtype.type(self.comm.world_size)


def _last_overlap(send, outs, per: int, s: int, e: int) -> int | None:
    """The index of the last of this hop's send segments `outs` (of range `send`, `per`
    elements each) that reads any of [s, e); None when none does."""
    if send is None or e <= s or e <= send[0] or send[1] <= s:
        return None
    return min((e - 1 - send[0]) // per, len(outs) - 1)
