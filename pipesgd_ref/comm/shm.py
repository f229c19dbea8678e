"""Shared-memory links: a frame's payload through slots both ranks map, its header on the socket.

Why a same-host path is faster. On a socket (tcp or unix) every byte is copied twice by the
kernel: the sender's `send` copies it from the array into a socket buffer, the receiver's
`recv_into` copies it out again, each with the kernel's bookkeeping per packet. Between two
processes on one host the payload can instead be written once into memory that both map, and
read where it lies:

    path        copies per payload byte          what else
    tcp         2 (user -> kernel -> user)       TCP/IP stack, loopback packets of 64 KB
    unix        2 (user -> kernel -> user)       no TCP/IP stack: the buffers are linked, not sent
    shm         1 (user -> slot), the receiver   a 48-byte header on the unix socket per frame
                reads the slot (the ring's add
                reads it where it lies: no copy)

and the ring can go one better: at a reduce-scatter hop the sum of the left neighbour's segment
and this rank's own chunk is written straight into the right neighbour's slot (`claim`), one
pass over the bytes, where a socket path copies the segment in, adds it, and copies the sum out.

One direction of a link (the sender's side) owns a region of N_SLOTS slots of SLOT_BYTES:

    offset  size        written by   meaning
    0       u64         receiver     consumed: slotted frames the receiver is done with
    64      SLOT_BYTES  sender       slot 0
    ...                              slot N_SLOTS - 1

Which frames use a slot: DATA frames with 0 < payload <= SLOT_BYTES (every ring segment: the
ring cuts chunks into segments of comm/schedule.SEGMENT_BYTES). Both ends apply the same rule to
the header, so it needs no flag. Everything else (hello, control JSON, ABORT, heartbeats, a
parameter server's whole-vector pushes and pulls) goes on the socket, as on `unix`.

The k-th slotted frame of a direction uses slot k mod N_SLOTS. The sender waits until the
receiver has released slot k - N_SLOTS (consumed > k - N_SLOTS), writes the payload, then
sends the header: the header on the socket is the "slot full" signal and wakes the receiver
(a blocking recv, after a poll of at most links.SPIN_SECONDS: Link._spin_into), and that
system call orders the payload's stores before it. The receiver reads the header, uses the
slot, then releases it (consumed = k + 1). Only a sender with every slot full polls (backing
off from 20 us to 1 ms), and while it polls it watches the socket: a closed connection is a
dead receiver, silence past --timeout a hung one.

Everything the socket protocol does stays as it is: the agreement check (the header), sequence
numbers, ABORT news, heartbeats, link emulation (the header's deliver_at), timeouts, the job
token (the hello goes first on the socket, and no memory is mapped before it is accepted).

No names, nothing to leak: a region is an anonymous memfd whose file descriptor is handed to
the peer over the unix socket (SCM_RIGHTS) during the hello. It never appears in /dev/shm,
and the kernel frees it when the last process that maps it exits, however it exits (SIGKILL
included): there is no segment to unlink, early or late.

Memory per link: 2 regions x (64 + N_SLOTS * SLOT_BYTES) = 16 MiB of address space, only the
pages actually written are backed (a ring link writes in one direction only).
"""

from __future__ import annotations

import mmap
import os
import socket
import time

import numpy as np

from pipesgd_ref.comm.activity import current
from pipesgd_ref.comm.links import INLINE_SEND_BYTES, Link
from pipesgd_ref.comm.netem import wait_until
from pipesgd_ref.comm.wire import HEADER, POLL_SECONDS, Frame, Kind
from pipesgd_ref.errors import CollectiveMismatch, CommError, PeerTimeout, RendezvousError
from pipesgd_ref.runtime import faults

N_SLOTS = 4  # slots per direction: how far a sender may run ahead of its receiver
SLOT_BYTES = 2 << 20  # = comm/schedule.SEGMENT_BYTES: one ring segment per slot
CONTROL_BYTES = 64  # the consumed counter, alone on its cache line
REGION_BYTES = CONTROL_BYTES + N_SLOTS * SLOT_BYTES
FD_MESSAGE = b"R"  # the one byte that carries a region's file descriptor (SCM_RIGHTS)


def new_region() -> tuple[int, mmap.mmap]:
    """A fresh anonymous shared region (file descriptor, this process's mapping)."""
    fd = os.memfd_create("pipesgd-slots", os.MFD_CLOEXEC)
    os.ftruncate(fd, REGION_BYTES)  # sparse: pages are backed when first written
    return fd, mmap.mmap(fd, REGION_BYTES)


def send_region(sock: socket.socket, fd: int) -> None:
    """Hand `fd` to the peer at the other end of the unix socket `sock`."""
    socket.send_fds(sock, [FD_MESSAGE], [fd])


