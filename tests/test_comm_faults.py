"""Communication faults: what happens when a rank dies, stops, disagrees, or never comes.

Every case runs real worker processes (fork: fast, and the jobs below are module-level
functions) or real sockets in threads, with small timeouts, and checks three things:

    * it ends: an error, never a hang, within a bound stated in the assert message;
    * the error names the rank at fault and says what differed;
    * nothing is left behind: no worker process alive afterwards.

The measured detection times are printed: `pytest -s` shows them.
"""

import json
import logging
import multiprocessing as mp
import os
import re
import signal
import socket
import struct
import threading
import time

import numpy as np
import pytest
from jobs import (
    TIMEOUT,
    assert_every_rank_blames_the_killed,
    assert_nothing_left_alive,
    blamed,
    killed_job,
    run_failing,
    stopped_job,
    write_pid,
)

from pipesgd_ref.comm.activity import doing
from pipesgd_ref.comm.collectives import allreduce, barrier, broadcast
from pipesgd_ref.comm.communicator import CAUSE_WAIT_SECONDS, Communicator
from pipesgd_ref.comm.links import Link
from pipesgd_ref.comm.rendezvous import JobSpec, RendezvousError, init_process_group
from pipesgd_ref.comm.wire import Frame, Kind
from pipesgd_ref.errors import CommError, LaunchError, PeerAborted
from pipesgd_ref.runtime import lifetime
from pipesgd_ref.runtime.jobenv import JobEnv, _default_token, detect_env
from pipesgd_ref.runtime.launch import free_port, launch_local
from pipesgd_ref.runtime.lifetime import LocalStop


def record(case: str, seconds: float) -> None:
    print(f"\n[detection] {case}: {seconds:.2f} s")


# --- 1. a rank killed mid-collective ---------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_rank_killed_mid_allreduce_is_named_by_every_rank(tmp_path):
    p, victim = 4, 2
    failed, elapsed = run_failing(p, killed_job, (victim, 4_000_000, 5, tmp_path))
    record(f"SIGKILL of rank {victim} (timeout {TIMEOUT} s)", elapsed)
    assert elapsed < 2 * TIMEOUT, (
        f"the job took {elapsed:.2f} s to fail; bound: 2 x the {TIMEOUT} s timeout "
        f"(a closed socket is noticed at once, no timeout should be needed)"
    )
    assert_every_rank_blames_the_killed(failed, p, victim)
    assert_nothing_left_alive(tmp_path, expected=p)


def _killed_while_downstream_sleeps(comm, victim, sleeper, n, pid_dir):
    write_pid(pid_dir)
    x = np.ones(n, np.float32)
    allreduce(comm, x)
    if comm.rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    if comm.rank == sleeper:
        # The victim's right neighbour hears of nothing for a while (as on a loaded machine):
        # the news that reaches rank 0 first is the victim's left neighbour's, who then exits.
        time.sleep(1.0)
    allreduce(comm, x)


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_a_neighbour_that_passed_the_failure_on_and_exited_is_not_blamed(tmp_path):
    """The CI failure of issue 18, made certain: rank 2 is killed; rank 1 (sending to it) sees
    the reset, passes the news on and exits, long before rank 3 (the other way round the ring)
    notices. Rank 0 then sees rank 1 close its connection: it must still blame rank 2, as the
    news rank 1 sent both ways before closing says."""
    p, victim, sleeper = 4, 2, 3
    args = (victim, sleeper, 100_000, tmp_path)
    failed, elapsed = run_failing(p, _killed_while_downstream_sleeps, args)
    record(f"SIGKILL of rank {victim}, rank {sleeper} asleep (timeout {TIMEOUT} s)", elapsed)
    assert elapsed < 1.0 + 2 * TIMEOUT, f"took {elapsed:.2f} s; bound 1 s asleep + 2 x timeout"
    assert "died with exit code -9" in failed.errors[victim], failed.errors[victim]
    blames = {r: blamed(t) for r, t in failed.errors.items() if r != victim}
    assert blames == {0: victim, 1: victim, 3: victim}, f"who blamed whom: {blames}\n{failed}"
    assert failed.cause == victim, failed
    assert_nothing_left_alive(tmp_path, expected=p)


def _news_frame(origin: int, reason: str) -> bytes:
    payload = json.dumps({"origin": origin, "reason": reason}).encode()
    return Frame(kind=Kind.ABORT, nbytes=len(payload)).pack() + payload


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        a = socket.create_connection(server.getsockname(), timeout=2)
        b, _ = server.accept()
    return a, b


