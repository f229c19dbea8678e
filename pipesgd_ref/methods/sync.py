"""Decentralized synchronous SGD: compute, ring AllReduce (mean), update. Every step.

    iteration t on every worker r:
        g_r   = grad f(w_t; minibatch (r, t))          # compute
        g     = AllReduce(g_r) / p                      # communicate: the network works,
                                                        #   the compute units wait
        w_t+1 = w_t - lr_t * g                          # update: identical on every rank

Iteration time t_comp + T_allreduce + t_update: compute and communication alternate, each
idle while the other works. The oracle is `reference.sync_sgd` (equal to large-batch SGD).

The update is the optimiser's (methods/optimizer.py; w - lr_t g is plain SGD's): with
--momentum every replica keeps its own velocity, bitwise the others' (the same averaged
gradients, applied in the same order), and the oracle takes the same rule (`optimizer=`).

--device cuda: the same loop on GPU arrays (Worker.to_device); the AllReduce is the device
ring (comm/device_ring.py), bitwise the host ring's on the same gradients.
"""

from __future__ import annotations

from pipesgd_ref.comm.ring import barrier
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.methods.table import METHODS
from pipesgd_ref.runtime.hooks import Hooks
from pipesgd_ref.runtime.worker import WorkerResult


def sync_worker(comm, cfg: TrainConfig, hooks: Hooks | None = None) -> WorkerResult:
    """One rank of synchronous SGD. `hooks`: this rank's runtime (its Worker, built once by
    the per-rank job); built here when a caller runs the method directly."""
    hooks = hooks or Hooks.build(comm, cfg, METHODS["sync"])
    worker, span = hooks.worker, hooks.timeline.span
    worker.to_device(comm.rank)  # --device cuda: weights and buffers on this rank's GPU
    grads = worker.new_buffer()  # preallocated once, beside the weights: the loop allocates none
    codec = worker.codec()
    skipped = []  # --skip-nonfinite: (step, ranks left out)
    barrier(comm)  # every rank starts step 0 together: the run's clock starts with training
    for t in range(worker.start_step, worker.steps):
        if not hooks.keep_going(t):  # a signal: every rank stops before this same step
            break
        # --- compute: g_r = grad f(w_t; minibatch (r, t)); ok False: left out (zeros)
        with span("compute", "compute", t):
            loss, ok = worker.compute(t, grads, codec, comm.rank)
        # --- communicate: g = AllReduce(g_r) / p, the sync point (every rank waits for all)
        with span("allreduce", "comm", t):
            bad = worker.average(comm, grads, codec, ok)
            if bad:  # --skip-nonfinite: their gradients were left out of the mean
                skipped.append((t, bad))
        # --- update: w_{t+1} = w_t - lr_t * g, the same on every rank
        with span("update", "compute", t):
            worker.sgd_step(grads, t)
        hooks.step_done(t, loss)
        if hooks.checkpoint_due(t):
            hooks.save(t + 1)
    end = worker.steps if hooks.stopped_at is None else hooks.stopped_at
    hooks.save(end)
    return hooks.result(
        worker.params,
        comm.bytes_sent,
        nonfinite_skipped=skipped,
        stopped_at=hooks.stopped_at,
        allreduce_ran=comm.allreduce_ran(),  # what carried the gradients (summary.json)
    )
