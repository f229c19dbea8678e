"""Pipe-SGD of width K (Li et al., NeurIPS 2018; docs/paper.md, section 2): compute and
communication overlap.

Each worker runs two threads. The compute thread computes g_t on the current weights and hands
it to the communication thread, which AllReduces it while the compute thread goes on to
iteration t+1. The update at step t applies the averaged gradient of step t-K+1 (staleness
s = K-1), so K-1 gradients are in flight at any time, each in one of K preallocated buffers.

    phase          step t               compute thread                      comm thread
    warm-up        t < W                g_t; hand over; wait avg(g_t);     AllReduce(g_t)
                                        w -= lr_t avg(g_t)   (synchronous)
    fill           W <= t < W + s       g_t; hand over                      AllReduce(g_t)
                                        (no update yet: w_{t+1} = w_t)
    steady state   t >= W + s           g_t; hand over; wait avg(g_{t-s});  AllReduce(g_t)
                                        w -= lr_t avg(g_{t-s})              overlaps g_{t+1}
    drain          after the last step  wait and apply the s gradients still in flight

Every rank applies the same averaged gradients in the same order (the ring makes them bitwise
identical), so the replicas stay identical, the final weights included, and so does the
optimiser's velocity (--momentum: methods/optimizer.py), which each replica keeps and which
every update above, warm-up, steady state and drain, advances in that order. Iteration time in
steady state: max(t_comp + t_update, T_allreduce). The oracle is `reference.delayed_sgd`.

NumPy, Numba (nogil) and socket calls release the GIL, so the two threads truly run at once.

--device cuda: the K buffers and the weights live on the GPU (Worker.to_device); the
communication thread makes the worker's GPU current in itself (CUDA contexts are per thread)
and runs the device ring (comm/device_ring.py). Both threads issue work on the default stream,
which orders a buffer's copies after the kernels that wrote it.
"""

from __future__ import annotations

import queue
import threading

import numpy as np

from pipesgd_ref.comm.ring import barrier
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.errors import JobError
from pipesgd_ref.methods.compensation import PipeCompensation
from pipesgd_ref.methods.table import METHODS
from pipesgd_ref.runtime.hooks import Hooks
from pipesgd_ref.runtime.worker import Worker, WorkerResult
from pipesgd_ref.trace import Timeline

_STOP = None  # tells the communication thread to finish


class CommThread:
    """AllReduces (step, buffer) pairs in the order they are handed over. `after(step)`, if
    given, runs in this thread once step's AllReduce is done, before the compute thread hears
    of it (the calibration times ring hops there, beside the computation)."""

    def __init__(self, comm, timeline: Timeline, worker: Worker, codec=None, after=None):
        from pipesgd_ref.timing.emulated import emulated_allreduce_seconds

        self.comm, self.timeline, self.codec, self.after = comm, timeline, codec, after
        self.allreduce_s = emulated_allreduce_seconds(worker.cfg, worker.params.size)
        self.worker = worker  # where the buffers live: its `average` fits them
        self.skipped: list[tuple[int, list[int]]] = []  # (step, ranks left out)
        self.todo: queue.SimpleQueue = queue.SimpleQueue()
        self.done: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name=f"comm-{comm.rank}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with self.worker.device_scope():  # --device cuda: the worker's GPU, in this thread too
            while (item := self.todo.get()) is not _STOP:
                step, buf, ok = item
                try:
                    with self.timeline.span("allreduce", "comm", step):
                        bad = self.worker.average(self.comm, buf, self.codec, ok)  # host/device
                        if bad:  # --skip-nonfinite: their gradients were left out of the mean
                            self.skipped.append((step, bad))
                    if self.after is not None:
                        self.after(step)
                except BaseException as e:  # handed to the compute thread, which re-raises
                    self.done.put(e)
                    return
                self.done.put((step, buf))

    def start_allreduce(self, step: int, buf: np.ndarray, ok: bool = True) -> None:
        """Hand over g_step; `ok` False: it was left out (zeros, --skip-nonfinite)."""
        self.todo.put((step, buf, ok))

    def wait(self, expected_step: int):
        """Block until the AllReduce of `expected_step` is done; return its averaged buffer."""
        try:  # the ring's own timeouts bound this wait; the margin is a guard against bugs
            # (each hop is bounded by the timeout, a whole AllReduce on a slow emulated link
            # only by its 2 (p - 1) hops: `allreduce_s`)
            item = self.done.get(timeout=2 * self.comm.timeout + 5 + self.allreduce_s)
        except queue.Empty:
            raise JobError(
                f"rank {self.comm.rank}: the AllReduce of step {expected_step} never finished "
                f"(nothing was handed to the communication thread for it)"
            ) from None
        if isinstance(item, BaseException):
            raise item
        step, buf = item
        assert step == expected_step, f"pipeline out of order: got {step}, want {expected_step}"
        return buf

    def stop(self) -> None:
        self.todo.put(_STOP)
        self.thread.join(timeout=self.comm.timeout)


