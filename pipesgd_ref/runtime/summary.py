"""The summary of a training run: what happened, measured (summary.json).

    Recorder              rank 0's view during the run: progress bar, a loss line per epoch,
                          a copy of the weights (and of the model's running statistics) every
                          cfg.eval_every steps (evaluated after)
    summarise             the summary from every rank's WorkerResult (a job of local workers)
    gather_for_summary    a joined job: what rank 0 needs from every rank, over the ring
    summary_of_gathered   rank 0's summary of a joined job from what it gathered

The summary (a dict, written as DIR/summary.json by train.py when `cfg.out` is set) holds:
algo, world_size, width, steps, wall_time_s, iter_time_s (the median steady-state step),
t_comp_s and t_comm_s (median span lengths), comm_hidden_fraction, final_train_loss,
test_accuracy, steps_to_target and time_to_target_s (first evaluation at or above
cfg.target_accuracy), bytes sent per rank, allreduce_ran (what carried the gradients, below),
whether the ranks' final weights are identical, loss_curve (a list of {step, wall_time_s,
loss}), eval_curve (a list of {step, wall_time_s, test_accuracy}), config.

bytes_sent_per_rank counts everything each rank handed to its peers (Communicator.bytes_sent:
every frame with its 48-byte header on the ring's and the mesh's links, the start barrier and
the small control AllReduces included, and what it wrote into one host's shared-memory group).
allreduce_ran says which AllReduce carried the gradients, as rank 0 ran them: one entry per
message size (a whole gradient, or a ddp bucket) and algorithm, e.g.

    {"bytes": 2600, "algorithm": "twoshot", "transport": "shm", "calls": 60,
     "bytes_sent": 234000}

with the payload bytes rank 0 sent for them (no headers; per call, comm/choose.py's
`sent_volume` times the message bytes). Only the float32 AllReduces, the gradients', are
listed (Communicator.allreduce_ran); null where the method has no AllReduce (a parameter
server) or the run did not record it (the lesson core).

The test accuracies are computed by rank 0 after training (the Recorder's snapshots and the
final weights, in WorkerResult.extra), so a summary needs neither the model nor the data. A
model with batch norm is evaluated with the running statistics that go with those weights:
the job's, worker 0's (runtime/worker.py), snapshotted with each copy of the weights.
"""

from __future__ import annotations

import hashlib
import logging
import math
import statistics
import time
import warnings
from typing import Any

import numpy as np

from pipesgd_ref.comm.collectives import allgather
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.logs import progress_bar
from pipesgd_ref.runtime.worker import WorkerResult
from pipesgd_ref.trace import hidden_fraction

SNAPSHOT_BUDGET = 1 << 30  # bytes of weight copies rank 0 may keep for the evaluation


