"""Links: framed messages over one stream socket (TCP, or unix between ranks on one host), the
only thing that ever crosses a socket. A frame is a 48-byte header and raw bytes (comm/wire.py);
shared-memory links (comm/shm.py) keep these headers on a unix socket and move the payloads
through shared slots; MPI links (comm/mpi.py) send them as MPI messages.

Every blocking call has a timeout. Receives wait in slices of POLL_SECONDS (the socket's
SO_RCVTIMEO), so that a failure seen by another thread of this rank (the sending thread,
comm/sender.py) stops the wait at once instead of after the full timeout. Errors name this
rank, the peer, what was under way, and what to do. On a link to a rank of this host, a wait
for the next frame first polls for SPIN_SECONDS (`_spin_into`): a small ring hop costs less
when its receiver is not asleep (benchmarks/hop_cost.py).

Failure news. A rank that cannot finish sends ABORT (JSON {origin, reason}) on its links before
it closes them (comm/communicator.py's abort); a link this rank only sends on carries nothing
back but that news (`take_news`), so a send refused by a closed connection first looks for it:
a neighbour that only passed a failure on is never blamed for it.
"""

from __future__ import annotations

import json
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from pipesgd_ref.comm.activity import current, doing
from pipesgd_ref.comm.netem import LinkEmulator, LinkSpec, wait_until
from pipesgd_ref.comm.sender import Sender
from pipesgd_ref.comm.wire import (
    DEFAULT_MAX_FRAME_BYTES,
    HEADER,
    POLL_SECONDS,
    Frame,
    Kind,
    News,
    decode_header,
)
from pipesgd_ref.errors import (
    CollectiveMismatch,
    CommError,
    PeerAborted,
    PeerClosed,
    PeerTimeout,
    ProtocolError,
)
from pipesgd_ref.runtime import faults, lifetime

UNIX_SEND_BUFFER = 4 << 20  # unix links: up to two ring segments in flight in the kernel
INLINE_SEND_BYTES = 64 << 10  # frames up to this size skip the sending thread when it is idle
# A link to a rank on this host polls this long for the next frame before it sleeps in the
# kernel (Link._spin_into); a link to another host sleeps at once.
SPIN_SECONDS = 50e-6
# A send that fails on a closed connection looks, this long at most, for the ABORT the peer
# sent before it closed (already received: TCP delivers the bytes before the reset).
NEWS_WAIT_SECONDS = 0.1


def _drop_sent(parts: list[memoryview], sent: int) -> list[memoryview]:
    """What is left of a gathered send after the kernel took `sent` bytes of it."""
    while parts and sent >= len(parts[0]):
        sent -= len(parts[0])
        parts = parts[1:]
    if parts and sent:
        parts = [parts[0][sent:], *parts[1:]]
    return parts


