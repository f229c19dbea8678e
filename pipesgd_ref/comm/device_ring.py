"""Ring AllReduce of a GPU-resident array: only the chunks in flight cross to the host.

The schedule, the frames and the order of additions are exactly those of the host ring (the
same loop, comm/ring.py's `RingReduce`, with the same headers and checks), so a device rank
and a host rank can sit in one ring, and the result is bitwise the host ring's. What changes
is where each segment is between the wire and the array:

    reduce-scatter, per segment:  socket -> pinned slot -> device scratch (H2D)
                                  add_into(array[s:e], scratch) on the device
                                  array[s:e] -> the same pinned slot (D2H) -> socket (forwarded)
    all-gather, per segment:      socket -> pinned slot -> array[s:e] (H2D) -> socket
    step 0:                       array[s:e] -> pinned slot (D2H) -> socket

Why pinned (page-locked) host buffers: the GPU copies them by DMA, directly and at full PCIe
speed; pageable memory would first be staged through a driver buffer. Pinning is slow to set
up, so the slots are allocated once per size and dtype (per thread) and reused by every call.

Why a ring of slots, and how many: the sending thread sends a slot's bytes after `put` returns,
so a slot is reused only once its frame is on the wire (`_Sender.wait_pending`). With fewer
slots than the segments of the first chunk, every rank could block at step 0 waiting for its own
sender while no rank is receiving: a deadlock. One more slot than that (`n_slots` below) rules
it out: after its first chunk a rank only forwards what it received, so the frames waiting on
all the wires together number at most p x (segments of a chunk), fewer than every rank would
need waiting at once. Extra memory per rank: (segments per chunk + 1) pinned segments and one
device segment, O(M/p).

The mean: the owner of a chunk divides it on the host, in the pinned slot, exactly as the host
ring does (x / p, not x * (1/p): the same bits), copies it back to the device and forwards it.

Cost per rank, beside the host ring's 2(p-1)/p * M bytes on the wire: over PCIe M bytes device
to host and 2(p-1)/p * M host to device (plus M/p for the owner's mean), and (p-1)/p * M
additions on the GPU. The copies are synchronous, on the default stream: each one waits for the
kernels that wrote its part of the array.

With a codec other than none, the compressed ring (comm/compressed_ring.py) runs on a host copy of
the whole array (one D2H and one H2D of M bytes per call; O(M) pinned memory): its codecs
re-encode partial sums on the host.

Direct, when the wire takes device memory (`Link.takes_device_memory`: MPI built with CUDA
support, comm/mpi.py's cuda_aware()): no pinned slots at all but one for the owner's mean.
Frames are sent from the array itself and received into it (all-gather) or into one device
scratch segment (reduce-scatter), as the host ring does with host memory, and the library moves
device memory by whatever path it has (GPUDirect RDMA, CUDA IPC between ranks of one host).
Before MPI reads a segment a kernel wrote, the device is synchronised (`DirectDeviceRingReduce`).
The bytes on the wire are the same, so a direct rank and a staged one can share a ring.

In Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1) "device" arrays are host arrays in disguise
and pinned arrays plain NumPy ones: the same code runs, the copies are memcpys.
"""

from __future__ import annotations

import threading

import numpy as np

from pipesgd_ref.comm.collectives import allreduce, tally
from pipesgd_ref.comm.communicator import Communicator
from pipesgd_ref.comm.frames import aborting_on_error
from pipesgd_ref.comm.ring import RingReduce
from pipesgd_ref.comm.schedule import SEGMENT_BYTES
from pipesgd_ref.comm.wire import Op

_local = threading.local()  # per thread: pinned slots and device scratch, reused across calls


def _pinned(shape: tuple[int, ...], dtype) -> np.ndarray:
    """A page-locked host buffer of this shape and dtype, allocated once per thread."""
    from numba import cuda

    cache = _local.__dict__.setdefault("pinned", {})
    key = (shape, np.dtype(dtype))
    if key not in cache:
        cache[key] = cuda.pinned_array(shape, dtype=np.dtype(dtype))
    return cache[key]


def _device_scratch(n: int, dtype):
    """A device buffer of n elements, allocated once per thread, size and dtype."""
    from numba import cuda

    cache = _local.__dict__.setdefault("scratch", {})
    key = (n, np.dtype(dtype))
    if key not in cache:
        cache[key] = cuda.device_array(n, dtype=np.dtype(dtype))
    return cache[key]


def device_allreduce(
    comm: Communicator,
    array,
    op: str = "mean",
    codec=None,
    ops=None,
    segment_bytes: int = SEGMENT_BYTES,
):
    """Sum (or mean) the device array `array` across all ranks, in place; returns it.

    `array`: a contiguous 1-D float32 or float64 Numba device array, the same length and dtype
    on every rank. `ops`: the backend whose `add_into` reduces on the device (default: the
    "cuda" backend). `codec`: as in collectives.allreduce (compressed: on a host copy, see
    above). Every rank ends with bitwise the bytes the host ring would give. Counted
    in comm's tally of AllReduces as the ring (comm/collectives.py).
    """
    if op not in ("sum", "mean"):
        raise ValueError(f"allreduce op must be 'sum' or 'mean', got {op!r}")
    _check_device_array(array)
    if codec is not None and codec.name != "none":
        # O(M): the compressed ring's host copy (pinning 0 bytes is an error on some drivers)
        host = _pinned((array.size,), array.dtype) if array.size else np.empty(0, array.dtype)
        array.copy_to_host(host)
        allreduce(comm, host, op, codec=codec, segment_bytes=segment_bytes)  # the ring
        array.copy_to_device(host)
        return array
    if ops is None:
        from pipesgd_ref.ops import get_backend

        ops = get_backend("cuda")
    code = Op.ALLREDUCE_SUM if op == "sum" else Op.ALLREDUCE_MEAN
    kind = DirectDeviceRingReduce if takes_device_memory(comm) else DeviceRingReduce
    ring = kind(comm, array, code, segment_bytes, ops)
    aborting_on_error(comm, ring.run)
    tally(comm, "ring", array, ring.sent)
    return array


