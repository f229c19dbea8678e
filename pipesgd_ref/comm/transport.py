"""Framed messages over a stream socket (TCP, or unix between ranks on one host): the only
thing that ever crosses a socket. Shared-memory links (comm/shm.py) keep these headers on a unix
socket and move the payloads through shared slots.

A frame is a fixed 48-byte header followed by raw array bytes:

    offset  field       type   meaning
    0       magic       4s     b"PSGD": anything else is not our protocol (a port scanner, HTTP...)
    4       version     u8     protocol version; a mismatch is refused, never guessed at
    5       kind        u8     HELLO / WELCOME / REFUSE / CONTROL / DATA (see Kind)
    6       op          u8     the collective this frame belongs to (see Op)
    7       dtype       u8     element type of the payload (see DTYPE_CODES)
    8       seq         u64    the collective's sequence number on this communicator
    16      step        u16    ring step within the collective
    18      part        u16    segment of the chunk within the step
    20      src         u32    sender's rank
    24      total_len   u64    elements in the whole collective (checked: all ranks must agree)
    32      nbytes      u64    payload bytes that follow
    40      deliver_at  f64    link emulation: when the frame "arrives" (0.0 = not emulated)

Why a length-prefixed binary header and raw bytes, never pickle: a receiver knows exactly how
many bytes to expect before it reads them (so it can `recv_into` a preallocated buffer with no
copy), refuses frames larger than `max_frame_bytes` before allocating anything, and a peer that
sends garbage produces a clear error, not code execution. Control messages (rendezvous) carry
JSON text in their payload.

Every blocking call has a timeout. Receives wait in short slices so that a failure seen by
another thread of this rank (the sending thread, see `Link.start_sender`) stops the wait at once
instead of after the full timeout. Errors name this rank, the peer, what was under way, and what
to do.
"""

from __future__ import annotations

import dataclasses
import json
import queue
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from pipesgd_ref.comm.netem import LinkEmulator, LinkModel, wait_until
from pipesgd_ref.errors import (
    CollectiveMismatch,
    CommError,
    PeerAborted,
    PeerClosed,
    PeerTimeout,
    ProtocolError,
)
from pipesgd_ref.runtime import faults

MAGIC = b"PSGD"
VERSION = 1
HEADER = struct.Struct("!4sBBBBQHHIQQd")
HEADER_BYTES = HEADER.size  # 48: the fixed cost of every frame on the wire
assert HEADER_BYTES == 48
DEFAULT_MAX_FRAME_BYTES = 1 << 31  # 2 GiB: larger frames are refused before any allocation
POLL_SECONDS = 0.2  # receive slice: how quickly a rank notices its own sender's failure
UNIX_SEND_BUFFER = 4 << 20  # unix links: up to two ring segments in flight in the kernel
INLINE_SEND_BYTES = 64 << 10  # frames up to this size skip the sending thread when it is idle
# A rank that has sent ABORT keeps its sockets open this long: closing at once could make a
# neighbour see a connection reset (with unread data) before, and instead of, the reason.
ABORT_LINGER_SECONDS = 0.25
# A send that fails on a closed connection looks, this long at most, for the ABORT the peer
# sent before it closed (already received: TCP delivers the bytes before the reset).
NEWS_WAIT_SECONDS = 0.1


class Kind(IntEnum):
    HELLO = 1  # connector -> acceptor: JSON {token, rank, purpose}
    WELCOME = 2  # acceptor -> connector: accepted
    REFUSE = 3  # acceptor -> connector: refused, JSON {reason}
    CONTROL = 4  # JSON payload (rendezvous store)
    DATA = 5  # array payload of a collective
    ABORT = 6  # JSON {origin, reason}: a rank failed; sent both ways round the ring (see abort)
    HEARTBEAT = 7  # "I am alive, waiting on my own left neighbour": resets the peer's timeout


class Op(IntEnum):
    NONE = 0
    ALLREDUCE_SUM = 1
    ALLREDUCE_MEAN = 2
    BROADCAST = 3
    BARRIER = 4