@pytest.mark.timeout(30)
def test_a_send_refused_by_a_close_reports_the_news_sent_before_it():
    """A peer that fails because of another rank sends ABORT on the link this rank only sends
    on, then closes (with our data unread: a reset). The failed send reports that news,
    naming the rank at fault, not the peer that closed."""
    a, b = tcp_pair()
    tx = Link(a, rank=0, peer=1, timeout=2)
    try:
        a.sendall(b"x" * 1000)  # unread by the peer: its close is a reset
        b.sendall(_news_frame(2, "rank 1: rank 2 closed the connection during allreduce #2"))
        b.close()
        time.sleep(0.05)
        with pytest.raises(PeerAborted) as info:
            for _ in range(3):  # the first send may still go into the socket buffer
                with doing("allreduce #2 step 0"):
                    tx.send(Frame(kind=Kind.DATA), b"y" * 100_000)
        text = str(info.value)
        assert info.value.origin == 2 and blamed(text) == 2, text
        assert text.startswith(
            "rank 0: rank 2 failed, so allreduce #2 step 0 cannot finish "
            "(news from rank 1, which then closed the connection)"
        ), text
    finally:
        tx.close()


@pytest.mark.timeout(30)
def test_a_send_refused_by_a_silent_close_blames_the_peer():
    a, b = tcp_pair()
    tx = Link(a, rank=0, peer=1, timeout=2)
    try:
        a.sendall(b"x" * 1000)
        b.close()  # died: no news
        time.sleep(0.05)
        with pytest.raises(CommError) as info:
            for _ in range(3):
                tx.send(Frame(kind=Kind.DATA), b"y" * 100_000)
        assert type(info.value).__name__ == "PeerClosed" and info.value.origin == 1, info.value
        assert blamed(str(info.value)) == 1, info.value
    finally:
        tx.close()


def _ring_of_sockets(p_left: int, p_right: int):
    """Rank 1's view of a ring: its left link (from rank p_left) and right link (to rank
    p_right), each with the test holding the other end."""
    (left_far, left_near), (right_near, right_far) = tcp_pair(), tcp_pair()
    left = Link(left_near, rank=1, peer=p_left, timeout=TIMEOUT)
    right = Link(right_near, rank=1, peer=p_right, timeout=TIMEOUT)
    comm = Communicator(JobSpec(1, 4, timeout=TIMEOUT), left, right)
    return comm, left_far, right_far


def _closed_mid_frame(comm, left_far) -> CommError:
    """The left neighbour sends a header and part of its payload, then resets."""
    left_far.sendall(Frame(kind=Kind.DATA, op=1, dtype=1, seq=1, nbytes=400, total_len=100).pack()
                     + b"z" * 100)  # fmt: skip
    left_far.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    left_far.close()
    with doing("allreduce #1 step 0"):
        frame = comm.left.recv_header()
        with pytest.raises(CommError) as info:
            comm.left.recv_payload_into(frame, memoryview(bytearray(400)))
    assert comm.left.mid_frame
    return info.value


@pytest.mark.timeout(30)
def test_a_close_mid_frame_waits_for_news_from_the_other_side():
    comm, left_far, right_far = _ring_of_sockets(0, 2)
    try:
        error = _closed_mid_frame(comm, left_far)
        threading.Timer(0.2, right_far.sendall, (_news_frame(3, "rank 2: rank 3 failed"),)).start()
        start = time.monotonic()
        cause = comm.explain(error)
        elapsed = time.monotonic() - start
        assert isinstance(cause, PeerAborted) and cause.origin == 3, cause
        assert blamed(str(cause)) == 3 and "after rank 0 closed the connection" in str(cause)
        assert 0.15 < elapsed < 1.0, f"the news came after 0.2 s; explain took {elapsed:.2f} s"
    finally:
        comm.close()
        right_far.close()


@pytest.mark.timeout(30)
def test_a_close_mid_frame_without_news_blames_the_neighbour_within_the_bound():
    comm, left_far, right_far = _ring_of_sockets(0, 2)
    try:
        error = _closed_mid_frame(comm, left_far)
        start = time.monotonic()
        assert comm.explain(error) is error
        elapsed = time.monotonic() - start
        bound = min(CAUSE_WAIT_SECONDS, TIMEOUT / 2)
        assert bound - 0.05 < elapsed < bound + 0.5, f"waited {elapsed:.2f} s, bound {bound} s"
        right_far.close()  # the other neighbour gone too: no news can come, no waiting
        start = time.monotonic()
        assert comm.explain(error) is error
        assert time.monotonic() - start < 0.5
    finally:
        comm.close()


@pytest.mark.timeout(30)
def test_a_close_between_frames_blames_the_neighbour_at_once():
    """A neighbour that passes a failure on sends ABORT before closing; one that closes
    between frames without it is the cause: no waiting."""
    comm, left_far, right_far = _ring_of_sockets(0, 2)
    try:
        left_far.close()
        with pytest.raises(CommError) as info:
            comm.left.recv_header()
        start = time.monotonic()
        assert comm.explain(info.value) is info.value and info.value.origin == 0
        assert time.monotonic() - start < 0.1
    finally:
        comm.close()
        right_far.close()


