"""`pipesgd compare --comm mpi`: the same comparison, every run a job of MPI ranks.

Under `mpirun -n P+1` (P workers and the parameter server's rank: ps-sync and ps-async need
P + 1; the ring's methods run on the first P ranks and the last one sits their runs out), every
rank runs `run_compare_mpi`. Rank 0 drives: it runs compare.run_compare as `pipesgd compare`
does with sockets (calibrate, predict, each method `repeats` times, the table, the checks,
the figures), except that each training run, and the measurement of the wire, is a job of the
MPI ranks rather than of local worker processes. The other ranks serve: they wait for rank 0's
next order, take their part in it, and wait again, until rank 0 says it is done.

    rank 0     calibrate (this host) | order "wire" | order "train" x 6 x repeats | "done"
    rank r>0   wait                  | wire         | train, ...                 | exit

Waiting costs no core: an order comes through `mpi.quiet_bcast` (MPI_Ibarrier tested with
sleeps). A plain MPI_Bcast busy-polls, and on one host the waiting ranks would take the cores
from rank 0 while it times the computation alone.

The calibration. The computation's figures (t_comp with k workers computing at once, and under
pipe's communication; t_u; gamma; the codecs) are timed on rank 0's host as `pipesgd compare`
times them, in local processes. The wire's are MPI's own, measured by the same ring code over
MPILinks that the runs use (`_wire_figures`): a ring hop (alpha: a ring AllReduce of 4 bytes
per hop among the P workers, per hop) and a stream of 16 MB from rank 0 to rank 1 (B, and the
CPU time each byte costs the two sides). The hop while pipe's workers compute (alpha_busy) is
left unmeasured: the local measurement would time the sockets' hop, not MPI's. No link is
emulated: MPI owns the wire (the compare preset's emulated link is dropped, cli.py).

Outputs: as `pipesgd compare`, written by rank 0; a run's trace holds rank 0's spans only (as
every joined job's: the other ranks' never leave their hosts).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipesgd_ref import timing
from pipesgd_ref.comm import mpi
from pipesgd_ref.commands.compare import (
    CALIBRATION_REPS,
    CALIBRATION_TRIES,
    REPEATS,
    calibrate_for,
    preflight_runs,
    run_compare,
)
from pipesgd_ref.commands.train_joined import run_training_joined
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.errors import LaunchError
from pipesgd_ref.runtime.job import n_ranks
from pipesgd_ref.timing.network import hop_job, p2p_job, p2p_summary, stream_and_copy

WIRE_BYTES = 16 << 20  # the stream of the bandwidth measurement (as network_figures')
WIRE_REPS = 6  # its timed repeats; the hop takes a ring AllReduce of 4 bytes per hop ...
HOP_REPS = 50  # ... this many times


def ranks_needed(cfg: TrainConfig) -> int:
    """The MPI job compare needs: the workers and the parameter server's rank."""
    return cfg.world_size + 1


