"""The sending thread of a link: frames leave in the order they were queued, while the rank's
main thread receives from its other neighbour (the ring is full duplex: each link is used in
one direction).

`put` starts a frame from the calling thread when nothing is queued ahead of it, handing the
kernel what its socket buffer takes now; only the rest goes to the thread. While the main
thread waits on its left neighbour, `heartbeat` tells the right one this rank is alive, so
that only the rank next to a silent peer times out. After a failure `cancel` drops every frame
not yet started, and waits for the one on the wire: the ABORT that follows needs the stream
between frames.

A frame sent by the thread is sent under the name of what its caller was doing when it queued
it (comm/activity.py), so an error on the way names the caller's operation.

Blame of a stuck send. Every collective waits on its sending thread before it returns (the
caller may reuse the buffer), and a mesh hop waits on it mid-collective too. When that wait
times out, the peer is named only if it is the holdup: a send blocked by a peer that does not
read leaves bytes in the socket's send queue, or, on a shared-memory link, slots the peer has
not released. An empty queue (Linux's SIOCOUTQ) with every slot released means the peer took
everything handed to it, so the frame is stuck in this process (a hung sending thread, a
truncated frame): the error names this rank (`own_stall`), as its peer's "no data from rank
..." does, and no rank blames the peer. Without this, the rank after a truncated frame and the
rank that cut it short time out together, each naming the other.
"""

from __future__ import annotations

import fcntl
import queue
import struct
import termios
import threading
import time

from pipesgd_ref.comm.activity import current, doing
from pipesgd_ref.comm.wire import POLL_SECONDS, Frame, Kind
from pipesgd_ref.errors import CommError, PeerTimeout