@pytest.mark.timeout(30)
def test_news_from_the_right_stops_a_wait_on_the_left():
    """check_news, polled while waiting on the left neighbour, raises the news that the right
    neighbour sent back; a right neighbour that merely finished and closed is no failure."""
    comm, left_far, right_far = _ring_of_sockets(0, 2)
    try:
        comm.check_news()  # nothing: no error
        right_far.sendall(_news_frame(3, "rank 2: rank 3 closed the connection"))
        time.sleep(0.05)
        with pytest.raises(PeerAborted) as info:
            comm.check_news()
        assert info.value.origin == 3 and blamed(str(info.value)) == 3, info.value
        right_far.close()
        time.sleep(0.05)
        comm.check_news()  # closed without news: for the send to find
    finally:
        comm.close()
        left_far.close()


@pytest.mark.timeout(30)
def test_a_rank_stopped_by_a_signal_tells_its_peers_who_stop_on_the_same_signal(monkeypatch):
    """A joined rank that stops on a signal says so on every link as it closes (a stop, not
    a failure: its launcher signals the others too, maybe later); a rank that reads that news
    stops on the same signal (lifetime.heard_stop), so it exits as stopped, not failed."""
    plan = LocalStop()  # a joined rank's plan: nobody else shares it
    monkeypatch.setattr(lifetime, "_PLAN", plan)
    comm, left_far, right_far = _ring_of_sockets(0, 2)
    try:
        news = {"origin": 2, "reason": "rank 2 stopped by SIGTERM before step 7",
                "signal": int(signal.SIGTERM), "step": 7}  # fmt: skip
        payload = json.dumps(news).encode()
        right_far.sendall(Frame(kind=Kind.ABORT, nbytes=len(payload)).pack() + payload)
        time.sleep(0.05)
        with pytest.raises(PeerAborted) as info:
            comm.check_news()
        assert str(info.value).startswith("rank 1: rank 2 stopped, so "), info.value
        assert plan.signum == signal.SIGTERM, "the news did not stop this rank"
        comm.close()  # stopping now: it tells both neighbours before it closes
        for far, peer in ((left_far, 0), (right_far, 2)):
            link = Link(far, rank=peer, peer=1, timeout=2)
            frame = link.recv_header()
            assert frame.kind == Kind.ABORT, frame
            told = link.read_abort(frame)
            assert (told.origin, told.signal, told.happened) == (1, signal.SIGTERM, "stopped")
            assert told.reason == "rank 1 stopped by SIGTERM", told
    finally:
        comm.close()
        left_far.close()
        right_far.close()


# --- 2. a stopped rank -----------------------------------------------------------------------


STOP_GRACE = 0.5  # launch_local's grace: the stopped rank cannot exit on its own anyway


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory):
    """Rank 2 of 4 stops itself before an allreduce; run once, judged by several tests."""
    pid_dir = tmp_path_factory.mktemp("stopped")
    failed, elapsed = run_failing(4, stopped_job, (2, 1000, pid_dir), grace=STOP_GRACE)
    record(f"SIGSTOP of rank 2 (timeout {TIMEOUT} s, grace {STOP_GRACE} s)", elapsed)
    return failed, elapsed, pid_dir


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_stopped_rank_is_timed_out_and_cleaned_up(stopped_run):
    failed, elapsed, pid_dir = stopped_run
    # Detection within the timeout plus a poll slice; then grace; then the launcher's
    # terminate (2 s wait: a stopped process ignores SIGTERM) and kill.
    bound = TIMEOUT + 0.5 + STOP_GRACE + 0.5 + 2.0 + 1.0
    assert elapsed < bound, f"took {elapsed:.2f} s, bound {bound:.1f} s"
    assert {0, 1, 3} <= set(failed.errors), failed
    text = failed.errors[3]  # rank 3's left neighbour is the stopped rank
    assert f"rank 3: no data from rank 2 for {TIMEOUT:.1f} s" in text, text
    assert "is rank 2 alive" in text and "raise --timeout" in text, text
    assert_nothing_left_alive(pid_dir, expected=4)


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_stopped_rank_is_listed_among_the_failed(stopped_run):
    failed, _, _ = stopped_run
    assert 2 in failed.errors, f"rank 2 (stopped, then killed) is not reported: {failed}"


@pytest.mark.timeout(60)
@pytest.mark.slow
def test_stopped_rank_ends_within_twice_the_timeout(stopped_run):
    _, elapsed, _ = stopped_run
    bound = 2 * TIMEOUT + STOP_GRACE
    assert elapsed < bound, (
        f"took {elapsed:.2f} s; bound: 2 x timeout ({TIMEOUT} s) + grace ({STOP_GRACE} s)"
    )


