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

    server, ps-sync (ps_server.py, `ParameterServer.run_sync`), steps t = start .. steps - 1:
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

"w - lr g" is the optimiser's update (methods/optimizer.py; plain SGD's form): with --momentum
the velocity lives on the server, beside the only weights that are updated (its Worker's,
which its checkpoints carry); the workers keep none.

A model with batch norm: every push carries the worker's running statistics after its loss;
only worker 0's change (runtime/worker.py: the job's are worker 0's, as under DDP), and the
server keeps those (ps_server.py), to snapshot, evaluate and checkpoint with its weights.

In ps-sync every worker waits for its pull, and the pull for the slowest worker's push: the
barrier is there. In ps-async a fast worker never waits for a slow one, but staleness is
unbounded in principle (about p - 1 for equal speeds).

Oracles. ps-sync: reference.sync_sgd, bitwise (same gradients, the same additions in the same
order, the same update). ps-async: the recorded arrival order, replayed by
reference.async_ps_sgd, gives the same weights and the same staleness list.

The server's loops (ParameterServer.run_sync, run_async), what they cost on the wire, how
compression and --skip-nonfinite enter them, and what each rank hands back: ps_server.py.
"""

from __future__ import annotations

import math

from pipesgd_ref.comm.activity import doing
from pipesgd_ref.comm.ps import PSClient, worker_of
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.errors import JobError
from pipesgd_ref.methods.compensation import DelayCompensation
from pipesgd_ref.methods.ps_server import ParameterServer
from pipesgd_ref.methods.table import METHODS
from pipesgd_ref.runtime.hooks import Hooks
from pipesgd_ref.runtime.worker import WorkerResult


def ps_sync_worker(comm, cfg: TrainConfig, hooks: Hooks | None = None) -> WorkerResult:
    """One rank of synchronous parameter-server SGD: rank 0 serves, the others compute.
    `hooks`: this rank's runtime (built once by the per-rank job; here when None)."""
    hooks = hooks or Hooks.build(comm, cfg, METHODS["ps-sync"])
    return serve(comm, cfg, hooks, False) if comm.rank == 0 else work(comm, cfg, hooks, False)


def ps_async_worker(comm, cfg: TrainConfig, hooks: Hooks | None = None) -> WorkerResult:
    """One rank of asynchronous parameter-server SGD: rank 0 serves, the others compute."""
    hooks = hooks or Hooks.build(comm, cfg, METHODS["ps-async"])
    return serve(comm, cfg, hooks, True) if comm.rank == 0 else work(comm, cfg, hooks, True)


def work(comm, cfg: TrainConfig, hooks: Hooks, rounds: bool) -> WorkerResult:
    """Worker i = rank - 1: compute, push, pull, `steps` times (the docstring's worker loop).
    `rounds` (ps-async): the server's versions count every push, n per step."""
    method = "ps-async" if rounds else "ps-sync"
    n, i, worker = n_workers_of(comm, method), worker_of(comm.rank), hooks.worker
    codec = worker.codec()
    client = PSClient(
        comm.server,
        worker.params.size,
        worker.params.dtype,
        codec=codec,
        pull_codec=pull_codec(cfg),
        n_stats=0 if worker.buffers is None else worker.buffers.size,
    )
    # A resumed run: the checkpoint's weights, version start (ps-async: start rounds of n)
    client.version = worker.start_step * (n if rounds else 1)
    with doing(f"the start of {method} (worker {i} waits for the others)"):
        client.wait_for_start()
    sent0 = comm.server.bytes_sent  # the rendezvous hello is not this method's traffic
    for t in range(worker.start_step, worker.steps):
        if not hooks.keep_going(t):  # a signal: every worker stops before one step
            break
        what = f"{method} step {t} of worker {i}"  # named by the push's and pull's errors
        # --- compute g, loss on the weights last pulled; bad values stop the job here,
        # naming this rank, or (--skip-nonfinite) come back not ok, the gradient zeroed
        with hooks.timeline.span("compute", "compute", t):
            loss, ok = worker.compute(t, client.grads, codec, comm.rank)
        # --- push g: a left-out gradient goes with a NaN loss (the server leaves out any
        # push that is not finite, and must know, to divide by the others only)
        with hooks.timeline.span("push", "comm", t), doing(what):
            client.push(loss if ok else math.nan, worker.buffers)
        # --- pull w: ps-sync waits for the slowest worker's push too (w_{t+1})
        with hooks.timeline.span("pull", "comm", t), doing(what):
            expect = None if rounds else t + 1
            client.pull(worker.params, expect=expect, same_ok=cfg.skip_nonfinite)
        hooks.step_done(t, loss, worker.params)
    sent = comm.server.bytes_sent - sent0
    return hooks.result(worker.params, sent, role="worker", worker=i)