DTYPE_CODES = {
    0: np.dtype(np.uint8),
    1: np.dtype(np.float32),
    2: np.dtype(np.float64),
    3: np.dtype(np.int64),
    4: np.dtype(np.int32),
}
CODE_OF_DTYPE = {dt: code for code, dt in DTYPE_CODES.items()}


@dataclass(frozen=True)
class Frame:
    """A decoded header (the payload, if any, is read separately into the caller's buffer)."""

    kind: int
    op: int = Op.NONE
    dtype: int = 0
    seq: int = 0
    step: int = 0
    part: int = 0
    src: int = 0
    total_len: int = 0
    nbytes: int = 0
    deliver_at: float = 0.0

    def pack(self) -> bytes:
        return HEADER.pack(
            MAGIC, VERSION, self.kind, self.op, self.dtype, self.seq, self.step, self.part,
            self.src, self.total_len, self.nbytes, self.deliver_at,
        )  # fmt: skip

    def describe(self) -> str:
        """Human words for the collective a DATA frame belongs to."""
        op = Op(self.op).name.lower() if self.op in Op._value2member_map_ else f"op {self.op}"
        dtype = DTYPE_CODES.get(self.dtype, f"dtype code {self.dtype}")
        return f"{op} #{self.seq} of {self.total_len} {dtype}"


