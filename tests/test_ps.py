"""Parameter server, sync and async, over real worker processes and real sockets, against the
one-process oracles (reference.sync_sgd, reference.async_ps_sgd replayed in the recorded
arrival order); its wire protocol's checks; and its failures."""

import os
import socket
import threading
import time

import numpy as np
import pytest
from oracles import oracle_inputs

from pipesgd_ref.codecs import get_codec
from pipesgd_ref.comm.links import Link
from pipesgd_ref.comm.netem import LinkEmulator, LinkSpec, ServerNIC
from pipesgd_ref.comm.ps import PSClient
from pipesgd_ref.comm.wire import HEADER_BYTES, Frame, Kind
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.errors import CollectiveMismatch, ConfigError, PeerAborted, WorkerFailed
from pipesgd_ref.methods.ps import ParameterServer, ps_async_worker, ps_sync_worker
from pipesgd_ref.methods.reference import async_ps_sgd, sync_sgd
from pipesgd_ref.runtime.launch import launch_local
from pipesgd_ref.runtime.preflight import check_config
from pipesgd_ref.runtime.worker import Worker
from pipesgd_ref.timing import Calibration, predict

STEPS = 20
CONFIGS = {
    "softmax": TrainConfig.preset("tiny").replace(steps=STEPS),
    "mlp": TrainConfig.preset("tiny").replace(steps=STEPS, model="mlp", hidden=(16,)),
}


def run(worker_fn, cfg, n_workers, timeout=10.0):
    return launch_local(n_workers + 1, worker_fn, (cfg,), start_method="fork", star=True,
                        timeout=timeout, job_timeout=50)  # fmt: skip


@pytest.fixture
def steady_workers(monkeypatch):
    """Every gradient takes at least 1 ms, so that async workers interleave (a tiny model's
    step is ~0.1 ms: one worker would finish before another has started). Forked workers
    inherit the patch."""
    compute = Worker.loss_and_grad

    def slowed(self, step, grads, params=None):
        time.sleep(1e-3)
        return compute(self, step, grads, params)

    monkeypatch.setattr(Worker, "loss_and_grad", slowed)


# --- ps-sync ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("model", ["softmax", "mlp"])
def test_ps_sync_equals_sync_sgd_bitwise(model):
    """Same gradients, summed in worker order, the same update: bitwise reference.sync_sgd,
    on the server and on every worker (which hold the last pulled weights)."""
    cfg = CONFIGS[model]
    for n in range(1, 5):
        grad_fn, w0 = oracle_inputs(cfg, n)  # first: forked workers inherit the loaded data set
        results = run(ps_sync_worker, cfg, n)
        want = sync_sgd(grad_fn, w0, n, STEPS, cfg.lr_at)
        server, workers = results[0], results[1:]
        for r, result in enumerate(results):
            np.testing.assert_array_equal(
                result.params, want.params, err_msg=f"{model}, {n} workers: rank {r} differs "
                f"from reference.sync_sgd (max diff {np.abs(result.params - want.params).max()})"
            )  # fmt: skip
        # The server's loss per step is the workers' mean; each worker's losses are its own.
        np.testing.assert_allclose(server.losses, want.losses, rtol=1e-6)
        mean = [sum(w.losses[t] for w in workers) / n for t in range(STEPS)]  # worker order
        assert mean == want.losses, f"{model}, {n} workers: worker losses != the oracle's"
        assert len(server.step_end) == STEPS and server.extra["role"] == "server"
        # Bytes: every push is n_params + 1 elements (gradient, loss), every pull n_params.
        m = w0.nbytes
        assert [w.bytes_sent for w in workers] == [STEPS * (HEADER_BYTES + m + 4)] * n
        assert server.bytes_sent == n * STEPS * (HEADER_BYTES + m)
        assert server.extra["bytes_received"] == n * STEPS * (HEADER_BYTES + m + 4)
        names = {(e["name"], e["tid"]) for r in results for e in r.events}
        assert names == {("compute", "compute"), ("push", "comm"), ("pull", "comm"),
                         ("recv", "server"), ("server", "server")}  # fmt: skip


# --- ps-async --------------------------------------------------------------------------------


def staleness_identity(arrival_order):
    """sum of staleness, counted another way: each update v adds one to the next update of
    every OTHER worker that still has one to come (that update was computed before v)."""
    total = 0
    for v, worker in enumerate(arrival_order):
        later = set(arrival_order[v + 1 :]) - {worker}
        total += len(later)
    return total


