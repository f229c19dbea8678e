"""Programs that tests/test_mpi.py runs under a real `mpirun`: each rank of the job runs one of
them, and writes what the test checks into OUT (one .npz per rank and run; no pickle).

    python tests/mpi_programs.py collectives OUT   ring allreduce (sum, mean; float32, float64;
                                                   the q8 codec), broadcast, allgather, barrier
                                                   over MPI for every p = 1 .. size (one
                                                   sub-communicator each) and lengths 0, 1,
                                                   < p, not divisible by p, several segments
    python tests/mpi_programs.py train OUT         sync, ddp and pipe (width 2) on ranks 0..3,
                                                   ps-sync and ps-async on all 5 ranks
                                                   (4 workers + the server), over MPI
    python tests/mpi_programs.py device OUT        the device ring over MPI (Numba's CUDA
                                                   simulator: NUMBA_ENABLE_CUDASIM=1)

A rank whose check fails raises; the program then ends the job (comm.mpi.abort_job), so the
test sees a non-zero exit status and the assertion's message.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from pipesgd_ref.comm.mpi import MPICommunicator, abort_job, init_mpi
from pipesgd_ref.config import TrainConfig

TIMEOUT = 60.0  # seconds any one wait may take: generous, the machine may be loaded
LENGTHS = (0, 1, 2, 3, 7, 1000, 4099)  # 0, 1, < p, not divisible by p, several segments
SEGMENT_BYTES = 1024  # small segments: a chunk of 1000 float32 crosses as several frames
# The tiny preset with an MLP: 4 workers, 20 steps (tests/test_mpi.py builds the oracles of
# these very configs).
TRAIN = TrainConfig.preset("tiny").replace(world_size=4, steps=20, model="mlp", hidden=(16,))
CONFIGS = {
    "sync": TRAIN.replace(algo="sync", width=1),
    "ddp": TRAIN.replace(algo="ddp", width=1, bucket_size="0"),  # a bucket per layer
    "pipe": TRAIN.replace(algo="pipe", width=2),
    "ps-sync": TRAIN.replace(algo="ps-sync", width=1),
    "ps-async": TRAIN.replace(algo="ps-async", width=1),
}


def inputs(p: int, n: int, dtype) -> list[np.ndarray]:
    """Every rank's input, known to every rank: each builds all p to run the oracle."""
    return [np.random.default_rng([p, n, r]).standard_normal(n).astype(dtype) for r in range(p)]


def sub_communicators(MPI, sizes):
    """For each p in `sizes`: an MPICommunicator of world ranks 0..p-1 on those ranks (None on
    the others). Split is collective: every rank takes part in every one."""
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    for p in sizes:
        sub = world.Split(0 if rank < p else MPI.UNDEFINED, rank)
        yield p, (None if sub == MPI.COMM_NULL else MPICommunicator(sub, TIMEOUT))


def quiet_barrier(comm) -> None:
    """A barrier that sleeps while it waits (a blocking MPI call spins a core)."""
    import time

    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.01)


def collectives(out: Path) -> None:
    from pipesgd_ref.codecs import get_codec
    from pipesgd_ref.comm.collectives import allgather, allreduce, barrier, broadcast
    from pipesgd_ref.comm.schedule import simulate_allreduce, simulate_compressed_allreduce

    MPI = init_mpi()
    rank = MPI.COMM_WORLD.Get_rank()
    q8 = get_codec("q8", "numpy")
    checked = 0
    for p, comm in sub_communicators(MPI, range(1, MPI.COMM_WORLD.Get_size() + 1)):
        if comm is None:
            continue
        for n in LENGTHS:
            for dtype in (np.float32, np.float64):
                arrays = inputs(p, n, dtype)
                for op in ("sum", "mean"):
                    got = allreduce(comm, arrays[rank].copy(), op, segment_bytes=SEGMENT_BYTES)
                    want = simulate_allreduce(arrays, op)[rank]
                    assert got.tobytes() == want.tobytes(), (
                        f"rank {rank}: allreduce {op} of {n} {np.dtype(dtype)} over {p} MPI "
                        f"ranks is not bitwise simulate_allreduce: max difference "
                        f"{np.max(np.abs(got - want)) if n else 0}"
                    )
                    checked += 1
            arrays = inputs(p, n, np.float32)
            got = allreduce(comm, arrays[rank].copy(), "mean", segment_bytes=SEGMENT_BYTES,
                            codec=q8)  # fmt: skip
            want = simulate_compressed_allreduce(arrays, q8, "mean", SEGMENT_BYTES)[rank]
            assert got.tobytes() == want.tobytes(), f"rank {rank}: q8 ring, p {p}, n {n}"
            checked += 1
        for root in range(p):
            mine = np.arange(5.0) + root if rank == root else np.zeros(5)
            broadcast(comm, mine, root=root, segment_bytes=16)
            assert np.array_equal(mine, np.arange(5.0) + root), f"rank {rank}: broadcast {root}"
        got = allgather(comm, np.full(rank, float(rank)))  # lengths 0 .. p-1
        assert all(np.array_equal(g, np.full(i, float(i))) for i, g in enumerate(got))
        barrier(comm)
        comm.close()
    np.savez(out / f"collectives-rank{rank}.npz", checked=checked)