def recv_fd(sock: socket.socket, rank: int, peer: int, timeout: float) -> int:
    """Receive a file descriptor the peer sent with `send_region` (the caller closes it)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, len(FD_MESSAGE), 1)
            break
        except (BlockingIOError, TimeoutError):  # the socket's receive slice ended
            if time.monotonic() > deadline:
                raise RendezvousError(
                    f"rank {rank}: rank {peer} sent no shared-memory region within "
                    f"{timeout:.1f} s; is it alive?"
                ) from None
    if msg != FD_MESSAGE or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise RendezvousError(
            f"rank {rank}: rank {peer} did not send a shared-memory region (got {msg!r}); does "
            f"it run the same --transport and --allreduce?"
        )
    return fds[0]


def recv_region(sock: socket.socket, rank: int, peer: int, timeout: float) -> mmap.mmap:
    """Receive the peer's region (its file descriptor) and map it."""
    fd = recv_fd(sock, rank, peer, timeout)
    try:
        if os.fstat(fd).st_size != REGION_BYTES:
            raise RendezvousError(
                f"rank {rank}: rank {peer}'s shared-memory region has the wrong size (another "
                f"version of pipesgd?)"
            )
        return mmap.mmap(fd, REGION_BYTES)
    finally:
        os.close(fd)  # the mapping keeps the memory alive


