"""One thread drives both directions of a ring hop: sends to the right, receives from the left.

Every ring step sends a segment to the right neighbour while receiving one from the left. A
sending thread per link does that with blocking calls, but each hop then has to wake that thread
(a futex and a context switch, 0.1-0.5 ms on a busy virtual machine), and the two threads of a
rank take turns at the GIL. On 4 ranks sharing 2 cores those hand-overs are a large part of the
time. `Duplex` does both directions from the calling thread, with system calls that never block:

    loop:
        hand the right socket as much of the next outgoing frame as it takes now  (MSG_DONTWAIT)
        read whatever the left socket holds into the expected frame's buffer      (MSG_DONTWAIT)
        a frame complete -> check its header, run its `then` (reduce, queue a forward)
        neither moved    -> select() on the two sockets, until the nearest timer

The outgoing frames leave in the order they were queued, the incoming ones are expected in a
fixed order (the collective's schedule), and each expected frame's `then` runs before the next
frame is read: a caller can receive every segment into the same scratch buffer.

Link emulation (netem.py) needs no sleeping thread: a frame leaves when the emulated wire is
free (`LinkEmulator.book`), and a received frame counts as arrived at its `deliver_at`; both are
timers of the loop, and the other direction keeps moving meanwhile.

Failures are the same errors, with the same words, as the blocking calls of transport.py:
no progress on a direction for the link's timeout (PeerTimeout naming the silent peer), a closed
connection (PeerClosed), a bad header (ProtocolError), a frame of another collective
(CollectiveMismatch), an ABORT from the left (PeerAborted, naming the rank at fault).
HEARTBEAT frames from the left reset the wait; while this rank waits on its left with nothing to
send, it sends HEARTBEATs to its right, so only the neighbour of a silent rank times out.
"""

from __future__ import annotations

import dataclasses
import select
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from pipesgd_ref.comm.transport import (
    HEADER,
    POLL_SECONDS,
    CollectiveMismatch,
    CommError,
    Frame,
    Kind,
    Link,
    PeerAborted,
    PeerTimeout,
    ProtocolError,
    _drop_sent,
    decode_header,
    frame_mismatch,
)

FINISH_SECONDS = 1.0  # after a failure: how long a half-sent frame is given to finish


@dataclass
class _Out:
    frame: Frame
    payload: memoryview
    doing: str
    ready_at: float  # when it was queued (emulation: it may depart no earlier)
    parts: list[memoryview] | None = None  # set once started: what is left to hand the kernel


@dataclass
class _In:
    want: Frame  # kind, seq, op, dtype, total_len, step and part it must carry
    out: memoryview
    doing: str
    then: Callable[[], None] | None
    header: bytearray = field(default_factory=lambda: bytearray(HEADER.size))
    got: Frame | None = None  # the decoded header, once read
    done: int = 0  # bytes of the current piece (header, then payload) read so far
    due: float | None = None  # emulation: payload read, waiting for its delivery time


