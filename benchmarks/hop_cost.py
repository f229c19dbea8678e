"""What one ring hop costs, and where its time goes.

    python benchmarks/hop_cost.py                     # the table and the breakdown, best of 3
    python benchmarks/hop_cost.py --runs 1 --reps 200 --no-breakdown

A ring AllReduce of p ranks takes 2(p-1) steps; for a small message each step costs what one
hop costs (a frame handed to the right neighbour, a frame taken from the left), whatever the
bytes. This prints:

1. The AllReduce: for each transport (tcp, shm), p (2, 4) and size (4 KB, 64 KB), the time of
   one `allreduce(comm, x, algorithm="ring")` in local jobs started with `launch_local(...,
   start_method="fork")`, and that time divided by 2(p-1): the cost of one hop. A run is one
   job of --batches batches of --reps calls, each batch after a barrier and as long as its
   slowest rank; the figure is the best batch of the best of --runs runs (the cost of a hop
   when nothing else wants the cores: on a shared machine other jobs' bursts only add).

2. The breakdown of one hop: a 2-rank ring (each rank has a core of its own on a 2-core
   machine; --profile-ranks for another p) with rank 0 under cProfile for --profile-reps
   4 KB AllReduces. Every function's own time (tottime) is put in one component by its name
   (COMPONENTS below), divided by the hops, less cProfile's own cost of recording each call
   (timed in the same process on empty calls: `profiler_cost`), scaled to add up to the hop
   not profiled. "waiting for the left's frame" is the time rank 0 spent in receives:
   polling, or asleep until the kernel woke it (its peer's half of the hop), not work of its
   own. Below the table: the hop not profiled, and the CPU time rank 0's threads used in it,
   in user space and in the kernel (getrusage). With p = 2 the two ranks run in lock step,
   each on its core, so a hop is nearly all CPU; with p > 2 on two cores, ranks take turns
   on a core, and the profiled rank's slowness shows up as its neighbours' waiting.

Prints the tables and nothing else (benchmarks/RESULTS.md keeps the dated figures).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import resource
import time

import numpy as np

from pipesgd_ref.comm.collectives import allreduce, barrier
from pipesgd_ref.runtime.launch import launch_local

# component -> substrings of a profiled function's "file:line(name)" that belong to it (first
# match wins, in this order; case ignored); anything else is OTHER.
COMPONENTS = {
    "waiting for the left's frame (recv_into: polling or asleep)": (
        "'recv_into'",
        "'recv' of '_socket",
        "sched_yield",
    ),
    "system calls: send (sendmsg)": ("'sendmsg'", "'send' of '_socket", "'sendall'"),
    "system calls: select / poll": ("select", "poll"),
    "thread hand-offs (queue, Condition, locks)": ("queue", "threading.py", "lock"),
    "frame headers: built, packed (Frame(), replace, struct)": (
        "dataclasses.py",
        "<string>:",  # a dataclass's generated __init__: Frame(...)
        "(pack)",
        "struct",
        "frame_at",
        "getattr",  # dataclasses.replace reads every field by name
    ),
    "frame checks (decode_header, checked_header)": ("decode_header", "frames.py"),
    "doing() / contextvars": ("activity.py", "contextlib.py", "contextvar", "builtins.next"),
    "trace / logging checks": ("logs.py", "logging", "(trace"),
    "numpy and byte views (add, copy, as_bytes)": (
        "numpy",
        "ndarray",
        "as_bytes",
        "memoryview",
    ),
    "clocks (monotonic, perf_counter)": ("monotonic", "perf_counter", "time.time"),
    # the rest: Python's cost of the calls themselves, by where they are
    "the ring's loop and schedule (ring.py, shm_hop.py, schedule.py)": (
        "ring.py",
        "shm_hop.py",
        "schedule.py",
    ),
    "the links' code (links.py, shm.py, netem.py)": ("links.py", "shm.py", "netem.py"),
    "the sending thread's front (sender.py: put, flush)": ("sender.py",),
}
OTHER = "other (builtins: len, min...; allreduce()'s checks; the communicator)"


def timed_calls(comm, n: int, reps: int, batches: int) -> list[float]:
    """Seconds per AllReduce of n float32, one figure per batch of `reps` calls."""
    x = np.zeros(n, np.float32)  # zeros: sums stay finite however many calls
    for _ in range(max(20, reps // 5)):
        allreduce(comm, x, algorithm="ring")
    out = []
    for _ in range(batches):
        barrier(comm)
        t = time.perf_counter()
        for _ in range(reps):
            allreduce(comm, x, algorithm="ring")
        out.append((time.perf_counter() - t) / reps)
    return out


def profiler_cost() -> tuple[float, float]:
    """cProfile's own cost of recording one call (seconds): of a Python function, of a C one.
    Timed here, in the profiled process, on loops of empty calls."""

    def empty() -> None:
        pass

    def python_calls(n: int) -> None:
        for _ in range(n):
            empty()

    def c_calls(n: int) -> None:
        for _ in range(n):
            len(())

    costs = []
    for loop in (python_calls, c_calls):
        plain = profiled = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            loop(20000)
            plain = min(plain, time.perf_counter() - t)
            prof = cProfile.Profile()
            prof.enable()
            t = time.perf_counter()
            loop(20000)
            profiled = min(profiled, time.perf_counter() - t)
            prof.disable()
        costs.append(max(0.0, profiled - plain) / 20000)
    return costs[0], costs[1]


def cpu_seconds() -> tuple[float, float]:
    """This process's CPU time so far, all its threads: (in Python and libraries, in the kernel)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime


