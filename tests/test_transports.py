"""The same-host transports (unix, shm, auto) under the suites the tcp path passes: the ring
against its one-process simulation (bitwise), training against the oracles, the parameter
server, link emulation, a killed and a stopped rank, the job token; and that shared memory
leaves nothing behind, a SIGKILLed job included. The tcp path itself: test_ring.py and the
rest."""

import os
import signal
import time

import numpy as np
import pytest
from jobs import (
    TIMEOUT,
    assert_nothing_left_alive,
    blamed,
    killed_job,
    run_failing,
    stopped_job,
)
from oracles import assert_matches_oracle, oracle, oracle_inputs

from pipesgd_ref.comm import shm
from pipesgd_ref.comm.collectives import allgather, allreduce, barrier, broadcast
from pipesgd_ref.comm.netem import LinkSpec
from pipesgd_ref.comm.rendezvous import JobSpec, link_transport
from pipesgd_ref.comm.schedule import simulate_allreduce
from pipesgd_ref.config import TrainConfig
from pipesgd_ref.errors import RendezvousError
from pipesgd_ref.methods.pipe import pipe_worker
from pipesgd_ref.methods.ps import ps_async_worker, ps_sync_worker
from pipesgd_ref.methods.reference import async_ps_sgd, sync_sgd
from pipesgd_ref.methods.sync import sync_worker
from pipesgd_ref.runtime.launch import launch_local

SAME_HOST = ["unix", "shm", "auto"]
STEPS = 20  # of the parameter server's runs, as in test_ps.py


def _ring_job(comm, n, segment_bytes, seed):
    x = np.random.default_rng([seed, comm.rank]).normal(size=n).astype(np.float32)
    allreduce(comm, x, segment_bytes=segment_bytes)
    data = np.arange(7, dtype=np.int64) * (comm.rank + 1)
    broadcast(comm, data, root=comm.world_size - 1)
    barrier(comm)
    gathered = allgather(comm, np.full(comm.rank, float(comm.rank)))
    return x, data, gathered, comm.transports


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", SAME_HOST)
@pytest.mark.parametrize(
    "p, n, segment_bytes",
    [
        (2, 0, 1 << 20),  # nothing to send: every frame is empty (never a slot)
        (3, 2, 8),  # fewer elements than ranks
        (4, 1000, 64),  # 63 segments a chunk: the slots wrap round, the sender waits for them
        # whole slots and a part-filled one (in the full suite only)
        pytest.param(4, 300_001, 1 << 20, marks=pytest.mark.slow),
    ],
)
def test_ring_equals_its_simulation_bitwise(transport, p, n, segment_bytes):
    results = launch_local(p, _ring_job, (n, segment_bytes, n), start_method="fork", timeout=10,
                           job_timeout=60, transport=transport)  # fmt: skip
    inputs = [np.random.default_rng([n, r]).normal(size=n).astype(np.float32) for r in range(p)]
    want = simulate_allreduce(inputs)[0]
    expected_link = "shm" if transport == "auto" else transport  # auto: shm on one host
    for rank, (x, data, gathered, transports) in enumerate(results):
        np.testing.assert_array_equal(x, want, err_msg=f"{transport}: rank {rank} of {p}")
        np.testing.assert_array_equal(data, np.arange(7) * p, err_msg=f"rank {rank} broadcast")
        assert [g.tolist() for g in gathered] == [[float(r)] * r for r in range(p)]
        assert set(transports.values()) == {expected_link}, transports


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["unix", "shm"])
def test_training_equals_the_oracles(transport):
    """Sync and Pipe-SGD of width 2 over the transport: the oracles' weights (bitwise at p = 2,
    the replicas bitwise identical at any p)."""
    for p, model in [(2, "mlp"), (3, "softmax")]:
        cfg = TrainConfig.preset("tiny").replace(world_size=p, model=model, hidden=(8,),
                                                 steps=20)  # fmt: skip
        got = launch_local(p, sync_worker, (cfg,), start_method="fork", timeout=20,
                           transport=transport)  # fmt: skip
        assert_matches_oracle(got, oracle(cfg, 0), p)
        got = launch_local(p, pipe_worker, (cfg,), start_method="fork", timeout=20,
                           transport=transport)  # fmt: skip
        assert_matches_oracle(got, oracle(cfg, 1), p)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["unix", "shm"])
def test_parameter_server_equals_the_oracles(transport):
    """ps-sync bitwise reference.sync_sgd; ps-async bitwise the oracle replayed in the order
    the pushes arrived; over the star links of the transport."""
    n = 3
    cfg = TrainConfig.preset("tiny").replace(steps=STEPS, model="mlp", hidden=(16,))
    grad_fn, w0 = oracle_inputs(cfg, n)

    def run(worker_fn):
        return launch_local(n + 1, worker_fn, (cfg,), start_method="fork", star=True,
                            timeout=10, job_timeout=50, transport=transport)  # fmt: skip

    results = run(ps_sync_worker)
    want = sync_sgd(grad_fn, w0, n, STEPS, cfg.lr_at)
    for r, result in enumerate(results):
        np.testing.assert_array_equal(result.params, want.params, err_msg=f"rank {r}")
    server = run(ps_async_worker)[0]
    want = async_ps_sgd(grad_fn, w0, n, server.extra["arrival_order"], cfg.lr_at)
    np.testing.assert_array_equal(server.params, want.params, err_msg="ps-async server")


def _timed_job(comm, n, reps):
    x = np.ones(n, np.float32)
    allreduce(comm, x)
    start = time.perf_counter()
    for _ in range(reps):
        allreduce(comm, x)
    return (time.perf_counter() - start) / reps


