"""The parameter server's loops: rank 0 of ps-sync and ps-async (methods/ps.py is the
method; comm/ps.py the wire under it).

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

Cost (alpha-beta, docs/paper.md, section 3; M = 4n bytes, plus 48 header bytes a frame).
The server's one link carries p * M in (pushes) and p * M out (pulls) per round, so it is the
bottleneck as p grows. With a codec of ratio r a push is wire_bytes(n) + 4 ~ M / r bytes: in
the formulas below each push's M becomes M / r (e.g. (p + 1) M / B reads p M / B + M / (r B)),
the pulls' M stays 4n (with --codec-pull of ratio r', M / r' too), and the server's t_u gains p
decode passes (plus one encode per version with --codec-pull; each worker one decode per pull).
The conventional model (docs/paper.md, section 3) writes the sync round as two phases, all
pushes in, then all pulls out:

    ps-sync (phases):     T_it = t_c + 2 alpha + 2 p M / B + p M gamma + t_u

That is what a server pays when all p pulls finish together (p flows sharing its link fairly).
This server sends the pulls one after another, so worker 0 has its weights after M / B, computes
and pushes while the other pulls are still going out, and the full-duplex link takes that push
in meanwhile: only the last worker's pull, compute and push are on the critical path:

    ps-sync (this code):  T_it = t_c + 2 alpha + (p + 1) M / B + p M gamma + t_u

`pulls="shared"` (--ps-pulls=shared) sends the p pulls of a version all at once instead, as a
server answering every worker's request at the same time over one NIC does (the conventional
server, and the model of docs/paper.md, section 3): they share the link, so all arrive
together after p M / B, all workers compute at once, and their p pushes queue on the ingress
wire for p M / B more:

    ps-sync (shared):     T_it = t_c + 2 alpha + 2 p M / B + p M gamma + t_u
    ps-async:             rate = min(p / (t_c + 2 alpha + 2 M / B),  B / M)   updates/s

(timing.predict implements these; benchmarks/ps_link_model.py measures them under emulation,
its figures in benchmarks/RESULTS.md. With full-duplex links the push of one update and the
pull of another overlap, so the server's async bound is B / M, as docs/paper.md, section 3
writes it; a half-duplex link would give B / (2M).)

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

from pipesgd_ref.comm.ps import ServerLinks, worker_name
from pipesgd_ref.methods.compensation import DelayCompensation

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
    (the algorithm's optimizer step: methods/optimizer.py, whose velocity, with --momentum,
    lives here on the server beside `params`, in the server's Worker; `grads` is its scratch).
    `codec` (pipesgd_ref.codecs, or None for none): how the workers encode their pushes.
    `pull_codec` (likewise): how the server encodes the weights it pulls back (whole vector,
    one code; `params` stays full precision). `pulls`: how ps-sync sends a version's p pulls
    (comm/ps.py PULL_ORDERS). The loops never allocate: the links' buffers hold one push
    (comm/ps.py ServerLinks), and ps-sync has one sum buffer.

    `buffers` (a model with batch norm; None otherwise): the server's copy of the running
    statistics, which every push carries after its loss. The job's are worker 0's, as under
    DDP (runtime/worker.py): the server copies them from each push of worker 0 as it reads
    it, so its snapshots, its checkpoints and its evaluation after the run use the
    statistics of the same moment as its weights (worker 0's last gradient is in them).
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
        buffers: np.ndarray | None = None,
    ):
        n_stats = 0 if buffers is None else buffers.size
        self.links = ServerLinks(clients, params, timeline, codec, pull_codec, pulls, n_stats)
        self.buffers = buffers
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
                    loss_i = self._receive(i, t, phase, in_round=True)  # g_i, computed on w_t
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
                    loss = self._receive(i, v[i], phase)  # g, computed on w_{v_i}
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

    def _receive(self, i: int, version: int, phase: str, in_round: bool = False) -> float:
        """Read worker i's push, computed on `version` (ps-sync: `in_round`, comm/ps.py);
        its loss (its gradient: links.gradient()). Worker 0's running statistics become the
        server's, even when --skip-nonfinite leaves its gradient out: they are worker 0's."""
        receive = self.links.receive_in_round if in_round else self.links.receive
        loss = receive(i, version, phase)
        if i == 0 and self.buffers is not None:
            np.copyto(self.buffers, self.links.stats)
        return loss

    def _skip(self, when: int, ranks: list[int]) -> None:
        self.log.skipped.append((when, ranks))
        log.warning(
            "rank 0: %s: NaN/Inf in the push of %s; left out (--skip-nonfinite)",
            when,
            ", ".join(worker_name(r) for r in ranks),
        )

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
