"""Pipe-SGD of width K (docs/paper.md, section 2): compute and communication overlap.

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
identical), so the replicas stay identical, the final weights included. Iteration time in
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

        self.comm = comm
        self.allreduce_s = emulated_allreduce_seconds(worker.cfg, worker.params.size)
        self.worker = worker  # where the buffers live: its `average` fits them
        self.timeline = timeline
        self.codec = codec
        self.after = after
        self.skipped: list[tuple[int, list[int]]] = []  # (step, ranks left out)
        self.todo: queue.SimpleQueue = queue.SimpleQueue()
        self.done: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name=f"comm-{comm.rank}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with self.worker.device_scope():  # --device cuda: the worker's GPU, in this thread too
            self._loop()

    def _loop(self) -> None:
        while (item := self.todo.get()) is not _STOP:
            step, buf, ok = item
            try:
                with self.timeline.span("allreduce", "comm", step):
                    bad = self.worker.average(self.comm, buf, self.codec, ok)  # host or device
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


def pipe_worker(comm, cfg: TrainConfig, hooks: Hooks | None = None) -> WorkerResult:
    """One rank of Pipe-SGD of width cfg.width (the phases of the module docstring). `hooks`:
    this rank's runtime (its Worker, built once by the per-rank job); built here when a
    caller runs the method directly."""
    stale = f"staleness {cfg.staleness}" if cfg.width > 1 else ""
    hooks = hooks or Hooks.build(comm, cfg, stale=stale)
    worker, span = hooks.worker, hooks.timeline.span
    worker.to_device(comm.rank)  # --device cuda: weights, buffers, resumed gradients on the GPU
    K, s, warmup, first = cfg.width, cfg.staleness, cfg.warmup_steps, worker.start_step
    # K buffers: K-1 gradients in flight, one being computed. Buffer t % K is reused at step
    # t + K; its gradient was applied at step t + K - 1 at the latest.
    buffers = [worker.new_buffer() for _ in range(K)]
    codec = worker.codec()
    comm_thread = CommThread(comm, hooks.timeline, worker, codec)
    stale = PipeCompensation(cfg, worker)  # --compensation: none, dc, dc-adaptive or predict
    # Averaged gradients already back (from a checkpoint, or fetched early to write one).
    ready: dict = dict(worker.pending)

    def averaged(step: int):
        return ready.pop(step) if step in ready else comm_thread.wait(step)

    def in_flight(end: int) -> list[int]:
        """The steps whose averaged gradients are not yet applied when step `end` is next:
        the s before it (none of the warm-up's), computed in this run or restored (a run
        resumed from a final, drained checkpoint has none of the steps before its start)."""
        return [u for u in range(max(warmup, end - s), end) if u >= first or u in ready]

    def save(end: int) -> None:
        """The checkpoint before step `end`: the gradients in flight are part of the state,
        so wait for them now (they are applied later, from `ready`) and save them too."""
        if not cfg.out:
            return
        pending = in_flight(end)
        for u in pending:
            ready[u] = ready[u] if u in ready else comm_thread.wait(u)
        hooks.save(end, {u: ready[u] for u in pending})

    def update(t: int, t_grad: int, avg) -> None:
        with span("update", "compute", t):  # w_{t+1} = w_t - lr_t * avg(g_{t_grad})
            worker.sgd_step(stale.applied(t_grad, avg), t)

    barrier(comm)  # every rank starts step 0 together, before the comm thread's first AllReduce
    try:
        for t in range(first, worker.steps):
            if not hooks.keep_going(t):  # a signal: every rank stops before this same step
                break
            buf, pipelined = buffers[t % K], t >= warmup
            # --- compute g_t on the current w_t (predict: on the weights it will meet)
            with span("compute", "compute", t):
                at = stale.weights_for(in_flight(t)) if pipelined else None
                loss, ok = worker.compute(t, buf, codec, comm.rank, at)
                if pipelined:
                    stale.computed(t, buf)  # dc: keep w_t; predict: keep this g_t
            # --- communicate: AllReduce(g_t) starts now, in the communication thread
            comm_thread.start_allreduce(t, buf, ok)
            # --- update
            if t < warmup:  # warm-up: synchronous, the fresh gradient
                update(t, t, averaged(t))
            elif t >= warmup + s and (t - s >= first or t - s in ready):
                # steady state: w_{t+1} = w_t - lr_t * avg(g_{t-s}), whose AllReduce ran
                # during this compute (after a resume from a final, drained checkpoint,
                # g_{t-s} was already applied: the pipe refills)
                update(t, t - s, averaged(t - s))
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
            for j, t_grad in enumerate(in_flight(worker.steps)):
                update(worker.steps + j, t_grad, averaged(t_grad))
            hooks.save(worker.steps)  # after the drain: nothing in flight
    finally:
        comm_thread.stop()
    return hooks.result(
        worker.params,
        comm.bytes_sent,
        nonfinite_skipped=comm_thread.skipped,
        stopped_at=hooks.stopped_at,
    )