class Link:
    """One TCP connection to one peer, with this rank's name for it.

    The ring uses each link in one direction (send to the right, receive from the left), so
    sends and receives run concurrently on different sockets: full duplex.
    """

    # Whether GPU arrays may go straight to this link's wire (comm/device_ring.py's direct
    # path): never over sockets; over MPI when the library is CUDA-aware (comm/mpi.py).
    takes_device_memory = False
    spin_seconds = 0.0  # see _spin_into; __init__ sets it for a socket's link
    # A link that carries data both ways (comm/mesh.py's): a failed send does not look for news
    # in the receive stream (`_send_failed`), where the receiving thread may be mid-frame.
    two_way = False

    def __init__(
        self,
        sock: socket.socket,
        rank: int,
        peer: int,
        timeout: float,
        spec: LinkSpec | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ):
        self.sock = sock
        self.rank = rank
        self.peer = peer
        self.timeout = timeout
        self.spec = spec or LinkSpec()  # the emulated network this link behaves as
        self.max_frame_bytes = max_frame_bytes
        self.emulator = LinkEmulator(self.spec)
        self.bytes_sent = 0
        self.bytes_received = 0
        self._sender: Sender | None = None
        # True while a frame is half read: the receive stream is not at a frame boundary, so
        # no ABORT can be looked for in it (see take_news).
        self.mid_frame = False
        # news is read by the main or the sending thread (MPILink: one thread, no lock)
        self._news_lock: AbstractContextManager[object] = threading.Lock()
        self._news_ended = False  # the peer closed this direction: no news can come any more
        self.transport = "unix" if sock.family == socket.AF_UNIX else "tcp"  # shm: ShmLink
        self.spin_seconds = SPIN_SECONDS if self._same_host() else 0.0
        if self.transport == "tcp":
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # headers must not wait
        else:  # a larger buffer: fewer wake-ups per segment (the kernel caps it at wmem_max)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, UNIX_SEND_BUFFER)
        # Blocking calls that give up after POLL_SECONDS (see _recv_exact_into and _send_all).
        sock.settimeout(None)
        slice_ = struct.pack("ll", int(POLL_SECONDS), int(POLL_SECONDS % 1 * 1e6))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, slice_)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, slice_)

    def _same_host(self) -> bool:
        """Whether the peer runs on this host: a unix socket, or TCP between two addresses
        that are the same (loopback; a network namespace has an address of its own)."""
        if self.sock.family == socket.AF_UNIX:
            return True
        try:
            return self.sock.getpeername()[0] == self.sock.getsockname()[0]
        except OSError:  # not connected (yet): as another host
            return False

    # --- errors -------------------------------------------------------------------------
    # Each error names what this rank was doing (activity.current(): set where the operation
    # began, comm/activity.py), the peer, and what to do.
    def _timeout_error(self, timeout: float) -> PeerTimeout:
        what = current()
        return PeerTimeout(
            f"rank {self.rank}: no data from rank {self.peer} for {timeout:.1f} s during "
            f"{what}; is rank {self.peer} alive (stopped, hung, or overloaded)? "
            f"raise --timeout to wait longer",
            origin=self.peer,
            link=self,
            doing=what,
        )

    def _closed_error(self, detail: str = "") -> PeerClosed:
        what, more = current(), f" ({detail})" if detail else ""
        return PeerClosed(
            f"rank {self.rank}: rank {self.peer} closed the connection during {what}{more}; "
            f"it probably exited or crashed: look for its error above",
            origin=self.peer,
            link=self,
            doing=what,
        )

    def _send_failed(self, error: OSError) -> CommError:
        """The error for a send that the peer's closed connection refused. A peer that failed
        because of another rank sends ABORT, naming that rank, on every link before it closes:
        here it arrives on the direction this rank does not send in, before the reset, so a
        neighbour's exit is never taken for the cause when it only passed the failure on."""
        what, closed = current(), self._closed_error(str(error))
        if self.two_way:  # data comes back on it: only the receiving thread may read it
            return closed
        try:
            news = self.take_news(NEWS_WAIT_SECONDS)
        except CommError:
            return closed  # closed without a word: the peer itself is the cause
        if news is None:
            return closed
        source = f"news from rank {self.peer}, which then closed the connection"
        return PeerAborted(
            news.cannot_finish(self.rank, what, source), origin=news.origin, link=self, doing=what
        )

    # --- receiving ------------------------------------------------------------------------
    def _recv_exact_into(
        self, view: memoryview, stop: Callable[[], None], timeout: float | None = None
    ) -> None:
        """Fill `view` from the socket: zero-copy recv_into, waiting in slices of POLL_SECONDS.

        The socket is in blocking mode with SO_RCVTIMEO = POLL_SECONDS, and MSG_WAITALL asks the
        kernel to return only when the whole view is full (or the slice ends): one system call
        per segment, where a Python-level timeout would cost a poll() and a recv() per packet.
        A wait for the start of a frame on a link to this host polls first (_spin_into).
        """
        got, total = 0, len(view)
        if self.spin_seconds and not self.mid_frame:  # between frames: a header is due
            got = self._spin_into(view)
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while got < total:
            try:
                n = self.sock.recv_into(view[got:], total - got, socket.MSG_WAITALL)
            except (BlockingIOError, TimeoutError):  # the slice ended with nothing new
                stop()  # raises if another thread of this rank has failed
                if time.monotonic() > deadline:
                    raise self._timeout_error(timeout) from None
                continue
            except OSError as e:  # reset, broken pipe, closed under us
                raise self._closed_error(str(e)) from None
            if n == 0:
                raise self._closed_error(f"after {got} of {total} bytes")
            got += n
            self.mid_frame = True  # until the frame's last byte is read
            deadline = time.monotonic() + timeout  # progress: the peer is alive
        self.bytes_received += total

    def _spin_into(self, view: memoryview) -> int:
        """Poll for the next frame's first bytes for up to `spin_seconds`: non-blocking reads,
        the core yielded between them (os.sched_yield: a rank sharing it runs, this one comes
        back next). Returns the bytes read; 0 when none came in time or the peer closed (the
        blocking read that follows reports the close, and the timeouts are its own, unchanged).

        Why: a receiver asleep in recv() must be woken by the sender's system call, which on
        a virtual machine costs an inter-processor interrupt: the largest part of a small
        hop's sendmsg (benchmarks/hop_cost.py). A receiver that is still polling when the
        frame lands is not asleep, so neither side pays it; a neighbour in the same ring step
        usually sends within a few tens of microseconds."""
        deadline = time.monotonic() + self.spin_seconds
        while True:
            try:
                n = self.sock.recv_into(view, len(view), socket.MSG_DONTWAIT)
            except BlockingIOError:  # nothing yet
                if time.monotonic() > deadline:
                    return 0
                os.sched_yield()
                continue
            except OSError as e:  # reset, closed under us: as _recv_exact_into reports it
                raise self._closed_error(str(e)) from None
            if n:
                self.mid_frame = True  # until the frame's last byte is read
            return n

    def recv_header(
        self, *, stop: Callable[[], None] = lambda: None, timeout: float | None = None
    ) -> Frame:
        """The next frame's header, checked (wire.decode_header); its payload is still to be
        read. `stop` is called in every idle slice of the wait (it raises to end it)."""
        raw = bytearray(HEADER.size)
        self._recv_exact_into(memoryview(raw), stop, timeout)
        try:
            frame = decode_header(bytes(raw), self.max_frame_bytes)
        except ProtocolError as e:
            what = current()
            raise ProtocolError(
                f"rank {self.rank}: bad frame from rank {self.peer} during {what}: {e}; is "
                f"another program (or another job) talking to this port?",
                origin=self.peer,
                link=self,
                doing=what,
            ) from None
        self.mid_frame = frame.nbytes > 0  # its payload is still to be read
        return frame

    def recv_payload_into(
        self, frame: Frame, out: memoryview, *, stop: Callable[[], None] = lambda: None
    ) -> None:
        """Read the frame's payload into `out` (exactly frame.nbytes long), then honour the
        emulated delivery time."""
        if frame.nbytes != len(out):
            raise CollectiveMismatch(
                f"rank {self.rank}: rank {self.peer} sent {frame.nbytes} bytes during "
                f"{current()}, this rank expected {len(out)}"
            )
        self._recv_exact_into(out, stop)
        self.mid_frame = False
        if frame.deliver_at:
            wait_until(frame.deliver_at, max_wait=self.spec.message_time(frame.nbytes) + 1.0)

    def recv_json(self, kind: Kind, *, frame: Frame | None = None) -> dict:
        """Read a JSON control message (its header too, unless already read as `frame`)."""
        frame = frame or self.recv_header()
        if frame.nbytes > 1 << 20:
            raise ProtocolError(f"rank {self.rank}: control message of {frame.nbytes} bytes")
        buf = bytearray(frame.nbytes)
        self._recv_exact_into(memoryview(buf), lambda: None)
        self.mid_frame = False
        if frame.kind == Kind.REFUSE:
            reason = json.loads(buf.decode()).get("reason", "?")
            raise CommError(
                f"rank {self.rank}: rank {self.peer} refused us during {current()}: {reason}"
            )
        if frame.kind != kind:
            raise ProtocolError(
                f"rank {self.rank}: expected a {kind.name} frame from rank {self.peer} during "
                f"{current()}, got {Kind(frame.kind).name}"
            )
        try:
            return json.loads(buf.decode())
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ProtocolError(f"rank {self.rank}: bad JSON from rank {self.peer}: {e}") from None

    # --- sending --------------------------------------------------------------------------
    def send(
        self, frame: Frame, payload: memoryview | bytes = b"", *, deliver_at: float | None = None
    ) -> None:
        """Send one frame now, from the calling thread (paced by the link emulator, unless the
        caller already booked the wire and passes the emulated arrival time `deliver_at`)."""
        if deliver_at is None:
            deliver_at = self.emulator.schedule(len(payload) + HEADER.size)
        header = frame.pack(len(payload), deliver_at)  # the frame with its size and arrival
        body = memoryview(payload).cast("B")
        if faults.ARMED and faults.sabotage(self, header, body):  # tests only
            return
        self._send_all(header, body)
        self.bytes_sent += HEADER.size + len(payload)

    def send_without_waiting(
        self, frame: Frame, payload: memoryview | bytes
    ) -> list[memoryview] | None:
        """Start sending one frame from the calling thread, handing the kernel only what its
        socket buffer takes now (MSG_DONTWAIT: never blocks). Returns the parts still to send
        ([] when all went out; finish the rest with `send_rest` before any other frame). None:
        nothing was started, because the emulated wire is still busy with an earlier frame
        (waiting for it is the sending thread's job) or a test fault is armed."""
        if faults.ARMED or not self.emulator.free_now():
            return None
        deliver_at = self.emulator.schedule(len(payload) + HEADER.size)
        header = memoryview(frame.pack(len(payload), deliver_at))
        body = memoryview(payload).cast("B")
        parts = [header, body] if len(body) else [header]  # one system call for both
        try:
            sent = self.sock.sendmsg(parts, [], socket.MSG_DONTWAIT)
        except (BlockingIOError, TimeoutError):
            sent = 0
        except OSError as e:
            raise self._send_failed(e) from None
        self.bytes_sent += HEADER.size + len(body)
        return _drop_sent(parts, sent)

    def send_rest(self, parts: list[memoryview]) -> None:
        """Finish a frame that `send_without_waiting` started (blocking, with the timeout)."""
        self._send_parts(parts)

    def _send_all(self, header: bytes, payload: memoryview) -> None:
        """Send header and payload with one gathering system call (sendmsg) where the kernel
        takes it all: a lone 48-byte header would be its own packet and its own wake-up of the
        receiver. Blocking; SO_SNDTIMEO ends a call that could hand the kernel nothing for
        POLL_SECONDS; `timeout` without any progress is an error."""
        parts = [memoryview(header), payload] if len(payload) else [memoryview(header)]
        self._send_parts(parts)

    def _send_parts(self, parts: list[memoryview]) -> None:
        deadline = time.monotonic() + self.timeout
        while parts:
            try:
                sent = self.sock.sendmsg(parts)
            except (BlockingIOError, TimeoutError):
                if time.monotonic() > deadline:
                    raise self._refused_error() from None
                continue
            except OSError as e:
                raise self._send_failed(e) from None
            deadline = time.monotonic() + self.timeout
            parts = _drop_sent(parts, sent)

    def _refused_error(self) -> PeerTimeout:
        what = current()
        return PeerTimeout(
            f"rank {self.rank}: rank {self.peer} accepted no data for {self.timeout:.1f} s "
            f"during {what}; is it alive? raise --timeout to wait longer",
            origin=self.peer,
            link=self,
            doing=what,
        )

    def send_json(self, kind: Kind, payload: dict) -> None:
        self.send(Frame(kind=kind), json.dumps(payload).encode())

    def send_abort(self, error: BaseException, default_origin: int) -> bool:
        """Tell the peer why the job is failing: an ABORT frame naming the rank at fault
        (the error's `origin`, else `default_origin`). A rank that stops on a signal (its own,
        or one it heard of) passes the failure on as that stop. Best effort, within a second:
        the job is failing anyway. True when it was sent."""
        origin = getattr(error, "origin", None)
        origin = default_origin if origin is None else origin
        signum, step = lifetime.stop_to_tell() or (0, None)
        return self.send_news(News(origin, str(error), signum, step))

    def send_news(self, news: News) -> bool:
        """Send `news` as an ABORT frame; best effort, within a second. True when it was sent."""
        old_timeout, self.timeout = self.timeout, 1.0
        try:
            with doing("abort"):
                self.send_json(Kind.ABORT, news.as_json())
            return True
        except CommError:
            return False
        finally:
            self.timeout = old_timeout

    def read_abort(self, frame: Frame) -> News:
        """The news of an ABORT frame whose header was just read. News of a rank that stopped
        on a signal stops this rank too, as if the signal had reached it (runtime/lifetime.py):
        the ranks of a joined job are signalled one by one, and one that stops first must not
        be taken for a crash."""
        news = News.from_json(self.recv_json(Kind.ABORT, frame=frame))
        if news.signal:
            lifetime.heard_stop(news.signal)
        return news

    def take_news(self, wait: float) -> News | None:
        """The news of an ABORT that the peer sent on this link, within `wait` seconds; None
        when none came (or the stream is mid-frame, where none can be read).

        For a link this rank only sends on (the ring's right link; a worker's link to the
        server between two pulls): the peer sends nothing back but ABORT, so the first frame
        that arrives is the news. Raises PeerClosed when the peer closed the connection
        without any (a peer that fails because of another rank always sends it first)."""
        with doing("news"):
            if self._news_ended:
                raise self._closed_error("closed without an ABORT")
            return None if self.mid_frame else self._read_news(wait)

    def _read_news(self, wait: float) -> News | None:
        with self._news_lock:  # both threads of a rank may look: one reads, the other waits
            try:
                readable, _, _ = select.select([self.sock], [], [], max(wait, 0.0))
            except (OSError, ValueError):  # closed by this rank meanwhile
                return None
            if not readable:
                return None
            try:
                frame = self.recv_header(timeout=1.0)
                while frame.kind == Kind.HEARTBEAT:
                    frame = self.recv_header(timeout=1.0)
                if frame.kind != Kind.ABORT:
                    return None  # not news: this link carries data (nothing more is read)
                return self.read_abort(frame)
            except PeerClosed:
                self._news_ended = True
                raise
            except CommError:
                return None  # garbage or silence: no news

    def may_send_inline(self, frame: Frame, nbytes: int) -> bool:
        """Whether a frame of `nbytes` may be sent from the calling thread when the sending
        thread is idle: it fits the socket buffer, so sending cannot block."""
        return nbytes <= INLINE_SEND_BYTES

    def has_frame(self) -> bool:
        """Whether a frame has begun to arrive (no wait): ps-async's server asks this of links it
        cannot select on (comm/ps.py; MPILink's own answer probes MPI)."""
        return bool(select.select([self.sock], [], [], 0)[0])

    def start_sender(self) -> Sender:
        """A background thread that sends queued frames in order, so a rank can send to one
        neighbour while its main thread receives from another."""
        if self._sender is None:
            self._sender = Sender(self)
        return self._sender

    def close(self) -> None:
        if self._sender is not None:
            self._sender.stop()
            self._sender = None
        try:
            self.sock.close()
        except OSError:
            pass