def serve(comm, cfg: TrainConfig, hooks: Hooks, rounds: bool) -> WorkerResult:
    """Rank 0: the server's rounds (ParameterServer.run_sync / run_async), its updates, the
    checkpoints of its weights, and its result. `rounds` (ps-async): every push is an
    update, and a checkpoint step is a round of n of them."""
    method = "ps-async" if rounds else "ps-sync"
    n, runtime = n_workers_of(comm, method), hooks.worker  # w_0, the model, the steps
    dc = None
    if cfg.compensation in ("dc", "dc-adaptive"):
        w = runtime.params
        dc = DelayCompensation(cfg.compensation, cfg.dc_lambda, w.size, w.dtype)
    bound = None if cfg.max_staleness < 0 else cfg.max_staleness
    server = ParameterServer(
        comm.clients,
        runtime.params,
        hooks.timeline,
        codec=runtime.codec(),
        pulls=cfg.ps_pulls,
        pull_codec=pull_codec(cfg),
        skip_nonfinite=cfg.skip_nonfinite,
        max_staleness=bound,
        compensation=dc,
        buffers=runtime.buffers,  # worker 0's, copied from its pushes
    )
    links = list(comm.clients.values())
    server.start_together()  # every worker starts its first step at once
    # Count this method's bytes only, not the rendezvous hellos already on these links.
    sent0 = sum(link.bytes_sent for link in links)
    received0 = sum(link.bytes_received for link in links)

    def apply(version: int, grads) -> None:
        hooks.at_update(version)  # PIPESGD_FAULT (tests): the server fails at an update
        runtime.sgd_step(grads, version)  # w -= lr_at(version) * grads, the model's backend

    def on_update(t: int, params, loss: float) -> None:
        hooks.show_progress(t, params, loss)
        # ps-async: a "step" is a round of n updates; the checkpoint after round t holds the
        # weights after (t + 1) n updates, whichever workers' they were
        step, done = ((t + 1) // n - 1, (t + 1) % n == 0) if rounds else (t, True)
        if done and hooks.checkpoint_due(step):
            hooks.save(step + 1)  # the server's weights after update (round) step

    start = runtime.start_step
    if rounds:
        log = server.run_async(runtime.steps, apply, on_update, start, stop_at=hooks.stop_at)
        extra = {"staleness": log.staleness, "arrival_order": log.arrival_order}
    else:
        log = server.run_sync(runtime.steps, apply, on_update, start, hooks.keep_going)
        extra = {}
    # A signal stops every worker before one step (lifetime.py); the weights are then those
    # after the steps (ps-async: rounds of n pushes) before it.
    stopped_at = hooks.stop_at()
    end = runtime.steps if stopped_at is None else max(start, min(stopped_at, runtime.steps))
    hooks.save(end)
    sent = sum(link.bytes_sent for link in links) - sent0
    return hooks.result(
        runtime.params,
        sent,
        losses=log.losses,  # the server's steps are its updates, one loss each
        step_end=log.update_end,
        role="server",
        **extra,
        stopped_at=end if end < runtime.steps else None,
        bytes_received=sum(link.bytes_received for link in links) - received0,
        nonfinite_skipped=log.skipped,
    )


def n_workers_of(comm, method: str) -> int:
    """p = world_size - 1: the server is a rank of its own."""
    no_star = comm.server is None if comm.rank > 0 else not comm.clients
    if comm.world_size < 2 or no_star:
        raise JobError(
            f"rank {comm.rank}: {method} needs world_size = workers + 1 >= 2 (rank 0 is the "
            f"server) and the star links: launch with star=True (world_size {comm.world_size})"
        )
    return comm.world_size - 1


def pull_codec(cfg: TrainConfig):
    """The codec the weights are pulled back with (--codec-pull), on this run's backend."""
    from pipesgd_ref.codecs import get_codec  # here, as Worker.codec: Numba loads lazily

    return get_codec(cfg.codec_pull, cfg.codec_backend)