def _stopped_job_slow_detector(comm, victim, n, skew):
    x = np.ones(n, np.float32)
    allreduce(comm, x)
    if comm.rank == victim:
        os.kill(os.getpid(), signal.SIGSTOP)
    if comm.rank == (victim + 1) % comm.world_size:
        # The rank downstream of the victim notices `skew` seconds late. Naturally its 0.2 s
        # poll slices make it late by 0..0.2 s, at random: this makes the race deterministic.
        comm.left.timeout += skew
    allreduce(comm, x)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_every_rank_blames_the_stopped_rank():
    failed, elapsed = run_failing(4, _stopped_job_slow_detector, (2, 1000, 0.5), grace=1.5)
    blames = {r: blamed(t) for r, t in failed.errors.items() if r != 2}
    assert blames == {0: 2, 1: 2, 3: 2}, f"who blamed whom: {blames}\n{failed}"
    assert "rank 2 never reported" in failed.errors[2]


# --- 3. mismatched length or dtype -----------------------------------------------------------


def _mismatch_job(comm, odd_rank, n_odd, dtype_odd, pid_dir):
    write_pid(pid_dir)
    odd = comm.rank == odd_rank
    x = np.ones(n_odd if odd else 10, dtype_odd if odd else np.float32)
    allreduce(comm, x)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "n_odd, dtype_odd, mine, theirs",
    [
        (11, np.float32, "of 11 float32", "of 10 float32"),  # length 11 vs 10
        (10, np.float64, "of 10 float64", "of 10 float32"),  # float64 vs float32
    ],
    ids=["length", "dtype"],
)
def test_mismatched_allreduce_is_an_error_naming_both_ranks(tmp_path, n_odd, dtype_odd, mine,
                                                            theirs):  # fmt: skip
    p, odd = 4, 1
    failed, elapsed = run_failing(p, _mismatch_job, (odd, n_odd, dtype_odd, tmp_path))
    record(f"mismatch {mine} vs {theirs} (timeout {TIMEOUT} s)", elapsed)
    assert elapsed < TIMEOUT, f"took {elapsed:.2f} s: a mismatch needs no timeout to be seen"
    assert sorted(failed.errors) == list(range(p)), failed
    # Rank 1 (the odd one) receives rank 0's frames first, whatever the timing: it names
    # rank 0 and both collectives.
    text = failed.errors[1]
    assert text.startswith("rank 1: rank 0 sent a frame of allreduce_sum #1 " + theirs), text
    assert "while this rank is in allreduce_sum #1 " + mine in text, text
    assert "same order, with the same dtype and length" in text, text
    # Ranks 2 and 3 learn it from rank 1's frames (rank 2) or from the ABORT news passed along
    # the ring, which carries rank 1's text: their errors show what differed, and rank 1.
    # (Rank 0 may not: see test_mismatch_news_reaches_every_rank.)
    for rank in (2, 3):
        text = failed.errors[rank]
        assert mine in text and theirs in text and "rank 1" in text, f"rank {rank}: {text}"
    assert_nothing_left_alive(tmp_path, expected=p)


# --- 4. mismatched op sequence ---------------------------------------------------------------


def _op_mismatch_job(comm):
    x = np.ones(10, np.float32)
    if comm.rank == 0:
        broadcast(comm, x, root=0)
        barrier(comm)  # the next collective: rank 0 must not get through it either
    else:
        allreduce(comm, x)


@pytest.mark.timeout(60)
def test_broadcast_against_allreduce_is_an_error():
    failed, elapsed = run_failing(3, _op_mismatch_job, ())
    record(f"broadcast vs allreduce (timeout {TIMEOUT} s)", elapsed)
    assert elapsed < 2 * TIMEOUT, f"took {elapsed:.2f} s; bound 2 x timeout"
    text = failed.errors[1]  # rank 1 receives the broadcast from rank 0
    assert text.startswith("rank 1: rank 0 sent a frame of broadcast #1 of 10 float32"), text
    assert "while this rank is in allreduce_sum #1 of 10 float32" in text, text
    assert set(failed.errors) == {0, 1, 2}, failed


def _one_rank_broadcasts(comm, odd_rank):
    x = np.ones(10, np.float32)
    if comm.rank == odd_rank:
        broadcast(comm, x, root=0)  # a non-root rank receives first: it sends nothing before
    else:
        allreduce(comm, x)


@pytest.mark.timeout(60)
def test_mismatch_news_reaches_every_rank():
    failed, elapsed = run_failing(3, _one_rank_broadcasts, (1,))
    assert elapsed < 2 * TIMEOUT, f"took {elapsed:.2f} s; bound 2 x timeout"
    text = failed.errors[1]
    assert text.startswith("rank 1: rank 0 sent a frame of allreduce_sum #1 of 10 float32"), text
    assert "while this rank is in broadcast #1 of 10 float32" in text, text
    for rank, text in failed.errors.items():
        assert "broadcast #1" in text, f"rank {rank} never heard what differed: {text}"