class Duplex:
    """The frames of one collective on a rank's two ring links, pumped by one thread."""

    def __init__(self, left: Link, right: Link):
        self.left, self.right = left, right
        self.outgoing: deque[_Out] = deque()
        self.incoming: deque[_In] = deque()
        self.lost = False  # the right link failed (see _lost_right)
        # Whatever a sending thread still holds on the right link goes out first.
        if right._sender is not None:
            right._sender.flush(right.timeout)

    def send(self, frame: Frame, payload: memoryview, doing: str) -> None:
        """Queue a frame for the right neighbour (sent by `run`, in order)."""
        if self.lost:  # the right link failed: nothing more goes out
            return
        self.outgoing.append(_Out(frame, memoryview(payload).cast("B"), doing, time.monotonic()))

    def expect(
        self, want: Frame, out: memoryview, doing: str, then: Callable[[], None] | None = None
    ) -> None:
        """Queue the next frame expected from the left: `want`'s header, its payload read into
        `out` (exactly len(out) bytes), then `then()` called."""
        self.incoming.append(_In(want, memoryview(out).cast("B"), doing, then))

    # --- the loop ---------------------------------------------------------------------------
    def run(self) -> None:
        """Until every queued frame has left and every expected one has arrived (a `then` may
        queue more of either). On a failure, the frame half handed to the right socket is
        given FINISH_SECONDS to complete, so that the link can still carry an ABORT."""
        try:
            self._loop()
        except BaseException:
            self._finish_half_sent()
            raise

    def _loop(self) -> None:
        left, right = self.left, self.right
        now = time.monotonic()
        recv_quiet_since = send_quiet_since = now  # the last progress in each direction
        last_heartbeat = now
        while self.outgoing or self.incoming:
            wake_at = now + POLL_SECONDS
            moved = False
            # Out: start the head frame when the (emulated) wire is free, then feed the kernel.
            if self.outgoing:
                head = self.outgoing[0]
                if head.parts is None:
                    head.parts = self._start(head)
                    if head.parts is None:  # the emulated wire is busy until wire_free
                        wake_at = min(wake_at, right.emulator.wire_free)
                        send_quiet_since = now
                if head.parts:
                    try:
                        if self._send_some(head):
                            moved, send_quiet_since = True, now
                    except CommError as e:
                        self._lost_right(e)
                if head.parts is not None and not head.parts:
                    self.outgoing.popleft()
                    right.half_sent = False
                    moved = True
            # In: read what has arrived for the expected frame; complete it when due.
            reading = False
            if self.incoming:
                item = self.incoming[0]
                if item.due is None:
                    n = self._recv_some(item)
                    if n:
                        moved, recv_quiet_since = True, now
                    reading = item.due is None
                if item.due is not None:
                    if item.due <= time.monotonic():
                        self.incoming.popleft()
                        if item.then is not None:
                            item.then()
                        moved, recv_quiet_since = True, time.monotonic()
                    else:
                        wake_at = min(wake_at, item.due)
            if moved:
                now = time.monotonic()
                continue
            # Nothing moved: check the clocks, say we are alive, then wait for a socket.
            now = time.monotonic()
            if reading and now - recv_quiet_since > left.timeout:
                raise left._timeout_error(self.incoming[0].doing)
            if self.outgoing and self.outgoing[0].parts and now - send_quiet_since > right.timeout:
                self._lost_right(
                    PeerTimeout(
                        f"rank {right.rank}: rank {right.peer} accepted no data for "
                        f"{right.timeout:.1f} s during {self.outgoing[0].doing}; is it alive? "
                        f"raise --timeout to wait longer",
                        origin=right.peer,
                    )
                )
            quiet = now - max(last_heartbeat, recv_quiet_since)
            if reading and not self.outgoing and quiet >= POLL_SECONDS:
                # Waiting on the left with nothing to send: tell the right we are alive.
                self.send(Frame(kind=Kind.HEARTBEAT), b"", "heartbeat")
                last_heartbeat = now
                continue
            want_read = [left.sock] if reading else []
            want_write = [right.sock] if self.outgoing and self.outgoing[0].parts else []
            wait = max(0.0, wake_at - now)
            if want_read or want_write or wait:
                select.select(want_read, want_write, [], wait)
            now = time.monotonic()

    def _lost_right(self, error: CommError) -> None:
        """The right link failed. That may be the echo of a failure further round the ring,
        whose news (an ABORT naming the rank at fault) is on its way from the left: listen
        there for POLL_SECONDS, without sending, before reporting the right's own failure."""
        self.outgoing.clear()
        self.lost = True
        deadline = time.monotonic() + POLL_SECONDS
        try:
            while self.incoming and (left := deadline - time.monotonic()) > 0:
                item = self.incoming[0]
                if item.due is None:
                    self._recv_some(item)
                if item.due is not None:
                    self.incoming.popleft()  # its `then` is not run: the collective is lost
                else:
                    select.select([self.left.sock], [], [], left)
        except PeerAborted:
            raise  # names the rank where it started
        except CommError:
            pass  # the left failed too: the right's failure is the one to report
        raise error

    def _start(self, item: _Out) -> list[memoryview] | None:
        """Book the wire for the head frame and pack its header; None while the emulated wire
        is still busy."""
        right = self.right
        size = HEADER.size + len(item.payload)
        deliver_at = right.emulator.book(size, item.ready_at)
        if deliver_at is None:
            return None
        header = dataclasses.replace(item.frame, nbytes=len(item.payload), deliver_at=deliver_at)
        packed = header.pack()
        from pipesgd_ref import faults

        if faults.ARMED and faults.sabotage(right, packed, item.payload):  # tests only
            return []
        right.bytes_sent += size
        return [memoryview(packed), item.payload] if len(item.payload) else [memoryview(packed)]

    def _send_some(self, item: _Out) -> int:
        right = self.right
        try:
            sent = right.sock.sendmsg(item.parts, [], socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError as e:
            raise right._closed_error(item.doing, str(e)) from None
        item.parts = _drop_sent(item.parts, sent)
        right.half_sent = bool(item.parts)
        return sent

    def _recv_some(self, item: _In) -> int:
        """Read what the left socket holds into the expected frame (header, then payload);
        sets `item.due` once the payload is complete. Bytes read."""
        left, total = self.left, 0
        while item.due is None:
            if item.got is None:
                view, have = memoryview(item.header), item.done
            else:
                view, have = item.out, item.done
            if have < len(view):
                try:
                    n = left.sock.recv_into(view[have:], len(view) - have, socket.MSG_DONTWAIT)
                except (BlockingIOError, InterruptedError):
                    return total
                except OSError as e:
                    raise left._closed_error(item.doing, str(e)) from None
                if n == 0:
                    raise left._closed_error(item.doing, f"after {have} of {len(view)} bytes")
                total += n
                item.done += n
                left.bytes_received += n
                if item.done < len(view):
                    return total
            if item.got is None:
                self._header_read(item)
            else:
                item.due = self._arrival(item.got)
        return total

    def _header_read(self, item: _In) -> None:
        left = self.left
        try:
            got = decode_header(bytes(item.header), left.max_frame_bytes)
        except ProtocolError as e:
            raise ProtocolError(
                f"rank {left.rank}: bad frame from rank {left.peer} during {item.doing}: {e}; "
                f"is another program (or another job) talking to this port?",
                origin=left.peer,
            ) from None
        item.done = 0
        if got.kind == Kind.HEARTBEAT:  # the left neighbour is alive and waiting: keep waiting
            return
        if got.kind == Kind.ABORT:  # a rank upstream failed: pass its story on
            origin, reason = left.read_abort(got, item.doing)
            raise PeerAborted(
                f"rank {left.rank}: rank {origin} failed, so {item.doing} cannot finish "
                f"(news from rank {left.peer}): {reason}",
                origin=origin,
            )
        error = frame_mismatch(left, got, item.want)
        if error is not None:
            raise error
        if got.nbytes != len(item.out):
            raise CollectiveMismatch(
                f"rank {left.rank}: rank {left.peer} sent {got.nbytes} bytes during "
                f"{item.doing}, this rank expected {len(item.out)}",
                origin=left.peer,
            )
        item.got = got
        if not len(item.out):
            item.due = self._arrival(got)

    def _arrival(self, got: Frame) -> float:
        """When a received frame counts as arrived: now, or its emulated delivery time (never
        more than one message time plus a second away: see netem.wait_until)."""
        now = time.monotonic()
        if not got.deliver_at:
            return now
        return min(got.deliver_at, now + self.left.model.message_time(got.nbytes) + 1.0)

    def _finish_half_sent(self) -> None:
        """After a failure: drop the frames not started; finish the one half handed to the
        kernel (within FINISH_SECONDS), so that the right link is between frames again."""
        head = self.outgoing[0] if self.outgoing else None
        self.outgoing.clear()
        self.incoming.clear()
        if head is None or not head.parts or not self.right.half_sent:
            return
        right, old = self.right, self.right.timeout
        right.timeout = FINISH_SECONDS
        try:
            right.send_rest(head.parts, "finishing a frame after a failure")
            right.half_sent = False
        except CommError:
            pass  # still half sent: Communicator.abort will not send on this link
        finally:
            right.timeout = old


__all__ = ["Duplex"]
