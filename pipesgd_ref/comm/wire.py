"""The wire format: what one frame is, and the checks every frame passes on arrival. Every
link (TCP or unix stream sockets: comm/links.py; shared memory: comm/shm.py; MPI: comm/mpi.py)
moves these frames and nothing else.

A frame is a fixed 48-byte header followed by raw array bytes:

    offset  field       type   meaning
    0       magic       4s     b"PSGD": anything else is not our protocol (a port scanner, HTTP...)
    4       version     u8     protocol version; a mismatch is refused, never guessed at
    5       kind        u8     HELLO / WELCOME / REFUSE / CONTROL / DATA / ABORT / HEARTBEAT
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
sends garbage produces a clear error (`decode_header`), not code execution. Control messages
(rendezvous, ABORT news) carry JSON text in their payload.

ABORT news (`News`): {origin, reason}, the rank where a failure began and why, passed from rank
to rank so that every rank's error names it; with {signal, step} when that rank did not fail
but stopped on a signal before that step (a rank of a joined job: runtime/lifetime.py), so that
its peers stop too instead of taking its exit for a crash.

Timing, the same on every link: a wait on a peer is cut into slices of POLL_SECONDS, so that a
failure seen by another thread of this rank (its sending thread), or news of one from another
rank, stops the wait at once instead of after the full timeout; and a rank that has told its
neighbours why it fails keeps its links open ABORT_LINGER_SECONDS before closing them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from pipesgd_ref.errors import ProtocolError

MAGIC = b"PSGD"
VERSION = 1
HEADER = struct.Struct("!4sBBBBQHHIQQd")
HEADER_BYTES = HEADER.size  # 48: the fixed cost of every frame on the wire
assert HEADER_BYTES == 48
DEFAULT_MAX_FRAME_BYTES = 1 << 31  # 2 GiB: larger frames are refused before any allocation
POLL_SECONDS = 0.2  # the slice of every wait: how quickly a rank notices a failure elsewhere
# A rank that has sent ABORT keeps its sockets open this long: closing at once could make a
# neighbour see a connection reset (with unread data) before, and instead of, the reason.
ABORT_LINGER_SECONDS = 0.25


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


DTYPE_CODES: dict[int, np.dtype] = {
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

    def pack(self, nbytes: int | None = None, deliver_at: float | None = None) -> bytes:
        """The 48 header bytes; `nbytes` and `deliver_at`, when given, in place of the frame's
        own. A link sets both on every frame it sends (the payload's size, the emulated
        arrival): packing them straight in costs one struct call, where a second Frame made by
        dataclasses.replace cost about 2 us a frame, a tenth of a small ring hop."""
        nbytes = self.nbytes if nbytes is None else nbytes
        deliver_at = self.deliver_at if deliver_at is None else deliver_at
        fields = (self.kind, self.op, self.dtype, self.seq, self.step, self.part, self.src)
        return HEADER.pack(MAGIC, VERSION, *fields, self.total_len, nbytes, deliver_at)

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
    return array.reshape(-1).view(np.uint8).data  # a memoryview of the same bytes


@dataclass(frozen=True)
class News:
    """What an ABORT frame says: the rank where the story began (None: unknown) and why, and,
    when that rank stopped on a signal instead of failing, the signal and the first step it
    did not run (None: unknown)."""

    origin: int | None
    reason: str
    signal: int = 0
    step: int | None = None

    @property
    def happened(self) -> str:
        """What happened to the rank at the origin: "failed" or "stopped"."""
        return "stopped" if self.signal else "failed"

    def cannot_finish(self, rank: int, what: str, source: str) -> str:
        """The error of a rank whose operation `what` cannot finish because of this news,
        which `source` brought. News naming this very rank (a peer could not read what it
        sent) says that the peer blames it, not that it failed."""
        if self.origin == rank and not self.signal:
            return f"rank {rank}: {source} blames this rank, so {what} cannot finish: {self.reason}"
        return (
            f"rank {rank}: rank {self.origin} {self.happened}, so {what} cannot finish "
            f"({source}): {self.reason}"
        )

    def as_json(self) -> dict:
        payload = {"origin": self.origin, "reason": self.reason}
        if self.signal:
            payload |= {"signal": self.signal, "step": self.step}
        return payload

    @classmethod
    def from_json(cls, payload: dict) -> News:
        """The news of a JSON payload, as a peer sent it (a field of the wrong type: unknown)."""

        def number(key: str) -> int | None:
            value = payload.get(key)
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        signal = number("signal")
        return cls(
            origin=number("origin"),
            reason=str(payload.get("reason", "?")),
            signal=signal if signal is not None and 0 < signal < 128 else 0,
            step=number("step"),
        )