@pytest.mark.timeout(60)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_ps_async_equals_the_oracle_replayed_in_arrival_order(n, steady_workers):
    cfg = CONFIGS["mlp" if n % 2 else "softmax"]
    grad_fn, w0 = oracle_inputs(cfg, n)
    results = run(ps_async_worker, cfg, n)
    server, workers = results[0], results[1:]
    order, staleness = server.extra["arrival_order"], server.extra["staleness"]
    assert sorted(order) == sorted(list(range(n)) * STEPS), "every worker pushes STEPS times"
    want = async_ps_sgd(grad_fn, w0, n, order, cfg.lr_at, record=True)
    np.testing.assert_array_equal(
        server.params, want.params,
        err_msg=f"{n} workers: server weights != reference.async_ps_sgd in the recorded order",
    )  # fmt: skip
    assert staleness == want.staleness, f"{n} workers: staleness differs from the oracle's"
    np.testing.assert_allclose(server.losses, want.losses, rtol=1e-6)
    for i, worker in enumerate(workers):  # worker i holds the weights right after its last push
        last = len(order) - 1 - order[::-1].index(i)
        np.testing.assert_array_equal(
            worker.params, want.history[last + 1], err_msg=f"worker {i}: not its last pull"
        )
    # The staleness histogram: exact by a second count; mean at most p - 1 (each update ages
    # at most the p - 1 other workers' next gradients); zero for one worker.
    assert sum(staleness) == staleness_identity(order)
    assert 0 <= np.mean(staleness) <= n - 1
    if n == 1:
        assert staleness == [0] * STEPS
    if n == 4:  # steady workers interleave: some gradients must be stale
        assert max(staleness) > 0, f"no staleness in {order}"


@pytest.mark.timeout(60)
def test_ps_async_with_one_worker_is_sequential_sgd():
    cfg = CONFIGS["mlp"]
    grad_fn, w0 = oracle_inputs(cfg, 1)
    server, worker = run(ps_async_worker, cfg, 1)
    np.testing.assert_array_equal(server.params, sync_sgd(grad_fn, w0, 1, STEPS, cfg.lr).params)
    np.testing.assert_array_equal(worker.params, server.params)
    assert server.extra["staleness"] == [0] * STEPS
    assert server.extra["arrival_order"] == [0] * STEPS


# --- compressed pushes ------------------------------------------------------------------------


def codec_oracle(cfg, n_workers, base=None):
    """(grad_fn, w_0) of the oracles for compressed pushes: every worker's gradient is replaced
    by decode(encode(g)), where g has that worker's residual added first with error feedback
    (and the residual becomes g - decode(encode(g))), as Worker.feed_back does. `base`:
    the (grad_fn, w_0) to wrap (default: oracle_inputs(cfg, n_workers))."""
    grad_fn, w0 = base or oracle_inputs(cfg, n_workers)
    codec = get_codec(cfg.codec, cfg.backend)
    wire = np.empty(codec.wire_bytes(w0.size), np.uint8)
    residual = [np.zeros_like(w0) for _ in range(n_workers)]  # calls come in each rank's order

    def round_trip(params, rank, step):
        loss, g = grad_fn(params, rank, step)
        if cfg.error_feedback:
            g += residual[rank]
        codec.encode(g, wire)
        decoded = np.empty_like(g)
        codec.decode(wire, decoded)
        if cfg.error_feedback:
            np.subtract(g, decoded, out=residual[rank])
        return loss, decoded

    return round_trip, w0


