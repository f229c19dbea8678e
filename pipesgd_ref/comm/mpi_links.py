"""A Link over MPI: the frames of comm/wire.py as MPI messages (`--comm mpi`, comm/mpi.py).

`MPILink` is a links.Link whose bytes move as MPI messages instead of socket bytes: Link's own
methods (headers, their checks, errors that name the peer, ABORT news) run unchanged on it.

one frame = two MPI messages on (peer, tag): the 48-byte header, then (if any) the payload,
            received straight into the caller's buffer (no pickle, no copy)
tags      = which link: the ring's data to the right (TAG_RING) and news back to the left
            (TAG_BACK); the star's pushes up (TAG_UP) and pulls down (TAG_DOWN). MPI keeps
            the messages of one (sender, receiver, tag) in order (non-overtaking), which is
            all a stream of frames needs. p = 2: left and right are the same peer, apart
            by tag, as they are by socket in the TCP ring.
sending   = MPI_Isend from the calling thread, kept until complete (`_MPISender`): no
            sending thread, so after start-up only one thread of a rank ever calls MPI
            (pipe's communication thread, or the main thread of sync and ps)
waiting   = MPI_Test / MPI_Iprobe in a loop that sleeps up to MAX_PAUSE_S between tries
            and gives up after --timeout, naming the silent rank, as the sockets do; a
            blocking MPI_Wait would spin a core and could never time out
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable

from pipesgd_ref.comm.activity import current
from pipesgd_ref.comm.links import Link
from pipesgd_ref.comm.netem import LinkEmulator, LinkSpec
from pipesgd_ref.comm.wire import HEADER_BYTES, POLL_SECONDS, DeviceBytes, Frame, Kind, News
from pipesgd_ref.errors import CommError, PeerTimeout, ProtocolError

TAG_RING, TAG_BACK, TAG_UP, TAG_DOWN = 11, 12, 13, 14  # see the module docstring: "tags"
MIN_PAUSE_S = 20e-6  # first sleep of a wait that did not end at once; doubles up to ...
MAX_PAUSE_S = 1e-3  # ... this: short beside a step, long enough to leave the core to compute


def poll(done: Callable[[], bool], deadline: float, idle: Callable[[], None] | None = None) -> bool:
    """Ask done() until it is True (then True) or the deadline passes (then False), sleeping a
    little more after each miss (MIN_PAUSE_S doubling to MAX_PAUSE_S) and calling idle() every
    POLL_SECONDS: the sockets' receive slice, where a rank checks its sender and the news."""
    pause, next_idle = MIN_PAUSE_S, time.monotonic() + POLL_SECONDS
    while not done():
        now = time.monotonic()
        if now >= next_idle and idle is not None:
            idle()  # may raise: this rank's own failure, or news of another's
            next_idle = now + POLL_SECONDS
        if now > deadline:
            return False
        time.sleep(pause)
        pause = min(2 * pause, MAX_PAUSE_S)
    return True


# --- a Link over MPI -------------------------------------------------------------------------