def takes_device_memory(comm: Communicator) -> bool:
    """Whether both of comm's ring links move device memory themselves (the direct path)."""
    links = (comm.left, comm.right)
    return all(link is not None and link.takes_device_memory for link in links)


def _check_device_array(array) -> None:
    if isinstance(array, np.ndarray) or not hasattr(array, "copy_to_host"):
        raise ValueError(
            "device_allreduce takes a Numba CUDA device array (host arrays: collectives.allreduce)"
        )
    if len(array.shape) != 1 or not array.is_c_contiguous():
        raise ValueError("collectives take a contiguous 1-D array (the flat buffer)")
    if array.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise ValueError(f"dtype {array.dtype} is not supported here; use float32 or float64")


class DeviceRingReduce(RingReduce):
    """The ring's loop (comm/ring.py) on a device array: every frame is staged through a
    ring of pinned slots, and the additions run on the device (`ops.add_into`)."""

    where = "device"

    def __init__(self, comm: Communicator, flat, op: Op, segment_bytes: int, ops):
        super().__init__(comm, flat, op, segment_bytes)
        self.ops = ops

    def prepare(self, largest: int, per: int) -> None:
        width = max(1, min(per, largest))  # elements per slot: one segment
        # One more slot than the segments of a chunk: no deadlock at step 0 (module docstring).
        self.n_slots = -(-largest // per) + 1
        self.slots = _pinned((self.n_slots, width), self.dtype)
        self.scratch = _device_scratch(width, self.dtype)

    def next_slot(self, n: int) -> np.ndarray:
        """The next slot, once free, as n elements: with at most n_slots - 1 frames still
        pending, the one queued n_slots frames ago (this slot's last use) is on the wire."""
        self.sender.wait_pending(self.n_slots - 1, self.comm.timeout)
        return self.slots[self.queued % self.n_slots, :n]

    def outgoing(self, s: int, e: int) -> np.ndarray:
        slot = self.next_slot(e - s)
        if e > s:
            self.flat[s:e].copy_to_host(slot)  # D2H: the sync point after the kernels
        return slot

    def inbox(self, s: int, e: int, gathering: bool) -> np.ndarray:
        return self.next_slot(e - s)

    def reduce(self, slot: np.ndarray, s: int, e: int, last: bool) -> np.ndarray:
        if e > s:
            flat = self.flat
            tmp = self.scratch[: e - s]
            tmp.copy_to_device(slot)  # H2D: the running sum of the ranks before us
            self.ops.add_into(flat[s:e], tmp)  # our term joins on the device: same bits as host
            flat[s:e].copy_to_host(slot)  # D2H: what the next hop needs
            if last and self.op == Op.ALLREDUCE_MEAN:
                # The owner divides once, on the host as the host ring does (same bits),
                # and everyone, itself included, keeps these bytes.
                slot /= self.dtype.type(self.comm.world_size)
                flat[s:e].copy_to_device(slot)
        return slot  # forwarded at once: the next hop needs it now

    def place(self, got: np.ndarray, s: int, e: int) -> np.ndarray:
        if e > s:
            self.flat[s:e].copy_to_device(got)  # H2D into place (`got` is the pinned slot)
        return got  # forwarded from the same slot


class DirectDeviceRingReduce(DeviceRingReduce):
    """The ring's loop on a device array whose links take device memory (module docstring:
    "Direct"): frames leave from the array and arrive into it or into one device scratch
    segment, additions on the device; only the owner's mean passes through a pinned slot
    (divided on the host, as the host ring divides: the same bits)."""

    where = "device, direct"

    def prepare(self, largest: int, per: int) -> None:
        from numba import cuda

        width = max(1, min(per, largest))
        self.scratch = _device_scratch(width, self.dtype)
        self.slot = _pinned((width,), self.dtype)
        cuda.synchronize()  # the kernels that wrote the array are done before MPI reads it

    # Where frames leave from and arrive into: the host ring's own hooks (the array's slices,
    # one scratch segment), here on device memory.
    outgoing = RingReduce.outgoing
    inbox = RingReduce.inbox
    place = RingReduce.place

    def reduce(self, got, s: int, e: int, last: bool):
        dst = self.flat[s:e]
        if e > s:
            from numba import cuda

            self.ops.add_into(dst, got)  # the running sum arrived, our term joins
            if last and self.op == Op.ALLREDUCE_MEAN:
                slot = self.slot[: e - s]
                dst.copy_to_host(slot)
                slot /= self.dtype.type(self.comm.world_size)  # the owner scales once
                dst.copy_to_device(slot)
            cuda.synchronize()  # MPI reads dst next: the addition must be done
        return dst