def push_bytes(cfg, n_params):
    """One compressed push on the wire: header, codes, the loss as a float32."""
    return HEADER_BYTES + get_codec(cfg.codec).wire_bytes(n_params) + 4


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "model, codec, error_feedback, backend",
    [("softmax", "trunc16", False, "numpy"), ("mlp", "bf16", False, "numpy"),
     ("mlp", "q8", False, "numpy"), ("softmax", "q8", True, "numpy"),
     ("mlp", "q8", True, "numba")],
)  # fmt: skip
def test_compressed_ps_sync_equals_its_simulation_bitwise(model, codec, error_feedback, backend):
    """Workers push codes; the server decode-adds them in worker order and averages: bitwise
    reference.sync_sgd with every gradient round-tripped through the codec (after error
    feedback), on the server and every worker. Pushes shrink to wire_bytes(n) + 4 bytes; the
    pulls stay float32."""
    cfg = CONFIGS[model].replace(codec=codec, error_feedback=error_feedback, backend=backend)
    n = 3
    grad_fn, w0 = codec_oracle(cfg, n)
    results = run(ps_sync_worker, cfg, n)
    want = sync_sgd(grad_fn, w0, n, STEPS, cfg.lr_at)
    server, workers = results[0], results[1:]
    for r, result in enumerate(results):
        np.testing.assert_array_equal(
            result.params, want.params, err_msg=f"{model}, {codec}: rank {r} differs from the "
            f"simulation (max diff {np.abs(result.params - want.params).max()})"
        )  # fmt: skip
    plain = sync_sgd(oracle_inputs(cfg, n)[0], w0, n, STEPS, cfg.lr_at).params
    assert not np.array_equal(server.params, plain), f"{codec} changed nothing"
    np.testing.assert_allclose(server.losses, want.losses, rtol=1e-6)  # the loss is not encoded
    push, pull = push_bytes(cfg, w0.size), HEADER_BYTES + w0.nbytes
    assert push < HEADER_BYTES + w0.nbytes + 4
    assert [w.bytes_sent for w in workers] == [STEPS * push] * n
    assert server.extra["bytes_received"] == n * STEPS * push
    assert server.bytes_sent == n * STEPS * pull


@pytest.mark.timeout(60)
@pytest.mark.parametrize("n, codec, error_feedback", [(2, "bf16", False), (3, "q8", True)])
def test_compressed_ps_async_equals_its_simulation_in_arrival_order(
    n, codec, error_feedback, steady_workers
):
    cfg = CONFIGS["mlp"].replace(codec=codec, error_feedback=error_feedback)
    grad_fn, w0 = codec_oracle(cfg, n)
    results = run(ps_async_worker, cfg, n)
    server, workers = results[0], results[1:]
    order = server.extra["arrival_order"]
    want = async_ps_sgd(grad_fn, w0, n, order, cfg.lr_at, record=True)
    np.testing.assert_array_equal(
        server.params, want.params,
        err_msg=f"{n} workers, {codec}: server weights != the simulation in the recorded order",
    )  # fmt: skip
    assert server.extra["staleness"] == want.staleness
    np.testing.assert_allclose(server.losses, want.losses, rtol=1e-6)
    for i, worker in enumerate(workers):
        last = len(order) - 1 - order[::-1].index(i)
        np.testing.assert_array_equal(worker.params, want.history[last + 1])
    push = push_bytes(cfg, w0.size)
    assert [w.bytes_sent for w in workers] == [STEPS * push] * n
    assert server.extra["bytes_received"] == n * STEPS * push
    assert server.bytes_sent == n * STEPS * (HEADER_BYTES + w0.nbytes)


# --- compressed pulls ------------------------------------------------------------------------


def round_trip(codec, x):
    """decode(encode(x)): what a worker holds after pulling x with `codec`."""
    wire = np.empty(codec.wire_bytes(x.size), np.uint8)
    codec.encode(x, wire)
    out = np.empty_like(x)
    codec.decode(wire, out)
    return out


def pull_oracle(cfg, n_workers):
    """(grad_fn, w_0) of the oracles for compressed pulls (--codec-pull): every gradient is
    computed on decode(encode(w)) of the server's exact weights w, except each worker's first,
    on the exact w_0 (built from the seed, never pulled); then the push is round-tripped as in
    codec_oracle (a no-op with codec none). The oracles' updates use the exact weights, as the
    server does."""
    model_grad, w0 = oracle_inputs(cfg, n_workers)
    codec = get_codec(cfg.codec_pull, cfg.backend)

    def on_pulled(params, rank, step):
        return model_grad(params if step == 0 else round_trip(codec, params), rank, step)

    return codec_oracle(cfg, n_workers, base=(on_pulled, w0))


def push_bytes_of(cfg, n_params):
    """One push on the wire, compressed or not."""
    if cfg.codec == "none":
        return HEADER_BYTES + 4 * n_params + 4
    return push_bytes(cfg, n_params)


