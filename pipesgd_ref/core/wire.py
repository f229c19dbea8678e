"""Arrays over plain sockets: one frame is a fixed header, then the array's raw bytes.

    header (20 bytes): magic b"PSG1" | step (uint32) | tag (uint32) | payload bytes (uint64)
    payload:           the array's memory, as it is (no pickle: a peer can send garbage, never
                       code, and a receiver checks the header before it reads a byte more)

Why length-prefixed: TCP delivers a stream of bytes, not messages. The header says where this
frame ends, and (step, tag) say which frame it is, so a receiver that expects another one
raises at once instead of adding the wrong numbers.
"""

from __future__ import annotations

import socket
import struct
import threading

import numpy as np

HEADER = struct.Struct("!4sIIQ")
MAGIC = b"PSG1"


class Link:
    """One end of a socket to rank `peer`, for rank `me`; counts the bytes it sends."""

    def __init__(self, sock: socket.socket, me: int, peer: int, timeout: float | None):
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            # without it the small header waits for an acknowledgement (Nagle's algorithm)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(timeout)  # None: wait forever (a debugger may pause any rank)
        self.sock, self.me, self.peer, self.timeout = sock, me, peer, timeout
        self.bytes_sent = 0

    def send(self, step: int, tag: int, array: np.ndarray) -> None:
        payload = np.ascontiguousarray(array).data.cast("B")  # its bytes (a memoryview)
        try:
            self.sock.sendall(HEADER.pack(MAGIC, step, tag, payload.nbytes))
            self.sock.sendall(payload)  # a break here stops rank `me` at its send
        except OSError as e:
            raise ConnectionError(self._lost(f"could not send step {step} to", e)) from None
        self.bytes_sent += HEADER.size + payload.nbytes

    def recv_into(self, step: int, tag: int, out: np.ndarray) -> np.ndarray:
        """Receive frame (step, tag) into `out`, which must be exactly its size."""
        header = bytearray(HEADER.size)
        self._fill(memoryview(header), step)
        magic, got_step, got_tag, nbytes = HEADER.unpack(header)
        if magic != MAGIC or (got_step, got_tag, nbytes) != (step, tag, out.nbytes):
            raise RuntimeError(
                f"rank {self.me}: expected step {step}, tag {tag}, {out.nbytes} bytes from "
                f"rank {self.peer}; got magic {bytes(magic)!r}, step {got_step}, tag "
                f"{got_tag}, {nbytes} bytes (do both ranks run the same job?)"
            )
        self._fill(out.data.cast("B"), step)
        return out

    def _fill(self, view: memoryview, step: int) -> None:
        while view.nbytes:
            try:
                n = self.sock.recv_into(view)
            except TimeoutError:
                raise TimeoutError(
                    f"rank {self.me}: nothing from rank {self.peer} for {self.timeout} s at "
                    f"step {step}; is rank {self.peer} alive? (a longer --timeout waits more)"
                ) from None
            except OSError as e:
                raise ConnectionError(self._lost(f"lost step {step} from", e)) from None
            if n == 0:
                raise ConnectionError(self._lost(f"waiting for step {step}:", "closed the link"))
            view = view[n:]

    def _lost(self, what: str, why) -> str:
        return f"rank {self.me}: {what} rank {self.peer} ({why}); its own error says why"

    def shut(self) -> None:
        """End the link both ways now: a send or receive waiting on it fails at once, here
        and at the peer (which then names this rank)."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # closed already


def exchange(right: Link, left: Link, step: int, sent: tuple, received: tuple) -> None:
    """Send (tag, array) to the right and receive (tag, out) from the left, at once. The send
    runs on a helper thread: if every rank of a ring only sent first, each would wait for its
    neighbour to read, and no one would (a deadlock once a chunk outgrows the socket buffers)."""
    failed = []

    def send() -> None:
        try:
            right.send(step, *sent)
        except BaseException as e:  # handed to the receiving thread, which raises it
            failed.append(e)

    sender = threading.Thread(target=send, name=f"send-{right.me}")
    sender.start()
    try:
        left.recv_into(step, *received)
    except BaseException:
        right.shut()  # the send may wait for a reader that will never come: end it too
        raise
    finally:
        sender.join()
    if failed:
        raise failed[0]