def decode_header(data: bytes, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> Frame:
    """Parse and validate 48 header bytes; raise ProtocolError saying what is wrong."""
    if len(data) != HEADER.size:
        raise ProtocolError(f"truncated header: {len(data)} of {HEADER.size} bytes")
    magic, version, kind, op, dtype, seq, step, part, src, total_len, nbytes, deliver_at = (
        HEADER.unpack(data)
    )
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {magic!r} (expected {MAGIC!r}): not a pipesgd peer")
    if version != VERSION:
        raise ProtocolError(f"protocol version {version}, this build speaks {VERSION}")
    if kind not in Kind._value2member_map_:
        raise ProtocolError(f"unknown frame kind {kind}")
    if op not in Op._value2member_map_:
        raise ProtocolError(f"unknown op {op}")
    if dtype not in DTYPE_CODES:
        raise ProtocolError(f"unknown dtype code {dtype}")
    if nbytes > max_frame_bytes:
        raise ProtocolError(
            f"frame of {nbytes} bytes exceeds the maximum of {max_frame_bytes} bytes"
        )
    if nbytes % DTYPE_CODES[dtype].itemsize:
        raise ProtocolError(
            f"{nbytes} payload bytes are not a whole number of {DTYPE_CODES[dtype]}"
        )
    if deliver_at != deliver_at or deliver_at < 0:  # NaN or negative
        raise ProtocolError(f"bad deliver_at {deliver_at}")
    return Frame(kind, op, dtype, seq, step, part, src, total_len, nbytes, deliver_at)


class DeviceBytes:
    """A contiguous GPU array as a frame's payload, for a link whose wire takes device memory
    itself (`Link.takes_device_memory`: MPI built with CUDA support). len() is its size in
    bytes, as a memoryview's; `buffer` is what the MPI library gets: the array itself, through
    __cuda_array_interface__, or, in Numba's CUDA simulator (whose "device" memory is host
    memory and has no such interface), the host bytes it wraps."""

    def __init__(self, array):
        self.array = array
        self.nbytes = array.size * array.dtype.itemsize

    def __len__(self) -> int:
        return self.nbytes

    @property
    def buffer(self):
        if hasattr(self.array, "__cuda_array_interface__"):
            return self.array
        return np.asarray(self.array).reshape(-1).view(np.uint8)  # the simulator's host bytes


def as_bytes(array: np.ndarray) -> memoryview:
    """A flat byte view of a contiguous array (no copy): what goes on the wire. A device array
    (Numba's) becomes DeviceBytes, which only a link that takes device memory can move."""
    if not isinstance(array, np.ndarray) and hasattr(array, "copy_to_host"):
        return DeviceBytes(array)
    if not array.flags.c_contiguous:
        raise ValueError("only contiguous arrays can be sent without a copy")
    return memoryview(array.reshape(-1).view(np.uint8))


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

    def __init__(
        self,
        sock: socket.socket,
        rank: int,
        peer: int,
        timeout: float,
        model: LinkModel | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ):
        self.sock = sock
        self.rank = rank
        self.peer = peer
        self.timeout = timeout
        self.model = model or LinkModel()
        self.max_frame_bytes = max_frame_bytes
        self.emulator = LinkEmulator(self.model)
        self.bytes_sent = 0
        self.bytes_received = 0
        self._sender: _Sender | None = None
        # True while a frame is half read: the receive stream is not at a frame boundary, so
        # no ABORT can be looked for in it (see take_news).
        self.mid_frame = False
        self._news_lock = threading.Lock()  # news is read by the main or the sending thread
        self._news_ended = False  # the peer closed this direction: no news can come any more
        self.transport = "unix" if sock.family == socket.AF_UNIX else "tcp"  # shm: ShmLink
        if self.transport == "tcp":
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # headers must not wait
        else:  # a larger buffer: fewer wake-ups per segment (the kernel caps it at wmem_max)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, UNIX_SEND_BUFFER)
        # Blocking calls that give up after POLL_SECONDS (see _recv_exact_into and _send_all).
        sock.settimeout(None)
        slice_ = struct.pack("ll", int(POLL_SECONDS), int(POLL_SECONDS % 1 * 1e6))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, slice_)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, slice_)

    # --- errors -------------------------------------------------------------------------
    def _timeout_error(self, doing: str, timeout: float) -> PeerTimeout:
        return PeerTimeout(
            f"rank {self.rank}: no data from rank {self.peer} for {timeout:.1f} s during "
            f"{doing}; is rank {self.peer} alive (stopped, hung, or overloaded)? "
            f"raise --timeout to wait longer",
            origin=self.peer,
            link=self,
            doing=doing,
        )

    def _closed_error(self, doing: str, detail: str = "") -> PeerClosed:
        more = f" ({detail})" if detail else ""
        return PeerClosed(
            f"rank {self.rank}: rank {self.peer} closed the connection during {doing}{more}; "
            f"it probably exited or crashed: look for its error above",
            origin=self.peer,
            link=self,
            doing=doing,
        )

    def _send_failed(self, doing: str, error: OSError) -> CommError:
        """The error for a send that the peer's closed connection refused. A peer that failed
        because of another rank sends ABORT, naming that rank, on every link before it closes:
        here it arrives on the direction this rank does not send in, before the reset, so a
        neighbour's exit is never taken for the cause when it only passed the failure on."""
        closed = self._closed_error(doing, str(error))
        try:
            news = self.take_news(NEWS_WAIT_SECONDS)
        except CommError:
            return closed  # closed without a word: the peer itself is the cause
        if news is None:
            return closed
        origin, reason = news
        return PeerAborted(
            f"rank {self.rank}: rank {origin} failed, so {doing} cannot finish (news from rank "
            f"{self.peer}, which then closed the connection): {reason}",
            origin=origin,
            link=self,
            doing=doing,
        )

    # --- receiving ------------------------------------------------------------------------
    def _recv_exact_into(
        self,
        view: memoryview,
        doing: str,
        stop: Callable[[], None],
        timeout: float | None = None,
    ) -> None:
        """Fill `view` from the socket: zero-copy recv_into, waiting in slices of POLL_SECONDS.

        The socket is in blocking mode with SO_RCVTIMEO = POLL_SECONDS, and MSG_WAITALL asks the
        kernel to return only when the whole view is full (or the slice ends): one system call
        per segment, where a Python-level timeout would cost a poll() and a recv() per packet.
        """
        got, total = 0, len(view)
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while got < total:
            try:
                n = self.sock.recv_into(view[got:], total - got, socket.MSG_WAITALL)
            except (BlockingIOError, TimeoutError):  # the slice ended with nothing new
                stop()  # raises if another thread of this rank has failed
                if time.monotonic() > deadline:
                    raise self._timeout_error(doing, timeout) from None
                continue
            except OSError as e:  # reset, broken pipe, closed under us
                raise self._closed_error(doing, str(e)) from None
            if n == 0:
                raise self._closed_error(doing, f"after {got} of {total} bytes")
            got += n
            self.mid_frame = True  # until the frame's last byte is read
            deadline = time.monotonic() + timeout  # progress: the peer is alive
        self.bytes_received += total

    def recv_header(
        self, doing: str, stop: Callable[[], None] = lambda: None, timeout: float | None = None
    ) -> Frame:
        raw = bytearray(HEADER.size)
        self._recv_exact_into(memoryview(raw), doing, stop, timeout)
        try:
            frame = decode_header(bytes(raw), self.max_frame_bytes)
        except ProtocolError as e:
            raise ProtocolError(
                f"rank {self.rank}: bad frame from rank {self.peer} during {doing}: {e}; is "
                f"another program (or another job) talking to this port?",
                origin=self.peer,
                link=self,
                doing=doing,
            ) from None
        self.mid_frame = frame.nbytes > 0  # its payload is still to be read
        return frame

    def recv_payload_into(
        self, frame: Frame, out: memoryview, doing: str, stop: Callable[[], None] = lambda: None
    ) -> None:
        """Read the frame's payload into `out` (exactly frame.nbytes long), then honour the
        emulated delivery time."""
        if frame.nbytes != len(out):
            raise CollectiveMismatch(
                f"rank {self.rank}: rank {self.peer} sent {frame.nbytes} bytes during {doing}, "
                f"this rank expected {len(out)}"
            )
        self._recv_exact_into(out, doing, stop)
        self.mid_frame = False
        if frame.deliver_at:
            wait_until(frame.deliver_at, max_wait=self.model.message_time(frame.nbytes) + 1.0)

    def recv_json(self, kind: Kind, doing: str, frame: Frame | None = None) -> dict:
        """Read a JSON control message (its header too, unless already read as `frame`)."""
        frame = frame or self.recv_header(doing)
        if frame.nbytes > 1 << 20:
            raise ProtocolError(f"rank {self.rank}: control message of {frame.nbytes} bytes")
        buf = bytearray(frame.nbytes)
        self._recv_exact_into(memoryview(buf), doing, lambda: None)
        self.mid_frame = False
        if frame.kind == Kind.REFUSE:
            reason = json.loads(buf.decode()).get("reason", "?")
            raise CommError(
                f"rank {self.rank}: rank {self.peer} refused us during {doing}: {reason}"
            )
        if frame.kind != kind:
            raise ProtocolError(
                f"rank {self.rank}: expected a {kind.name} frame from rank {self.peer} during "
                f"{doing}, got {Kind(frame.kind).name}"
            )
        try:
            return json.loads(buf.decode())
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ProtocolError(f"rank {self.rank}: bad JSON from rank {self.peer}: {e}") from None

    # --- sending --------------------------------------------------------------------------
    def send(
        self,
        frame: Frame,
        payload: memoryview | bytes = b"",
        doing: str = "send",
        deliver_at: float | None = None,
    ) -> None:
        """Send one frame now, from the calling thread (paced by the link emulator, unless the
        caller already booked the wire and passes the emulated arrival time `deliver_at`)."""
        if deliver_at is None:
            deliver_at = self.emulator.schedule(len(payload) + HEADER.size)
        header = dataclasses.replace(frame, nbytes=len(payload), deliver_at=deliver_at)
        body = memoryview(payload).cast("B")
        if faults.ARMED and faults.sabotage(self, header.pack(), body):  # tests only
            return
        self._send_all(header.pack(), body, doing)
        self.bytes_sent += HEADER.size + len(payload)

    def send_without_waiting(
        self, frame: Frame, payload: memoryview | bytes, doing: str
    ) -> list[memoryview] | None:
        """Start sending one frame from the calling thread, handing the kernel only what its
        socket buffer takes now (MSG_DONTWAIT: never blocks). Returns the parts still to send
        ([] when all went out; finish the rest with `send_rest` before any other frame). None:
        nothing was started, because the emulated wire is still busy with an earlier frame
        (waiting for it is the sending thread's job) or a test fault is armed."""
        if faults.ARMED or not self.emulator.free_now():
            return None
        deliver_at = self.emulator.schedule(len(payload) + HEADER.size)
        header = dataclasses.replace(frame, nbytes=len(payload), deliver_at=deliver_at)
        body = memoryview(payload).cast("B")
        parts = [memoryview(header.pack()), body] if len(body) else [memoryview(header.pack())]
        try:
            sent = self.sock.sendmsg(parts, [], socket.MSG_DONTWAIT)
        except (BlockingIOError, TimeoutError):
            sent = 0
        except OSError as e:
            raise self._send_failed(doing, e) from None
        self.bytes_sent += HEADER.size + len(body)
        return _drop_sent(parts, sent)

    def send_rest(self, parts: list[memoryview], doing: str) -> None:
        """Finish a frame that `send_without_waiting` started (blocking, with the timeout)."""
        self._send_parts(parts, doing)

    def _send_all(self, header: bytes, payload: memoryview, doing: str) -> None:
        """Send header and payload with one gathering system call (sendmsg) where the kernel
        takes it all: a lone 48-byte header would be its own packet and its own wake-up of the
        receiver. Blocking; SO_SNDTIMEO ends a call that could hand the kernel nothing for
        POLL_SECONDS; `timeout` without any progress is an error."""
        parts = [memoryview(header), payload] if len(payload) else [memoryview(header)]
        self._send_parts(parts, doing)

    def _send_parts(self, parts: list[memoryview], doing: str) -> None:
        deadline = time.monotonic() + self.timeout
        while parts:
            try:
                sent = self.sock.sendmsg(parts)
            except (BlockingIOError, TimeoutError):
                if time.monotonic() > deadline:
                    raise PeerTimeout(
                        f"rank {self.rank}: rank {self.peer} accepted no data for "
                        f"{self.timeout:.1f} s during {doing}; is it alive? raise --timeout to "
                        f"wait longer",
                        origin=self.peer,
                        link=self,
                        doing=doing,
                    ) from None
                continue
            except OSError as e:
                raise self._send_failed(doing, e) from None
            deadline = time.monotonic() + self.timeout
            parts = _drop_sent(parts, sent)

    def send_json(self, kind: Kind, payload: dict, doing: str) -> None:
        self.send(Frame(kind=kind), json.dumps(payload).encode(), doing)

    def send_abort(self, error: BaseException, default_origin: int) -> bool:
        """Tell the peer why the job is failing: an ABORT frame naming the rank at fault
        (the error's `origin`, else `default_origin`). Best effort, within a second: the job
        is failing anyway. True when it was sent."""
        origin = getattr(error, "origin", None)
        payload = {"origin": default_origin if origin is None else origin, "reason": str(error)}
        old_timeout, self.timeout = self.timeout, 1.0
        try:
            self.send_json(Kind.ABORT, payload, "abort")
            return True
        except CommError:
            return False
        finally:
            self.timeout = old_timeout

    def read_abort(self, frame: Frame, doing: str) -> tuple[int | None, str]:
        """(rank at fault, reason) from an ABORT frame whose header was just read."""
        news = self.recv_json(Kind.ABORT, doing, frame=frame)
        origin = news.get("origin")
        return (origin if isinstance(origin, int) else None), str(news.get("reason", "?"))

    def take_news(self, wait: float) -> tuple[int | None, str] | None:
        """(rank at fault, reason) of an ABORT that the peer sent on this link, within `wait`
        seconds; None when none came (or the stream is mid-frame, where none can be read).

        For a link this rank only sends on (the ring's right link; a worker's link to the
        server between two pulls): the peer sends nothing back but ABORT, so the first frame
        that arrives is the news. Raises PeerClosed when the peer closed the connection
        without any (a peer that fails because of another rank always sends it first)."""
        if self._news_ended:
            raise self._closed_error("news", "closed without an ABORT")
        if self.mid_frame:
            return None
        with self._news_lock:  # both threads of a rank may look: one reads, the other waits
            try:
                readable, _, _ = select.select([self.sock], [], [], max(wait, 0.0))
            except (OSError, ValueError):  # closed by this rank meanwhile
                return None
            if not readable:
                return None
            try:
                frame = self.recv_header("news", timeout=1.0)
                while frame.kind == Kind.HEARTBEAT:
                    frame = self.recv_header("news", timeout=1.0)
                if frame.kind != Kind.ABORT:
                    return None  # not news: this link carries data (nothing more is read)
                return self.read_abort(frame, "news")
            except PeerClosed:
                self._news_ended = True
                raise
            except CommError:
                return None  # garbage or silence: no news

    def may_send_inline(self, frame: Frame, nbytes: int) -> bool:
        """Whether a frame of `nbytes` may be sent from the calling thread when the sending
        thread is idle: it fits the socket buffer, so sending cannot block."""
        return nbytes <= INLINE_SEND_BYTES

    def start_sender(self) -> _Sender:
        """A background thread that sends queued frames in order, so a rank can send to one
        neighbour while its main thread receives from another."""
        if self._sender is None:
            self._sender = _Sender(self)
        return self._sender

    def close(self) -> None:
        if self._sender is not None:
            self._sender.stop()
            self._sender = None
        try:
            self.sock.close()
        except OSError:
            pass