class Sender:
    """The sending thread of `link` (a Link, comm/links.py): frames go out in the order they
    were queued."""

    def __init__(self, link):
        self.link = link
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.error: BaseException | None = None
        self.pending = 0
        # True from a frame's first byte on the wire to its last (whichever thread sent the
        # first): another header may go out only between frames, or it garbles the stream.
        self.half_sent = False
        self.cancelled = False  # error is cancel()'s, not a failed send: the link still works
        self._idle = threading.Condition()
        self.thread = threading.Thread(
            target=self._run, name=f"send-{link.rank}->{link.peer}", daemon=True
        )
        self.thread.start()

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            frame, payload, what = job  # what its caller was doing when it queued the frame
            with self._idle:
                # After a failure, drop the rest: the collective is lost. But finish a frame
                # that put() started, after a cancel too: the ABORT that follows needs the
                # stream between frames.
                go = self.error is None or (frame is None and self.cancelled)
                if go:
                    self.half_sent = True
            failed = False
            if go:
                try:
                    with doing(what):
                        if frame is None:  # the rest of a frame put() started (its parts)
                            self.link.send_rest(payload)
                        else:
                            self.link.send(frame, payload)
                except BaseException as e:  # handed to the main thread by check()
                    self.error, self.cancelled, failed = e, False, True
            with self._idle:
                if go:  # a frame that failed part way stays half sent: nothing may follow it
                    self.half_sent = failed
                self.pending -= 1
                self._idle.notify_all()

    def put(self, frame: Frame, payload: memoryview | bytes) -> None:
        """Queue a frame. With nothing queued ahead of it, the calling thread starts it at once
        and hands the kernel what its socket buffer takes without waiting; only the rest (if
        any) goes to the sending thread. Waking that thread costs a scheduler wake-up on a busy
        or virtual machine (benchmarks/RESULTS.md), once per ring hop: the latency term of
        every step."""
        queued: tuple[Frame | None, memoryview | bytes | list[memoryview]] = (frame, payload)
        with self._idle:
            idle = self.pending == 0
        if idle:
            self.check()
            rest = self.link.send_without_waiting(frame, payload)
            if rest is None and self.link.may_send_inline(frame, len(payload)):
                self.link.send(frame, payload)  # small: fits the buffer, cannot block
                return
            if rest is not None:
                if not rest:
                    return
                queued = (None, rest)  # the sending thread finishes this frame
        with self._idle:
            self.pending += 1
            if queued[0] is None:
                self.half_sent = True  # its first bytes are on the wire already
        self.jobs.put((*queued, current()))

    def check(self) -> None:
        """Raise the sending thread's error, if it had one (called from the main thread)."""
        if self.error is not None:
            raise self.error

    def heartbeat(self) -> None:
        """Called while the main thread waits on its left neighbour: if nothing is queued,
        tell the right neighbour we are alive, so that only the rank next to a silent peer
        times out, and everyone else waits for its ABORT, which names the silent rank."""
        self.check()
        if self.pending == 0:  # only the main thread queues: idle now means idle when sent
            with doing("heartbeat"):
                self.put(Frame(kind=Kind.HEARTBEAT), b"")

    def cancel(self, wait: float) -> bool:
        """Drop every frame not yet started; wait up to `wait` s for the one on the wire.
        True when the link is between frames (safe to send one more)."""
        deadline = time.monotonic() + wait
        with self._idle:
            if self.error is None:
                self.error = CommError("sending cancelled: the collective failed")
                self.cancelled = True
            # Frames not started are dropped whenever the thread gets to them; only the one
            # on the wire is waited for (a busy machine may take long to run that thread).
            while self.half_sent and time.monotonic() < deadline:
                self._idle.wait(0.05)
            return not self.half_sent

    def flush(self, timeout: float) -> None:
        """Wait until every queued frame is on the wire (or raise the error that stopped it)."""
        self.wait_pending(0, timeout)

    def wait_pending(self, at_most: int, timeout: float) -> None:
        """Wait until at most `at_most` queued frames are still to be sent (or raise the error
        that stopped the sender). Frames leave in order, so the ones still pending are the
        last ones queued: a caller reusing buffers round-robin knows which are free."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self.pending > at_most and self.error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise own_stall(
                        self.link.rank,
                        timeout,
                        PeerTimeout(
                            f"rank {self.link.rank}: could not hand data to rank "
                            f"{self.link.peer} for {timeout:.1f} s; is it alive? raise "
                            f"--timeout to wait longer",
                            origin=self.link.peer,
                            link=self.link,
                        ),
                    )
                self._idle.wait(min(left, POLL_SECONDS))
        self.check()

    def stop(self) -> None:
        self.jobs.put(None)
        self.thread.join(timeout=1.0)


def own_stall(rank: int, timeout: float, error: PeerTimeout) -> PeerTimeout:
    """The error for a send from `rank` to a peer that did not finish in `timeout` s (`error`,
    naming the peer): itself while the peer has not taken what it was handed (the peer does
    not read), else an error naming this rank: the peer took all it was given, so the frame is
    stuck in this process (module docstring). A link where that cannot be told keeps it."""
    link = getattr(error, "link", None)
    if link is None or _untaken(link) != 0:
        return error
    return PeerTimeout(
        f"rank {rank}: a frame to rank {link.peer} has been stuck in this rank for "
        f"{timeout:.1f} s, though rank {link.peer} took every byte sent so far: this "
        f"rank's sending thread is hung or its frame was cut short; look for this rank's "
        f"error or fault above",
        origin=rank,
        link=link,
        doing=getattr(error, "doing", ""),
    )


def _untaken(link) -> int | None:
    """What `link`'s peer has not taken yet of what this rank handed it: the bytes in the
    socket's send queue, plus, on a shared-memory link (comm/shm.py), the slotted frames
    written and not yet released; None where it cannot be told (another transport)."""
    if getattr(link, "transport", "") not in ("tcp", "unix", "shm"):
        return None
    try:
        queued = struct.unpack("i", fcntl.ioctl(link.sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))
    except (OSError, AttributeError, ValueError):
        return None
    if link.transport != "shm":
        return queued[0]
    consumed = getattr(link, "_consumed_out", None)  # the peer's count of released slots
    if consumed is None:
        return None
    return queued[0] + link._sent - int(consumed[0])
