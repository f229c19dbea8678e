"""`pipesgd bench allreduce`: how fast is our ring, next to the wire and to other libraries?

For each size M it reports, as nccl-tests does:

    time    median over repeats (after warm-up) of the slowest rank's AllReduce time
    algbw   M / time                        (what the caller sees)
    busbw   algbw * 2(p-1)/p                (what each link carried: comparable across p)

beside the alpha-beta prediction 2(p-1)·alpha + 2(p-1)/p·M/B + (p-1)/p·M·gamma, with alpha and
B from the emulated link (--latency, --bandwidth) or, unemulated, from the point-to-point
test described next, and gamma from timing the reduction (np.add) on this machine.

In the same run it measures the point-to-point TCP limit between two processes on this machine
(timing/calibrate.py: a ping-pong for alpha, a one-way stream for B) and prints busbw as a
fraction of it; where torch (gloo backend) is installed it times torch.distributed.all_reduce
on the same sizes and world size, side by side (optional: never a dependency): in the same
worker processes, one call of ours and one of gloo's in turn, so that a machine whose speed
drifts between seconds (a shared VM) slows both alike.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np

from pipesgd_ref.comm.netem import LinkModel
from pipesgd_ref.comm.ring import allreduce, barrier
from pipesgd_ref.launch import free_port, join_from_env, launch_local
from pipesgd_ref.outputs import write_text_atomic
from pipesgd_ref.timing import ring_allreduce_time
from pipesgd_ref.timing.calibrate import measure_gamma, measure_p2p
from pipesgd_ref.units import format_bytes


@dataclass
class Row:
    size_bytes: int
    time_s: float
    algbw: float  # bytes/s
    busbw: float  # bytes/s
    predicted_s: float
    verified: bool
    wire_bytes: int = 0  # what rank 0 sent for one AllReduce, headers included
    gloo_time_s: float | None = None
    gloo_busbw: float | None = None


def bus_factor(p: int) -> float:
    return 2 * (p - 1) / p if p > 1 else 1.0


# --- our ring, in worker processes ------------------------------------------------------------


def _ring_job(
    comm, sizes: list[int], reps: int, warmup: int, codec_name: str = "none",
    gloo_port: int | None = None,
) -> dict:  # fmt: skip
    """Time our AllReduce on each size; with `gloo_port`, gloo's too, in the same processes,
    one call of each in turn: a machine whose speed drifts (a shared VM) then slows both
    alike, and their ratio is measured, not the drift."""
    from pipesgd_ref.codecs import get_codec

    codec = get_codec(codec_name, "numba")
    gloo = _Gloo(comm, gloo_port) if gloo_port else None
    out = {}
    try:
        for nbytes in sizes:
            n = nbytes // 4
            # Integer-valued data: the sum is exact, so it can be checked without tolerance.
            x = np.full(n, comm.rank + 1, np.float32)
            sent0 = comm.bytes_sent
            allreduce(comm, x, codec=codec)
            wire = comm.bytes_sent - sent0
            want = comm.world_size * (comm.world_size + 1) / 2
            verified = bool(np.all(x == want))
            x.fill(0)  # the timed sums stay 0: p^reps would overflow float32 at ~60 reps of 4
            if gloo is not None:
                gloo.start(n)
            # Alone: back to back after one barrier, as nccl-tests does (a barrier before every
            # call would add its own exit skew between ranks to every measurement). Taking turns
            # with gloo: a barrier before each call, else each library's time would include
            # the other's exit skew (the ranks leave a collective up to a hop apart).
            times, gloo_times = [], []
            barrier(comm)
            for i in range(warmup + reps):
                if gloo is not None:
                    barrier(comm)
                start = time.perf_counter()
                allreduce(comm, x, codec=codec)
                if i >= warmup:
                    times.append(time.perf_counter() - start)
                if gloo is not None:
                    barrier(comm)
                    t = gloo.time_one()
                    if i >= warmup:
                        gloo_times.append(t)
            out[nbytes] = {"times": times, "verified": verified, "wire": wire,
                           "gloo_times": gloo_times}  # fmt: skip
    finally:
        if gloo is not None:
            gloo.close()
    return out


class _Gloo:
    """torch.distributed's gloo AllReduce beside ours, in the same worker process."""

    def __init__(self, comm, port: int):
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        self.torch, self.dist = torch, dist
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.rank,
                                world_size=comm.world_size)  # fmt: skip

    def start(self, n: int) -> None:
        """A tensor of n floats to sum, summed once (warm-up; its result is not checked)."""
        self.x = self.torch.full((n,), float(self.dist.get_rank() + 1))
        self.dist.all_reduce(self.x)
        self.dist.barrier()

    def time_one(self) -> float:
        start = time.perf_counter()
        self.dist.all_reduce(self.x)
        return time.perf_counter() - start

    def close(self) -> None:
        self.dist.destroy_process_group()