def train(out: Path) -> None:
    from pipesgd_ref.methods.ddp import ddp_worker
    from pipesgd_ref.methods.pipe import pipe_worker
    from pipesgd_ref.methods.ps import ps_async_worker, ps_sync_worker
    from pipesgd_ref.methods.sync import sync_worker

    MPI = init_mpi()
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    assert world.Get_size() == TRAIN.world_size + 1, "run this program on 5 ranks"
    # The ring methods on ranks 0..3 (rank 4 waits at the next collective call, the Split).
    _, ring = list(sub_communicators(MPI, [TRAIN.world_size]))[0]
    if ring is not None:
        for algo, fn in (("sync", sync_worker), ("ddp", ddp_worker), ("pipe", pipe_worker)):
            result = fn(ring, CONFIGS[algo])
            np.savez(out / f"{algo}-rank{rank}.npz", params=result.params, losses=result.losses)
        ring.close()
    quiet_barrier(world)  # rank 4 waits here without spinning a core the others compute on
    # The parameter server on all five: rank 0 serves, ranks 1..4 are workers 0..3.
    star = MPICommunicator(world, TIMEOUT, star=True)
    for algo, fn in (("ps-sync", ps_sync_worker), ("ps-async", ps_async_worker)):
        result = fn(star, CONFIGS[algo])
        order = result.extra.get("arrival_order", [])
        np.savez(out / f"{algo}-rank{rank}.npz", params=result.params, losses=result.losses,
                 order=np.array(order, np.int64))  # fmt: skip
    star.close()


def device(out: Path) -> None:
    """The device ring (comm/device_ring.py) over MPI: staged through pinned host buffers, or
    (PIPESGD_MPI_CUDA=1: the library said to take device memory) handed to MPI directly; added
    on the "device" (the simulator), bitwise simulate_allreduce. Records which path ran."""
    from numba import cuda

    from pipesgd_ref.comm.device_ring import device_allreduce, takes_device_memory
    from pipesgd_ref.comm.schedule import simulate_allreduce

    MPI = init_mpi()
    rank, p = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    comm = MPICommunicator(MPI.COMM_WORLD, TIMEOUT)
    for n in (0, 1, 5, 33):
        arrays = inputs(p, n, np.float32)
        array = cuda.to_device(arrays[rank])
        device_allreduce(comm, array, "mean", segment_bytes=32)
        got, want = array.copy_to_host(), simulate_allreduce(arrays, "mean")[rank]
        assert got.tobytes() == want.tobytes(), f"rank {rank}: device ring over MPI, n {n}"
    direct = takes_device_memory(comm)
    comm.close()
    np.savez(out / f"device-rank{rank}.npz", checked=4, direct=direct)


if __name__ == "__main__":
    program, folder = sys.argv[1], Path(sys.argv[2])
    try:
        {"collectives": collectives, "train": train, "device": device}[program](folder)
    except BaseException:
        import traceback

        traceback.print_exc()
        abort_job(1)  # every rank ends now: none waits out its timeout for this one
        raise
