"""Parameter-server SGD, synchronous and asynchronous: the classic baselines of Pipe-SGD.

A job of p workers runs on p + 1 ranks, launched with the star links:

    launch_local(cfg.world_size + 1, ps_sync_worker, (cfg,), star=True)

Rank 0 is the server (authoritative weights w, no gradients); rank r >= 1 is worker i = r - 1
and trains on minibatches (i, step) exactly as the oracles' rank i. Every rank builds w_0 from
the seed, so nothing is broadcast first. How pushes and pulls cross the wire (frames, codes, the
server's one network card) is comm/ps.py; this module is what the server and workers do.

The algorithm (the code below follows it line by line):

    worker i (`_work`), steps t = start .. steps - 1:
        g, loss = compute(t)                    # Worker.compute, on the weights last pulled
        push(g, loss)                           # seq = v, the version of those weights
        w, v = pull()                           # ps-sync: v = t + 1, once every worker pushed

    server, ps-sync (`ParameterServer.run_sync`), steps t = start .. steps - 1:
        total = 0
        for i = 0 .. p-1:                       # worker order, as reference.average_gradient
            g_i, loss_i = receive the push of worker i      # computed on w_t
            total += g_i
        avg = total / p
        w_{t+1} = w_t - lr_t * avg              # apply: the sync point of the job
        pull w_{t+1} to every worker            # seq = t + 1

    server, ps-async (`ParameterServer.run_async`); u = updates applied so far, v_i = the
    version worker i holds:
        until every worker has pushed `steps` times:
            i = the worker whose push arrives first
            g, loss = receive the push of worker i          # computed on w_{v_i}
            staleness = u - v_i                             # updates since worker i pulled
            w <- w - lr_u * g;  u <- u + 1                  # apply, `staleness` stale
            pull w to worker i only;  v_i = u               # seq = u

In ps-sync every worker waits for its pull, and the pull for the slowest worker's push: the
barrier is there. In ps-async a fast worker never waits for a slow one, but staleness is
unbounded in principle (about p - 1 for equal speeds).

Oracles. ps-sync: reference.sync_sgd, bitwise (same gradients, the same additions in the same
order, the same update). ps-async: the recorded arrival order, replayed by
reference.async_ps_sgd, gives the same weights and the same staleness list.

--skip-nonfinite: a push whose gradient or loss is not finite is left out: ps-sync sums and
divides by the others only (all left out: no change), ps-async applies nothing and pulls the
same weights back. A worker that finds its own gradient not finite pushes it zeroed with a NaN
loss, which the server leaves out the same way (without the flag the worker stops the job).

Compression (--codec trunc16 | bf16 | q8, --error-feedback). A worker applies error feedback
(in Worker.compute), then pushes one code of its whole gradient; the server decodes every
push: ps-sync decode-adds each into the float32 sum in worker order, then divides by p; ps-async
decodes it and applies it. The oracle is therefore the uncompressed one with every worker's
gradient replaced by decode(encode(g)) (plus each worker's residual, with error feedback),
bitwise. With --codec-pull the server pulls one code of its whole weight vector per version,
and each worker computes its next gradient on decode(encode(w)); the server keeps and updates
its own full-precision weights exactly (w <- w - lr * g, never decoded weights): they are the
answer. Workers start on the exact w_0, so the oracle is the one above with every gradient
after a worker's first computed on decode(encode(w)) of the weights it pulled.

Cost (alpha-beta, shared/PAPER.md section 3; M = 4n bytes, plus 48 header bytes a frame).
The server's one link carries p * M in (pushes) and p * M out (pulls) per round, so it is the
bottleneck as p grows. With a codec of ratio r a push is wire_bytes(n) + 4 ~ M / r bytes: in
the formulas below each push's M becomes M / r (e.g. (p + 1) M / B reads p M / B + M / (r B)),
the pulls' M stays 4n (with --codec-pull of ratio r', M / r' too), and the server's t_u gains p
decode passes (plus one encode per version with --codec-pull; each worker one decode per pull).
PAPER.md writes the sync round as two separate phases, all pushes in, then all pulls out:

    ps-sync (phases):     T_it = t_c + 2 alpha + 2 p M / B + p M gamma + t_u

That is what a server pays when all p pulls finish together (p flows sharing its link fairly).
This server sends the pulls one after another, so worker 0 has its weights after M / B, computes
and pushes while the other pulls are still going out, and the full-duplex link takes that push
in meanwhile: only the last worker's pull, compute and push are on the critical path:

    ps-sync (this code):  T_it = t_c + 2 alpha + (p + 1) M / B + p M gamma + t_u

`pulls="shared"` (--ps-pulls=shared) sends the p pulls of a version all at once instead, as a
server answering every worker's request at the same time over one NIC does (the conventional
server, and PAPER.md's model): they share the link, so all arrive together after p M / B, all
workers compute at once, and their p pushes queue on the ingress wire for p M / B more:

    ps-sync (shared):     T_it = t_c + 2 alpha + 2 p M / B + p M gamma + t_u
    ps-async:             rate = min(p / (t_c + 2 alpha + 2 M / B),  B / M)   updates/s

(timing.predict implements these; benchmarks/ps_link_model.py measures them under emulation,
its figures in benchmarks/RESULTS.md. With full-duplex links the push of one update and the
pull of another overlap, so the server's async bound is B / M; PAPER.md section 3 writes
B / (2M), the figure for a half-duplex link.)

Results. Rank 0's WorkerResult is the answer: params = the server's final weights, losses and
step_end one per applied update (the loss that came with the push: in ps-sync the mean over the
workers, in worker order; in ps-async the pushing worker's), extra = {"role": "server",
"staleness": [...], "arrival_order": [...]} (the last two for ps-async). A worker's result holds
its last pulled weights (ps-sync: equal to the server's; with --codec-pull, their decoded codes)
and its own minibatch losses.

`progress(u, params, loss)` is called on rank 0 after each applied update (ps-sync: `steps`
updates; ps-async: p * steps) and on workers after each step, with their pulled weights.
Time spans: workers "compute" (thread compute), "push" and "pull" (thread comm); the server
"recv" per push and "server" per update (apply and send pulls), thread server.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from pipesgd_ref.comm.ps import PSClient, ServerLinks, worker_name, worker_of
from pipesgd_ref.comm.rendezvous import Communicator
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.errors import JobError
from pipesgd_ref.methods.compensation import DelayCompensation
from pipesgd_ref.runtime import checkpoint, faults, lifetime
from pipesgd_ref.runtime.worker import Worker, WorkerResult
from pipesgd_ref.trace import Timeline

log = logging.getLogger("pipesgd.ps")

Apply = Callable[[int, np.ndarray], None]  # apply(version, grads): update the weights in place
OnUpdate = Callable[[int, np.ndarray, float], None]  # (version, weights after it, loss)


# --- the server ------------------------------------------------------------------------------


@dataclass
class ServerLog:
    """What the server saw: one entry per applied update, in the order applied."""

    arrival_order: list[int] = field(default_factory=list)  # worker index of each gradient
    staleness: list[int] = field(default_factory=list)  # updates since that worker's pull
    losses: list[float] = field(default_factory=list)  # the loss that came with the push(es)
    update_end: list[float] = field(default_factory=list)  # perf_counter after the pull(s)
    # --skip-nonfinite: (ps-sync step or ps-async update, [ranks]) of the pushes left out
    skipped: list[tuple[int, list[int]]] = field(default_factory=list)


class ParameterServer:
    """Rank 0: receive pushes, update the weights, send pulls (the loops of the docstring).

    `params` is the authoritative weight vector; `apply(version, grads)` updates it in place
    (the algorithm's optimizer step). `codec` (pipesgd_ref.codecs, or None for none): how the
    workers encode their pushes. `pull_codec` (likewise): how the server encodes the weights it
    pulls back (whole vector, one code; `params` stays full precision). `pulls`: how ps-sync
    sends a version's p pulls (comm/ps.py PULL_ORDERS). The loops never allocate: the links'
    buffers hold one push (comm/ps.py ServerLinks), and ps-sync has one sum buffer.
    """

    def __init__(
        self,
        clients: dict,
        params: np.ndarray,
        timeline=None,
        codec=None,
        pull_codec=None,
        pulls: str = "sequential",
        skip_nonfinite: bool = False,
        max_staleness: int | None = None,
        compensation: DelayCompensation | None = None,
    ):
        self.links = ServerLinks(clients, params, timeline, codec, pull_codec, pulls)
        self.params = params
        self.p = self.links.n_workers
        # ps-async: how many steps a worker may run ahead of the slowest (None: no bound), and
        # dc: each push corrected for the updates since its worker pulled (the weights it
        # pulled are kept: one copy per worker)
        self.max_staleness = max_staleness
        self.compensation = compensation
        self.timeline = self.links.timeline
        self.skip_nonfinite = skip_nonfinite  # leave out pushes with NaN/Inf (else: workers
        # check their own gradient before pushing, and stop the job naming themselves)
        self.log = ServerLog()

    def start_together(self) -> None:
        """Every worker starts its first step at once (comm/ps.py ServerLinks)."""
        self.links.start_together()

    def run_sync(
        self,
        steps: int,
        apply: Apply,
        on_update: OnUpdate | None = None,
        start: int = 0,
        entering: Callable[[int], bool] | None = None,
    ) -> ServerLog:
        """ps-sync: every step, all p pushes, one averaged update, p pulls; steps start ..
        steps - 1 (start > 0: a resumed run, whose weights are the checkpoint's w_start).
        entering(t), when given, is asked before round t: False ends the run there (a stop
        signal, on which the workers agree: lifetime.py)."""
        links, p = self.links, self.p
        total = np.empty_like(self.params)  # preallocated: the loop allocates nothing
        links.new_run()
        with links.aborting_on_error():
            for t in range(start, steps):
                if entering is not None and not entering(t):
                    break
                phase = f"ps-sync step {t}"
                total.fill(0)
                loss, bad = 0.0, []  # bad: the ranks left out (--skip-nonfinite)
                links.begin_round()
                # The sum in worker order 0..p-1, as reference.average_gradient sums ranks:
                # the same additions in the same order give bitwise the oracle's average
                # (with a codec: of the decoded gradients).
                for i in range(p):
                    loss_i = links.receive_in_round(i, t, phase)  # g_i, computed on w_t
                    if self.skip_nonfinite and not finite(links.gradient(), loss_i):
                        bad.append(links.rank_of(i))  # left out of the sum and of the mean
                        continue
                    links.add_gradient_into(total)  # total += g_i
                    loss += loss_i
                links.end_round()
                good = p - len(bad)  # all left out: total stays 0, no change
                total /= max(good, 1)  # avg
                loss = loss / good if good else math.nan
                if bad:
                    self._skip(t, bad)
                with self.timeline.span("server", "server", t):
                    apply(t, total)  # w_{t+1} = w_t - lr_t * avg: the sync point of the job
                    links.send_pulls(t + 1, phase)  # pull w_{t+1} to every worker
                self._record(None, 0, loss)
                if on_update is not None:
                    on_update(t, self.params, loss)
        return self.log

    def run_async(
        self,
        pushes_per_worker: int,
        apply: Apply,
        on_update: OnUpdate | None = None,
        start: int = 0,
        stop_at: Callable[[], int | None] | None = None,
    ) -> ServerLog:
        """ps-async: apply each push the moment it arrives; pull back to its worker only.
        start > 0: a resumed run, whose weights are a checkpoint's after start * p updates;
        each worker then has pushes_per_worker - start pushes to go. stop_at(), when given,
        says the step no worker begins once a signal stopped the job (lifetime.py): each
        worker then pushes up to it, and no more is waited for."""
        links, p = self.links, self.p
        left = [pushes_per_worker - start] * p  # pushes still to come from each worker
        u = start * p  # updates applied so far
        v = [u] * p  # v[i]: version of the weights worker i holds (computes on)
        clock = [start] * p  # steps each worker has pushed
        held: list[int] = []  # workers whose pull waits for the slowest (--max-staleness)
        bound = self.max_staleness
        dc = self.compensation
        pulled = [self.params.copy() for _ in range(p)] if dc is not None else []
        links.new_run()
        stopping = False

        def pull(i: int, phase: str) -> None:
            links.send_pull(i, u, phase)  # pull w to worker i only
            v[i] = u
            if dc is not None:
                np.copyto(pulled[i], self.params)

        with links.aborting_on_error(), links.watching([i for i in range(p) if left[i]]):
            while any(left):
                if not stopping and stop_at is not None and (end := stop_at()) is not None:
                    stopping = True  # a signal: every worker runs steps start .. end - 1 only
                    bound = None  # no one is held back any more: each gets its pull now
                    for i in held:
                        pull(i, f"ps-async update {u}")
                    held.clear()
                    cut = pushes_per_worker - min(end, pushes_per_worker)
                    left = [max(0, n - cut) for n in left]
                    for i in range(p):
                        if not left[i]:
                            links.drop(i)
                    if not any(left):
                        break
                for i in links.ready():  # whichever push arrives first is applied first
                    phase = f"ps-async update {u}"
                    loss = links.receive(i, v[i], phase)  # g, computed on w_{v_i}
                    staleness = u - v[i]  # updates applied since worker i pulled
                    applied = not self.skip_nonfinite or finite(links.gradient(), loss)
                    with self.timeline.span("server", "server", u):
                        if applied:
                            g = links.gradient()
                            if dc is not None:  # g + lam g^2 (w - the weights g was computed on)
                                g = dc.correct(g, self.params, pulled[i])
                            apply(u, g)  # w <- w - lr_u * g, stale
                            u += 1
                        else:  # --skip-nonfinite: no update, its weights go back as they are
                            self._skip(u, [links.rank_of(i)])
                        clock[i] += 1
                        if bound is None:
                            pull(i, phase)
                        else:  # every worker the bound now lets go, in worker order
                            held.append(i)
                            slowest = min(clock)
                            for r in sorted(held):
                                if clock[r] - slowest <= bound:
                                    held.remove(r)
                                    pull(r, phase)
                    left[i] -= 1
                    if not left[i]:
                        links.drop(i)
                    if applied:
                        self._record(i, staleness, loss)
                        if on_update is not None:
                            on_update(u - 1, self.params, loss)
                # a worker that hangs names itself here (one held back waits for its pull)
                links.check_silence([0 if i in held else n for i, n in enumerate(left)], u)
        return self.log

    def _skip(self, when: int, ranks: list[int]) -> None:
        self.log.skipped.append((when, ranks))
        log.warning("rank 0: %s: NaN/Inf in the push of %s; left out (--skip-nonfinite)",
                    when, ", ".join(worker_name(r) for r in ranks))  # fmt: skip

    def _record(self, worker: int | None, staleness: int, loss: float) -> None:
        if worker is not None:
            self.log.arrival_order.append(worker)
            self.log.staleness.append(staleness)
        self.log.losses.append(loss)
        self.log.update_end.append(time.perf_counter())


def finite(grads: np.ndarray, loss: float) -> bool:
    """--skip-nonfinite: whether a push (its gradient and its loss) is finite."""
    # One pass: a NaN or Inf anywhere makes the sum non-finite; only then is each value checked
    # (a non-finite sum of finite values is an overflow).
    with np.errstate(over="ignore", invalid="ignore"):
        if math.isfinite(loss) and math.isfinite(float(np.add.reduce(grads))):
            return True
    return math.isfinite(loss) and bool(np.all(np.isfinite(grads)))


# --- the ranks of a job ----------------------------------------------------------------------


def ps_sync_worker(
    comm: Communicator, cfg: TrainConfig, progress=None, worker: Worker | None = None
) -> WorkerResult:
    """One rank of synchronous parameter-server SGD (rank 0: the server; `worker`: this
    rank's Worker, where the caller has built it already)."""
    if comm.rank == 0:
        return _serve(comm, cfg, "ps-sync", progress, worker)
    return _work(comm, cfg, "ps-sync", progress, worker)


def ps_async_worker(
    comm: Communicator, cfg: TrainConfig, progress=None, worker: Worker | None = None
) -> WorkerResult:
    """One rank of asynchronous parameter-server SGD (rank 0: the server; `worker`: this
    rank's Worker, where the caller has built it already)."""
    if comm.rank == 0:
        return _serve(comm, cfg, "ps-async", progress, worker)
    return _work(comm, cfg, "ps-async", progress, worker)


def n_workers_of(comm: Communicator, method: str) -> int:
    """p = world_size - 1: the server is a rank of its own."""
    if comm.world_size < 2 or (comm.rank == 0 and not comm.clients) or (
        comm.rank > 0 and comm.server is None
    ):  # fmt: skip
        raise JobError(
            f"rank {comm.rank}: {method} needs world_size = workers + 1 >= 2 (rank 0 is the "
            f"server) and the star links: launch with star=True (world_size {comm.world_size})"
        )
    return comm.world_size - 1


def pull_codec(cfg: TrainConfig):
    """The codec the weights are pulled back with (--codec-pull), on this run's backend."""
    from pipesgd_ref.codecs import get_codec  # here, as Worker.codec: numba loads lazily

    return get_codec(cfg.codec_pull, cfg.codec_backend)


def _serve(
    comm: Communicator, cfg: TrainConfig, method: str, progress, worker: Worker | None
) -> WorkerResult:
    n = n_workers_of(comm, method)
    # the server never computes: w_0, the model, steps
    runtime = worker or Worker.build(cfg, 0, n)
    timeline = Timeline(comm.rank)
    dc = None
    if cfg.compensation in ("dc", "dc-adaptive"):
        w = runtime.params
        dc = DelayCompensation(cfg.compensation, cfg.dc_lambda, w.size, w.dtype)
    server = ParameterServer(comm.clients, runtime.params, timeline, codec=runtime.codec(),
                             pulls=cfg.ps_pulls, pull_codec=pull_codec(cfg),
                             skip_nonfinite=cfg.skip_nonfinite,
                             max_staleness=None if cfg.max_staleness < 0 else cfg.max_staleness,
                             compensation=dc)  # fmt: skip
    links = list(comm.clients.values())
    server.start_together()  # every worker starts its first step at once
    # Count this method's bytes only, not the rendezvous hellos already on these links.
    sent0, received0 = (sum(link.bytes_sent for link in links),
                        sum(link.bytes_received for link in links))  # fmt: skip

    def apply(version: int, grads) -> None:
        faults.at_step(0, version)  # PIPESGD_FAULT (tests): the server fails at an update
        runtime.sgd_step(grads, version)  # w -= lr_at(version) * grads, the model's backend

    def on_update(t: int, params, loss: float) -> None:
        if progress is not None:
            progress(t, params, loss)
        if method == "ps-sync" and checkpoint.due(cfg, t):
            runtime.save_checkpoint(t + 1)  # the server's weights after update t: w_{t+1}
        # ps-async: a "step" is a round of n updates; the checkpoint after round t holds the
        # weights after (t + 1) n updates, whichever workers' they were
        if method == "ps-async" and (t + 1) % n == 0 and checkpoint.due(cfg, (t + 1) // n - 1):
            runtime.save_checkpoint((t + 1) // n)

    if method == "ps-sync":
        log = server.run_sync(runtime.steps, apply, on_update, start=runtime.start_step,
                              entering=lambda t: lifetime.entering(comm.rank, t))  # fmt: skip
        extra = {"role": "server"}
    else:
        log = server.run_async(runtime.steps, apply, on_update, start=runtime.start_step,
                               stop_at=lifetime.stop_at)  # fmt: skip
        extra = {"role": "server", "staleness": log.staleness, "arrival_order": log.arrival_order}
    # A signal stops every worker before one step (lifetime.py); the weights are then those
    # after the steps (ps-async: rounds of n pushes) before it.
    stopped_at = lifetime.stop_at()
    end = (
        runtime.steps
        if stopped_at is None
        else max(runtime.start_step, min(stopped_at, runtime.steps))
    )
    if cfg.out:
        runtime.save_checkpoint(end)
    extra["stopped_at"] = end if end < runtime.steps else None
    extra["bytes_received"] = sum(link.bytes_received for link in links) - received0
    extra["nonfinite_skipped"] = log.skipped
    return WorkerResult(comm.rank, runtime.params, log.losses, log.update_end, timeline.events,
                        sum(link.bytes_sent for link in links) - sent0, extra)  # fmt: skip


def _work(
    comm: Communicator, cfg: TrainConfig, method: str, progress, worker: Worker | None = None
) -> WorkerResult:
    """Worker i = rank - 1: compute, push, pull, `steps` times (the docstring's worker loop)."""
    n = n_workers_of(comm, method)
    i = worker_of(comm.rank)
    worker = worker or Worker.build(cfg, i, n)  # the same w_0 as the server's: same seed
    timeline = Timeline(comm.rank)
    codec = worker.codec()
    client = PSClient(comm.server, worker.params.size, worker.params.dtype, codec=codec,
                      pull_codec=pull_codec(cfg))  # fmt: skip
    # A resumed run: the checkpoint's weights, version start (ps-async: start rounds of n)
    client.version = worker.start_step * (n if method == "ps-async" else 1)
    client.wait_for_start(f"the start of {method} (worker {i} waits for the others)")
    sent0 = comm.server.bytes_sent  # the rendezvous hello is not this method's traffic
    losses, step_end = [], []
    for t in range(worker.start_step, worker.steps):
        if not lifetime.entering(comm.rank, t):  # a signal: every worker stops before one step
            break
        doing = f"{method} step {t} of worker {i}"
        with timeline.span("compute", "compute", t):
            # g, loss on the weights last pulled; bad values stop the job here, naming this
            # rank, or (--skip-nonfinite) come back not ok, the gradient zeroed
            loss, ok = worker.compute(t, client.grads, codec, comm.rank)
        with timeline.span("push", "comm", t):
            # A left-out gradient goes with a NaN loss: the server leaves out any push that
            # is not finite (and must know, to divide by the others only)
            client.push(loss if ok else math.nan, doing)
        with timeline.span("pull", "comm", t):  # ps-sync: waits for the slowest worker too
            client.pull(worker.params, doing, expect=t + 1 if method == "ps-sync" else None,
                        same_ok=cfg.skip_nonfinite)  # fmt: skip
        losses.append(loss)
        step_end.append(time.perf_counter())
        if progress is not None:
            progress(t, worker.params, loss)
    extra = {"role": "worker", "worker": i}
    return WorkerResult(comm.rank, worker.params, losses, step_end, timeline.events,
                        comm.server.bytes_sent - sent0, extra)  # fmt: skip
