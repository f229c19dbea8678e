"""Open MPI's Allreduce, timed as `pipesgd bench allreduce` times our ring: the `mpi` peer.

The bench starts it as a job of its own (bench_peers.run_mpi), never by hand:

    mpirun -n P --oversubscribe python -m pipesgd_ref.commands.bench_mpi \\
        --size 16000000 --reps 10 --warmup 2 --out FILE

Every rank sums a float32 array of `--size` bytes in place with MPI.COMM_WORLD.Allreduce
(MPI.IN_PLACE, as our ring and gloo sum in place). The first call sums integer-valued data
(rank + 1 everywhere), so its result is checked exactly, as the ring's is; then `--warmup`
untimed calls and `--reps` timed ones, back to back after one barrier (as nccl-tests times,
and as the bench times our ring alone). Rank 0 gathers every rank's times and writes, to
--out, one JSON object:

    {"times": [the slowest rank's time of each timed call, s], "verified": bool,
     "library": MPI.Get_library_version()'s first line}

Which path the bytes take is Open MPI's choice: between ranks on one host its default is
shared memory (the `sm` BTL); the bench's `mpi-tcp` peer adds `--mca btl tcp,self` so they go
through loopback TCP, as ours do with --transport tcp.

This module imports nothing of the package but NumPy and mpi4py: each of P ranks starts a
Python on a machine whose cores the benchmark shares.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def time_allreduce(size_bytes: int, reps: int, warmup: int) -> dict | None:
    """Time MPI Allreduce of `size_bytes` on COMM_WORLD; the figures on rank 0, None elsewhere."""
    from mpi4py import MPI  # MPI_Init happens here: only inside the mpirun job

    comm = MPI.COMM_WORLD
    p = comm.Get_size()
    x = np.full(size_bytes // 4, comm.Get_rank() + 1, np.float32)
    comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
    # sum over ranks of (rank + 1) = p(p+1)/2, exact in float32 for any p we start
    ok = bool(np.all(x == p * (p + 1) / 2))
    verified = comm.allreduce(ok, op=MPI.LAND)
    x.fill(0)  # the timed sums stay 0 (p^reps would overflow float32), as the ring's do
    times = []
    comm.Barrier()
    for i in range(warmup + reps):
        start = time.perf_counter()
        comm.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    every = comm.gather(times, root=0)
    if comm.Get_rank() != 0:
        return None
    assert every is not None  # rank 0 gathers
    # A call's time is its slowest rank's: the collective is done when the last rank has it.
    slowest = [max(rank[i] for rank in every) for i in range(reps)]
    library = MPI.Get_library_version().replace("\0", "").strip().splitlines()[0]
    return {"times": slowest, "verified": verified, "library": library}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m pipesgd_ref.commands.bench_mpi", description=__doc__
    )
    ap.add_argument("--size", type=int, required=True, help="bytes to sum (a multiple of 4)")
    ap.add_argument("--reps", type=int, default=10, help="timed calls")
    ap.add_argument("--warmup", type=int, default=2, help="untimed calls before them")
    ap.add_argument("--out", required=True, help="where rank 0 writes its JSON")
    args = ap.parse_args(argv)
    figures = time_allreduce(args.size, args.reps, args.warmup)
    if figures is not None:
        with open(args.out, "w") as f:
            json.dump(figures, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