@pytest.mark.timeout(60)
def test_link_emulation_paces_shared_memory_too():
    """The emulated wire decides when a slotted frame arrives, as on a socket: an AllReduce
    takes at least its bandwidth term 2(p-1)/p M / B (a lower bound: load only adds time)."""
    p, n, bandwidth = 4, 250_000, 100e6  # 1 MB at 100 MB/s
    link = LinkSpec(latency=0.0, bandwidth=bandwidth)
    per_rank = launch_local(p, _timed_job, (n, 3), start_method="fork", timeout=10,
                            link=link, transport="shm")  # fmt: skip
    floor = 2 * (p - 1) / p * n * 4 / bandwidth
    assert min(per_rank) >= floor, f"{min(per_rank) * 1e3:.1f} ms < {floor * 1e3:.1f} ms"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["unix", "shm"])
@pytest.mark.slow  # 2-5 s: kept out of the fast subset
def test_rank_killed_mid_allreduce_is_named_by_every_rank(transport, tmp_path):
    """As fast as on tcp: a closed control socket is a death, noticed at once, whether the
    survivor was receiving or waiting for a free slot."""
    p, victim = 4, 2
    failed, elapsed = run_failing(p, killed_job, (victim, 4_000_000, 5, tmp_path),
                                  transport=transport)  # fmt: skip
    assert elapsed < 2 * TIMEOUT, f"{transport}: the job took {elapsed:.2f} s to fail"
    assert "died with exit code -9" in failed.errors[victim], failed.errors[victim]
    for rank in set(range(p)) - {victim}:
        text = failed.errors[rank]
        assert blamed(text) == victim, f"{transport}: rank {rank} should blame {victim}: {text}"
    assert_nothing_left_alive(tmp_path, expected=p)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_stopped_rank_on_shm_is_a_timeout(tmp_path):
    """A slot never filled: the stopped rank's right neighbour times out naming it."""
    failed, elapsed = run_failing(4, stopped_job, (2, 1000, tmp_path), grace=0.5,
                                  transport="shm")  # fmt: skip
    text = failed.errors[3]
    assert f"rank 3: no data from rank 2 for {TIMEOUT:.1f} s" in text, text
    assert elapsed < TIMEOUT + 0.5 + 0.5 + 0.5 + 2.0 + 1.0, f"took {elapsed:.2f} s"
    assert_nothing_left_alive(tmp_path, expected=4)


def _dev_shm() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def _sigkilled_job(comm):
    allreduce(comm, np.ones(100_000, np.float32))
    if comm.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    allreduce(comm, np.ones(100_000, np.float32))


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_shared_memory_leaves_nothing_behind():
    """The regions are anonymous memfds handed over the socket: nothing is ever named in
    /dev/shm, so no exit, a SIGKILL included, can leave a segment there."""
    before = _dev_shm()
    launch_local(3, _ring_job, (1000, 64, 0), start_method="fork", timeout=10, transport="shm")
    run_failing(3, _sigkilled_job, (), transport="shm")
    assert _dev_shm() == before, f"left in /dev/shm: {sorted(_dev_shm() - before)}"


# --- which transport a link takes ------------------------------------------------------------


def table(*nodes):
    return [{"node": node} for node in nodes]


def test_auto_takes_shared_memory_on_one_host_and_tcp_across():
    addrs = table("a", "a", "b")
    assert link_transport("auto", 0, 1, addrs) == "shm"
    assert link_transport("auto", 1, 2, addrs) == "tcp"
    assert link_transport("tcp", 0, 1, addrs) == "tcp"
    assert link_transport("unix", 0, 1, addrs) == "unix"


@pytest.mark.parametrize("transport", ["unix", "shm"])
def test_a_same_host_transport_across_hosts_is_refused_naming_both_ranks(transport):
    with pytest.raises(RendezvousError) as info:
        link_transport(transport, 1, 2, table("a", "a", "b"))
    text = str(info.value)
    assert f"--transport {transport} needs ranks 1 and 2 on one host" in text, text
    assert "--transport auto" in text, text


def test_an_unknown_transport_is_refused():
    with pytest.raises(ValueError, match="transport must be one of auto, tcp, unix, shm"):
        JobSpec(0, 1, transport="rdma")


def test_slots_hold_a_ring_segment():
    from pipesgd_ref.comm.schedule import SEGMENT_BYTES

    assert shm.SLOT_BYTES >= SEGMENT_BYTES  # every segment of the plain ring fits one slot


def _compressed_job(comm, n, codec_name):
    from pipesgd_ref.codecs import get_codec

    x = np.random.default_rng([n, comm.rank]).normal(size=n).astype(np.float32)
    allreduce(comm, x, "mean", codec=get_codec(codec_name), segment_bytes=1024)
    return x


@pytest.mark.timeout(60)
@pytest.mark.parametrize("codec_name", ["trunc16", "q8"])
def test_the_compressed_ring_over_shared_memory_equals_its_simulation(codec_name):
    from pipesgd_ref.codecs import get_codec
    from pipesgd_ref.comm.schedule import simulate_compressed_allreduce

    p, n = 3, 5000
    got = launch_local(p, _compressed_job, (n, codec_name), start_method="fork", timeout=10,
                       transport="shm")  # fmt: skip
    inputs = [np.random.default_rng([n, r]).normal(size=n).astype(np.float32) for r in range(p)]
    want = simulate_compressed_allreduce(inputs, get_codec(codec_name), "mean", 1024)[0]
    for rank, x in enumerate(got):
        np.testing.assert_array_equal(x, want, err_msg=f"{codec_name}: rank {rank}")