class Recorder:
    """Rank 0's view of a run, called after every update: a progress bar (iterations, loss,
    samples/s; optional), a loss line per epoch, and a copy of the weights every
    cfg.eval_every steps. The copies are evaluated on the test set only after training
    (`eval_curve`): evaluating during the run would slow rank 0, and with it every rank, by
    exactly the time it took, and distort the times it measures. A model with batch norm
    (`n_buffers` > 0) is evaluated in evaluation mode, with its running statistics: each copy
    of the weights keeps the statistics of the same moment beside it."""

    def __init__(
        self,
        cfg: TrainConfig,
        total: int,
        per_epoch: int,
        per_step: int,
        bar: bool,
        label: str | None = None,
        n_params: int = 0,
        n_buffers: int = 0,
    ):
        self.cfg = cfg
        self.steps, self.steps_per_epoch = total, per_epoch  # in updates of rank 0
        self.per_step = per_step  # updates per step: p for ps-async's server, else 1
        self.bar = progress_bar(total, label or cfg.algo, enabled=bar)
        self.log = logging.getLogger("pipesgd.train")
        self.every = cfg.eval_every * per_step  # updates between snapshots (0: none)
        self.snapshots: list[tuple[int, float, int]] = []  # (step, perf_counter, row of store)
        self.store = np.empty((0, 0), np.float32)
        self.n_buffers = n_buffers
        self.buffer_store = np.empty((0, 0), np.float32)  # the running statistics, row by row
        if self.every:
            rows = total // self.every
            size = (n_params + n_buffers) * 4  # bytes of one snapshot
            if size * rows > SNAPSHOT_BUDGET:  # thin out rather than run out of memory
                thin = math.ceil(size * rows / SNAPSHOT_BUDGET)
                self.every *= thin
                rows = total // self.every
                self.log.warning(
                    "keeping a copy of the weights every %d steps instead of every %d (memory "
                    "budget %d MB): the time to target is that coarse",
                    self.every // per_step,
                    cfg.eval_every,
                    SNAPSHOT_BUDGET >> 20,
                )
            # Allocated and touched now, before training: a copy during the run is then a
            # plain memcpy, not page faults on fresh memory that would slow rank 0, and
            # with it every rank that waits for it.
            self.store = np.empty((rows, n_params), np.float32)
            self.store.fill(0.0)  # np.zeros would only map the pages; fill touches them
            self.buffer_store = np.full((rows, n_buffers), 0.0, np.float32)  # touched too
        self.start = time.perf_counter()

    def __call__(self, step: int, params: np.ndarray, loss: float, buffers=None) -> None:
        """After update `step`: its weights, its loss, and (batch norm) the running statistics
        on the host, which a snapshot keeps with the weights."""
        now = time.perf_counter()
        done = step + 1
        if self.every and done % self.every == 0 and len(self.snapshots) < len(self.store):
            row = len(self.snapshots)
            self.store[row] = params
            if self.n_buffers:
                self.buffer_store[row] = buffers
            self.snapshots.append((done // self.per_step, now, row))
        self.bar.update(1)
        rate = self.cfg.world_size * self.cfg.batch_size * done / max(now - self.start, 1e-9)
        self.bar.set_postfix(loss=f"{loss:.4f}", samples_s=f"{rate / self.per_step:.0f}")
        if done % self.steps_per_epoch == 0 and done < self.steps:
            self.log.info(
                "epoch %d (step %d): loss %.4f",
                done // self.steps_per_epoch,
                done // self.per_step,
                loss,
            )

    def eval_curve(self, model, data) -> list[dict]:
        """[{step, time (perf_counter s), test_accuracy}] of the snapshots, evaluated now
        (with each snapshot's running statistics, for a model with batch norm)."""

        def accuracy(row: int) -> float:
            X, y = data.X_test, data.y_test
            if not self.n_buffers:
                return model.accuracy(self.store[row], X, y)
            return model.accuracy(self.store[row], X, y, buffers=self.buffer_store[row])

        return [
            {"step": step, "time": when, "test_accuracy": accuracy(row)}
            for step, when, row in self.snapshots
        ]

    def close(self) -> None:
        self.bar.close()


COMM_SPANS = ("allreduce", "push", "pull")  # the timeline spans that are communication


def served(answer: WorkerResult) -> bool:
    """Whether rank 0 was a parameter server (its result says so): the workers are then
    ranks 1..p, and the server's weights are the answer."""
    return answer.extra.get("role") == "server"


def summarise(cfg: TrainConfig, results: list[WorkerResult], wall: float) -> dict[str, Any]:
    """summary.json: what happened, measured."""
    events = [e for r in results for e in r.events]
    answer = results[0]  # rank 0: a ring rank, or the parameter server (its weights count)
    workers = results[1:] if served(answer) else results
    ends = np.array(workers[0].step_end)
    return _summary(
        cfg,
        wall,
        answer,
        worker_losses=np.array([r.losses for r in workers]),
        ends=ends,
        start=min(e["ts"] for e in events) / 1e6 if events else ends[0],
        compute_s=_durations(events, ("compute",)),
        comm_s=_durations(events, COMM_SPANS),
        hidden=hidden_fraction(events, COMM_SPANS),
        bytes_sent=[r.bytes_sent for r in results],
        identical=all(np.array_equal(r.params, answer.params) for r in results),
    )


def _durations(events: list[dict], names: tuple[str, ...]) -> list[float]:
    """Lengths in seconds of the spans called one of `names`."""
    return [e["dur"] / 1e6 for e in events if e["name"] in names]


def _median(values) -> float | None:
    return float(statistics.median(values)) if len(values) else None


def _summary(
    cfg: TrainConfig,
    wall: float,
    answer: WorkerResult,
    *,
    worker_losses: np.ndarray,
    ends: np.ndarray,
    start: float,
    compute_s,
    comm_s,
    hidden: float | None,
    bytes_sent: list[int],
    identical: bool,
) -> dict[str, Any]:
    """The summary from what it is made of, however that was collected (all WorkerResults in
    one process, or gathered over the ring in a joined job): rank 0's result `answer` (its
    extra: the test accuracies rank 0 evaluated after training, where the run began), every
    worker's per-step losses (n_workers x steps), worker 0's step ends and the trace's start
    (perf_counter s, rank 0's clock), the compute and communication span lengths (s) of every
    rank, the share of communication hidden under computation, and per rank the bytes sent."""
    start_step = answer.extra.get("start_step", 0)
    steps = worker_losses.shape[1]
    skip = min(steps - 1, cfg.warmup_steps + cfg.width + 1)  # steady state only
    iter_times = np.diff(ends[skip:]) if steps - skip > 1 else np.diff(ends)
    if not len(iter_times) and steps:  # one step: its time from the first span's start
        iter_times = np.array([ends[-1] - start])
    # the oracle's "mean worker loss" (a NaN loss left out by --skip-nonfinite is not averaged)
    with warnings.catch_warnings():  # a step where every loss was NaN stays NaN, silently
        warnings.simplefilter("ignore", RuntimeWarning)
        losses = np.nanmean(worker_losses, axis=0)
        tail = losses[-max(1, steps // 20) :]
        final_loss = float(np.nanmean(tail))
    eval_curve = [
        {
            "step": e["step"],
            "wall_time_s": float(e["time"] - start),
            "test_accuracy": e["test_accuracy"],
        }
        for e in answer.extra.get("eval_curve", [])
    ]
    return {
        "algo": cfg.algo,
        "world_size": cfg.world_size,
        "width": cfg.width,
        "codec": cfg.codec,
        "error_feedback": cfg.error_feedback,
        "codec_pull": cfg.codec_pull if served(answer) else None,
        "steps": steps,
        "wall_time_s": wall,
        "iter_time_s": float(np.median(iter_times)) if len(iter_times) else None,
        "t_comp_s": _median(compute_s),
        "t_comm_s": _median(comm_s),
        "comm_hidden_fraction": hidden,
        "final_train_loss": final_loss,
        "test_accuracy": answer.extra["test_accuracy"],  # rank 0's, after training
        **reaching_target(eval_curve, cfg.target_accuracy),
        "bytes_sent_per_rank": bytes_sent,
        "allreduce_ran": answer.extra.get("allreduce_ran"),  # rank 0's gradient AllReduces
        "params_identical_on_all_ranks": identical,
        "staleness_histogram": _histogram(answer.extra.get("staleness")),
        # --skip-nonfinite: each step (ps-async: update) where gradients were left out, and
        # whose (ranks; in ps methods worker i is rank i + 1)
        "nonfinite_skipped": [
            {"step": int(t), "ranks": [int(r) for r in ranks]}
            for t, ranks in answer.extra.get("nonfinite_skipped", [])
        ],
        "config": cfg.to_dict(),
        "loss_curve": [
            {
                "step": start_step + t,
                "wall_time_s": float(ends[t] - start),
                "loss": float(losses[t]),
            }
            for t in range(steps)
        ],
        "eval_curve": eval_curve,
    }


def _histogram(values: list[int] | None) -> dict[str, int] | None:
    """{staleness: count} of the applied gradients (ps-async), keys as strings for JSON."""
    if values is None:
        return None
    counts = np.bincount(np.asarray(values, dtype=np.int64)) if values else np.zeros(0, int)
    return {str(k): int(c) for k, c in enumerate(counts) if c}


def reaching_target(eval_curve: list[dict], target: float) -> dict[str, Any]:
    """target_accuracy, steps_to_target and time_to_target_s of a summary: the first
    evaluation of `eval_curve` ({step, wall_time_s, test_accuracy}) at or above `target`."""
    reached = next((e for e in eval_curve if e["test_accuracy"] >= target), None)
    return {
        "target_accuracy": target,
        "steps_to_target": reached["step"] if reached else None,
        "time_to_target_s": reached["wall_time_s"] if reached else None,
    }


# --- a joined job: rank 0's summary from what every rank sends over the ring --------------


def fingerprint(params: np.ndarray) -> float:
    """48 bits of the SHA-256 of the weights' bytes, as a float64 (exact: below 2^53): two
    ranks' weights are bitwise equal when their fingerprints are (up to a 2^-48 collision)."""
    digest = hashlib.sha256(np.ascontiguousarray(params).tobytes()).digest()
    return float(int.from_bytes(digest[:6], "big"))


# The per-rank numbers of `gather_for_summary`, in this order.
_SCALARS = ("fingerprint", "bytes_sent", "hidden_s", "comm_s", "first_span")


def gather_for_summary(comm, result: WorkerResult, t0: float) -> dict[str, list[np.ndarray]]:
    """What rank 0's summary needs from every rank, via `allgather` (float64 arrays, no
    pickle): per rank the _SCALARS (the weights' fingerprint, bytes sent, the communication
    time hidden under computation and its total, the first span's start), its per-step losses
    and step ends, and the lengths of its compute and communication spans. Times are seconds
    since this rank's t0; the whole gather is a few AllReduces of about 8 x steps bytes per
    rank. Rank 0's own events stay whole (trace.json); the others' never leave their hosts."""
    events = result.events
    comm_s = _durations(events, COMM_SPANS)
    hidden = (hidden_fraction(events, COMM_SPANS) or 0.0) * sum(comm_s)
    first = min(e["ts"] for e in events) / 1e6 - t0 if events else np.inf  # inf: no spans
    scalars = [fingerprint(result.params), result.bytes_sent, hidden, sum(comm_s), first]
    return {
        "scalars": allgather(comm, np.array(scalars, np.float64)),
        "losses": allgather(comm, np.asarray(result.losses, np.float64)),
        "step_end": allgather(comm, np.asarray(result.step_end, np.float64) - t0),
        "compute_s": allgather(comm, np.array(_durations(events, ("compute",)), np.float64)),
        "comm_s": allgather(comm, np.array(comm_s, np.float64)),
    }


def summary_of_gathered(
    cfg: TrainConfig, wall: float, answer: WorkerResult, gathered: dict, t0: float
) -> dict[str, Any]:
    """Rank 0's summary of a joined job: `_summary` from rank 0's own result and what
    `gather_for_summary` brought from the others (times moved onto rank 0's clock)."""
    scalars = [dict(zip(_SCALARS, row, strict=True)) for row in gathered["scalars"]]
    workers = range(1, len(scalars)) if served(answer) else range(len(scalars))
    ends = gathered["step_end"][workers[0]] + t0
    first = min(s["first_span"] for s in scalars)
    comm_total = sum(s["comm_s"] for s in scalars)
    return _summary(
        cfg,
        wall,
        answer,
        worker_losses=np.array([gathered["losses"][r] for r in workers]),
        ends=ends,
        start=t0 + first if math.isfinite(first) else ends[0],
        compute_s=np.concatenate(gathered["compute_s"]),
        comm_s=np.concatenate(gathered["comm_s"]),
        hidden=sum(s["hidden_s"] for s in scalars) / comm_total if comm_total > 0 else None,
        bytes_sent=[int(s["bytes_sent"]) for s in scalars],
        identical=all(s["fingerprint"] == scalars[0]["fingerprint"] for s in scalars),
    )