class MPILink(Link):
    """One direction pair to one peer, as a links.Link, whose frames travel as MPI messages.

    Link's own methods (recv_header, recv_payload_into, recv_json, send, send_json, send_abort,
    read_abort) run unchanged, with their checks and their errors that name the peer: they
    move bytes only through `_recv_exact_into` and `_send_all`, which here receive and send
    one MPI message each. A header is one message, a payload the next: receiving "exactly n
    bytes" is receiving the next message, which must be n bytes long.
    """

    sock = None  # type: ignore[assignment]  # no socket: comm/ps.py's ps-async server polls these links (has_frame)
    transport = "mpi"  # what Communicator.transports reports, and the ring reads

    def __init__(
        self,
        comm,
        rank: int,
        peer: int,
        timeout: float,
        send_tag: int,
        recv_tag: int,
        device_memory: bool = False,
    ):
        # Not Link.__init__: that one sets up a socket. These are the attributes its methods use.
        self.takes_device_memory = device_memory  # a CUDA-aware library (cuda_aware())
        self.comm, self.send_tag, self.recv_tag = comm, send_tag, recv_tag
        self.rank, self.peer, self.timeout = rank, peer, timeout
        self.spec = LinkSpec()  # never emulated: MPI owns the wire
        self.emulator = LinkEmulator(self.spec)
        self.max_frame_bytes = 1 << 31
        self.bytes_sent = self.bytes_received = 0
        self._sender: _MPISender | None = None  # type: ignore[assignment]  # duck-typed: sender.Sender's methods, not its class
        self.mid_frame = False
        self._news_lock = _NoLock()  # one thread calls MPI (module docstring)
        self._news_ended = False

    def has_frame(self) -> bool:
        """Whether a message from the peer is waiting (MPI_Iprobe, no wait)."""
        return bool(self.comm.Iprobe(self.peer, self.recv_tag))

    def _recv_exact_into(
        self, view: memoryview, stop: Callable[[], None], timeout: float | None = None
    ) -> None:
        """Receive the peer's next message into `view`; it must be len(view) bytes (a header,
        or the payload its header announced). Waits in poll's slices, calling stop()."""
        if not len(view):
            return  # an empty payload is never sent
        from mpi4py import MPI

        timeout = self.timeout if timeout is None else timeout
        status = MPI.Status()
        comm, peer, tag = self.comm, self.peer, self.recv_tag
        if not poll(lambda: comm.Iprobe(peer, tag, status), time.monotonic() + timeout, stop):
            raise self._timeout_error(timeout)
        got = status.Get_count(MPI.BYTE)
        if got != len(view):
            # A frame is always header then payload: a message of another size means the two
            # ranks are out of step (never garbage: MPI delivers whole messages).
            raise self._out_of_step(got, len(view))
        comm.Recv([_buffer(view), MPI.BYTE], peer, tag)  # it has arrived (probed): no long block
        self.mid_frame = True  # until the frame's last message is read (Link resets it)
        self.bytes_received += got

    def _out_of_step(self, got: int, expected: int) -> ProtocolError:
        what, part = current(), "a header" if expected == HEADER_BYTES else "a payload"
        return ProtocolError(
            f"rank {self.rank}: rank {self.peer} sent a message of {got} bytes during {what}, "
            f"this rank expected {expected} ({part}): the two ranks are out of step; is it "
            f"running the same command?",
            origin=self.peer,
            link=self,
            doing=what,
        )

    def _send_all(self, header: bytes, payload: memoryview) -> None:
        """Send one frame now: header and payload as two messages, complete within the
        timeout (eager sends complete at once; large ones when the peer receives them)."""
        requests = self._post(header, payload)
        from mpi4py import MPI

        deadline = time.monotonic() + self.timeout
        if not poll(lambda: MPI.Request.Testall(requests), deadline):
            what = current()
            raise PeerTimeout(
                f"rank {self.rank}: rank {self.peer} took no data for {self.timeout:.1f} s "
                f"during {what}; is it alive? raise --timeout to wait longer",
                origin=self.peer,
                link=self,
                doing=what,
            )

    def _post(self, header: bytes, payload) -> list:
        """Start sending a frame (MPI_Isend of its header and, if any, its payload); the caller
        keeps the payload unchanged until the requests complete."""
        from mpi4py import MPI

        requests = [self.comm.Isend([header, MPI.BYTE], self.peer, self.send_tag)]
        if len(payload):
            body = self.comm.Isend([_buffer(payload), MPI.BYTE], self.peer, self.send_tag)
            requests.append(body)
        return requests

    def _read_news(self, wait: float) -> News | None:
        """Link.take_news's look at the link, with MPI_Iprobe for select (a peer never "closes"
        under MPI: a dead rank ends the job)."""
        if not poll(self.has_frame, time.monotonic() + max(wait, 0.0)):
            return None
        try:
            frame = self.recv_header(timeout=1.0)
            while frame.kind == Kind.HEARTBEAT:
                if not self.has_frame():
                    return None
                frame = self.recv_header(timeout=1.0)
            if frame.kind != Kind.ABORT:
                return None  # not news: this link carries data (nothing more is read)
            return self.read_abort(frame)
        except CommError:
            return None

    def start_sender(self) -> _MPISender:  # type: ignore[override]  # duck-typed: sender.Sender's methods, not its class
        if self._sender is None:
            self._sender = _MPISender(self)
        return self._sender

    def close(self) -> None:
        if self._sender is not None:
            self._sender.stop()
            self._sender = None


def _buffer(view):
    """What MPI gets for a frame's bytes: a memoryview, or a device array (DeviceBytes) when
    the library takes device memory."""
    return view.buffer if isinstance(view, DeviceBytes) else view


class _NoLock:
    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


class _MPISender:
    """The ring's sender on an MPILink (sender.Sender's surface): `put` starts the frame's
    MPI_Isends at once from the calling thread and keeps them, with the payload they read, until
    complete. Frames complete in order as far as callers can tell: `pending` counts from the
    oldest frame not yet complete, so a buffer reused round-robin (the device ring's pinned
    slots) is free once fewer than its turn are pending."""

    half_sent = False  # an MPI message is whole or not sent: the stream is never mid-frame

    def __init__(self, link: MPILink):
        self.link = link
        self.inflight: collections.deque = collections.deque()  # (requests, payload) per frame
        self.error: BaseException | None = None

    @property
    def pending(self) -> int:
        from mpi4py import MPI

        while self.inflight and MPI.Request.Testall(self.inflight[0][0]):
            self.inflight.popleft()
        return len(self.inflight)

    def put(self, frame: Frame, payload: memoryview | bytes) -> None:
        self.check()
        link = self.link
        header = dataclasses.replace(frame, nbytes=len(payload), deliver_at=0.0).pack()
        self.inflight.append((link._post(header, payload), (header, payload)))
        link.bytes_sent += HEADER_BYTES + len(payload)

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def heartbeat(self) -> None:
        """While this rank waits on its left neighbour: tell the right one we are alive (see
        sender.Sender.heartbeat), and let MPI progress the frames in flight."""
        self.check()
        if self.pending == 0:
            self.put(Frame(kind=Kind.HEARTBEAT), b"")

    def cancel(self, wait: float) -> bool:
        """After a failure: send nothing more of the collective. Always True: the link is
        between frames (an ABORT may follow at once)."""
        if self.error is None:
            self.error = CommError("sending cancelled: the collective failed")
        return True

    def flush(self, timeout: float) -> None:
        self.wait_pending(0, timeout)

    def wait_pending(self, at_most: int, timeout: float) -> None:
        """Wait until at most `at_most` frames are still in flight."""
        if not poll(lambda: self.pending <= at_most, time.monotonic() + timeout, self.check):
            link = self.link
            raise PeerTimeout(
                f"rank {link.rank}: rank {link.peer} took no data for {timeout:.1f} s; is it "
                f"alive? raise --timeout to wait longer",
                origin=link.peer,
                link=link,
            )
        self.check()

    def stop(self) -> None:
        """Give the frames in flight a moment to complete (their buffers must outlive them)."""
        poll(lambda: self.pending == 0, time.monotonic() + 1.0)