# --- 5. a wrong job token (and garbage) at rendezvous ----------------------------------------


class Ranks:
    """Run one function per rank in threads of this process; collect results or errors."""

    def __init__(self, fn, per_rank_args: dict[int, tuple]):
        self.results, self.errors = {}, {}
        self.threads = {
            r: threading.Thread(target=self._run, args=(r, fn, args), daemon=True)
            for r, args in per_rank_args.items()
        }

    def _run(self, rank, fn, args):
        try:
            self.results[rank] = fn(*args)
        except BaseException as e:
            self.errors[rank] = e

    def start(self, *ranks):
        for r in ranks or self.threads:
            self.threads[r].start()
        return self

    def join(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        for r, t in self.threads.items():
            t.join(max(0.0, deadline - time.monotonic()))
            assert not t.is_alive(), f"rank {r} is still running after {timeout} s"
        assert not self.errors, f"ranks failed: {self.errors}"
        return self.results


def connect_when_listening(port: int, timeout: float = 2.0) -> socket.socket:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=timeout)
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def dropped(sock: socket.socket) -> bool:
    """Whether the other end closed `sock` (within 2 s) without sending anything."""
    sock.settimeout(2.0)
    try:
        return sock.recv(100) == b""  # FIN
    except ConnectionResetError:  # RST: it closed with our unread bytes still in its buffer
        return True