def pull_bytes(cfg, n_params):
    """One compressed pull on the wire: header and codes (no loss travels back)."""
    return HEADER_BYTES + get_codec(cfg.codec_pull).wire_bytes(n_params)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "model, codec_pull, codec, error_feedback",
    [("softmax", "trunc16", "none", False), ("mlp", "q8", "none", False),
     ("mlp", "q8", "bf16", False), ("softmax", "trunc16", "q8", True)],
)  # fmt: skip
def test_compressed_pulls_ps_sync_equal_their_simulation_bitwise(
    model, codec_pull, codec, error_feedback
):
    """The server pulls decode-able codes of its whole weight vector; workers compute on the
    decoded weights; the server keeps and updates its exact weights: bitwise reference.sync_sgd
    with every gradient (after the first, on w_0) computed on decode(encode(w)). Each pull
    shrinks to 48 + wire_bytes(n) bytes; every worker ends on decode(encode(answer))."""
    cfg = CONFIGS[model].replace(codec_pull=codec_pull, codec=codec, error_feedback=error_feedback)
    n = 3
    grad_fn, w0 = pull_oracle(cfg, n)
    results = run(ps_sync_worker, cfg, n)
    want = sync_sgd(grad_fn, w0, n, STEPS, cfg.lr_at)
    server, workers = results[0], results[1:]
    np.testing.assert_array_equal(
        server.params, want.params, err_msg=f"{model}, pull {codec_pull}, push {codec}: the "
        f"server differs (max diff {np.abs(server.params - want.params).max()})"
    )  # fmt: skip
    pulled = round_trip(get_codec(codec_pull), want.params)
    for r, worker in enumerate(workers, start=1):
        np.testing.assert_array_equal(worker.params, pulled, err_msg=f"rank {r}: not its pull")
    exact_pulls = sync_sgd(codec_oracle(cfg, n)[0], w0, n, STEPS, cfg.lr_at).params
    assert not np.array_equal(server.params, exact_pulls), f"pull {codec_pull} changed nothing"
    np.testing.assert_allclose(server.losses, want.losses, rtol=1e-6)
    pull = pull_bytes(cfg, w0.size)
    assert pull < HEADER_BYTES + w0.nbytes
    assert server.bytes_sent == n * STEPS * pull
    assert [w.bytes_sent for w in workers] == [STEPS * push_bytes_of(cfg, w0.size)] * n
    assert server.extra["bytes_received"] == n * STEPS * push_bytes_of(cfg, w0.size)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "n, codec_pull, codec, error_feedback", [(2, "trunc16", "none", False), (3, "q8", "q8", True)]
)
def test_compressed_pulls_ps_async_equal_their_simulation_in_arrival_order(
    n, codec_pull, codec, error_feedback, steady_workers
):
    """reference.async_ps_sgd in the recorded order, its pulled weights seen through the pull
    codec (the grad_fn round-trips them), its updates on the exact weights."""
    cfg = CONFIGS["mlp"].replace(codec_pull=codec_pull, codec=codec, error_feedback=error_feedback)
    grad_fn, w0 = pull_oracle(cfg, n)
    results = run(ps_async_worker, cfg, n)
    server, workers = results[0], results[1:]
    order = server.extra["arrival_order"]
    want = async_ps_sgd(grad_fn, w0, n, order, cfg.lr_at, record=True)
    np.testing.assert_array_equal(
        server.params, want.params,
        err_msg=f"{n} workers, pull {codec_pull}: server weights != the simulation",
    )  # fmt: skip
    assert server.extra["staleness"] == want.staleness
    np.testing.assert_allclose(server.losses, want.losses, rtol=1e-6)
    pull_codec = get_codec(codec_pull)
    for i, worker in enumerate(workers):
        last = len(order) - 1 - order[::-1].index(i)
        np.testing.assert_array_equal(worker.params, round_trip(pull_codec, want.history[last + 1]))
    assert server.bytes_sent == n * STEPS * pull_bytes(cfg, w0.size)
    assert [w.bytes_sent for w in workers] == [STEPS * push_bytes_of(cfg, w0.size)] * n


def test_codec_pull_is_validated():
    assert TrainConfig().codec_pull == "none"
    assert TrainConfig().replace(codec_pull="q8").codec_pull == "q8"
    with pytest.raises(ConfigError, match="codec_pull must be none, trunc16, bf16 or q8"):
        check_config(TrainConfig().replace(codec_pull="fp8"))


# --- the server's one link, emulated ---------------------------------------------------------


