"""Pipe-SGD of width K (shared/PAPER.md section 2): compute and communication overlap.

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
import time

import numpy as np

from pipesgd_ref.comm.rendezvous import Communicator
from pipesgd_ref.comm.ring import barrier
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.errors import JobError
from pipesgd_ref.methods.compensation import DelayCompensation, predicted_weights
from pipesgd_ref.runtime import checkpoint, lifetime
from pipesgd_ref.runtime.worker import Worker, WorkerResult
from pipesgd_ref.trace import Timeline

_STOP = None  # tells the communication thread to finish


class CommThread:
    """AllReduces (step, buffer) pairs in the order they are handed over. `after(step)`, if
    given, runs in this thread once step's AllReduce is done, before the compute thread hears
    of it (the calibration times ring hops there, beside the computation)."""

    def __init__(
        self, comm: Communicator, timeline: Timeline, worker: Worker, codec=None, after=None
    ):
        from pipesgd_ref.config import emulated_allreduce_seconds

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


def pipe_worker(
    comm: Communicator, cfg: TrainConfig, progress=None, worker: Worker | None = None
) -> WorkerResult:
    """One rank of Pipe-SGD of width cfg.width. `worker`: this process's runtime, built once
    by the caller (train.py's per-rank job); built here when a caller runs the method
    directly."""
    worker = worker or Worker.build(cfg, comm.rank, comm.world_size)
    worker.to_device(comm.rank)  # --device cuda: weights, buffers, resumed gradients on the GPU
    K, s, warmup = cfg.width, cfg.width - 1, cfg.warmup_steps
    timeline = Timeline(comm.rank)
    # K buffers: K-1 gradients in flight, one being computed. Buffer t % K is reused at step
    # t + K; its gradient was applied at step t + K - 1 at the latest.
    buffers = [worker.new_buffer() for _ in range(K)]
    codec = worker.codec()
    comm_thread = CommThread(comm, timeline, worker, codec)
    # Averaged gradients already back (from a checkpoint, or fetched early to write one).
    ready: dict = dict(worker.pending)

    def averaged(step: int):
        return ready.pop(step) if step in ready else comm_thread.wait(step)

    def in_flight(end: int) -> list[int]:
        """The steps whose averaged gradients are not yet applied when step `end` is next:
        the s before it (none of the warm-up's), computed in this run or restored (a run
        resumed from a final, drained checkpoint has none of the steps before its start)."""
        return [u for u in range(max(warmup, end - s), end) if u >= worker.start_step or u in ready]

    def save_with_in_flight(end: int) -> None:
        """The checkpoint before step `end`: the gradients in flight are part of the state,
        so wait for them now (they are applied later, from `ready`) and save them too."""
        pending = in_flight(end)
        for u in pending:
            if u not in ready:
                ready[u] = comm_thread.wait(u)
        if comm.rank == 0:
            worker.save_checkpoint(end, {u: ready[u] for u in pending})

    stale = Compensation(cfg, worker)  # --compensation: none, dc, dc-adaptive or predict

    losses, step_end = [], []
    stopped_at = None  # where a signal stopped the job (every rank stops before one step)
    barrier(comm)  # every rank starts step 0 together, before the comm thread's first AllReduce
    try:
        for t in range(worker.start_step, worker.steps):
            if not lifetime.entering(comm.rank, t):
                stopped_at = t
                break
            buf = buffers[t % K]
            pipelined = t >= warmup
            with timeline.span("compute", "compute", t):
                # g_t, on the current w_t (predict: on the weights it will be applied to)
                at = stale.weights_for(in_flight(t)) if pipelined else None
                loss, ok = worker.compute(t, buf, codec, comm.rank, at)
                if pipelined:
                    stale.computed(t, buf)  # dc: keep w_t; predict: keep this g_t
            comm_thread.start_allreduce(t, buf, ok)  # AllReduce(g_t) starts now
            if t < warmup:  # warm-up: synchronous, the fresh gradient
                avg = averaged(t)
                with timeline.span("update", "compute", t):
                    worker.sgd_step(avg, t)
            elif t >= warmup + s and (t - s >= worker.start_step or t - s in ready):
                # steady state: avg(g_{t-s}) ran during this compute (after a resume from a
                # final, drained checkpoint, g_{t-s} was already applied: the pipe refills)
                avg = averaged(t - s)
                with timeline.span("update", "compute", t):
                    worker.sgd_step(stale.applied(t - s, avg), t)
            # else: fill, nothing has arrived yet
            losses.append(loss)
            step_end.append(time.perf_counter())
            if progress is not None:
                progress(t, worker.params_host(), loss)  # on the GPU: a copy, rank 0 only
            if checkpoint.due(cfg, t):  # so that a resumed run applies the same gradients
                save_with_in_flight(t + 1)
        if stopped_at is not None:
            # Stopped by a signal: no drain, so that the checkpoint continues this very run
            # (a resumed run applies the gradients in flight where this one would have).
            if cfg.out:
                save_with_in_flight(stopped_at)
        else:
            # Drain: the gradients still in flight, oldest first, as the oracle applies them.
            for j, t_grad in enumerate(in_flight(worker.steps)):
                avg = averaged(t_grad)
                with timeline.span("update", "compute", worker.steps + j):
                    worker.sgd_step(stale.applied(t_grad, avg), worker.steps + j)
            if comm.rank == 0 and cfg.out:
                worker.save_checkpoint(worker.steps)  # after the drain: nothing in flight
    finally:
        comm_thread.stop()
    return WorkerResult(comm.rank, worker.host(worker.params), losses, step_end, timeline.events,
                        comm.bytes_sent, {"nonfinite_skipped": comm_thread.skipped,
                                          "stopped_at": stopped_at})  # fmt: skip


class Compensation:
    """One replica's --compensation (methods/compensation.py), in the order the oracle
    (reference.delayed_sgd) uses, so the replicas stay bitwise identical and equal to it:

        weights_for(in flight)  the weights g_t is computed at: w_t (None: the worker's own),
                                or for predict w_t - sum over the steps u in flight of
                                lr_{u+s} * (this worker's own g_u)
        computed(t, g_t)        after the computation, before the AllReduce overwrites g_t:
                                dc keeps a copy of w_t, predict a copy of g_t
        applied(u, avg)         what the update of avg(g_u) applies: avg, or for dc
                                avg + lam * avg * avg * (w_now - w_u)

    Memory: K vectors (one per step in flight and the one being computed, reused as the pipe's
    gradient buffers are: step t's in slot t % K), and predict's weights."""

    def __init__(self, cfg: TrainConfig, worker: Worker):
        self.kind, self.s, self.lr_at, self.worker = (
            cfg.compensation,
            cfg.staleness,
            cfg.lr_at,
            worker,
        )
        w = worker.params
        self.kept = [np.empty_like(w) for _ in range(cfg.width)] if self.kind != "none" else []
        self.dc = None
        if self.kind in ("dc", "dc-adaptive"):
            self.dc = DelayCompensation(self.kind, cfg.dc_lambda, w.size, w.dtype)
        self.predicted = np.empty_like(w) if self.kind == "predict" else None

    def weights_for(self, in_flight: list[int]):
        if self.predicted is None:
            return None
        ahead = [(self.lr_at(u + self.s), self.kept[u % len(self.kept)]) for u in in_flight]
        return predicted_weights(self.worker.params, ahead, self.predicted)

    def computed(self, t: int, grads: np.ndarray) -> None:
        if self.kept:
            np.copyto(
                self.kept[t % len(self.kept)], grads if self.dc is None else self.worker.params
            )

    def applied(self, u: int, avg: np.ndarray) -> np.ndarray:
        if self.dc is None:
            return avg
        return self.dc.correct(avg, self.worker.params, self.kept[u % len(self.kept)])