def run_compare_mpi(
    cfg: TrainConfig,
    out: str | Path | None = "runs/compare",
    progress: bool = True,
    log: Callable[[str], None] = print,
    calibration_reps: int = CALIBRATION_REPS,
    calibration_tries: int = CALIBRATION_TRIES,
    repeats: int = REPEATS,
) -> dict[str, Any] | None:
    """`pipesgd compare` as one rank of an MPI job of ranks_needed(cfg) ranks; returns what
    compare.json holds on rank 0, None on the others (see the module docstring)."""
    preflight_runs(cfg)  # every rank, before any measures: each fails with the same line
    MPI = mpi.init_mpi()
    world = MPI.COMM_WORLD
    if world.Get_size() != ranks_needed(cfg):
        raise LaunchError(
            f"rank {world.Get_rank()}: compare --comm mpi with --world-size={cfg.world_size} "
            f"needs {ranks_needed(cfg)} ranks ({cfg.world_size} workers + the parameter "
            f"server's), the MPI job has {world.Get_size()}; start {ranks_needed(cfg)} ranks, "
            f"or pass --world-size={world.Get_size() - 1}"
        )
    if world.Get_rank() != 0:
        while True:
            order, arg = mpi.quiet_bcast(world)
            if order == "done":
                return None
            _carry_out(world, order, arg, progress=False)

    def give(order: str, arg: Any) -> Any:
        mpi.quiet_bcast(world, (order, arg))
        return _carry_out(world, order, arg, progress=progress)

    log(
        f"compare --comm mpi: {world.Get_size()} MPI ranks ({mpi.thread_level_name()}), "
        f"measuring MPI's wire ..."
    )
    network = give("wire", cfg)
    log(
        f"  MPI: hop {network['hop'] * 1e6:.1f} us, stream {network['stream'] / 1e6:.0f} MB/s, "
        f"{network['copy'] * 1e9:.2f} ns of CPU per byte"
    )
    log("calibrating the computation on this host ...")
    cal = calibrate_for(cfg, timing.COMPARE_RUNS, calibration_reps, calibration_tries, network)
    source = {
        **cal.source,
        "alpha": f"a ring AllReduce of 4 B per hop among {cfg.world_size} MPI ranks (the "
        f"median of {HOP_REPS}), per hop",
        "loop_bandwidth": f"the median of {WIRE_REPS} MPI streams of 16 MB from rank 0 to 1",
        "copy": "CPU time per byte of the sending and receiving rank of those streams (mean)",
    }
    cal = dataclasses.replace(cal, alpha_busy=None, source=source)

    def train(run_cfg: TrainConfig, progress: bool, log: Callable, label: str):
        return give("train", run_cfg)

    report = run_compare(
        cfg, out=out, progress=progress, log=log, calibration=cal, repeats=repeats, train=train
    )
    mpi.quiet_bcast(world, ("done", None))
    log(
        "(the bars are set for compare's emulated link, the communication-heavy regime; over "
        "MPI's own wire the regime is this cluster's, so read them as figures, not targets)"
    )
    return report


def _carry_out(world, order: str, arg: Any, progress: bool) -> Any:
    """Every rank's part in one of rank 0's orders; what rank 0 gets back."""
    if order == "wire":
        return _wire_figures(world, arg)
    if order == "train":  # the run's ranks: all for the parameter server, else the first P
        part = mpi.first_ranks(world, n_ranks(arg))
        if part is None:
            return None
        summary, result = run_training_joined(arg, progress=progress, log=_quiet, mpi_comm=part)
        return summary, [result]
    raise ValueError(f"unknown order {order!r}")


def _wire_figures(world, cfg: TrainConfig) -> dict | None:
    """{"hop": s, "stream": bytes/s, "copy": CPU s per byte} of MPI's wire, on rank 0 (None on
    the others): the hop among the first P ranks, the stream between ranks 0 and 1."""
    figures: dict[str, float] = {}
    ring = mpi.first_ranks(world, cfg.world_size)
    if ring is not None:
        comm = mpi.join_mpi(cfg.timeout, mpi_comm=ring)
        try:
            mine = hop_job(comm, comm.world_size, HOP_REPS)  # 4 bytes per hop
        finally:
            comm.close()
        medians = ring.allgather(mine)
        hops = 2 * (cfg.world_size - 1)
        figures["hop"] = max(medians) / hops if hops else 0.0
    pair = mpi.first_ranks(world, 2)
    if pair is not None:
        comm = mpi.join_mpi(cfg.timeout, mpi_comm=pair)
        try:
            got = p2p_job(comm, WIRE_BYTES, WIRE_REPS)
        finally:
            comm.close()
        send, recv = pair.allgather(got)
        figures.update(stream_and_copy(p2p_summary(send, recv, WIRE_BYTES)))
    return figures if world.Get_rank() == 0 else None


def _quiet(*_: Any) -> None:
    pass
