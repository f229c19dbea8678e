"""`pipesgd bench allreduce`: how fast is our ring, next to the wire, memory and other libraries?

Rows. One per transport asked for (`--transport tcp,unix,shm,auto`: `ring-tcp`, ...) and one
per peer (`--peers gloo,mpi,mpi-tcp`, bench_peers.py: torch's gloo, Open MPI's Allreduce
through mpi4py, the same over TCP only); a peer whose library is missing is skipped, saying
why. For each size M, each row reports, as nccl-tests does:

    time    median over repeats (after warm-up) of the slowest rank's AllReduce time
    algbw   M / time                        (what the caller sees)
    busbw   algbw * 2(p-1)/p                (what each link carried: comparable across p)
    of mem  busbw / the memory bandwidth: np.copyto of M bytes in this process, best of 5
    of TCP  busbw / the point-to-point TCP limit between two processes on this machine
            (timing/network.py: a ping-pong for alpha, a one-way stream for B)
    t/peer  time / the fastest peer's time at that size (below 1: faster than every peer)

and, for the ring over TCP or an emulated link (--latency, --bandwidth), the alpha-beta
prediction 2(p-1)·alpha + 2(p-1)/p·M/B + (p-1)/p·M·gamma, with alpha and B from the emulated
link or, unemulated, from the point-to-point test, and gamma from timing the reduction
(np.add) here.

In turns: every row runs as a job of its own (fresh processes) at each size, and the whole set
runs `rounds` (2) times, the order of the rows reversed every other round, so that no row
always runs first on a machine whose speed drifts between seconds (a shared VM); each row keeps
its best round. The peers' traffic does not pass through our link emulation: on an emulated
link they are skipped.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import time
from dataclasses import asdict, dataclass

import numpy as np

from pipesgd_ref.comm import choose
from pipesgd_ref.comm.collectives import allreduce, barrier
from pipesgd_ref.comm.netem import LinkSpec
from pipesgd_ref.commands import bench_algorithms
from pipesgd_ref.commands.bench_peers import peer_problem, run_peer
from pipesgd_ref.outputs import write_text_atomic
from pipesgd_ref.runtime.jobenv import join_from_env
from pipesgd_ref.runtime.launch import launch_local
from pipesgd_ref.timing import ring_allreduce_time
from pipesgd_ref.timing.measure import measure_gamma
from pipesgd_ref.timing.network import measure_p2p
from pipesgd_ref.units import format_bytes

ROUNDS = 2  # every row is run this many times at each size, its best kept ("best of two")


@dataclass
class Row:
    name: str  # ring-tcp, ring-unix, ring-shm, ring-auto, gloo, mpi, mpi-tcp
    size_bytes: int
    time_s: float  # the best round's median over repeats of the slowest rank
    algbw: float  # bytes/s
    busbw: float  # bytes/s
    copy_Bps: float  # memory bandwidth: np.copyto of the same bytes, best of 5
    of_memory: float  # busbw / copy_Bps
    of_tcp: float  # busbw / the loopback TCP point-to-point bandwidth
    time_vs_best_peer: float | None  # time_s / the fastest peer's time_s; None: no peer ran
    verified: bool  # every round's first sum was exact
    round_times_s: list[float]  # each round's time, in round order
    predicted_s: float | None = None  # alpha-beta prediction (ring over TCP or emulated link)
    wire_bytes: int | None = None  # ring rows: what rank 0 sent for one AllReduce, headers in
    algorithm: str | None = None  # our rows: the algorithm that ran (auto's pick, for auto)
    model_s: float | None = None  # our rows: that algorithm's fitted model (bench_algorithms)


def _print(*args) -> None:
    """print, flushed: a run takes minutes, and its rounds are worth seeing as they end."""
    print(*args, flush=True)


REPS = 10  # timed calls per row and size, at least
MIN_TIMED_BYTES = 4 << 20  # ...and at least this much AllReduce, up to MAX_REPS calls
MAX_REPS = 200


def reps_at(nbytes: int, reps: int | None = None) -> int:
    """Timed calls at one size: `reps` when given; else REPS, more below 4 MB (a 4 KB call
    takes tens of microseconds: ten of them measure the machine's noise, not the call)."""
    if reps is not None:
        return reps
    return max(REPS, min(MAX_REPS, MIN_TIMED_BYTES // max(nbytes, 1)))


def bus_factor(p: int) -> float:
    return 2 * (p - 1) / p if p > 1 else 1.0


def copy_bandwidth(nbytes: int, reps: int = 5) -> float:
    """Bytes/s of np.copyto between two arrays of `nbytes` (best of `reps`, after one that
    faults the pages in): the memory bandwidth a same-host transport is measured against (one
    copy per byte is its floor)."""
    src = np.ones(max(nbytes // 4, 1), np.float32)
    dst = np.zeros_like(src)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return src.nbytes / best


# --- our ring, in worker processes ------------------------------------------------------------


def _ring_job(comm, sizes: list[int], reps: int, warmup: int, codec_name: str = "none") -> dict:
    """Time our AllReduce on each size: the first call checked, `warmup` untimed, `reps` timed,
    back to back after one barrier, as nccl-tests does (a barrier before every call would add
    its own exit skew between ranks to every measurement)."""
    from pipesgd_ref.codecs import get_codec

    codec = get_codec(codec_name, "numba")
    out = {}
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
        times = []
        barrier(comm)
        for i in range(warmup + reps):
            start = time.perf_counter()
            allreduce(comm, x, codec=codec)
            if i >= warmup:
                times.append(time.perf_counter() - start)
        picked = "ring" if codec.name != "none" else choose.algorithm_for(comm, nbytes)
        out[nbytes] = {"times": times, "verified": verified, "wire": wire, "algorithm": picked}
    return out


def run_ring(
    world_size: int,
    nbytes: int,
    reps: int,
    warmup: int,
    transport: str,
    codec: str,
    link: LinkSpec,
    timeout: float,
    algorithm: str = "ring",
) -> dict:
    """One row of ours at one size, in fresh worker processes: {"times": the slowest rank's
    time of each call, "verified", "wire", "algorithm" (the one that ran)}."""
    per_rank = launch_local(
        world_size,
        _ring_job,
        ([nbytes], reps, warmup, codec),
        start_method="fork",
        link=link,
        timeout=timeout,
        transport=transport,
        allreduce=algorithm,
    )
    mine = [rank[nbytes] for rank in per_rank]
    # A call's time is its slowest rank's: the collective is done when the last rank has it.
    slowest = [max(rank["times"][i] for rank in mine) for i in range(reps)]
    verified = all(rank["verified"] for rank in mine)
    picked = mine[0]["algorithm"]
    return {"times": slowest, "verified": verified, "wire": mine[0]["wire"], "algorithm": picked}


# --- the benchmark ----------------------------------------------------------------------------


def link_problem(
    world_size: int, sizes: list[int], link: LinkSpec, timeout: float, codec: str = "none"
) -> str | None:
    """None when the emulated link carries the benchmark's largest ring frame within
    `timeout`; otherwise the sentence that says why not (netem.frame_problem), for the CLI to
    print before any rank starts: the frame is a segment of the largest chunk, ceil(n / p)
    float32 values capped at SEGMENT_BYTES (comm/schedule.py), in the codec's wire bytes."""
    from pipesgd_ref.codecs import get_codec
    from pipesgd_ref.comm.netem import frame_problem
    from pipesgd_ref.comm.schedule import SEGMENT_BYTES
    from pipesgd_ref.comm.wire import HEADER_BYTES

    if world_size < 2 or not link.enabled:
        return None
    values = min(-(-max(sizes) // 4 // world_size), max(1, SEGMENT_BYTES // 4))
    nbytes = get_codec(codec, "numpy").wire_bytes(values) + HEADER_BYTES
    return frame_problem(link, nbytes, timeout, what="a ring segment")


@dataclass
class Machine:
    """What a row is measured against, timed in this process before the rows run."""

    p2p_bw: float  # bytes/s of a one-way TCP stream between two processes here
    p2p_alpha: float  # s: one-way latency of a TCP ping-pong here
    gamma: float  # s per byte of the reduction (np.add)
    copy_bps: dict[int, float]  # size -> bytes/s of np.copyto (copy_bandwidth)


def measure_machine(sizes: list[int], print_fn=_print) -> Machine:
    """The point-to-point TCP limit, the reduction's cost and the memory bandwidth, printed."""
    p2p_bw, p2p_alpha = measure_p2p()
    gamma = measure_gamma()
    copy_bps = {nbytes: copy_bandwidth(nbytes) for nbytes in sizes}
    print_fn(
        f"point-to-point TCP: {p2p_bw / 1e9:.2f} GB/s, one-way latency "
        f"{p2p_alpha * 1e6:.0f} us; reduction {1 / gamma / 1e9:.2f} GB/s; memory copy "
        + ", ".join(f"{format_bytes(n)} {copy_bps[n] / 1e9:.2f} GB/s" for n in sizes)
    )
    return Machine(p2p_bw, p2p_alpha, gamma, copy_bps)


def bench_allreduce(
    world_size: int,
    sizes: list[int],
    link: LinkSpec | None = None,
    reps: int | None = None,
    warmup: int = 2,
    transports: list[str] | tuple[str, ...] = ("tcp",),
    peers: list[str] | tuple[str, ...] = ("gloo",),
    json_path: str | None = None,
    timeout: float = 60.0,
    print_fn=_print,
    codec: str = "none",
    rounds: int = ROUNDS,
    algorithms: list[str] | tuple[str, ...] = ("ring",),
    fit_path=None,
    argv: str = "",
) -> dict:
    """Every row (each algorithm on each transport, each peer that can run) at every size,
    `rounds` times in turns; one table of each row's best round (module docstring); the result
    as a dict, also written to `json_path`. `fit_path`: fit each algorithm's model to the rows
    and write the figures there (bench_algorithms.py)."""
    link = link or LinkSpec()
    print_fn(
        f"AllReduce, {world_size} ranks on this machine, algorithms {','.join(algorithms)}, "
        f"transports {','.join(transports)}, codec {codec}, "
        f"link: {link if link.enabled else 'not emulated'}"
    )
    machine = measure_machine(sizes, print_fn)
    skipped = skipped_peers(peers, link, print_fn)
    ran_peers = [peer for peer in peers if peer not in skipped]
    ours, not_run = bench_algorithms.row_names(list(algorithms), list(transports), link)
    for name, why in not_run.items():
        print_fn(f"row {name} skipped: {why}")
    names = ours + ran_peers

    def run(name: str, nbytes: int) -> dict:
        n = reps_at(nbytes, reps)
        if name in ours:
            algo, transport = bench_algorithms.split_name(name)
            return run_ring(world_size, nbytes, n, warmup, transport, codec, link, timeout, algo)
        return run_peer(name, world_size, nbytes, n, warmup, timeout)

    got = in_turns(names, sizes, rounds, run, print_fn)
    rows = best_rows(got, names, sizes, ran_peers, world_size, link, machine)
    models = None
    if fit_path is not None and codec == "none" and not link.enabled:
        models = bench_algorithms.fit(rows, world_size)  # written after --json (below)
    add_models(rows, ours, world_size, codec, link)
    print_table(rows, rounds, link.bandwidth if link.enabled else None, print_fn)
    result = {
        "world_size": world_size,
        "link": {"latency_s": link.latency, "bandwidth_Bps": link.bandwidth},
        "p2p_bandwidth_Bps": machine.p2p_bw,
        "p2p_latency_s": machine.p2p_alpha,
        "gamma_s_per_byte": machine.gamma,
        "codec": codec,
        "transports": list(transports),
        "algorithms": list(algorithms),
        "fitted": models,
        "peers": ran_peers,
        "skipped_peers": skipped,
        "rounds": rounds,
        "reps": {n: reps_at(n, reps) for n in sizes},
        "rows": [asdict(r) for r in rows],
        "cpu_count": os.cpu_count(),
        "host": socket.gethostname(),
    }
    if json_path:  # first: what was measured is kept whatever happens to the fit
        write_text_atomic(json_path, json.dumps(result, indent=2) + "\n")
        print_fn(f"wrote {json_path}")
    if models is not None:
        bench_algorithms.finish_fit(models, rows, world_size, fit_path, argv, print_fn)
    return result


def skipped_peers(peers, link: LinkSpec, print_fn=_print) -> dict[str, str]:
    """{peer: why it cannot run}, each said in one line: its library is missing, or the link
    is emulated and the peers' traffic would not pass through the emulation."""
    skipped = {}
    for peer in peers:
        why: str | None
        if link.enabled:
            why = (
                "the link is emulated (--latency/--bandwidth) and the peers' traffic does not "
                "pass through the emulation"
            )
        else:
            why = peer_problem(peer)
        if why is not None:
            skipped[peer] = why
            print_fn(f"peer {peer} skipped: {why}")
    return skipped


def in_turns(names: list[str], sizes: list[int], rounds: int, run, print_fn=_print) -> dict:
    """{(row, size): each round's figures}: round k runs every row at every size, the rows
    reversed in odd rounds, so that no row always runs first on a machine whose speed drifts."""
    got: dict[tuple[str, int], list[dict]] = {(name, n): [] for name in names for n in sizes}
    for k in range(rounds):
        for nbytes in sizes:
            for name in names if k % 2 == 0 else names[::-1]:
                figures = run(name, nbytes)
                figures["time_s"] = statistics.median(figures["times"])
                got[name, nbytes].append(figures)
            times = (f"{name} {got[name, nbytes][-1]['time_s'] * 1e3:.2f} ms" for name in names)
            print_fn(f"round {k + 1} of {rounds}, {format_bytes(nbytes)}: " + ", ".join(times))
    return got


def best_rows(
    got: dict,
    names: list[str],
    sizes: list[int],
    peers: list[str],
    world_size: int,
    link: LinkSpec,
    m: Machine,
) -> list[Row]:
    """One Row per size and row name: its best round against the machine's figures, the peers'
    best and, for the ring over TCP or an emulated link, the alpha-beta prediction."""
    alpha = link.latency if link.enabled else m.p2p_alpha
    bandwidth = link.bandwidth if link.bandwidth != float("inf") else m.p2p_bw
    rows = []
    for nbytes in sizes:
        best = {name: min(r["time_s"] for r in got[name, nbytes]) for name in names}
        best_peer = min((best[peer] for peer in peers), default=None)
        for name in names:
            t = best[name]
            algbw = nbytes / t
            busbw = algbw * bus_factor(world_size)
            runs = got[name, nbytes]
            ours = "wire" in runs[0]  # our rows count the bytes they sent
            predicted = None
            if name.startswith("ring-") and (
                link.enabled or name == "ring-tcp"
            ):  # the unemulated figures are TCP's
                predicted = ring_allreduce_time(world_size, nbytes, alpha, bandwidth, m.gamma)
            copy = m.copy_bps[nbytes]
            rows.append(
                Row(
                    name=name,
                    size_bytes=nbytes,
                    time_s=t,
                    algbw=algbw,
                    busbw=busbw,
                    copy_Bps=copy,
                    of_memory=busbw / copy,
                    of_tcp=busbw / m.p2p_bw,
                    time_vs_best_peer=None if best_peer is None else t / best_peer,
                    verified=all(r["verified"] for r in runs),
                    round_times_s=[r["time_s"] for r in runs],
                    predicted_s=predicted,
                    wire_bytes=runs[0]["wire"] if ours else None,
                    algorithm=runs[0].get("algorithm"),
                )
            )
    return rows


def add_models(rows: list[Row], ours: list[str], p: int, codec: str, link: LinkSpec) -> None:
    """Each row of ours gets the fitted model of the algorithm that ran (comm/choose.py), where
    there are figures for it: plain AllReduces on unemulated links."""
    if codec != "none" or link.enabled:
        return
    for r in rows:
        if r.name in ours and r.algorithm is not None:
            transport = bench_algorithms.split_name(r.name)[1]
            r.model_s = bench_algorithms.model_time(r.algorithm, transport, p, r.size_bytes)


def _label(r: Row, picks: dict) -> str:
    """A row's name; auto's rows say what auto ran, and the row of the algorithm auto picked
    at that size (on those links) is marked *."""
    if r.algorithm is None:
        return r.name
    algo, transport = bench_algorithms.split_name(r.name)
    if algo == "auto":
        return f"{r.name} ({r.algorithm})"
    picked = picks.get((r.size_bytes, bench_algorithms.resolved(transport)))
    return r.name + (" *" if picked == algo else "")


def print_table(rows: list[Row], rounds: int, link_bandwidth: float | None, print_fn=print):
    """The table: one line per row and size, "-" where a figure does not apply. With an
    emulated link, an "of link" column: busbw / the link's bandwidth."""
    picks = {
        (
            r.size_bytes,
            bench_algorithms.resolved(bench_algorithms.split_name(r.name)[1]),
        ): r.algorithm
        for r in rows
        if r.algorithm is not None and r.name.startswith("auto-")
    }
    labels = [_label(r, picks) for r in rows]
    width = max(len("row"), *(len(label) for label in labels))
    header = (
        f"{'row':<{width}} {'size':>10} {'time ms':>9} {'algbw GB/s':>11} "
        f"{'busbw GB/s':>11} {'of mem':>7} {'of TCP':>7}"
    )
    if link_bandwidth is not None:
        header += f" {'of link':>7}"
    header += f" {'model ms':>9} {'verified':>9} {'sent MB':>8} {'t/peer':>7}"
    print_fn(f"best of {rounds} rounds:")
    print_fn(header)
    for r, label in zip(rows, labels, strict=True):
        model = r.model_s if r.model_s is not None else r.predicted_s
        line = (
            f"{label:<{width}} {format_bytes(r.size_bytes):>10} {r.time_s * 1e3:9.2f} "
            f"{r.algbw / 1e9:11.3f} {r.busbw / 1e9:11.3f} {r.of_memory:7.0%} {r.of_tcp:7.0%}"
        )
        if link_bandwidth is not None:
            line += f" {r.busbw / link_bandwidth:7.0%}"
        line += (
            f" {_or_dash(model, 1e3, 9)} {'yes' if r.verified else 'NO':>9} "
            f"{_or_dash(r.wire_bytes, 1e-6, 8)} {_or_dash(r.time_vs_best_peer, 1, 7)}"
        )
        print_fn(line)
    if any(r.time_vs_best_peer is not None for r in rows):
        print_fn("t/peer: a row's time over the fastest peer's at that size (below 1: faster)")
    if picks:
        print_fn("auto-*: what auto ran in brackets; * marks the row of the algorithm it picked")
    if any(r.model_s is not None for r in rows):
        print_fn("model: the fitted alpha-beta model of the algorithm that ran (comm/choose.py)")


def _or_dash(value: float | None, scale: float, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value * scale:{width}.2f}"


def bench_allreduce_joined(
    sizes: list[int],
    link: LinkSpec | None = None,
    reps: int | None = None,
    warmup: int = 2,
    timeout: float = 60.0,
    json_path: str | None = None,
    print_fn=print,
    bind: str | None = None,
    transport: str = "auto",
    comm_kind: str = "sockets",
    allreduce: str = "auto",
) -> dict | None:
    """The benchmark as one rank of a job from the environment (torchrun, mpirun, srun
    variables): every rank runs the same sizes; rank 0 prints the table (its own times).
    comm_kind "mpi": the same ring over MPI point-to-point (comm/mpi.py), in MPI_COMM_WORLD."""
    link = link or LinkSpec()
    if comm_kind == "mpi":
        from pipesgd_ref.comm.mpi import join_mpi

        comm, how = join_mpi(timeout=timeout), "over MPI point-to-point"
    else:
        comm = join_from_env(
            timeout=timeout, bind=bind, link=link, transport=transport, allreduce=allreduce
        )
        how = "joined from the environment"
    try:
        mine = {n: _ring_job(comm, [n], reps_at(n, reps), warmup)[n] for n in sizes}
        if comm.rank != 0:
            return None
        p = comm.world_size
        wire = "" if comm_kind == "mpi" else f", transport {transport}, allreduce {allreduce}"
        print_fn(f"AllReduce, {p} ranks ({how}){wire}, rank 0's times")
        print_fn(
            f"{'size':>10} {'time ms':>9} {'algbw GB/s':>11} {'busbw GB/s':>11} {'verified':>9}"
        )
        rows = []
        for nbytes in sizes:
            t, ok = statistics.median(mine[nbytes]["times"]), mine[nbytes]["verified"]
            busbw = nbytes / t * bus_factor(p)
            print_fn(
                f"{format_bytes(nbytes):>10} {t * 1e3:9.2f} {nbytes / t / 1e9:11.3f} "
                f"{busbw / 1e9:11.3f} {'yes' if ok else 'NO':>9}"
            )
            rows.append({"size_bytes": nbytes, "time_s": t, "busbw": busbw, "verified_rank0": ok})
        result = {"world_size": p, "rows": rows}
        if json_path:
            write_text_atomic(json_path, json.dumps(result, indent=2) + "\n")
        return result
    finally:
        comm.close()
