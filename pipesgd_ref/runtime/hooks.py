"""What a method's loop calls for everything that is not the algorithm.

A method's file (methods/sync.py, pipe.py, ps.py) reads as its loop: compute, communicate,
update. The product around it (stopping on a signal at one step on every rank, checkpoints,
the progress bar, the timeline of spans, fault injection, the result handed back to the
launcher) reaches the loop through one `Hooks` object and these few calls:

    hooks.worker              the rank's Worker: data, model, weights, steps (runtime/worker.py)
    hooks.timeline            spans for the Chrome trace: `with hooks.timeline.span(...)`
    hooks.keep_going(t)       False once a signal stopped the job before step t (lifetime.py)
    hooks.step_done(t, loss)  after step t: the loss, the step's end time, the progress bar
    hooks.checkpoint_due(t)   whether a periodic checkpoint follows step t (--checkpoint-every)
    hooks.save(next_step, in_flight)   rank 0 writes the checkpoint (with pipe's gradients in
                              flight); the others skip it
    hooks.at_update(v)        the server's planned fault at update v (tests: PIPESGD_FAULT)
    hooks.result(...)         the WorkerResult the launcher collects

The loop never imports checkpoint, lifetime or faults itself: a reader sees the algorithm,
and a change to how runs stop or save touches this file, not every method.
"""

from __future__ import annotations

import time

import numpy as np

from pipesgd_ref.runtime import checkpoint, faults, lifetime
from pipesgd_ref.runtime.worker import Worker, WorkerResult
from pipesgd_ref.trace import Timeline


class Hooks:
    """One rank's hooks: built by the per-rank job (commands/train.py) around the Worker it
    built once, or by `Hooks.build` when a caller runs a method directly (tests)."""

    def __init__(self, rank: int, worker: Worker, progress=None, writer: bool | None = None):
        self.rank = rank
        self.worker = worker
        self.cfg = worker.cfg
        self.progress = progress  # progress(t, params, loss, buffers): rank 0's recorder, or None
        self.writer = rank == 0 if writer is None else writer  # who writes checkpoints
        self.timeline = Timeline(rank)
        self.losses: list[float] = []
        self.step_end: list[float] = []
        self.stopped_at: int | None = None  # the step a signal stopped the job before

    @classmethod
    def build(cls, comm, cfg, row, progress=None) -> Hooks:
        """The hooks of `comm.rank` in a job of cfg running the method `row`
        (methods/table.py), its Worker built here for the job `comm` forms (a parameter
        server's job: comm.world_size - 1 workers)."""
        n_workers = comm.world_size - 1 if row.server else comm.world_size
        return cls(comm.rank, Worker.for_rank(cfg, comm.rank, row, n_workers=n_workers), progress)

    def keep_going(self, step: int) -> bool:
        """Whether to run `step`: False once a signal stopped the job (every rank stops
        before the same step: lifetime.py); the step is then kept as `stopped_at`."""
        if lifetime.entering(self.rank, step):
            return True
        self.stopped_at = step
        return False

    def stop_at(self) -> int | None:
        """The first step no rank runs, once a signal asked for a stop (else None)."""
        return lifetime.stop_at()

    def step_done(self, step: int, loss: float, params=None) -> None:
        """After `step`: record its loss and end time, and show progress (rank 0). `params`:
        the weights to show (default the worker's; on the GPU a host copy is made)."""
        self.losses.append(loss)
        self.step_end.append(time.perf_counter())
        self.show_progress(step, params, loss)

    def show_progress(self, step: int, params=None, loss: float = float("nan")) -> None:
        """Rank 0's progress bar and snapshots of the weights and the running statistics
        (summary.Recorder: the statistics go with the weights they were made with; a
        parameter server's are its copy of worker 0's); nothing elsewhere."""
        if self.progress is not None:
            shown = self.worker.params_host() if params is None else params
            self.progress(step, shown, loss, self.buffers_host())

    def buffers_host(self):
        """The worker's running statistics on the host (a copy, from a GPU), or None."""
        buffers = self.worker.buffers
        return None if buffers is None else self.worker.host(buffers)

    def checkpoint_due(self, step: int) -> bool:
        """Whether a periodic checkpoint (--checkpoint-every, into --out) follows `step`."""
        return checkpoint.due(self.cfg, step)

    def save(self, next_step: int, in_flight: dict | None = None) -> None:
        """The checkpoint before `next_step`, written by one rank (every replica holds the
        same weights). `in_flight`: pipe's averaged gradients not yet applied, step ->
        gradient: part of the state, so that a resumed run applies them where this one
        would have."""
        if self.writer and self.cfg.out:
            self.worker.save_checkpoint(next_step, in_flight)

    def at_update(self, version: int) -> None:
        """The fault planned for this rank at update `version`, if any (PIPESGD_FAULT)."""
        faults.at_step(self.rank, version)

    def result(
        self, params: np.ndarray, bytes_sent: int, losses=None, step_end=None, **extra
    ) -> WorkerResult:
        """What this rank hands back: final weights (on the host), its losses and step ends
        (default those of step_done), its spans, the bytes it sent, the method's extras, and
        its running statistics (on the host; the ring methods' are made rank 0's after the
        loop: runtime/job.py)."""
        losses = self.losses if losses is None else losses
        step_end = self.step_end if step_end is None else step_end
        host, events = self.worker.host(params), self.timeline.events
        result = WorkerResult(self.rank, host, losses, step_end, events, bytes_sent, extra)
        result.buffers = self.buffers_host()
        return result