class ShmLink(Link):
    """A Link whose ring-segment payloads travel through shared slots (see the module doc).

    `out_region`: this rank's region for what it sends; `in_region`: the peer's, mapped here,
    for what it receives. The socket under it is a unix stream socket."""

    def __init__(self, sock, rank, peer, timeout, out_region, in_region, **kwargs):
        super().__init__(sock, rank, peer, timeout, **kwargs)
        self.transport = "shm"
        self._out = np.frombuffer(out_region, np.uint8)
        self._in = np.frombuffer(in_region, np.uint8)
        self._consumed_out = self._out[:8].view(np.uint64)  # the peer's progress on ours
        self._consumed_in = self._in[:8].view(np.uint64)  # ours on the peer's
        self._regions = (out_region, in_region)  # kept mapped while the link lives
        self._sent = 0  # slotted frames sent so far
        self._received = 0  # slotted frames received so far
        self._claimed: np.ndarray | None = None  # a slot handed out by claim(), not yet sent
        self._held: int | None = None  # a received slot not yet released

    # --- which frames use a slot --------------------------------------------------------

    @staticmethod
    def slotted(frame: Frame) -> bool:
        return ShmLink.takes_slot(frame.kind, frame.nbytes)

    @staticmethod
    def takes_slot(kind: int, nbytes: int) -> bool:
        """Whether a frame of `kind` with `nbytes` of payload goes through a slot: the rule
        both ends apply (the sender before its header exists, the receiver to the header)."""
        return kind == Kind.DATA and 0 < nbytes <= SLOT_BYTES

    def _slot(self, region: np.ndarray, k: int, nbytes: int) -> np.ndarray:
        start = CONTROL_BYTES + (k % N_SLOTS) * SLOT_BYTES
        return region[start : start + nbytes]

    # --- sending --------------------------------------------------------------------------

    def _slot_free(self) -> bool:
        return self._sent - int(self._consumed_out[0]) < N_SLOTS

    def _wait_for_slot(self) -> None:
        """Block until slot `_sent` is free: the receiver has released the frame that used it
        N_SLOTS frames ago. Polls (there is nothing to block on), watching for a dead peer."""
        if self._slot_free():
            return
        deadline = time.monotonic() + self.timeout
        seen, pause, next_look = int(self._consumed_out[0]), 20e-6, 0.0
        while not self._slot_free():
            now = time.monotonic()
            if self._sender is not None and self._sender.cancelled:
                raise CommError("sending cancelled: the collective failed")
            if (consumed := int(self._consumed_out[0])) != seen:  # progress: the peer is alive
                seen, deadline = consumed, now + self.timeout
            if now > next_look:  # is the receiver still there?
                next_look = now + POLL_SECONDS / 20
                try:
                    if self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                        raise self._send_failed(ConnectionResetError("connection closed"))
                except (BlockingIOError, TimeoutError):
                    pass
                except OSError as e:
                    raise self._send_failed(e) from None
            if now > deadline:
                raise PeerTimeout(
                    f"rank {self.rank}: rank {self.peer} took no data from its shared-memory "
                    f"slots for {self.timeout:.1f} s during {current()}; is it alive? raise "
                    f"--timeout to wait longer",
                    origin=self.peer,
                    link=self,
                    doing=current(),
                )
            time.sleep(pause)
            pause = min(2 * pause, 1e-3)

    def _put_in_slot(self, payload) -> None:
        """Copy a slotted frame's payload into its slot (free: checked or waited for)."""
        body = np.frombuffer(memoryview(payload).cast("B"), np.uint8)
        np.copyto(self._slot(self._out, self._sent, body.size), body)

    def _header_for(self, frame: Frame, nbytes: int, deliver_at: float | None) -> bytes:
        """The header bytes of `frame` with `nbytes` of payload, booked on the emulated wire
        unless the caller did (`deliver_at`)."""
        if deliver_at is None:
            deliver_at = self.emulator.schedule(nbytes + HEADER.size)
        return frame.pack(nbytes, deliver_at)

    def send(self, frame, payload=b"", *, deliver_at=None) -> None:
        nbytes = len(payload)
        if not self.takes_slot(frame.kind, nbytes):
            super().send(frame, payload, deliver_at=deliver_at)
            return
        header = self._header_for(frame, nbytes, deliver_at)
        # tests only: the fault acts on the socket (the payload would have gone to a slot)
        if faults.ARMED and faults.sabotage(self, header, payload, on_socket=False):
            return
        self._wait_for_slot()
        self._put_in_slot(payload)
        self._send_header(header, nbytes)

    def _send_header(self, header: bytes, nbytes: int) -> None:
        self._sent += 1
        self._send_all(header, memoryview(b""))
        self.bytes_sent += HEADER.size + nbytes

    def send_without_waiting(self, frame, payload):
        """As Link's, for a slotted frame: copied into its slot and the header sent now, when
        a slot is free; None (the sending thread will wait for one) when none is."""
        if faults.ARMED or not self.emulator.free_now():
            return None
        nbytes = len(payload)
        if not self.takes_slot(frame.kind, nbytes):
            return super().send_without_waiting(frame, payload)
        if not self._slot_free():
            return None
        header = self._header_for(frame, nbytes, None)
        self._put_in_slot(payload)
        self._sent += 1
        self.bytes_sent += HEADER.size + nbytes
        parts = [memoryview(header)]
        try:
            sent = self.sock.sendmsg(parts, [], socket.MSG_DONTWAIT)
        except (BlockingIOError, TimeoutError):
            sent = 0
        except OSError as e:
            raise self._send_failed(e) from None
        return [parts[0][sent:]] if sent < HEADER.size else []

    def may_send_inline(self, frame: Frame, nbytes: int) -> bool:
        # A slotted frame may have to wait for a slot: never on the caller's thread, or two
        # neighbours each waiting for the other's slots would never receive.
        return not self.takes_slot(frame.kind, nbytes) and nbytes <= INLINE_SEND_BYTES

    # --- the ring's one-pass hop: compute straight into the right neighbour's slot --------

    def claim(self, nbytes: int) -> np.ndarray | None:
        """The next slot as a writable byte array, when one is free now and nothing is queued
        ahead of it (frames leave in order); None otherwise (then send as usual). Fill it,
        then `send_claimed` before anything else is sent on this link."""
        sender = self._sender
        busy = sender is not None and (sender.pending or sender.half_sent or sender.error)
        if busy or faults.ARMED or not 0 < nbytes <= SLOT_BYTES or not self._slot_free():
            return None
        if not self.emulator.free_now():
            return None
        self._claimed = self._slot(self._out, self._sent, nbytes)
        return self._claimed

    def send_claimed(self, frame: Frame) -> None:
        """Send the header of the claimed slot, now filled."""
        claimed = self._claimed
        assert claimed is not None  # claim() returned a slot
        nbytes, self._claimed = claimed.size, None
        self._send_header(self._header_for(frame, nbytes, None), nbytes)

    # --- receiving ------------------------------------------------------------------------

    def recv_header(self, *, stop=lambda: None, timeout=None) -> Frame:
        frame = super().recv_header(stop=stop, timeout=timeout)
        if self.slotted(frame):
            self.mid_frame = False  # its payload is in a slot: the stream is between frames
        return frame

    def recv_payload_into(self, frame, out, *, stop=lambda: None) -> None:
        if not self.slotted(frame) or self._held is not None:
            super().recv_payload_into(frame, out, stop=stop)
            return
        got = self.payload_view(frame, len(out))
        np.copyto(np.frombuffer(out, np.uint8), got)
        self.release()

    def payload_view(self, frame: Frame, out_len: int) -> np.ndarray:
        """The slotted frame's payload where it lies (no copy), after its emulated delivery
        time; `release()` once it is no longer read."""
        if frame.nbytes != out_len:  # as Link.recv_payload_into checks
            raise CollectiveMismatch(
                f"rank {self.rank}: rank {self.peer} sent {frame.nbytes} bytes during {current()}, "
                f"this rank expected {out_len}"
            )
        if frame.deliver_at:
            wait_until(frame.deliver_at, max_wait=self.spec.message_time(frame.nbytes) + 1.0)
        self._held = self._received
        self.bytes_received += frame.nbytes
        return self._slot(self._in, self._received, frame.nbytes)

    def release(self) -> None:
        """The received slot is free for the peer to write again."""
        self._received += 1
        self._consumed_in[0] = self._received
        self._held = None

    def close(self) -> None:
        super().close()
        self._out = self._in = self._consumed_out = self._consumed_in = self._claimed = None  # type: ignore[assignment]  # closed: views dropped so the mappings can close
