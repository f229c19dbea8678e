"""Parameter-server SGD, synchronous and asynchronous: the classic baselines of Pipe-SGD.

A job of p workers runs on p + 1 ranks, launched with the star links:

    launch_local(cfg.world_size + 1, ps_sync_worker, (cfg,), star=True)

Rank 0 is the server (authoritative weights, no gradients); rank r >= 1 is worker r - 1 and
trains on minibatches (r - 1, step) exactly as the oracles' rank r - 1. Every rank builds w_0
from the seed, so nothing is broadcast first. The wire protocol and the server loop are in
comm/ps.py.

    ps-sync, step t:
        worker i:  g_i = grad f(w_t; minibatch (i, t))      # compute
                   push(g_i)                                 # p * M into the server's link
                   pull(w_{t+1})                             # p * M out: the barrier is here
        server:    w_{t+1} = w_t - lr_t * (1/p) sum_i g_i    # summed in worker order
        Iteration time t_c + 2 alpha + (p + 1) M / B + p M gamma + t_u with the pulls sent one
        after another (2 p M / B if they all finished together: comm/ps.py says why). Oracle:
        reference.sync_sgd, bitwise (same gradients, same additions in the same order, same
        update).

    ps-async, each worker independently, `steps` times:
        worker i:  g = grad f(w_v; its next minibatch);  push(g);  pull(w, newer version)
        server:    on each push in arrival order: w <- w - lr_u * g, u <- u + 1; the gradient
                   is u - v updates stale. No barrier: a fast worker never waits for a slow one,
                   but staleness is unbounded in principle (about p - 1 for equal speeds).
        Throughput min(p / (t_c + 2 alpha + 2 M / B), B / M) updates/s. Oracle: the recorded
        arrival order replayed by reference.async_ps_sgd gives the same weights and staleness.

Compression (--codec trunc16 | bf16 | q8, --error-feedback): workers push encoded gradients,
[codes: wire_bytes(n)][loss: float32] (comm/ps.py), after error feedback
(Worker.feed_back, in the compute span; the encoding is in the push span). The server
decodes each push (ps-sync: decode-adds into the sum in worker order; ps-async: decodes, then
applies); the pulls stay float32 unless --codec-pull says otherwise. Oracles: as above with each
worker's gradient replaced by decode(encode(g)) (plus each worker's residual, with error
feedback), bitwise. The push bytes in WorkerResult.bytes_sent shrink to wire_bytes(n) + 4
(+ 48 header) per push.

Compressed pulls (--codec-pull trunc16 | bf16 | q8): the server encodes its whole weight vector
as one code per version (q8: one scale for the whole vector) and pulls those codes; each worker
decodes them into its parameters and computes its next gradient on decode(encode(w)). The
server's own weights stay full precision and are updated exactly: they are the answer. Oracles:
as above with every gradient after a worker's first (computed on the exact w_0) computed on
decode(encode(w)) of the weights pulled, bitwise. The server's bytes shrink to
wire_bytes(n) (+ 48 header) per pull.

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

import time

from pipesgd_ref import checkpoint, faults, lifetime
from pipesgd_ref.algorithms.worker import Worker, WorkerResult
from pipesgd_ref.comm.ps import ParameterServer, PSClient, worker_of
from pipesgd_ref.comm.rendezvous import Communicator
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.errors import JobError
from pipesgd_ref.trace import Timeline


def ps_sync_worker(
    comm: Communicator, cfg: TrainConfig, progress=None, setup: Worker | None = None
) -> WorkerResult:
    """One rank of synchronous parameter-server SGD (rank 0: the server; `setup`: this
    rank's Worker, where the caller has built it already)."""
    if comm.rank == 0:
        return _serve(comm, cfg, "ps-sync", progress, setup)
    return _work(comm, cfg, "ps-sync", progress, setup)


def ps_async_worker(
    comm: Communicator, cfg: TrainConfig, progress=None, setup: Worker | None = None
) -> WorkerResult:
    """One rank of asynchronous parameter-server SGD (rank 0: the server; `setup`: this
    rank's Worker, where the caller has built it already)."""
    if comm.rank == 0:
        return _serve(comm, cfg, "ps-async", progress, setup)
    return _work(comm, cfg, "ps-async", progress, setup)


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
    comm: Communicator, cfg: TrainConfig, method: str, progress, setup: Worker | None
) -> WorkerResult:
    n = n_workers_of(comm, method)
    # the server never computes: w_0, the model, steps
    setup = setup or Worker.build(cfg, 0, n)
    timeline = Timeline(comm.rank)
    server = ParameterServer(comm.clients, setup.params, timeline, codec=setup.codec(),
                             pulls=cfg.ps_pulls, pull_codec=pull_codec(cfg),
                             skip_nonfinite=cfg.skip_nonfinite)  # fmt: skip
    links = list(comm.clients.values())
    server.start_together()  # every worker starts its first step at once
    # Count this method's bytes only, not the rendezvous hellos already on these links.
    sent0, received0 = (sum(link.bytes_sent for link in links),
                        sum(link.bytes_received for link in links))  # fmt: skip

    def apply(version: int, grads) -> None:
        faults.at_step(0, version)  # PIPESGD_FAULT (tests): the server fails at an update
        setup.sgd_step(grads, version)  # w -= lr_at(version) * grads, the model's backend

    def on_update(t: int, params, loss: float) -> None:
        if progress is not None:
            progress(t, params, loss)
        if method == "ps-sync" and checkpoint.due(cfg, t):
            setup.save_checkpoint(t + 1)  # the server's weights after update t: w_{t+1}
        # ps-async: a "step" is a round of n updates; the checkpoint after round t holds the
        # weights after (t + 1) n updates, whichever workers' they were
        if method == "ps-async" and (t + 1) % n == 0 and checkpoint.due(cfg, (t + 1) // n - 1):
            setup.save_checkpoint((t + 1) // n)

    if method == "ps-sync":
        log = server.run_sync(setup.steps, apply, on_update, start=setup.start_step,
                              entering=lambda t: lifetime.entering(comm.rank, t))  # fmt: skip
        extra = {"role": "server"}
    else:
        log = server.run_async(setup.steps, apply, on_update, start=setup.start_step,
                               stop_at=lifetime.stop_at)  # fmt: skip
        extra = {"role": "server", "staleness": log.staleness, "arrival_order": log.arrival_order}
    # A signal stops every worker before one step (lifetime.py); the weights are then those
    # after the steps (ps-async: rounds of n pushes) before it.
    stopped_at = lifetime.stop_at()
    end = setup.steps if stopped_at is None else max(setup.start_step, min(stopped_at, setup.steps))
    if cfg.out:
        setup.save_checkpoint(end)
    extra["stopped_at"] = end if end < setup.steps else None
    extra["bytes_received"] = sum(link.bytes_received for link in links) - received0
    extra["nonfinite_skipped"] = log.skipped
    return WorkerResult(comm.rank, setup.params, log.losses, log.update_end, timeline.events,
                        sum(link.bytes_sent for link in links) - sent0, extra)  # fmt: skip


def _work(
    comm: Communicator, cfg: TrainConfig, method: str, progress, setup: Worker | None = None
) -> WorkerResult:
    n = n_workers_of(comm, method)
    worker = worker_of(comm.rank)
    w = setup or Worker.build(cfg, worker, n)  # the same w_0 as the server's: same seed
    timeline = Timeline(comm.rank)
    codec = w.codec()
    client = PSClient(comm.server, w.params.size, w.params.dtype, codec=codec,
                      pull_codec=pull_codec(cfg))  # fmt: skip
    # A resumed run: the checkpoint's weights, version start (ps-async: start rounds of n)
    client.version = w.start_step * (n if method == "ps-async" else 1)
    client.wait_for_start(f"the start of {method} (worker {worker} waits for the others)")
    sent0 = comm.server.bytes_sent  # the rendezvous hello is not this method's traffic
    losses, step_end = [], []
    for t in range(w.start_step, w.steps):
        if not lifetime.entering(comm.rank, t):  # a signal: every worker stops before one step
            break
        doing = f"{method} step {t} of worker {worker}"
        with timeline.span("compute", "compute", t):
            loss = w.loss_and_grad(t, client.grads)  # on the weights last pulled
            faults.at_step(comm.rank, t, client.grads)  # PIPESGD_FAULT (tests)
            # Bad values stop the job here, naming this rank (or, with --skip-nonfinite, are
            # pushed anyway: the server leaves them out, and must know to divide right).
            if w.gradient_ok(client.grads, t, loss, comm.rank):
                w.feed_back(client.grads, codec)  # --error-feedback: before push encodes them
        with timeline.span("push", "comm", t):
            client.push(loss, doing)
        with timeline.span("pull", "comm", t):  # ps-sync: waits for the slowest worker too
            client.pull(w.params, doing, expect=t + 1 if method == "ps-sync" else None,
                        same_ok=cfg.skip_nonfinite)  # fmt: skip
        losses.append(loss)
        step_end.append(time.perf_counter())
        if progress is not None:
            progress(t, w.params, loss)
    extra = {"role": "worker", "worker": worker}
    return WorkerResult(comm.rank, w.params, losses, step_end, timeline.events,
                        comm.server.bytes_sent - sent0, extra)  # fmt: skip