@pytest.mark.parametrize("pulls", ["sequential", "shared"])
@pytest.mark.parametrize("p", [1, 2, 4, 5])
def test_the_emulated_server_link_is_timings_ps_sync_model(p, pulls):
    """One ps-sync round on the server's emulated card (netem.ServerNIC, on a clock of its own:
    nothing sleeps), as the server and its workers drive it, lasts exactly timing.predict's
    iteration: the pulls leave at t = 0 (one after another, or booked at once sharing the wire),
    each worker computes t_c once its pull is in and pushes on its own link, and the pushes
    cross the ingress wire in the order they left. The last push is usable at
        sequential:  t_c + 2 alpha + (p + 1) M / B
        shared:      t_c + 2 alpha + 2 p M / B
    (methods/ps.py derives both; benchmarks/ps_link_model.py measures them in real
    processes.) Header bytes are left out (header_bytes=0), as timing leaves them out."""
    link, t_comp, n_params = LinkSpec(latency=0.5e-3, bandwidth=10e6), 1e-3, 4810
    M = 4 * n_params

    class FakeLink:  # what ServerNIC reads of a transport Link
        emulator = None

    FakeLink.spec = link
    nic = ServerNIC([FakeLink() for _ in range(p)], header_bytes=0)
    clock = [0.0]  # the emulated wire's clock: a sleep only moves it on

    def sleep(seconds):
        clock[0] += seconds

    nic.egress = LinkEmulator(link, clock=lambda: clock[0], sleep=sleep)
    if pulls == "shared":
        pulled = [nic.book(p, M)] * p  # all p arrive together, when the last byte is in
    else:
        pulled = [nic.egress.schedule(M) for _ in range(p)]  # as Link.send does, one by one
    # every worker's own link is idle: its push departs as it finishes computing
    frames = [Frame(kind=Kind.DATA, nbytes=M, deliver_at=t + t_comp + link.message_time(M))
              for t in pulled]  # fmt: skip
    round_end = max(nic.round_arrival(frames, i) for i in range(p))
    cal = Calibration(n_params=n_params, t_comp=t_comp, t_update=0.0, alpha=link.latency,
                      bandwidth=link.bandwidth, gamma=0.0, cores=10**9)  # fmt: skip
    want = predict("ps-sync", p, cal, ps_pulls=pulls).iter_time_s
    assert round_end == pytest.approx(want, rel=1e-9), (
        f"{pulls} pulls, p = {p}: the emulated round ends at {round_end * 1e3:.4f} ms, "
        f"timing.predict says {want * 1e3:.4f} ms"
    )


def test_the_ingress_wire_takes_pushes_in_the_order_they_departed():
    """Three pushes of 1 ms each on the server's ingress wire (alpha 0.1 ms): worker 0's left
    last (t = 10 ms), workers 2 and 1 at t = 0 and 0.5 ms. They cross in the order they left,
    2, 1, 0, whatever the order the server reads them in (worker order, for its sum): worker 0's
    push arrives at 10 + 1 + 0.1 ms, not behind the other two; the next round starts from the
    last one's end."""

    class FakeLink:
        spec = LinkSpec(latency=1e-4, bandwidth=1e6)
        emulator = None

    nic = ServerNIC([FakeLink(), FakeLink(), FakeLink()], header_bytes=HEADER_BYTES)
    wire = 1e-3  # (nbytes + header) / B
    nbytes = round(wire * 1e6) - HEADER_BYTES

    def push(departed):  # deliver_at as the worker's own link stamps it
        return Frame(kind=Kind.DATA, nbytes=nbytes, deliver_at=departed + 1e-4 + wire)

    frames = [push(10e-3), push(0.5e-3), push(0.0)]
    assert nic.departure(frames[0]) == pytest.approx(10e-3)
    only_first = [frames[0], None, None]  # as if read alone: nothing ahead of it
    assert nic.round_arrival(only_first, 0) == pytest.approx(10e-3 + wire + 1e-4)
    assert nic.round_end is None, "a round ends only when every header is known"
    arrivals = [nic.round_arrival(frames, i) for i in range(3)]
    assert arrivals == pytest.approx([11.1e-3, 2.1e-3, 1.1e-3])  # 2 at 0-1, 1 at 1-2, 0 at 10-11
    nic.end_round()
    assert nic.ingress_free == pytest.approx(11e-3)
    # the next round queues behind: a push that left at 10.5 ms crosses from 11 ms
    again = [push(10.5e-3), push(20e-3), push(30e-3)]
    assert nic.round_arrival(again, 0) == pytest.approx(12.1e-3)


