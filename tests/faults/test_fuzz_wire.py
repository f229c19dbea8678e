"""Fuzzing what listens on the network: the rendezvous store of a forming job.

tests/test_transport.py fuzzes the frame parser and a Link's receive path (every random header
or byte stream ends in a valid frame or a ProtocolError / PeerClosed / PeerTimeout, never a
hang, a large allocation or an unpickle). Here hypothesis aims random connections at the one
port a job exposes to anyone who can reach it, the rendezvous store, while a real job is
forming: HELLO frames with random JSON and tokens, headers with random fields and lengths,
truncated frames and plain garbage. Each connection must be refused (a REFUSE frame) or
dropped within the hello timeout, never let in; the store must allocate no more than a control
message's limit; and afterwards the real job forms and computes correct sums.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipesgd_ref.comm.collectives import allreduce
from pipesgd_ref.comm.rendezvous import HELLO_TIMEOUT, JobSpec, init_process_group, new_token
from pipesgd_ref.comm.wire import HEADER, MAGIC, VERSION, Frame, Kind, decode_header
from pipesgd_ref.runtime.launch import free_port

CONTROL_LIMIT = 1 << 20  # Link.recv_json refuses larger control messages before reading them


def _connect(port: int, deadline_s: float = 10.0) -> socket.socket:
    end = time.monotonic() + deadline_s
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=1.0)
        except ConnectionRefusedError:
            if time.monotonic() > end:
                raise
            time.sleep(0.02)


@pytest.fixture(scope="module")
def forming_job():
    """Rank 0 of a 2-rank job, waiting in rendezvous (its store listening) for rank 1."""
    port, token = free_port(), new_token()
    done: dict = {}

    def rank(r: int) -> None:
        try:
            done[r] = init_process_group(JobSpec(r, 2, master_port=port, token=token,
                                                 timeout=120.0))  # fmt: skip
        except Exception as e:  # reported by the test that joins
            done[r] = e

    thread = threading.Thread(target=rank, args=(0,), daemon=True)
    thread.start()
    _connect(port).close()  # the store is up (an empty connection is simply dropped)
    yield {"port": port, "token": token, "done": done, "threads": [thread], "rank": rank}
    for comm in done.values():
        if hasattr(comm, "close"):
            comm.close()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),  # fmt: skip
    max_leaves=8,
)


@st.composite
def hellos(draw) -> bytes:
    """A HELLO frame whose JSON is plausible but not the job's: random token and fields."""
    body = {
        "token": draw(st.text(max_size=40)),
        "rank": draw(json_values),
        "world_size": draw(st.sampled_from([2, 3, "2", None])),
        "host": draw(json_values),
        "port": draw(json_values),
        "purpose": draw(st.sampled_from(["store", "ring", 7])),
    }
    payload = json.dumps(body).encode()
    return Frame(kind=Kind.HELLO, nbytes=len(payload)).pack() + payload


@st.composite
def headers(draw) -> bytes:
    """A header with the right magic and version and random everything else (lengths up to
    2^64: an announced size must never be allocated)."""
    fields = draw(st.tuples(*(st.integers(0, 255) for _ in range(3))))
    return HEADER.pack(
        MAGIC, VERSION, *fields, draw(st.integers(0, 2**64 - 1)), draw(st.integers(0, 2**16 - 1)),
        draw(st.integers(0, 2**16 - 1)), draw(st.integers(0, 2**32 - 1)),
        draw(st.integers(0, 2**64 - 1)), draw(st.integers(0, 2**64 - 1)),
        draw(st.floats(allow_nan=True)),
    ) + draw(st.binary(max_size=64))  # fmt: skip


streams = st.one_of(
    hellos(),
    headers(),
    st.binary(min_size=1, max_size=200),
    hellos().flatmap(lambda b: st.integers(1, len(b) - 1).map(lambda cut: b[:cut])),  # truncated
)


def _answer(sock: socket.socket) -> str:
    """'refused' (a REFUSE frame), 'dropped' (closed without one), or 'let in'."""
    sock.settimeout(HELLO_TIMEOUT + 2.0)
    data = b""
    try:
        while len(data) < HEADER.size:
            chunk = sock.recv(HEADER.size - len(data))
            if not chunk:
                break
            data += chunk
    except ConnectionResetError:
        return "dropped"
    if len(data) < HEADER.size:
        return "dropped"
    return "refused" if decode_header(data).kind == Kind.REFUSE else "let in"


@pytest.mark.slow
@pytest.mark.timeout(300)
@settings(max_examples=50)
@given(stream=streams, half_close=st.sampled_from([True, True, True, False]))
def test_random_connections_to_the_store_are_refused_or_dropped(forming_job, stream, half_close):
    sock = _connect(forming_job["port"])
    start = time.monotonic()
    try:
        try:
            sock.sendall(stream)
            if half_close:  # nothing more will come (else an unfinished hello waits HELLO_TIMEOUT)
                sock.shutdown(socket.SHUT_WR)
        except OSError:  # the store already hung up on what it read (reset, not connected)
            verdict = "dropped"
        else:
            verdict = _answer(sock)
    finally:
        sock.close()
    assert verdict in ("refused", "dropped"), f"{stream[:80]!r} was let into the job"
    assert time.monotonic() - start < HELLO_TIMEOUT + 2.0
    assert 0 not in forming_job["done"], "rank 0 stopped waiting for its real peer"


@pytest.mark.timeout(60)
def test_announced_lengths_are_never_allocated(forming_job):
    """Headers announcing up to 2^63 bytes: the store allocates no more than a control
    message's limit while refusing them (tracemalloc follows every thread of this process).
    One refusal first, untraced: what the first connection of the process costs once (lazy
    imports, the store's first buffers: about 2 MB, measured when no other test ran before)
    is not a cost of the huge lengths."""

    def refuse(nbytes: int) -> None:
        sock = _connect(forming_job["port"])
        sock.sendall(Frame(kind=Kind.HELLO, nbytes=nbytes).pack() + b"{" * 100)
        assert _answer(sock) in ("refused", "dropped")
        sock.close()

    refuse(CONTROL_LIMIT + 1)
    tracemalloc.start()
    try:
        for nbytes in (CONTROL_LIMIT + 1, 1 << 31, 1 << 40, 1 << 63):
            refuse(nbytes)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < CONTROL_LIMIT, f"{peak} bytes allocated while refusing huge frames"


@pytest.mark.timeout(60)
def test_the_real_job_still_forms_and_sums(forming_job):
    join = threading.Thread(target=forming_job["rank"], args=(1,), daemon=True)
    join.start()
    join.join(timeout=30)
    forming_job["threads"][0].join(timeout=30)
    comms = forming_job["done"]
    for r in (0, 1):
        assert not isinstance(comms.get(r), Exception), comms.get(r)
    out = {}

    def reduce(r: int) -> None:
        out[r] = allreduce(comms[r], np.full(7, r + 1.0, np.float32))

    threads = [threading.Thread(target=reduce, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    for r in (0, 1):
        np.testing.assert_array_equal(out[r], np.full(7, 3.0, np.float32))