def _combine(per_rank: list[dict], nbytes: int, key: str = "times") -> float:
    """Median over repeats of the slowest rank's time (ours: "times", gloo's: "gloo_times")."""
    runs = [rank[nbytes][key] for rank in per_rank]
    return statistics.median(max(run[i] for run in runs) for i in range(len(runs[0])))


def _wire(per_rank: list[dict], nbytes: int) -> int:
    """Bytes rank 0 sent for one AllReduce of this size (payload and headers)."""
    return per_rank[0][nbytes]["wire"]


# --- gloo, when torch is installed ------------------------------------------------------------


def gloo_available() -> bool:
    try:
        import torch.distributed as dist

        return dist.is_available() and dist.is_gloo_available()
    except Exception:  # torch absent or broken: gloo is optional
        return False


# --- the benchmark ----------------------------------------------------------------------------


def link_problem(world_size: int, sizes: list[int], model: LinkModel, timeout: float,
                 codec: str = "none") -> str | None:  # fmt: skip
    """None when the emulated link carries the benchmark's largest ring frame within
    `timeout`; otherwise the sentence that says why not (netem.frame_problem), for the CLI to
    print before any rank starts: the frame is a segment of the largest chunk, ceil(n / p)
    float32 values capped at SEGMENT_BYTES (comm/schedule.py), in the codec's wire bytes."""
    from pipesgd_ref.codecs import get_codec
    from pipesgd_ref.comm.netem import frame_problem
    from pipesgd_ref.comm.schedule import SEGMENT_BYTES
    from pipesgd_ref.comm.transport import HEADER_BYTES

    if world_size < 2 or not model.enabled:
        return None
    values = min(-(-max(sizes) // 4 // world_size), max(1, SEGMENT_BYTES // 4))
    nbytes = get_codec(codec, "numpy").wire_bytes(values) + HEADER_BYTES
    return frame_problem(model, nbytes, timeout, what="a ring segment")


def bench_allreduce(
    world_size: int,
    sizes: list[int],
    model: LinkModel | None = None,
    reps: int = 10,
    warmup: int = 2,
    with_gloo: bool = True,
    json_path: str | None = None,
    timeout: float = 60.0,
    print_fn=print,
    codec: str = "none",
) -> dict:
    model = model or LinkModel()
    print_fn(f"ring AllReduce, {world_size} ranks on this machine (loopback TCP), codec {codec}, "
             f"link: {model if model.enabled else 'not emulated'}")  # fmt: skip
    p2p_bw, p2p_alpha = measure_p2p()
    gamma = measure_gamma()
    print_fn(f"point-to-point TCP: {p2p_bw / 1e9:.2f} GB/s, one-way latency "
             f"{p2p_alpha * 1e6:.0f} us; reduction {1 / gamma / 1e9:.2f} GB/s")  # fmt: skip
    alpha = model.latency if model.enabled else p2p_alpha
    bandwidth = model.bandwidth if model.bandwidth != float("inf") else p2p_bw
    # busbw is compared with the link: the emulated bandwidth, or the measured p2p stream.
    gloo = with_gloo and gloo_available() and not model.enabled
    per_rank = launch_local(world_size, _ring_job,
                            (sizes, reps, warmup, codec, free_port() if gloo else None),
                            start_method="fork", model=model, timeout=timeout)  # fmt: skip
    rows = []
    for nbytes in sizes:
        t = _combine(per_rank, nbytes)
        ok = all(rank[nbytes]["verified"] for rank in per_rank)
        algbw = nbytes / t
        row = Row(nbytes, t, algbw, algbw * bus_factor(world_size),
                  ring_allreduce_time(world_size, nbytes, alpha, bandwidth, gamma), ok,
                  _wire(per_rank, nbytes))  # fmt: skip
        if gloo:
            gt = _combine(per_rank, nbytes, key="gloo_times")
            row.gloo_time_s, row.gloo_busbw = gt, nbytes / gt * bus_factor(world_size)
        rows.append(row)
    header = (f"{'size':>10} {'time ms':>9} {'algbw GB/s':>11} {'busbw GB/s':>11} "
              f"{'of link':>7} {'model ms':>9} {'verified':>9} {'sent MB':>8}")  # fmt: skip
    if gloo:
        header += f" {'gloo ms':>8} {'gloo busbw':>11} {'ours/gloo':>10}"
    print_fn(header)
    for r in rows:
        line = (f"{format_bytes(r.size_bytes):>10} {r.time_s * 1e3:9.2f} {r.algbw / 1e9:11.3f} "
                f"{r.busbw / 1e9:11.3f} {r.busbw / bandwidth:7.0%} {r.predicted_s * 1e3:9.2f} "
                f"{'yes' if r.verified else 'NO':>9} {r.wire_bytes / 1e6:8.2f}")  # fmt: skip
        if r.gloo_time_s is not None:
            line += (f" {r.gloo_time_s * 1e3:8.2f} {r.gloo_busbw / 1e9:11.3f} "
                     f"{r.busbw / r.gloo_busbw:10.2f}x")  # fmt: skip
        print_fn(line)
    result = {
        "world_size": world_size,
        "link": {"latency_s": model.latency, "bandwidth_Bps": model.bandwidth},
        "p2p_bandwidth_Bps": p2p_bw,
        "p2p_latency_s": p2p_alpha,
        "gamma_s_per_byte": gamma,
        "gloo": gloo,
        "codec": codec,
        "rows": [asdict(r) for r in rows],
        "cpu_count": os.cpu_count(),
        "host": socket.gethostname(),
    }
    if json_path:
        write_text_atomic(json_path, json.dumps(result, indent=2) + "\n")
        print_fn(f"wrote {json_path}")
    return result


def bench_allreduce_joined(
    sizes: list[int],
    model: LinkModel | None = None,
    reps: int = 10,
    warmup: int = 2,
    timeout: float = 60.0,
    json_path: str | None = None,
    print_fn=print,
    bind: str | None = None,
    comm_kind: str = "sockets",
) -> dict | None:
    """The benchmark as one rank of a job from the environment (torchrun, mpirun, srun
    variables): every rank runs the same sizes; rank 0 prints the table (its own times).
    comm_kind "mpi": the same ring over MPI point-to-point (comm/mpi.py), in MPI_COMM_WORLD."""
    model = model or LinkModel()
    if comm_kind == "mpi":
        from pipesgd_ref.comm.mpi import join_mpi

        comm, how = join_mpi(timeout=timeout), "over MPI point-to-point"
    else:
        comm = join_from_env(timeout=timeout, bind=bind, model=model)
        how = "joined from the environment"
    try:
        mine = _ring_job(comm, sizes, reps, warmup)
        if comm.rank != 0:
            return None
        p = comm.world_size
        print_fn(f"ring AllReduce, {p} ranks ({how}), rank 0's times")
        print_fn(
            f"{'size':>10} {'time ms':>9} {'algbw GB/s':>11} {'busbw GB/s':>11} {'verified':>9}"
        )
        rows = []
        for nbytes in sizes:
            t, ok = statistics.median(mine[nbytes]["times"]), mine[nbytes]["verified"]
            busbw = nbytes / t * bus_factor(p)
            print_fn(f"{format_bytes(nbytes):>10} {t * 1e3:9.2f} {nbytes / t / 1e9:11.3f} "
                     f"{busbw / 1e9:11.3f} {'yes' if ok else 'NO':>9}")  # fmt: skip
            rows.append({"size_bytes": nbytes, "time_s": t, "busbw": busbw, "verified_rank0": ok})
        result = {"world_size": p, "rows": rows}
        if json_path:
            write_text_atomic(json_path, json.dumps(result, indent=2) + "\n")
        return result
    finally:
        comm.close()
