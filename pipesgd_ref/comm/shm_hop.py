"""The ring's reduce-scatter hop over shared memory: add where the bytes lie.

On a socket a hop costs three passes over a segment: the kernel copies it into a scratch
buffer, the rank adds its own chunk into place, and the sum is copied out to the right
neighbour. Between two ranks of one host whose links are both shared memory (comm/shm.py),
the left neighbour's partial sum already lies in a slot this rank maps, and the right
neighbour's next slot is memory this rank may write: so the hop is one pass,

    right neighbour's slot  <-  left neighbour's slot + this rank's own chunk

with the same operands in the same order as the host ring's `reduce` (the running sum arrives,
our term joins): the same bits. This rank's own copy of the chunk keeps its gradient (the
all-gather overwrites it). The owner of a chunk (its last reduce-scatter step) adds into place
instead, scales the mean there, and sends as usual; so does any hop whose segment has no free
slot now, or does not fit one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from pipesgd_ref.comm.frames import checked_header, frame_at, waiting_check
from pipesgd_ref.comm.wire import Frame, Op, as_bytes

if TYPE_CHECKING:
    from pipesgd_ref.comm.sender import Sender


class SlotHops:
    """The ring's reduce-scatter hop through the shared-memory slots (module docstring), as
    RingReduce's `hop` (comm/ring.py): mixed in before RingReduce as ring.py's
    `SlotRingReduce`, which the ring runs when both of its links are shared memory and the
    reduction is the host ring's own (a variant with its own `reduce` or `inbox`, the
    compressed or the device ring, keeps the usual hop)."""

    if TYPE_CHECKING:  # RingReduce's, after this mixin in the MRO (comm/ring.py, not imported)
        comm: Any
        flat: np.ndarray
        dtype: np.dtype
        op: Op
        header: Frame
        sender: Sender
        sent: int

        def inbox(self, s: int, e: int, gathering: bool) -> Any: ...
        def reduce(self, got: Any, s: int, e: int, last: bool) -> Any: ...
        def send(self, step: int, chunk: int, part: int, payload: Any) -> None: ...
        def trace(self, step: int, chunk: int, part: int) -> None: ...

    def hop(self, step: int, chunk: int, part: int, s: int, e: int, last: bool) -> None:
        """One reduce-scatter hop for segment `part` ([s, e) of `chunk`) at `step`."""
        comm = self.comm  # what this rank is doing: named by the ring's step (comm/activity.py)
        frame = checked_header(comm, self.header, step, part, self.sender)
        mine = self.flat[s:e]
        if not comm.left.slotted(frame):  # empty, or a segment larger than a slot
            got = self.inbox(s, e, gathering=False)
            stop = waiting_check(comm, self.sender)
            comm.left.recv_payload_into(frame, as_bytes(got), stop=stop)
            self.send(step + 1, chunk, part, self.reduce(got, s, e, last))
            return
        got = comm.left.payload_view(frame, mine.nbytes).view(self.dtype)
        slot = None if last else comm.right.claim(mine.nbytes)
        if slot is not None:
            np.add(got, mine, out=slot.view(self.dtype))  # as reduce: the running sum, ours
            comm.left.release()
            comm.right.send_claimed(frame_at(self.header, step + 1, part))
            self.sent += mine.nbytes
            self.trace(step + 1, chunk, part)
            return
        np.add(got, mine, out=mine)
        comm.left.release()
        if last and self.op == Op.ALLREDUCE_MEAN:
            mine /= mine.dtype.type(comm.world_size)  # the owner scales once
        self.send(step + 1, chunk, part, mine)
