"""One rank's part of a training job, whoever started it (local workers, torchrun, mpirun,
srun): its Worker, built once from the job's inputs, handed to the method's loop through the
rank's Hooks; rank 0 also records the run and evaluates it after training.

A model with batch norm: the job's running statistics are worker 0's (runtime/worker.py), as
under PyTorch DDP, whose replicas all use rank 0's buffers. After a ring method's loop every
replica receives rank 0's (`share_rank0_buffers`), so every rank's result holds the same
statistics, as its weights are the same; a parameter server's rank 0 already holds worker 0's.
"""

from __future__ import annotations

import numpy as np

from pipesgd_ref.config import TrainConfig
from pipesgd_ref.methods.table import method
from pipesgd_ref.runtime.hooks import Hooks
from pipesgd_ref.runtime.inputs import JobInputs
from pipesgd_ref.runtime.summary import Recorder
from pipesgd_ref.runtime.worker import Worker, WorkerResult


def n_ranks(cfg: TrainConfig) -> int:
    """Processes in a job of cfg: one per worker, plus the server for ps-sync and ps-async."""
    return method(cfg.algo).ranks(cfg.world_size)


def job_allreduce(cfg: TrainConfig) -> str:
    """The AllReduce algorithm a job of cfg joins with (JobSpec.allreduce): cfg.allreduce, but
    the ring where only the ring runs, which is what auto means there: a codec (the compressed
    ring), --device cuda (the device ring), --comm mpi (the ring over MPI), a parameter
    server's job (no AllReduce of gradients); runtime/preflight.py refuses any other name
    asked for with a codec, cuda or MPI."""
    if method(cfg.algo).server:  # its links are the star's: no AllReduce to choose
        return "ring"
    ring_only = cfg.codec != "none" or cfg.device == "cuda" or cfg.comm == "mpi"
    return "ring" if ring_only and cfg.allreduce == "auto" else cfg.allreduce


def build_worker(cfg: TrainConfig, rank: int, inputs: JobInputs | None = None) -> Worker:
    """The Worker of `rank` in a job of cfg, as its method's row lays out the ranks; `inputs`:
    the job's data, model and checkpoint, when the launcher built them once."""
    return Worker.for_rank(cfg, rank, method(cfg.algo), inputs)


def train_job(
    comm,
    cfg: TrainConfig,
    show_progress: bool,
    label: str | None = None,
    worker: Worker | None = None,
    inputs: JobInputs | None = None,
) -> WorkerResult:
    """One rank's part of a job: its Worker, built once here (a joined rank brings the one it
    checked its inputs with) and handed to cfg.algo's method, which trains with it. Rank 0
    also records the run (a progress bar, weight snapshots) and, after training, evaluates the
    snapshots and the final weights on the test set, into its result's extra: the summary
    needs neither model nor data then, and the evaluation costs the run nothing."""
    # Why once: a Worker loads the data and the checkpoint and builds w_0; building it again
    # (the recorder's sizes, then the method) would delay this rank's first step, and with
    # it every rank's.
    worker = worker or build_worker(cfg, comm.rank, inputs)
    row = method(cfg.algo)
    recorder = None
    if comm.rank == 0:
        per_step = cfg.world_size if row.checkpoint_rounds else 1  # ps-async: an update a push
        recorder = Recorder(
            cfg,
            worker.steps * per_step,
            worker.sampler.steps_per_epoch * per_step,
            per_step,
            show_progress,
            label,
            worker.params.size,
            worker.model.n_buffers,
        )
        model, data = worker.model, worker.data  # the host model (--device cuda replaces it)
    try:
        result = row.loop(comm, cfg, Hooks(comm.rank, worker, recorder))
    finally:
        if recorder is not None:
            recorder.close()
    if not row.server:
        share_rank0_buffers(comm, result)
    if recorder is not None:  # after training: the evaluation costs the run nothing
        result.extra["eval_curve"] = recorder.eval_curve(model, data)
        X, y = data.X_test, data.y_test
        result.extra["test_accuracy"] = model.accuracy(result.params, X, y, result.buffers)
        # where this run began: the checkpoint it resumed may be overwritten by now (a
        # restart resumes from the folder it writes to)
        result.extra["start_step"] = worker.start_step
    return result


def share_rank0_buffers(comm, result: WorkerResult) -> None:
    """A ring method's end: every replica's running statistics become rank 0's (its result's,
    on the host), as DDP's broadcast_buffers makes them. An AllReduce "sum" of rank 0's
    statistics and zeros on every other rank is an exact copy (x + 0 = x in any order, and
    every rank ends with the same bits), over whatever carries the job's AllReduces (any
    transport, MPI). Nothing to do for a model without any, or for a job a signal stopped:
    its ranks may not all have left the loop at the same step (a joined job's ranks stop
    each on its own), and the checkpoint holds rank 0's."""
    if result.buffers is None or comm.world_size == 1:
        return
    if result.extra.get("stopped_at") is not None:
        return
    from pipesgd_ref.comm.collectives import allreduce

    stats = np.ascontiguousarray(result.buffers, np.float32)
    shared = stats.copy() if comm.rank == 0 else np.zeros_like(stats)
    result.buffers = allreduce(comm, shared, "sum")


def load_before_fork(cfg: TrainConfig) -> None:
    """Import and load in this process what every forked worker of cfg would otherwise load
    on its own: Numba and the codecs, and the method's module. Forked workers inherit it
    all. Why: each worker would pay the import itself, all of them at once on the same cores
    when there are more workers than cores, and a short run's wall time is then mostly
    imports."""
    from pipesgd_ref.codecs import get_codec

    get_codec(cfg.codec, cfg.codec_backend)
    _ = method(cfg.algo).loop  # the property imports the method's module