class InFlight:
    """The averaged gradients whose update is still to come: AllReduces the communication
    thread is running, and gradients already back (restored from a checkpoint, or fetched
    early to write one), by step."""

    def __init__(self, comm_thread: CommThread, cfg: TrainConfig, first: int, restored: dict):
        self.comm_thread, self.ready = comm_thread, dict(restored)
        self.s, self.warmup, self.first = cfg.staleness, cfg.warmup_steps, first

    def steps(self, end: int) -> list[int]:
        """The steps whose averaged gradients are not yet applied when step `end` is next:
        the s before it (none of the warm-up's), computed in this run or restored (a run
        resumed from a final, drained checkpoint has none of the steps before its start)."""
        before = range(max(self.warmup, end - self.s), end)
        return [u for u in before if u >= self.first or u in self.ready]

    def averaged(self, step: int):
        """avg(g_step): waits for its AllReduce unless it is back already."""
        return self.ready.pop(step) if step in self.ready else self.comm_thread.wait(step)

    def fetch(self, end: int) -> dict:
        """Every gradient in flight before step `end`, waited for now (and still applied
        later, in order): a checkpoint's part of the state."""
        for u in self.steps(end):
            self.ready[u] = self.ready[u] if u in self.ready else self.comm_thread.wait(u)
        return {u: self.ready[u] for u in self.steps(end)}


def pipe_worker(comm, cfg: TrainConfig, hooks: Hooks | None = None) -> WorkerResult:
    """One rank of Pipe-SGD of width cfg.width (the phases of the module docstring). `hooks`:
    this rank's runtime (its Worker, built once by the per-rank job); built here when a
    caller runs the method directly."""
    K, s = cfg.width, cfg.staleness  # width, staleness
    hooks = hooks or Hooks.build(comm, cfg, METHODS["pipe"])
    worker, span = hooks.worker, hooks.timeline.span
    worker.to_device(comm.rank)  # --device cuda: weights, buffers, resumed gradients on the GPU
    warmup, first = cfg.warmup_steps, worker.start_step
    # K buffers: K-1 gradients in flight, one being computed. Buffer t % K is reused at step
    # t + K; its gradient was applied at step t + K - 1 at the latest.
    buffers = [worker.new_buffer() for _ in range(K)]
    codec = worker.codec()
    comm_thread = CommThread(comm, hooks.timeline, worker, codec)
    flight = InFlight(comm_thread, cfg, first, worker.pending)
    stale = PipeCompensation(cfg, worker)  # --compensation: none, dc, dc-adaptive or predict

    def update(t: int, t_grad: int) -> None:  # w_{t+1} = w_t - lr_t * avg(g_{t_grad})
        avg = flight.averaged(t_grad)  # stale (t_grad < t): compensated as --compensation says
        with span("update", "compute", t):
            worker.sgd_step(stale.applied(t_grad, avg) if t_grad < t else avg, t)

    def save(end: int) -> None:  # the gradients in flight are part of the state
        if cfg.out:
            hooks.save(end, flight.fetch(end))

    barrier(comm)  # every rank starts step 0 together, before the comm thread's first AllReduce
    try:
        for t in range(first, worker.steps):
            if not hooks.keep_going(t):  # a signal: every rank stops before this same step
                break
            buf, pipelined = buffers[t % K], t >= warmup
            # --- compute g_t on the current w_t (predict: on the weights it will meet)
            with span("compute", "compute", t):
                at = stale.weights_for(flight.steps(t)) if pipelined else None
                loss, ok = worker.compute(t, buf, codec, comm.rank, at)
                if pipelined:
                    stale.computed(t, buf)  # dc: keep w_t; predict: keep this g_t
            # --- communicate: AllReduce(g_t) starts now, in the communication thread
            comm_thread.start_allreduce(t, buf, ok)
            # --- update
            if t < warmup:  # warm-up: synchronous, the fresh gradient
                update(t, t)
            elif t >= warmup + s and (t - s >= first or t - s in flight.ready):
                # steady state: w_{t+1} = w_t - lr_t * avg(g_{t-s}), whose AllReduce ran
                # during this compute (after a resume from a final, drained checkpoint,
                # g_{t-s} was already applied: the pipe refills)
                update(t, t - s)
            # else: fill, nothing has arrived yet
            hooks.step_done(t, loss)
            if hooks.checkpoint_due(t):  # so that a resumed run applies the same gradients
                save(t + 1)
        if hooks.stopped_at is not None:
            # Stopped by a signal: no drain, so that the checkpoint continues this very run
            # (a resumed run applies the gradients in flight where this one would have).
            save(hooks.stopped_at)
        else:
            # --- drain: the gradients still in flight, oldest first, as the oracle applies them
            for j, t_grad in enumerate(flight.steps(worker.steps)):
                update(worker.steps + j, t_grad)
            hooks.save(worker.steps)  # after the drain: nothing in flight
    finally:
        comm_thread.stop()
    extra = dict(nonfinite_skipped=comm_thread.skipped, stopped_at=hooks.stopped_at)
    extra["allreduce_ran"] = comm.allreduce_ran()  # what carried the gradients (summary.json)
    return hooks.result(worker.params, comm.bytes_sent, **extra)
