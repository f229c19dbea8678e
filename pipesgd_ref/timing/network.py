"""The link's figures: the software cost of a ring hop, and two processes streaming over TCP.

`measure_hop` times a ping-pong round a ring of local processes on the run's link and takes
the link's own latency and wire time out: what is left is alpha's software share. `p2p_figures`
streams between two processes: the bandwidth loopback moves, and the CPU time each byte costs
the sending and the receiving thread (`copy`).
"""

from __future__ import annotations

import math
import statistics
import time

import numpy as np

from pipesgd_ref.comm.collectives import allreduce, barrier
from pipesgd_ref.comm.wire import Frame, Kind
from pipesgd_ref.runtime.launch import launch_local

HOP_BYTES = 256 << 10  # per-hop message of the hop measurement on an emulated link (at most)


def hop_message_bytes(cal_bytes: int, world_size: int, emulated: bool) -> int:
    """Bytes per hop of the message `measure_hop` sends: on an emulated link a gradient chunk
    (M/p, at most HOP_BYTES), large enough that the receiver sleeps until the emulated arrival
    and must be woken, as in a real step; unemulated, one float (the wire term is modelled on
    its own there, from the stream)."""
    if not emulated or world_size < 2:
        return 4
    return int(max(4, min(HOP_BYTES, cal_bytes // world_size)) // 4 * 4)


def hop_job(comm, n: int, reps: int) -> float:
    x = np.ones(n, np.float32)
    barrier(comm)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        allreduce(comm, x)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_hop(
    world_size: int,
    link=None,
    hop_bytes: int = 4,
    reps: int | None = None,
    transport: str = "tcp",
) -> float:
    """Software cost of one ring hop among `world_size` local processes: a ring AllReduce of
    `hop_bytes` per hop (a ping-pong round the ring, 2(p-1) hops) on the emulated `link` (None:
    not emulated), less the link's own latency + bytes/B, divided by its hop count. What is
    left is what the alpha-beta model calls software: waking the receiver (from the socket, or
    from the sleep until an emulated arrival), frames, the sending thread, Python. `transport`:
    the links' (the runs' own: a shared-memory hop costs less than a TCP one)."""
    if world_size < 2:
        return 0.0
    hops = 2 * (world_size - 1)
    latency, bandwidth = (link.latency, link.bandwidth) if link is not None else (0.0, math.inf)
    wire = latency + hop_bytes / bandwidth
    if reps is None:  # about a second of emulated wire time, 5..50 reps
        reps = int(min(50, max(5, 1.0 / max(hops * wire, 1e-9))))
    n = world_size * hop_bytes // 4
    per_rank = launch_local(
        world_size, hop_job, (n, reps), start_method="fork", link=link, transport=transport
    )
    return max(0.0, max(per_rank) / hops - wire)


def p2p_job(comm, nbytes: int, reps: int) -> dict:
    """Rank 0 streams `nbytes` to rank 1 `reps` times, each rep timed on its own after a
    barrier, with the CPU time the sending and the receiving thread spent on it (bandwidth and
    the socket path's CPU cost per byte); then 200 one-byte ping-pongs (latency). Uses the ring
    links directly: right of 0 is 1, left of 0 is 1."""
    buf = np.zeros(nbytes, np.uint8)
    small = np.zeros(1, np.uint8)
    frame = Frame(kind=Kind.DATA)
    times, cpu = [], []
    for _ in range(reps):
        barrier(comm)
        cpu_start, start = time.thread_time(), time.perf_counter()
        if comm.rank == 0:
            comm.right.send(frame, buf.data)
        else:
            got = comm.left.recv_header()
            comm.left.recv_payload_into(got, buf.data)
        times.append(time.perf_counter() - start)
        cpu.append(time.thread_time() - cpu_start)
    barrier(comm)
    pings = 200
    start = time.perf_counter()
    for _ in range(pings):
        if comm.rank == 0:
            comm.right.send(frame, small.data)
            got = comm.left.recv_header()
            comm.left.recv_payload_into(got, small.data)
        else:
            got = comm.left.recv_header()
            comm.left.recv_payload_into(got, small.data)
            comm.right.send(frame, small.data)
    rtt = (time.perf_counter() - start) / pings
    return {"times": times, "cpu": cpu, "one_way": rtt / 2}


def p2p_figures(nbytes: int = 16 << 20, reps: int = 8) -> dict:
    """Two local processes over TCP: {"bandwidth": bytes/s of the median rep, as the receiver
    saw it (the fastest is an outlier on a shared machine); "latency": one-way s; "cpu_send",
    "cpu_recv": CPU s per byte of the sending and the receiving thread (median over reps:
    kernel copies and TCP, what every byte costs the cores whatever the link)}."""
    send, recv = launch_local(2, p2p_job, (nbytes, reps), start_method="fork")
    return p2p_summary(send, recv, nbytes)


def p2p_summary(send: dict, recv: dict, nbytes: int) -> dict:
    """p2p_job's two results (the sender's, the receiver's) as p2p_figures' dict: over any
    wire the ring's links run on (compare_mpi.py streams over MPI)."""
    return {
        "bandwidth": nbytes / statistics.median(recv["times"]),
        "latency": send["one_way"],
        "cpu_send": statistics.median(send["cpu"]) / nbytes,
        "cpu_recv": statistics.median(recv["cpu"]) / nbytes,
    }


def measure_p2p(nbytes: int = 16 << 20, reps: int = 8) -> tuple[float, float]:
    """(bandwidth bytes/s, one-way latency s) between two local processes over TCP."""
    got = p2p_figures(nbytes, reps)
    return got["bandwidth"], got["latency"]


def network_figures(nbytes: int = 16 << 20, reps: int = 6) -> dict:
    """{"stream": bytes/s, "copy": CPU s per byte}: what two local processes stream over
    loopback TCP (the median rep), and the CPU time each byte costs a side (the mean of the
    sender's and the receiver's, the median over reps). Machine figures: measure once."""
    return stream_and_copy(p2p_figures(nbytes, reps))


def stream_and_copy(p2p: dict) -> dict:
    """{"stream", "copy"} of network_figures from p2p_figures' (or p2p_summary's) dict."""
    return {"stream": p2p["bandwidth"], "copy": (p2p["cpu_send"] + p2p["cpu_recv"]) / 2}
