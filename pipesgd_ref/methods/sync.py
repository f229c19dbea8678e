"""Decentralized synchronous SGD: compute, ring AllReduce (mean), update. Every step.

    iteration t on every worker r:
        g_r   = grad f(w_t; minibatch (r, t))          # compute
        g     = AllReduce(g_r) / p                      # communicate: the network works,
                                                        #   the compute units wait
        w_t+1 = w_t - lr_t * g                          # update: identical on every rank

Iteration time t_comp + T_allreduce + t_update: compute and communication alternate, each
idle while the other works. The oracle is `reference.sync_sgd` (equal to large-batch SGD).

--device cuda: the same loop on GPU arrays (Worker.to_device); the AllReduce is the device
ring (comm/device_ring.py), bitwise the host ring's on the same gradients.
"""

from __future__ import annotations

import time

from pipesgd_ref.comm.rendezvous import Communicator
from pipesgd_ref.comm.ring import barrier
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.runtime import checkpoint, lifetime
from pipesgd_ref.runtime.worker import Worker, WorkerResult
from pipesgd_ref.trace import Timeline


def sync_worker(
    comm: Communicator, cfg: TrainConfig, progress=None, worker: Worker | None = None
) -> WorkerResult:
    """One rank of synchronous SGD. `worker`: this process's runtime, built once by the
    caller (train.py's per-rank job); built here when a caller runs the method directly."""
    worker = worker or Worker.build(cfg, comm.rank, comm.world_size)
    worker.to_device(comm.rank)  # --device cuda: weights and buffers on this rank's GPU
    timeline = Timeline(comm.rank)
    grads = worker.new_buffer()  # preallocated once, beside the weights: the loop allocates none
    codec = worker.codec()
    losses, step_end = [], []
    skipped = []  # --skip-nonfinite: (step, ranks left out)
    barrier(comm)  # every rank starts step 0 together: the run's clock starts with training
    end = worker.steps  # the first step not run: worker.steps, or where a signal stopped the job
    for t in range(worker.start_step, worker.steps):
        if not lifetime.entering(comm.rank, t):  # a signal: every rank stops before this step
            end = t
            break
        with timeline.span("compute", "compute", t):
            loss, ok = worker.compute(t, grads, codec, comm.rank)  # ok False: left out (zeros)
        with timeline.span("allreduce", "comm", t):
            # the sync point: every rank waits for every rank (host ring, or the device ring)
            bad = worker.average(comm, grads, codec, ok)
            if bad:  # --skip-nonfinite: their gradients were left out of the mean
                skipped.append((t, bad))
        with timeline.span("update", "compute", t):
            worker.sgd_step(grads, t)
        losses.append(loss)
        step_end.append(time.perf_counter())
        if progress is not None:
            progress(t, worker.params_host(), loss)  # on the GPU: a copy, rank 0 only
        if comm.rank == 0 and checkpoint.due(cfg, t):  # every replica is the same: one writes
            worker.save_checkpoint(t + 1)
    if comm.rank == 0 and cfg.out:
        worker.save_checkpoint(end)
    extra = {"nonfinite_skipped": skipped, "stopped_at": end if end < worker.steps else None}
    return WorkerResult(comm.rank, worker.host(worker.params), losses, step_end, timeline.events,
                        comm.bytes_sent, extra)  # fmt: skip