@pytest.mark.timeout(100)
def test_emulated_ps_sync_a_late_worker_0_does_not_delay_the_pushes_before_it():
    """The server sums the pushes in worker order, but its emulated ingress wire takes them in
    the order they left. Worker 0 computes 30 ms longer than the others; their pushes (5 ms
    each on the wire) cross meanwhile, so the round ends 5 ms + alpha after worker 0's push
    leaves: an iteration of about t_c + 30 ms + the pulls + M / B, not 2 M / B later (as when
    the pushes queued in the order read)."""
    cfg = TrainConfig.preset("tiny").replace(steps=12, model="mlp", hidden=(64,))
    p, link = 3, LinkSpec(latency=0.2e-3, bandwidth=4e6)
    compute = Worker.loss_and_grad

    def late_worker_0(self, step, grads, params=None):
        if self.index == 0:
            time.sleep(30e-3)
        return compute(self, step, grads, params)

    setup = Worker.build(cfg, 0, p)
    push_bytes = 4 * (setup.params.size + 1) + HEADER_BYTES  # the gradient and its loss
    pull_bytes = 4 * setup.params.size + HEADER_BYTES
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Worker, "loss_and_grad", late_worker_0)
        for _attempt in range(2):  # five processes on two shared cores: one retry for load
            results = launch_local(p + 1, ps_sync_worker, (cfg,), start_method="fork",
                                   star=True, link=link, timeout=10, job_timeout=50)  # fmt: skip
            measured = float(np.median(np.diff(results[0].step_end[2:])))
            # worker 0's pull is the first out: it leaves (M / B) + alpha after the update
            in_order = 30e-3 + 2 * link.latency + (pull_bytes + push_bytes) / link.bandwidth
            read_order = in_order + (p - 1) * push_bytes / link.bandwidth
            if measured < (in_order + read_order) / 2:
                break
    assert in_order < measured < (in_order + read_order) / 2, (
        f"measured {measured * 1e3:.2f} ms per iteration; pushes crossing in the order they "
        f"left: {in_order * 1e3:.2f} ms + compute, in the order read: {read_order * 1e3:.2f} ms"
    )


# --- failures --------------------------------------------------------------------------------


def _fail_at(monkeypatch, worker, step, how):
    """Make `worker` fail at `step` (in every forked rank's copy of Worker)."""
    compute = Worker.loss_and_grad

    def failing(self, t, grads, params=None):
        if self.index == worker and t == step:
            if how == "exit":
                os._exit(3)  # dies without a word: only its closed socket tells
            if how == "hang":
                time.sleep(30)  # stopped: the launcher stops it after the others have failed
            raise RuntimeError(f"worker {worker} exploded at step {step}")
        return compute(self, t, grads, params)

    monkeypatch.setattr(Worker, "loss_and_grad", failing)


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "method, how",
    [(ps_sync_worker, "exit"), (ps_sync_worker, "hang"), (ps_async_worker, "raise"),
     (ps_async_worker, "hang")],
)  # fmt: skip
def test_a_failing_worker_fails_the_server_with_its_name(monkeypatch, method, how):
    """Worker 1 (rank 2) dies, raises, or hangs at step 3: the server's error names rank 2,
    and every other worker is told why (an ABORT from the server), within the timeout."""
    oracle_inputs(CONFIGS["softmax"], 3)  # load the data here: forked workers start with it (< 1 s)
    _fail_at(monkeypatch, worker=1, step=3, how=how)
    start = time.monotonic()
    with pytest.raises(WorkerFailed) as failure:
        run(method, CONFIGS["softmax"], 3, timeout=1.0)
    assert time.monotonic() - start < 15
    errors = failure.value.errors
    assert "rank 2" in errors[0], errors[0]
    if how == "hang":  # sync: the server's wait on rank 2 times out; async: rank 2's deadline
        sync = method is ps_sync_worker
        want = "no data from rank 2 for 1.0 s" if sync else "no push from worker 1 (rank 2)"
    else:
        want = "rank 2 closed the connection"
    assert want in errors[0], errors[0]
    for rank in (1, 3):  # the survivors learn who is at fault from the server
        if rank in errors or method is ps_sync_worker:  # (async: may have finished first)
            assert "parameter server (rank 0) stopped" in errors[rank], errors[rank]
            assert "rank 2" in errors[rank], errors[rank]


# --- the wire protocol, in one process -------------------------------------------------------