class ListHandler(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.mark.timeout(60)
def test_wrong_token_is_refused_garbage_dropped_and_the_job_still_forms():
    port, token = free_port(), "the-real-token"
    specs = {r: (JobSpec(r, 2, master_port=port, token=token, timeout=5.0),) for r in (0, 1)}
    ranks = Ranks(init_process_group, specs).start(0)
    logger = logging.getLogger("pipesgd.rendezvous")
    handler, old_level = ListHandler(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    strays = []
    try:
        # A stray with the wrong token, claiming rank 1: refused, with the reason.
        stray = Link(connect_when_listening(port), rank=9, peer=0, timeout=2)
        strays.append(stray.sock)
        start = time.monotonic()
        hello = {"token": "not-the-token", "rank": 1, "world_size": 2, "host": "127.0.0.1",
                 "port": 1, "purpose": "store"}  # fmt: skip
        stray.send_json(Kind.HELLO, hello)
        with pytest.raises(CommError, match="refused") as info:
            stray.recv_json(Kind.CONTROL)
        record("wrong job token refused", time.monotonic() - start)
        assert "wrong job token" in str(info.value), info.value

        # Garbage: an HTTP request that then waits for an answer (fewer bytes than a header),
        # one that half-closes, and one longer than a header (bad magic at once).
        request = b"GET / HTTP/1.0\r\n\r\n"
        waiting = connect_when_listening(port)
        waiting.sendall(request)
        strays.append(waiting)
        for data, half_close in ((request, True), (request * 3, False)):
            sock = connect_when_listening(port)
            strays.append(sock)
            start = time.monotonic()
            sock.sendall(data)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
            assert dropped(sock), f"the store answered {data!r}"
            record(f"garbage of {len(data)} bytes dropped", time.monotonic() - start)

        # The real rank 1 still joins (the HTTP client still waiting does not block anyone).
        start = time.monotonic()
        ranks.start(1)
        comms = ranks.join(timeout=5.0)
        assert time.monotonic() - start < 2.0, "rendezvous was slowed by the stray connections"
        try:
            inputs = {0: np.arange(5, dtype=np.float32), 1: 10 * np.arange(5, dtype=np.float32)}
            summed = Ranks(allreduce, {r: (comms[r], inputs[r]) for r in (0, 1)})
            out = summed.start().join(timeout=5.0)
            for r in (0, 1):
                np.testing.assert_array_equal(out[r], 11 * np.arange(5, dtype=np.float32),
                                              err_msg=f"rank {r}: wrong sum")  # fmt: skip
        finally:
            for comm in comms.values():
                comm.close()
    finally:
        for sock in strays:
            sock.close()
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    logged = "\n".join(handler.messages)
    assert "refused a connection" in logged and "wrong job token" in logged, logged
    assert logged.count("dropped a connection") >= 2, logged
    assert "bad magic" in logged, logged


@pytest.mark.timeout(60)
@pytest.mark.parametrize("transport", ["tcp", "unix"])
def test_idle_strangers_on_every_data_listener_do_not_stop_the_job(monkeypatch, transport):
    """A local process holding idle connections to each data listener (as found with `ss`)
    neither stops the job from forming nor gets an innocent rank blamed: hellos are read
    concurrently, and each stranger is logged as one."""
    from pipesgd_ref.comm import rendezvous, store

    strays, per_listener = [], 3

    def occupied(listener: socket.socket) -> socket.socket:
        for _ in range(per_listener):  # connected before any rank of the job can be
            stray = socket.socket(listener.family, socket.SOCK_STREAM)
            stray.connect(listener.getsockname())
            strays.append(stray)
        return listener

    real_listen, real_listen_unix = rendezvous.listen, rendezvous.listen_unix
    monkeypatch.setattr(rendezvous, "listen", lambda *a: occupied(real_listen(*a)))
    monkeypatch.setattr(store, "listen", lambda *a: occupied(real_listen(*a)))  # the store's
    monkeypatch.setattr(rendezvous, "listen_unix", lambda: occupied(real_listen_unix()))
    logger = logging.getLogger("pipesgd.rendezvous")
    handler = ListHandler()
    logger.addHandler(handler)
    monkeypatch.setattr(logger, "level", logging.WARNING)
    port, world, timeout = free_port(), 3, 5.0  # strangers served one by one: 3 x 5 s > 5 s
    specs = {
        r: (JobSpec(r, world, master_port=port, token="t", timeout=timeout, transport=transport),)
        for r in range(world)
    }
    try:
        start = time.monotonic()
        comms = Ranks(init_process_group, specs).start().join(timeout=4 * timeout)
        elapsed = time.monotonic() - start
        record(f"{transport} job formed beside {len(strays)} idle strangers", elapsed)
        try:
            inputs = {r: np.full(4, r + 1.0) for r in range(world)}
            summed = Ranks(allreduce, {r: (comms[r], inputs[r]) for r in range(world)})
            for r, out in summed.start().join(timeout=2 * timeout).items():
                np.testing.assert_array_equal(out, np.full(4, 6.0), err_msg=f"rank {r}")
        finally:
            for comm in comms.values():
                comm.close()
    finally:
        for stray in strays:
            stray.close()
        logger.removeHandler(handler)
    logged = "\n".join(handler.messages)
    assert elapsed < timeout, f"the job took {elapsed:.1f} s to form (timeout {timeout} s)"
    assert "a stranger (not a rank of this job)" in logged, logged
    assert "rank -1" not in logged and "did not connect" not in logged, logged


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "change, reason",
    [
        ({"port": None}, "listening port None is not a port"),  # a hello without a port
        ({"port": "29500"}, "listening port '29500' is not a port"),
        ({"port": 70000}, "listening port 70000 is not a port"),
        ({"rank": [1]}, "rank [1] is outside"),
        ({"rank": True}, "rank True is outside"),
        ({"world_size": 2.0}, "world size 2.0 != the job's 2"),
        ({"host": ["h"]}, "host ['h'] is not a string"),
        ({"node": "x" * 300}, "node 'xxx"),
        ({"token": None}, "wrong job token"),
    ],
)
def test_the_store_refuses_a_malformed_registration_and_the_job_still_forms(
    monkeypatch, change, reason
):
    """Every field of a registration is checked: a malformed one is refused with the reason (it
    gets no address table), no store thread dies, and the real rank still joins."""
    died = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))
    port, token = free_port(), "the-real-token"
    specs = {r: (JobSpec(r, 2, master_port=port, token=token, timeout=5.0),) for r in (0, 1)}
    ranks = Ranks(init_process_group, specs).start(0)
    stray = Link(connect_when_listening(port), rank=9, peer=0, timeout=5.0)
    hello = {"token": token, "rank": 1, "world_size": 2, "host": "127.0.0.1", "port": 1,
             "unix": "", "node": "n", "purpose": "store"} | change  # fmt: skip
    hello = {k: v for k, v in hello.items() if v is not None}
    try:
        stray.send_json(Kind.HELLO, hello)
        with pytest.raises(CommError, match="refused") as info:
            stray.recv_json(Kind.CONTROL)
        assert reason in str(info.value), info.value
        comms = ranks.start(1).join(timeout=10.0)
        for comm in comms.values():
            comm.close()
    finally:
        stray.close()
    assert died == [], f"a store thread died: {died}"


@pytest.mark.timeout(60)
def test_a_data_listener_refuses_a_hello_with_an_unhashable_rank(monkeypatch):
    """A hello whose rank is a list (token right) is refused; the rank does not crash."""
    from pipesgd_ref.comm import rendezvous

    port, token = free_port(), "t"
    real_listen = rendezvous.listen

    def with_stray(host, port_, what, rank):
        listener = real_listen(host, port_, what, rank)
        if what == "data links" and rank == 0:
            stray = Link(socket.create_connection(listener.getsockname()), 9, 0, 5.0)
            stray.send_json(Kind.HELLO, {"token": token, "rank": [1], "purpose": "ring"})
            strays.append(stray)
        return listener

    strays = []
    monkeypatch.setattr(rendezvous, "listen", with_stray)
    specs = {r: (JobSpec(r, 2, master_port=port, token=token, timeout=5.0),) for r in (0, 1)}
    try:
        comms = Ranks(init_process_group, specs).start().join(timeout=10.0)
        for comm in comms.values():
            comm.close()
        with pytest.raises(CommError, match="refused .* rank \\[1\\]"):
            strays[0].recv_json(Kind.WELCOME)
    finally:
        for stray in strays:
            stray.close()


