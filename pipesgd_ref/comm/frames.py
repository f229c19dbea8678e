"""The frames of the ring's collectives: one header per (step, segment), checked on arrival, and
a failure told to both neighbours. Used by every ring (comm/ring.py's loop and broadcast, the
compressed and device rings), and, on other links than the ring's, by comm/mesh.py.

Agreement: every frame carries (sequence number, op, dtype, total length, step, segment); the
receiver checks them against its own call before reading the payload, so two ranks in different
collectives get an error naming both, never a hang or wrong numbers.

Failure: a rank that cannot finish a collective sends ABORT news to both neighbours before it
raises, and a rank that receives news instead of a frame passes the story on (PeerAborted,
naming the rank where it began): every rank of the ring ends with the same cause.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from pipesgd_ref.comm.activity import current
from pipesgd_ref.comm.wire import ABORT_LINGER_SECONDS, POLL_SECONDS, Frame, Kind, as_bytes
from pipesgd_ref.errors import CollectiveMismatch, CommError, PeerAborted


def frame_at(header: Frame, step: int, part: int) -> Frame:
    """The collective's header for frame (step, segment): what the receiver will check.

    Built field by field, once per segment: dataclasses.replace looks every field up by name
    (getattr, a dict of keywords) and costs three times as much, paid at every ring hop."""
    h = header
    fields = (h.kind, h.op, h.dtype, h.seq, step, part, h.src, h.total_len, h.nbytes)
    return Frame(*fields, h.deliver_at)


def recv_checked(
    comm, want: Frame, step: int, part: int, out: np.ndarray, sender, link=None, stop=None
) -> None:
    """Receive the next frame from the left neighbour (or `link`) into `out` (a contiguous
    array of the payload's size), after checking it is frame (step, part) of the collective
    `want` describes.

    While waiting it keeps the ring honest: heartbeats from the left are skipped (the neighbour
    is alive), `sender` (this rank's sending thread, or None) re-raises its own error and tells
    the right neighbour we are alive, and news of a failure from either side stops the wait.
    Raises PeerAborted when ABORT news arrives instead, CollectiveMismatch when the frame
    belongs to another collective, step or segment; both name what this rank is doing
    (comm/activity.py). `link` and `stop` (what to do in each idle slice of the wait): for a
    collective that receives on other links than the ring's (comm/mesh.py).
    """
    link = comm.left if link is None else link
    stop = waiting_check(comm, sender) if stop is None else stop
    got = checked_header(comm, want, step, part, sender, link, stop)
    link.recv_payload_into(got, as_bytes(out), stop=stop)


def waiting_check(comm, sender) -> Callable[[], None]:
    """What a rank does in each idle slice of a wait on its left neighbour."""

    def stop() -> None:  # each idle slice of the wait: raise if this rank should stop waiting
        if sender is not None:
            sender.heartbeat()  # raises the sending thread's error, if it had one
        comm.check_news()  # news of a failure may come from the right, too

    return stop


def checked_header(comm, want: Frame, step: int, part: int, sender, link=None, stop=None) -> Frame:
    """The header half of `recv_checked`: the next frame from the left (or `link`), checked to
    be frame (step, part) of `want`'s collective; its payload is still to be read."""
    link = comm.left if link is None else link
    stop = waiting_check(comm, sender) if stop is None else stop
    got, quiet_since = link.recv_header(stop=stop), time.monotonic()
    while got.kind == Kind.HEARTBEAT:  # the peer is alive and waiting: keep waiting
        # Pass it on, at most once a slice: heartbeats arriving more often than a slice would
        # end every idle slice early, `stop` would never run, and the ranks waiting on this
        # one would hear nothing and time out on it instead of on the silent rank upstream.
        if time.monotonic() - quiet_since >= POLL_SECONDS:
            stop()
            quiet_since = time.monotonic()
        got = link.recv_header(stop=stop)
    if got.kind == Kind.ABORT:  # a rank upstream failed (or stopped): pass its story on
        news = link.read_abort(got)
        source = f"news from rank {link.peer}"
        raise PeerAborted(news.cannot_finish(comm.rank, current(), source), origin=news.origin)
    ours = (want.kind, want.seq, want.op, want.dtype, want.total_len, step, part)
    if (got.kind, got.seq, got.op, got.dtype, got.total_len, got.step, got.part) != ours:
        raise CollectiveMismatch(
            f"rank {comm.rank}: rank {link.peer} sent a frame of {got.describe()} "
            f"(step {got.step}, segment {got.part}) while this rank is in {want.describe()} "
            f"(step {step}, segment {part}): every rank must call the same collectives in the "
            f"same order, with the same dtype and length",
            origin=link.peer,
        )
    return got


def aborting_on_error(comm, fn: Callable, *args):
    """Run the collective `fn(*args)` and return what it returns; on a communication failure
    tell both neighbours before raising (the cause, once a neighbour's close is told apart from
    the failure it passed on), so the whole ring stops with one story instead of timing out
    rank by rank. An error an inner call already told (a collective that does this itself,
    comm/mesh.py) is raised as is."""
    try:
        return fn(*args)
    except CommError as e:
        if getattr(e, "told", False):
            raise
        cause = comm.explain(e)
        cause.told = True
        if comm.abort(cause):
            # Keep our sockets open a moment: the news goes round the ring in milliseconds,
            # while closing now would make a neighbour see a reset instead of the reason.
            time.sleep(ABORT_LINGER_SECONDS)
        if cause is e:
            raise
        raise cause from None