class _Sender:
    """The sending thread of a link: frames go out in the order they were queued."""

    def __init__(self, link: Link):
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
            frame, payload, doing = job
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
                    if frame is None:  # the rest of a frame put() started (payload: its parts)
                        self.link.send_rest(payload, doing)
                    else:
                        self.link.send(frame, payload, doing)
                except BaseException as e:  # handed to the main thread by check()
                    self.error, self.cancelled, failed = e, False, True
            with self._idle:
                if go:  # a frame that failed part way stays half sent: nothing may follow it
                    self.half_sent = failed
                self.pending -= 1
                self._idle.notify_all()

    def put(self, frame: Frame, payload: memoryview, doing: str) -> None:
        """Queue a frame. With nothing queued ahead of it, the calling thread starts it at once
        and hands the kernel what its socket buffer takes without waiting; only the rest (if
        any) goes to the sending thread. Waking that thread costs a scheduler wake-up on a busy
        or virtual machine (benchmarks/RESULTS.md), once per ring hop: the latency term of
        every step."""
        with self._idle:
            idle = self.pending == 0
        if idle:
            self.check()
            rest = self.link.send_without_waiting(frame, payload, doing)
            if rest is None and self.link.may_send_inline(frame, len(payload)):
                self.link.send(frame, payload, doing)  # small: fits the buffer, cannot block
                return
            if rest is not None:
                if not rest:
                    return
                frame, payload = None, rest  # the sending thread finishes this frame
        with self._idle:
            self.pending += 1
            if frame is None:
                self.half_sent = True  # its first bytes are on the wire already
        self.jobs.put((frame, payload, doing))

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
            self.put(Frame(kind=Kind.HEARTBEAT), b"", "heartbeat")

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
                    raise PeerTimeout(
                        f"rank {self.link.rank}: could not hand data to rank {self.link.peer} "
                        f"for {timeout:.1f} s; is it alive? raise --timeout to wait longer",
                        origin=self.link.peer,
                        link=self.link,
                    )
                self._idle.wait(min(left, POLL_SECONDS))
        self.check()

    def stop(self) -> None:
        self.jobs.put(None)
        self.thread.join(timeout=1.0)
