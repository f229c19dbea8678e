"""DDP-style synchronous SGD: the AllReduce in buckets, overlapped with the backward pass.

What PyTorch DDP, Horovod, BytePS and most data-parallel trainers do, written out. The backward
pass finishes the last layer's gradient first; each bucket of the gradient (one or more layers)
is handed to a communication thread as soon as the backward has written it, and the ring
all-reduces it while the backward goes on to the layers below. The update waits for the last
bucket. Nothing is stale: every step applies the mean of this step's gradients, as sync does.

    iteration t on every worker r:
        forward
        backward, last layer first; bucket j written  ->  AllReduce(bucket j) / p   (comm thread)
        wait for every bucket                                      (the last one is the tail)
        w_t+1 = w_t - lr_t * g

    time  ->   compute thread:  [ forward ][ backward: L2 | L1 ............ | L0 ]      [update]
               comm thread:                            [AR L2]  [AR L1 ......... ][AR L0]

The buckets (models/layout.py `buckets`): units of the backward (a layer's weights and bias)
taken last layer first until a bucket holds at least --bucket-size bytes. Each bucket is a
contiguous slice of the flat gradient, so the ring all-reduces a view, with no copy; every rank
all-reduces the same buckets in the same order, and the ring leaves each bucket bitwise the same
on every rank, so the replicas never drift apart.

The default --bucket-size, 32KB, gives each layer of the compare preset's MLP its own bucket
(41 KB, 4.2 MB, 266 KB) and its CNN three. A bucket costs the ring's 2(p-1) hops whatever its
size (2(p-1) alpha: a few hundred microseconds with Python's hops here), so much smaller buckets
only add hops; larger ones start the communication later. DDP's defaults (25 MB, the first
bucket 1 MB) are sized for models of hundreds of megabytes: here 25 MB is one bucket (sync, with
the AllReduce after the backward) and a 1 MB first bucket holds both upper layers of the MLP.

What overlap can hide is bounded by the backward that is left when a bucket is ready: the
bucket with the bottom layer is ready only when the backward ends, so its AllReduce is never
hidden, and a model whose big layer is near the input (the MLP's 4.2 MB W1 is second from the
bottom) hides little. Pipe-SGD hides the whole AllReduce behind the next step's forward and
backward, at the price of one step of staleness; the timing models say where each wins
(timing/iteration.py `ddp`, `pipesgd predict --sweep`).

The oracle is sync's: `reference.sync_sgd`, bitwise when each bucket's mean is summed in the
ring's order for that bucket (tests/oracles.py), within float32 rounding of the whole-gradient
ring. The update is the optimiser's (methods/optimizer.py), its velocity in every replica, as
sync's. --skip-nonfinite is refused (runtime/preflight.py): a bucket leaves before the rest of the
gradient is known, so a rank's whole gradient can no longer be left out of the mean.
"""

from __future__ import annotations

from pipesgd_ref.comm.ring import barrier
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.methods.pipe import CommThread
from pipesgd_ref.methods.table import METHODS
from pipesgd_ref.models.layout import buckets
from pipesgd_ref.runtime import faults
from pipesgd_ref.runtime.hooks import Hooks
from pipesgd_ref.runtime.worker import WorkerResult
from pipesgd_ref.units import parse_size


def ddp_worker(comm, cfg: TrainConfig, hooks: Hooks | None = None) -> WorkerResult:
    """One rank of DDP-style SGD. `hooks`: this rank's runtime (its Worker, built once by the
    per-rank job); built here when a caller runs the method directly."""
    hooks = hooks or Hooks.build(comm, cfg, METHODS["ddp"])
    worker, span = hooks.worker, hooks.timeline.span
    worker.to_device(comm.rank)  # --device cuda: weights and buffers on this rank's GPU
    grads = worker.new_buffer()
    codec = worker.codec()
    plan = buckets(worker.model.grad_units(), parse_size(cfg.bucket_size), grads.dtype.itemsize)
    comm_thread = CommThread(comm, hooks.timeline, worker, codec)

    def bucketed(t: int):
        """The backward's `ready` callback of step t: hands each bucket to the comm thread as
        soon as its lowest unit is written (units come in order, last layer first)."""
        sent = 0  # buckets handed over so far

        def ready(lo: int, hi: int, loss: float) -> None:
            nonlocal sent
            while sent < len(plan) and plan[sent][0] >= lo:  # bucket `sent` is complete
                b_lo, b_hi = plan[sent]
                part = grads[b_lo:b_hi]
                if sent == 0:  # PIPESGD_FAULT (tests), before anything of step t leaves
                    faults.at_step(comm.rank, t, part)
                worker.gradient_ok(part, t, loss, comm.rank)  # or stop before it leaves
                worker.feed_back(grads, codec, b_lo, b_hi)  # --error-feedback, per bucket
                comm_thread.start_allreduce(t, part)
                sent += 1

        return ready

    barrier(comm)  # every rank starts step 0 together: the run's clock starts with training
    try:
        for t in range(worker.start_step, worker.steps):
            if not hooks.keep_going(t):  # a signal: every rank stops before this same step
                break
            # --- forward, then backward: each bucket's AllReduce starts as it is written
            with span("compute", "compute", t):
                loss = worker.loss_and_grad(t, grads, ready=bucketed(t))
            # --- the tail: wait for the buckets still in the ring
            for _ in plan:
                comm_thread.wait(t)
            # --- update: w_{t+1} = w_t - lr_t * g, the same on every rank
            with span("update", "compute", t):
                worker.sgd_step(grads, t)
            hooks.step_done(t, loss)
            if hooks.checkpoint_due(t):
                hooks.save(t + 1)
    finally:
        comm_thread.stop()
    end = worker.steps if hooks.stopped_at is None else hooks.stopped_at
    hooks.save(end)
    ran = comm.allreduce_ran()  # what carried the buckets, per bucket size (summary.json)
    return hooks.result(
        worker.params, comm.bytes_sent, stopped_at=hooks.stopped_at, allreduce_ran=ran
    )
