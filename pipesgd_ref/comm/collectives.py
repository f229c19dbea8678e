"""The job's collectives: the AllReduce the job asked for, and what ran.

`allreduce` is what a method calls to reduce its gradients. It checks its arguments, then runs
one of five algorithms on this rank:

    ring              comm/ring.py: 2(p-1) hops to the right neighbour (with a codec: the
                      compressed ring; with both links shared memory: the slot hop)
    rd, rab           comm/mesh.py: recursive doubling, Rabenseifner, over the mesh links
    oneshot, twoshot  comm/shm_group.py: one host's shared-memory group

The algorithm is the caller's `algorithm`, else the job's (`JobSpec.allreduce`); under "auto"
comm/choose.py picks, per message size and once per communicator, the one whose calibrated
model is fastest. Every rank picks the same algorithm for a message, and every rank ends with
the same bits (the group adds in the ring's order; rd and rab in their own: comm/algorithms.py).

What ran is counted where it ran: each call adds to the communicator's tally (calls and payload
bytes sent) under its (algorithm, transport, dtype, message bytes), which
`Communicator.allreduce_ran` lists and a method hands back in its result (summary.json's
`allreduce_ran`). The bytes counted are the payload this rank handed to its peers: the ring's
frames to the right, rd's and rab's to every mesh peer, and in the group what this rank wrote
into shared memory for the others to read; comm/choose.py's `sent_volume` is the same figure per
byte of message. Frame headers are not in the tally (they are in `Communicator.bytes_sent`).

The ring's own collectives (barrier, broadcast) are comm/ring.py's, and are re-exported here:
a caller imports the collectives from this module.
"""

from __future__ import annotations

import numpy as np

from pipesgd_ref.comm import choose, mesh, shm_group
from pipesgd_ref.comm.communicator import Communicator
from pipesgd_ref.comm.frames import aborting_on_error
from pipesgd_ref.comm.ring import barrier, broadcast, checked, ring_reducer
from pipesgd_ref.comm.schedule import SEGMENT_BYTES
from pipesgd_ref.comm.wire import Op
from pipesgd_ref.errors import CommError

__all__ = ["allgather", "allreduce", "barrier", "broadcast", "tally", "transport_of"]


def allreduce(
    comm: Communicator,
    array: np.ndarray,
    op: str = "sum",
    out: np.ndarray | None = None,
    segment_bytes: int = SEGMENT_BYTES,
    codec=None,
    algorithm: str | None = None,
) -> np.ndarray:
    """Sum (or mean) `array` across all ranks: in place, or into `out` when given (then
    `array` is left as it was). Returns the reduced array.

    `array` must be a contiguous 1-D float32 or float64 array of the same length and dtype on
    every rank (checked). Any length works, 0 and fewer than p included. With a `codec`
    (pipesgd_ref.codecs) other than "none", every hop is compressed: see comm/compressed_ring.py.

    `algorithm`: "ring", "rd", "rab" (comm/mesh.py), "oneshot" or "twoshot" (comm/shm_group.py);
    None: what the job asked for (`JobSpec.allreduce`), where "auto" picks per message the
    algorithm whose calibrated model is fastest (comm/choose.py). Every rank must pick the same.
    """
    array, code = checked(array, op, out)
    compressed = codec is not None and codec.name != "none"
    algo = "ring" if compressed else choose.algorithm_for(comm, array.nbytes, algorithm)
    if algo in shm_group.ALGORITHMS:
        sent = aborting_on_error(comm, _in_group, comm, array, code, algo)
    elif algo != "ring":
        sent = aborting_on_error(comm, mesh.reduce_by_schedule, comm, array, code, algo)
    else:
        ring = ring_reducer(comm, array, code, segment_bytes, codec)
        aborting_on_error(comm, ring.run)
        sent = ring.sent
    tally(comm, algo, array, sent)
    return array


def _in_group(comm: Communicator, array: np.ndarray, code: Op, algo: str) -> int:
    """The AllReduce through one host's shared-memory group (comm/shm_group.py); a failure is
    told to the whole group before the ring neighbours hear of it. Returns the bytes this rank
    wrote for the others."""
    seq = comm.next_seq()
    if comm.world_size == 1:
        return 0  # the sum of one array is itself; the mean divides by 1
    group = comm.group
    assert group is not None  # the caller picked the group's path: the group formed
    try:
        return group.allreduce(array, code, seq, algo)
    except CommError as e:
        group.abort(e)
        raise


def transport_of(comm: Communicator, algo: str) -> str:
    """What carried an AllReduce by `algo`: "shm" for the shared-memory group, else the links'
    transport (the mesh links' for rd and rab, the right link's for the ring; "tcp", "unix",
    "shm", "mpi"); "none" when this rank has no link (a job of one rank)."""
    if algo in shm_group.ALGORITHMS:
        return "shm" if comm.world_size > 1 else "none"
    if algo != "ring" and comm.mesh:
        return next(iter(comm.mesh.values())).transport
    right = comm.right
    return right.transport if right is not None else "none"


def tally(comm: Communicator, algo: str, array, sent: int) -> None:
    """Add one AllReduce of `array` by `algo`, which sent `sent` payload bytes, to comm's tally
    (module docstring). `array`: a host array, or a device one (comm/device_ring.py)."""
    comm.count_allreduce(algo, transport_of(comm, algo), array.dtype, array.nbytes, sent)


def allgather(comm: Communicator, mine: np.ndarray) -> list[np.ndarray]:
    """Every rank's 1-D float64 array (any length, possibly 0), on every rank, without
    pickle: two AllReduces of zero-padded arrays. First the lengths (rank r writes its
    length at index r, the others zeros), then the arrays laid end to end, each rank writing
    only its own slice. x + 0 = x exactly in floating point (infinities too), so each sum is
    the concatenation, bit for bit, whatever order the algorithm adds in."""
    p, r = comm.world_size, comm.rank
    lengths = np.zeros(p)
    lengths[r] = mine.size
    allreduce(comm, lengths)
    bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    flat = np.zeros(int(bounds[-1]))
    flat[bounds[r] : bounds[r + 1]] = mine
    allreduce(comm, flat)
    return [flat[bounds[i] : bounds[i + 1]] for i in range(p)]