def _tcp_pair(timeout=2.0):
    """(server side, worker side) Links over one loopback TCP connection."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
    return Link(b, rank=0, peer=1, timeout=timeout), Link(a, rank=1, peer=0, timeout=timeout)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fault", ["version", "length", "codec", "no codec"])
def test_a_push_out_of_step_is_refused_and_the_worker_told(fault):
    """A push of the wrong version, length or codec (bf16 and trunc16 codes have the same
    size): the server raises CollectiveMismatch naming the worker before reading a byte of
    payload, and the worker's pull gets the ABORT."""
    server_link, worker_link = _tcp_pair()
    params = np.zeros(10, np.float32)
    server_codec = {"codec": get_codec("bf16"), "no codec": get_codec("q8")}.get(fault)
    server = ParameterServer({1: server_link}, params, codec=server_codec)
    errors = []

    def serve():
        try:
            server.run_sync(1, lambda version, grads: None)
        except Exception as e:  # noqa: BLE001 - the test inspects it
            errors.append(e)

    thread = threading.Thread(target=serve)
    thread.start()
    client_codec = get_codec("trunc16") if fault == "codec" else None
    client = PSClient(worker_link, 11 if fault == "length" else 10, codec=client_codec)
    client.version = 5 if fault == "version" else 0
    client.grads[:] = 1.0
    client.push(0.5)
    with pytest.raises(PeerAborted, match="worker 0 \\(rank 1\\)"):
        client.pull(np.empty(client.n, np.float32))
    thread.join(timeout=5)
    assert len(errors) == 1 and isinstance(errors[0], CollectiveMismatch), errors
    assert "worker 0 (rank 1)" in str(errors[0])
    if fault == "codec":
        assert "codec trunc16" in str(errors[0]) and "codec bf16" in str(errors[0]), errors[0]
    server_link.close()
    worker_link.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("server_pull, worker_pull", [("bf16", "trunc16"), ("q8", None),
                                                      (None, "q8")])  # fmt: skip
def test_a_pull_with_another_codec_is_refused_naming_the_server(server_pull, worker_pull):
    """bf16 and trunc16 codes have the same size: only the codec id in `part` tells them apart.
    The worker raises CollectiveMismatch naming the server before reading the payload."""
    server_link, worker_link = _tcp_pair()
    params = np.zeros(10, np.float32)
    server = ParameterServer({1: server_link}, params,
                             pull_codec=server_pull and get_codec(server_pull))  # fmt: skip
    thread = threading.Thread(target=server.run_sync, args=(1, lambda version, grads: None))
    thread.start()
    client = PSClient(worker_link, 10, pull_codec=worker_pull and get_codec(worker_pull))
    client.grads[:] = 1.0
    client.push(0.5)
    with pytest.raises(CollectiveMismatch, match="parameter server \\(rank 0\\)") as error:
        client.pull(np.empty(10, np.float32))
    thread.join(timeout=5)
    assert error.value.origin == 0
    text = str(error.value)
    assert f"pull codec {server_pull or 'none'}" in text and "this worker expected" in text
    assert text.index(f"pull codec {worker_pull or 'none'}") > text.index("this worker expected")
    server_link.close()
    worker_link.close()


@pytest.mark.timeout(60)
def test_compressed_pull_round_trip_in_one_process():
    """One q8-pull sync step by hand: the pull is [scale, 5 codes] (4 + 5 bytes, one scale for
    the whole vector), the worker holds decode(encode(w_1)), the server keeps w_1 exactly."""
    server_link, worker_link = _tcp_pair()
    codec = get_codec("q8")
    params = np.array([0.5, -1.0, 0.3, 1e-3, 2.0], np.float32)
    exact = params - np.float32(0.25)  # w_1, computed here as apply does
    server = ParameterServer({1: server_link}, params, pull_codec=codec)

    def apply(version, grads):
        params[:] -= grads

    thread = threading.Thread(target=server.run_sync, args=(1, apply))
    thread.start()
    client = PSClient(worker_link, 5, pull_codec=codec)
    client.grads[:] = 0.25
    client.push(0.1)
    got = np.empty(5, np.float32)
    assert client.pull(got, expect=1) == 1
    thread.join(timeout=5)
    np.testing.assert_array_equal(params, exact)  # the server's weights: never rounded
    np.testing.assert_array_equal(got, round_trip(codec, exact))
    assert not np.array_equal(got, exact)
    assert server_link.bytes_sent == HEADER_BYTES + 4 + 5
    assert worker_link.bytes_sent == HEADER_BYTES + 4 * 5 + 4  # the push stays float32
    server_link.close()
    worker_link.close()


