"""The methods, each one rank's loop: compute -> communicate -> update. And their oracles.

    sync      g = AllReduce(g_r) / p;  w <- w - lr_t g                      (every step waits)
    pipe      two threads: the compute thread hands g_t over and applies avg(g_{t-s}), whose
              AllReduce the communication thread ran while g_t was computed (s = K - 1)
    ps-sync   workers push g_r to a server (rank 0), which sums them in worker order,
              updates w, and sends w back to every worker

`oracle` runs the same training in one process, with no threads and no sockets: it is the
definition the distributed runs are checked against, bit for bit.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from pipesgd_ref.core.model import Problem
from pipesgd_ref.core.ring import ring_allreduce, simulate
from pipesgd_ref.core.wire import Link


@dataclass
class Rank:
    """What one rank holds: its place, its links, the problem, and what it records."""

    rank: int
    problem: Problem
    left: Link | None = None  # ring: receive from rank - 1
    right: Link | None = None  # ring: send to rank + 1
    server: Link | None = None  # ps-sync worker: its link to rank 0
    workers: list[Link] = field(default_factory=list)  # ps-sync server: worker i's link
    losses: list[float] = field(default_factory=list)  # this rank's loss at each step
    step_end: list[float] = field(default_factory=list)  # perf_counter at each step's end
    spans: list[tuple] = field(default_factory=list)  # (name, thread, start, end, step)
    kept: list[tuple] = field(default_factory=list)  # (step, time, weights) every keep_every

    @contextlib.contextmanager
    def span(self, name: str, thread: str, step: int):
        start = time.perf_counter()
        yield
        self.spans.append((name, thread, start, time.perf_counter(), step))

    def step_done(self, t: int, loss: float, w: np.ndarray) -> None:
        self.losses.append(loss)
        self.step_end.append(time.perf_counter())
        every = self.problem.keep_every
        if self.rank == 0 and every and (t + 1) % every == 0:
            self.kept.append((t + 1, self.step_end[-1], w.copy()))

    def result(self, params: np.ndarray) -> dict:
        links = [self.right, self.server, *self.workers]
        sent = sum(link.bytes_sent for link in links if link is not None)
        return dict(rank=self.rank, params=params, losses=self.losses, step_end=self.step_end,
                    spans=self.spans, kept=self.kept, bytes_sent=sent)  # fmt: skip


def sync_worker(me: Rank) -> dict:
    """Synchronous SGD on ring rank me.rank: compute, AllReduce, update; compute and network
    take turns, each idle while the other works. Iteration: t_comp + T_ring + t_update."""
    prob, p = me.problem, me.problem.world_size
    left, right = me.left, me.right
    assert left is not None and right is not None  # a ring rank has both neighbours
    model = prob.model()
    w = model.init_params(prob.seed)  # the same w_0 on every rank: nothing to broadcast
    g = np.empty_like(w)  # allocated once: the loop allocates no gradient
    for t in range(prob.steps):
        with me.span("compute", "compute", t):  # g_r = grad f(w_t; minibatch (r, t))
            loss = prob.gradient(model, w, me.rank, t, g)
        with me.span("allreduce", "comm", t):  # g = sum_r g_r / p: every rank waits here
            ring_allreduce(me.rank, p, left, right, g)
        prob.sgd_step(w, g, t)  # w_{t+1} = w_t - lr_t g, identical on every rank
        me.step_done(t, loss, w)
    return me.result(w)


def pipe_worker(me: Rank) -> dict:
    """Pipe-SGD of width K on ring rank me.rank: two threads, K gradient buffers.

        phase       step t              compute thread                    comm thread
        warm-up     t < W               g_t; hand over; apply avg(g_t)    AllReduce(g_t)
        fill        W <= t < W + s      g_t; hand over (no update yet)    AllReduce(g_t)
        steady      t >= W + s          g_t; hand over; apply avg(g_{t-s}) AllReduce(g_t)
        drain       after the last      apply the s gradients still in flight

    Iteration in steady state: max(t_comp + t_update, T_ring). Every rank applies the same
    averaged gradients in the same order, so the replicas stay identical."""
    prob, p = me.problem, me.problem.world_size
    left, right = me.left, me.right
    assert left is not None and right is not None  # a ring rank has both neighbours
    K, s, W = prob.width, prob.width - 1, prob.warmup
    model = prob.model()
    w = model.init_params(prob.seed)
    buffers = [np.empty_like(w) for _ in range(K)]  # K-1 in flight, one being computed
    todo: queue.SimpleQueue = queue.SimpleQueue()  # (t, buffer) handed to the comm thread
    done: queue.SimpleQueue = queue.SimpleQueue()  # (t, buffer) averaged, or an error

    def communicate() -> None:  # the communication thread: AllReduces in the order given
        while (item := todo.get()) is not None:
            t, g = item
            try:
                with me.span("allreduce", "comm", t):
                    ring_allreduce(me.rank, p, left, right, g)
            except BaseException as e:  # handed to the compute thread, which raises it
                done.put(e)
                return
            done.put((t, g))

    def update(t: int, t_grad: int) -> None:  # w_{t+1} = w_t - lr_t * avg(g_{t_grad})
        item = done.get()  # waits only if the AllReduce of t_grad is still running
        if isinstance(item, BaseException):
            raise item
        assert item[0] == t_grad, f"rank {me.rank}: got avg(g_{item[0]}), want g_{t_grad}"
        prob.sgd_step(w, item[1], t)

    threading.Thread(target=communicate, name=f"comm-{me.rank}", daemon=True).start()
    try:
        for t in range(prob.steps):
            g = buffers[t % K]  # reused at t + K; its gradient was applied by step t + K - 1
            with me.span("compute", "compute", t):
                loss = prob.gradient(model, w, me.rank, t, g)  # on the current w_t
            todo.put((t, g))  # AllReduce(g_t) starts now, in the communication thread
            if t < W:
                update(t, t)  # warm-up: synchronous, the fresh gradient
            elif t >= W + s:
                update(t, t - s)  # steady state: staleness s
            me.step_done(t, loss, w)
        for j, t_grad in enumerate(range(max(W, prob.steps - s), prob.steps)):
            update(prob.steps + j, t_grad)  # drain: oldest first, as the oracle applies them
    finally:
        todo.put(None)  # the communication thread ends after what it holds
    return me.result(w)


def ps_sync(me: Rank) -> dict:
    """Synchronous parameter server: rank 0 serves, rank i + 1 is worker i."""
    return _serve(me) if me.rank == 0 else _work(me)


def _work(me: Rank) -> dict:
    """Worker i: compute on the weights last pulled, push the gradient and loss, pull."""
    prob, i = me.problem, me.rank - 1
    server = me.server
    assert server is not None  # a worker's link to rank 0
    model = prob.model()
    w = model.init_params(prob.seed)
    g, loss_box = np.empty_like(w), np.empty(1)
    for t in range(prob.steps):
        with me.span("compute", "compute", t):
            loss_box[0] = loss = prob.gradient(model, w, i, t, g)
        with me.span("push", "comm", t):
            server.send(t, 0, g)
            server.send(t, 1, loss_box)
        with me.span("pull", "comm", t):  # waits for the slowest worker's push: the barrier
            server.recv_into(t, 2, w)
        me.step_done(t, loss, w)
    return me.result(w)


def _serve(me: Rank) -> dict:
    """The server: every step, receive all p pushes, sum them in worker order, update, and
    send w_{t+1} to every worker. Its link carries p * M bytes in and p * M out each step."""
    prob, p = me.problem, me.problem.world_size
    w = prob.model().init_params(prob.seed)
    total, got, loss_box = np.empty_like(w), np.empty_like(w), np.empty(1)
    for t in range(prob.steps):
        total.fill(0)
        loss = 0.0
        with me.span("push", "server", t):
            for link in me.workers:  # worker order 0 .. p-1: the oracle's order of additions
                total += link.recv_into(t, 0, got)
                loss += link.recv_into(t, 1, loss_box)[0]
        total /= p
        prob.sgd_step(w, total, t)  # w_{t+1} = w_t - lr_t * avg
        with me.span("pull", "server", t):
            for link in me.workers:
                link.send(t, 2, w)
        me.step_done(t, loss / p, w)
    return me.result(w)


def oracle(prob: Problem, algo: str) -> np.ndarray:
    """The final weights of `algo` computed in one process: the definition.

    g_t     = (1/p) sum_r grad f(w_t; minibatch (r, t))    (summed as the wire sums it)
    sync    w_{t+1} = w_t - lr_t g_t
    pipe    w_{t+1} = w_t - lr_t g_{t-s} once the pipe is full (t >= W + s); nothing in the
            fill; after the last step the s gradients in flight, oldest first (the drain)
    """
    p, model = prob.world_size, prob.model()
    w = model.init_params(prob.seed)
    grads = [np.empty_like(w) for _ in range(p)]
    s = prob.width - 1 if algo == "pipe" else 0
    in_flight: deque = deque()
    for t in range(prob.steps):
        for r in range(p):  # every worker's gradient at the same w_t
            prob.gradient(model, w, r, t, grads[r])
        if algo == "ps-sync":  # the server: worker order, then one division
            avg = np.zeros_like(w)
            for g in grads:
                avg += g
            avg /= p
        else:  # the ring: chunk by chunk, round the ring
            avg = simulate(grads)[0]
        if t < prob.warmup:
            prob.sgd_step(w, avg, t)  # warm-up
            continue
        in_flight.append(avg)
        if len(in_flight) > s:
            prob.sgd_step(w, in_flight.popleft(), t)
    for j in range(len(in_flight)):
        prob.sgd_step(w, in_flight.popleft(), prob.steps + j)
    return w