# --- 6. a busy port --------------------------------------------------------------------------


def _never_runs(comm):
    raise AssertionError("no worker should start when the port is busy")


@pytest.mark.timeout(60)
def test_busy_master_port_is_reported_at_once():
    with socket.create_server(("127.0.0.1", 0)) as busy:  # bound and listening
        port = busy.getsockname()[1]
        start = time.monotonic()
        with pytest.raises(LaunchError, match=f"port {port} on 127.0.0.1 is in use"):
            launch_local(2, _never_runs, start_method="fork", timeout=TIMEOUT, master_port=port)
        record("busy port, launch_local", time.monotonic() - start)
        assert mp.active_children() == [], "workers were started on a busy port"
        start = time.monotonic()
        with pytest.raises(RendezvousError, match=f"127.0.0.1:{port}: the port is in use"):
            init_process_group(JobSpec(0, 2, master_port=port, token="t", timeout=TIMEOUT))
        elapsed = time.monotonic() - start
        record("busy port, init_process_group", elapsed)
        assert elapsed < 1.0, f"took {elapsed:.2f} s: a busy port needs no timeout"


# --- 7. a rank that never shows up -----------------------------------------------------------


@pytest.fixture(scope="module")
def missing_rank_1():
    """A 2-rank job where only rank 0 comes, timeout 1 s."""
    start = time.monotonic()
    with pytest.raises(RendezvousError) as info:
        init_process_group(JobSpec(0, 2, master_port=free_port(), token="t", timeout=1.0))
    elapsed = time.monotonic() - start
    record("missing rank 1, seen by rank 0 (timeout 1.0 s)", elapsed)
    return str(info.value), elapsed


@pytest.mark.timeout(60)
def test_missing_rank_fails_the_rendezvous_in_time(missing_rank_1):
    text, elapsed = missing_rank_1
    assert 1.0 <= elapsed < 2.0, f"timeout 1 s, failed after {elapsed:.2f} s"
    assert "raise --timeout" in text, text


@pytest.mark.timeout(60)
def test_missing_rank_is_named(missing_rank_1):
    text, _ = missing_rank_1
    assert re.search(r"\brank\(?s?\)? \[?1\b", text) and "is rank 0 alive" not in text, text


@pytest.mark.timeout(60)
def test_missing_rank_0_is_named_by_the_others():
    port = free_port()
    start = time.monotonic()
    with pytest.raises(RendezvousError) as info:
        init_process_group(JobSpec(1, 2, master_port=port, token="t", timeout=1.0))
    elapsed = time.monotonic() - start
    record("missing rank 0, seen by rank 1 (timeout 1.0 s)", elapsed)
    assert 1.0 <= elapsed < 2.0, f"timeout 1 s, failed after {elapsed:.2f} s"
    text = str(info.value)
    assert f"rank 1: could not reach the rendezvous store (rank 0) at 127.0.0.1:{port}" in text


# --- 8. detect_env ---------------------------------------------------------------------------

ADDR = {"MASTER_ADDR": "10.0.0.7", "MASTER_PORT": "23456"}
OMPI = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}
OMPI_UNDER_SLURM = OMPI | {"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}  # mpirun inside srun


@pytest.mark.parametrize(
    "env, rank, size, source",
    [
        ({"RANK": "1", "WORLD_SIZE": "4"}, 1, 4, "torchrun"),
        ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "3"}, 2, 3, "Open MPI"),
        ({"PMI_RANK": "0", "PMI_SIZE": "2"}, 0, 2, "MPICH/Hydra"),
        ({"SLURM_PROCID": "7", "SLURM_NTASKS": "8"}, 7, 8, "SLURM"),
        # Several launchers' variables: the first convention in ENV_CONVENTIONS wins.
        ({"RANK": "0", "WORLD_SIZE": "1", "PMI_RANK": "3", "PMI_SIZE": "4"}, 0, 1, "torchrun"),
        (OMPI_UNDER_SLURM, 1, 2, "Open MPI"),
    ],
)
def test_detect_env_reads_each_launcher(env, rank, size, source):
    job = detect_env(env | ADDR)
    assert job == JobEnv(rank, size, "10.0.0.7", 23456, _default_token("10.0.0.7", 23456), source)