def profiled_calls(comm, n: int, reps: int) -> dict | None:
    """Rank 0: the plain wall and CPU times of `reps` AllReduces of n float32 (the batch with
    the best wall time of three), then a profile of `reps` more."""
    x = np.zeros(n, np.float32)
    for _ in range(200):
        allreduce(comm, x, algorithm="ring")
    plain = (float("inf"), 0.0, 0.0)
    for _ in range(3):
        barrier(comm)
        (u0, s0), t0 = cpu_seconds(), time.perf_counter()
        for _ in range(reps):
            allreduce(comm, x, algorithm="ring")
        wall, (u1, s1) = time.perf_counter() - t0, cpu_seconds()
        plain = min(plain, (wall, u1 - u0, s1 - s0))
    costs = profiler_cost()
    barrier(comm)
    prof = cProfile.Profile() if comm.rank == 0 else None
    if prof is not None:
        prof.enable()
    t0 = time.perf_counter()
    for _ in range(reps):
        allreduce(comm, x, algorithm="ring")
    profiled = time.perf_counter() - t0
    if prof is None:
        return None
    prof.disable()
    stats = pstats.Stats(prof).stats  # {(file, line, name): (cc, ncalls, tottime, cumtime, ..)}
    rows = [
        (f"{f}:{line}({name})", f == "~", nc, tt)
        for (f, line, name), (_, nc, tt, _, _) in stats.items()
        if "_lsprof.Profiler" not in name
    ]
    wall, user, system = plain
    return dict(plain=wall, user=user, system=system, profiled=profiled, rows=rows, costs=costs)


def component_of(where: str) -> str:
    for name, needles in COMPONENTS.items():
        if any(needle.lower() in where.lower() for needle in needles):
            return name
    return OTHER


def breakdown(got: dict, hops: int) -> tuple[list[tuple[str, float, float]], float]:
    """([(component, calls per hop, us per hop)], scale): each function's own time under
    cProfile less cProfile's cost of recording its calls (profiler_cost), then all scaled by
    `scale` to add up to the hop not profiled (what recording costs in real code, calls to
    calls, is more than on empty ones)."""
    py_cost, c_cost = got["costs"]
    calls: dict[str, int] = {}
    sums: dict[str, float] = {}
    for where, builtin, nc, tt in got["rows"]:
        name = component_of(where)
        calls[name] = calls.get(name, 0) + nc
        sums[name] = sums.get(name, 0.0) + max(0.0, tt - nc * (c_cost if builtin else py_cost))
    scale = got["plain"] / max(sum(sums.values()), 1e-12)
    order = [*COMPONENTS, OTHER]
    rows = [(n, calls[n] / hops, sums[n] * scale / hops * 1e6) for n in order if n in sums]
    return rows, scale


def print_breakdown(transport: str, p: int, got: dict, hops: int) -> None:
    print(f"\none hop, 4 KB, p = {p}, {transport}, rank 0 under cProfile:")
    print(f"  {'component':<66} {'calls/hop':>9} {'us/hop':>7}")
    rows, scale = breakdown(got, hops)
    for name, calls, us in rows:
        print(f"  {name:<66} {calls:9.1f} {us:7.2f}")
    us = 1e6 / hops
    lines = {
        "= the hop, not profiled (wall time / hops)": got["plain"] * us,
        "  rank 0's CPU, all threads: in Python and libraries": got["user"] * us,
        "  rank 0's CPU, all threads: in the kernel": got["system"] * us,
        "  (under cProfile the hop took": got["profiled"] * us,
    }
    for name, value in lines.items():
        print(f"  {name:<76} {value:7.2f}")
    print(f"  (the components: own times under cProfile less its cost per call, x {scale:.2f})")


def size_text(nbytes: int) -> str:
    return f"{nbytes >> 10} KB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--transports", default="shm,tcp")
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--sizes", default="4096,65536", help="bytes, comma separated")
    ap.add_argument("--reps", type=int, default=200, help="AllReduces per batch")
    ap.add_argument("--batches", type=int, default=7)
    ap.add_argument("--runs", type=int, default=3, help="jobs per figure: the best is kept")
    ap.add_argument("--profile-reps", type=int, default=2000)
    ap.add_argument("--profile-ranks", type=int, default=2, help="p of the profiled ring")
    ap.add_argument("--no-breakdown", action="store_true")
    args = ap.parse_args()
    transports = args.transports.split(",")

    print(f"{'transport':>9} {'p':>2} {'size':>6} {'us/AllReduce':>13} {'us/hop':>8}")
    for transport in transports:
        for p in (int(r) for r in args.ranks.split(",")):
            for nbytes in (int(s) for s in args.sizes.split(",")):
                best = float("inf")
                for _ in range(args.runs):
                    batches = launch_local(
                        p, timed_calls, (nbytes // 4, args.reps, args.batches),
                        start_method="fork", transport=transport, allreduce="ring",
                    )  # fmt: skip
                    # a batch lasts as long as its slowest rank
                    slowest = [max(b) for b in zip(*batches, strict=True)]
                    best = min(best, *slowest)
                hop = best / (2 * (p - 1))
                print(f"{transport:>9} {p:>2} {size_text(nbytes):>6} "
                      f"{best * 1e6:13.1f} {hop * 1e6:8.1f}", flush=True)  # fmt: skip
    if args.no_breakdown:
        return
    for transport in transports:
        got = launch_local(
            args.profile_ranks, profiled_calls, (1024, args.profile_reps),
            start_method="fork", transport=transport, allreduce="ring",
        )[0]  # fmt: skip
        hops = 2 * (args.profile_ranks - 1) * args.profile_reps
        print_breakdown(transport, args.profile_ranks, got, hops)


if __name__ == "__main__":
    main()