@pytest.mark.timeout(60)
def test_protocol_round_trip_in_one_process():
    """One sync step by hand: the worker's push arrives, the server averages and applies,
    the pull returns version 1 and the new weights."""
    server_link, worker_link = _tcp_pair()
    params = np.arange(4, dtype=np.float32)
    server = ParameterServer({1: server_link}, params)

    def apply(version, grads):
        params[:] -= grads

    thread = threading.Thread(target=server.run_sync, args=(1, apply))
    thread.start()
    client = PSClient(worker_link, 4)
    client.grads[:] = [1, 1, 1, 1]
    client.push(2.5)
    got = np.empty(4, np.float32)
    assert client.pull(got, expect=1) == 1
    thread.join(timeout=5)
    np.testing.assert_array_equal(got, [-1, 0, 1, 2])
    assert server.log.losses == [2.5]
    server_link.close()
    worker_link.close()


@pytest.mark.timeout(60)
def test_compressed_protocol_round_trip_in_one_process():
    """One q8 sync step by hand: the push is [scale, 5 codes][loss] (4 + 5 + 4 bytes), the
    loss arrives exactly as float32, the server applies decode(encode(g)), the pull is float32."""
    server_link, worker_link = _tcp_pair()
    codec = get_codec("q8")
    params = np.arange(5, dtype=np.float32)
    server = ParameterServer({1: server_link}, params, codec=codec)

    def apply(version, grads):
        params[:] -= grads

    thread = threading.Thread(target=server.run_sync, args=(1, apply))
    thread.start()
    client = PSClient(worker_link, 5, codec=codec)
    g = np.array([1.0, -2.0, 0.3, 1e-3, 4.0], np.float32)
    client.grads[:] = g
    client.push(0.1)
    got = np.empty(5, np.float32)
    assert client.pull(got, expect=1) == 1
    thread.join(timeout=5)
    wire, decoded = np.empty(codec.wire_bytes(5), np.uint8), np.empty(5, np.float32)
    codec.encode(g, wire)
    codec.decode(wire, decoded)
    assert not np.array_equal(decoded, g)  # q8 rounds 0.3 and 1e-3
    np.testing.assert_array_equal(got, np.arange(5, dtype=np.float32) - decoded)
    np.testing.assert_array_equal(params, got)
    assert server.log.losses == [float(np.float32(0.1))]
    assert worker_link.bytes_sent == HEADER_BYTES + (4 + 5) + 4
    assert server_link.bytes_sent == HEADER_BYTES + 4 * 5
    server_link.close()
    worker_link.close()


# --- ps-sync with shared pulls (--ps-pulls=shared) --------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("codec, codec_pull", [("none", "none"), ("q8", "trunc16")])
def test_shared_and_sequential_pulls_give_the_same_weights_bitwise(codec, codec_pull):
    """How the pulls share the server's wire changes when bytes arrive, never which: the same
    pushes are summed in worker order either way. Both equal each other bitwise on every rank,
    and without codecs both equal reference.sync_sgd. Run over an emulated link, so that the
    shared server books its wire for all p pulls (and their codes, with a pull codec)."""
    n, link = 3, LinkSpec(latency=0.1e-3, bandwidth=200e6)
    base = CONFIGS["mlp"].replace(codec=codec, codec_pull=codec_pull)
    grad_fn, w0 = oracle_inputs(base, n)  # first: forked workers inherit the loaded data set
    got = {}
    for pulls in ("sequential", "shared"):
        got[pulls] = launch_local(n + 1, ps_sync_worker, (base.replace(ps_pulls=pulls),),
                                  start_method="fork", star=True, link=link, timeout=10,
                                  job_timeout=50)  # fmt: skip
    for r, (seq, shared) in enumerate(zip(got["sequential"], got["shared"], strict=True)):
        np.testing.assert_array_equal(
            shared.params, seq.params, err_msg=f"{codec}/{codec_pull}, rank {r}: shared pulls "
            f"changed the weights (max diff {np.abs(shared.params - seq.params).max()})"
        )  # fmt: skip
        assert shared.losses == seq.losses, f"rank {r}: shared pulls changed the losses"
        assert shared.bytes_sent == seq.bytes_sent, f"rank {r}: shared pulls changed the bytes"
    if codec == codec_pull == "none":
        want = sync_sgd(grad_fn, w0, n, STEPS, base.lr_at)
        np.testing.assert_array_equal(got["shared"][0].params, want.params)


def test_ps_pulls_is_validated_by_the_server():
    params = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="pulls must be one of sequential, shared, got 'all'"):
        ParameterServer({1: None}, params, pulls="all")