def test_detect_env_nothing_and_no_default_address():
    assert detect_env({}) is None
    assert detect_env({"MASTER_ADDR": "10.0.0.7", "PATH": "/bin"}) is None
    # A rank without the store's address is an error, never 127.0.0.1:29500 silently (more
    # cases: tests/test_launch_env.py).
    with pytest.raises(LaunchError, match="MASTER_ADDR and MASTER_PORT expected, but not set"):
        detect_env({"RANK": "0", "WORLD_SIZE": "1"})


@pytest.mark.parametrize(
    "env, message",
    [
        ({"RANK": "0"}, "torchrun job: WORLD_SIZE is not set"),
        ({"WORLD_SIZE": "2"}, "torchrun job: RANK is not set"),
        ({"OMPI_COMM_WORLD_SIZE": "2"}, "Open MPI job: OMPI_COMM_WORLD_RANK is not set"),
        ({"PMI_RANK": "1"}, "MPICH/Hydra job: PMI_SIZE is not set"),
        ({"SLURM_PROCID": "1"}, "SLURM job: SLURM_NTASKS is not set"),
        ({"RANK": "one", "WORLD_SIZE": "2"}, "RANK='one' and WORLD_SIZE='2' must be integers"),
        ({"PMI_RANK": "0", "PMI_SIZE": "2.0"}, "must be integers"),
        ({"RANK": "", "WORLD_SIZE": "2"}, "must be integers"),
        ({"RANK": "4", "WORLD_SIZE": "4"}, "rank 4 is outside 0..3"),
        ({"RANK": "-1", "WORLD_SIZE": "4"}, "rank -1 is outside 0..3"),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "0"}, "SLURM job: SLURM_NTASKS=0, but the world"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "http"}, "MASTER_PORT='http' is not"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": ""}, "MASTER_PORT='' is not a port"),
    ],
)
def test_detect_env_refuses_inconsistent_environments(env, message):
    with pytest.raises(LaunchError, match=re.escape(message)):
        detect_env(env)


@pytest.mark.parametrize("port", ["70000", "-1"])
def test_detect_env_refuses_a_port_out_of_range(port):
    with pytest.raises(LaunchError, match="MASTER_PORT"):
        detect_env({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": port})


def test_detect_env_job_token():
    env = {"RANK": "0", "WORLD_SIZE": "2"} | ADDR
    assert detect_env(env | {"PIPESGD_JOB_TOKEN": "s3cret"}).token == "s3cret"
    default = detect_env(env).token
    assert detect_env(env | {"PIPESGD_JOB_TOKEN": ""}).token == default  # empty: not set
    # Every rank derives the same default from the store's address...
    assert detect_env({"PMI_RANK": "1", "PMI_SIZE": "2"} | ADDR).token == default
    assert re.fullmatch(r"[0-9a-f]{32}", default), default
    # ...and another address or port is another job.
    assert detect_env(env | {"MASTER_PORT": "23457"}).token != default
    assert detect_env(env | {"MASTER_ADDR": "10.0.0.8"}).token != default


@pytest.mark.parametrize(
    "env, ranks, mine",
    [
        ({}, None, 5),  # no launcher says: local workers, the global rank
        ({"LOCAL_WORLD_SIZE": "4", "LOCAL_RANK": "1"}, 4, 1),  # torchrun
        ({"OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}, 2, 0),
        ({"MPI_LOCALNRANKS": "8", "MPI_LOCALRANKID": "7"}, 8, 7),  # MPICH/Hydra
        ({"SLURM_NTASKS_PER_NODE": "2(x3)", "SLURM_LOCALID": "1"}, 2, 1),  # SLURM's "2(x3)"
        ({"LOCAL_WORLD_SIZE": "0", "LOCAL_RANK": "-1"}, None, 5),  # nonsense: not believed
    ],
)
def test_local_ranks_and_local_rank_read_each_launcher(env, ranks, mine):
    from pipesgd_ref.runtime.jobenv import local_rank, local_ranks

    assert local_ranks(env) == ranks
    assert local_rank(5, env) == mine


def test_news_that_blames_the_rank_reading_it_says_so():
    """A worker that could not read the server's frame tells the server, naming rank 0: the
    server's own error then says a peer blames it, not that "rank 0 failed"."""
    from pipesgd_ref.comm.wire import News

    news = News(0, "rank 1: bad frame from rank 0 during ps-sync step 5")
    text = news.cannot_finish(0, "ps-sync step 6", "news from rank 1")
    assert text == (
        "rank 0: news from rank 1 blames this rank, so ps-sync step 6 cannot finish: "
        "rank 1: bad frame from rank 0 during ps-sync step 5"
    )
    other = news.cannot_finish(2, "ps-sync step 6", "news from rank 0")
    assert other.startswith("rank 2: rank 0 failed, so ps-sync step 6 cannot finish")
