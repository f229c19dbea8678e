"""Duplex: one thread sends to the right and receives from the left (comm/duplex.py).

One process plays rank 1 of a ring with real loopback TCP links: the test holds the far ends,
writing what rank 0 would send and reading what rank 2 would get, from helper threads. Every
wait is bounded: a test that would hang fails on its timeout instead.
"""

import dataclasses
import threading
import time

import numpy as np
import pytest
from test_transport import raw_header, tcp_pair

from pipesgd_ref.comm.duplex import Duplex
from pipesgd_ref.comm.netem import LinkModel
from pipesgd_ref.comm.transport import (
    HEADER,
    CollectiveMismatch,
    Frame,
    Kind,
    Link,
    Op,
    PeerAborted,
    PeerClosed,
    PeerTimeout,
    ProtocolError,
    as_bytes,
)

pytestmark = pytest.mark.timeout(60)

TIMEOUT = 1.0
DATA = Frame(kind=Kind.DATA, op=Op.ALLREDUCE_SUM, dtype=1, seq=7, total_len=1 << 22)


def at(step: int, part: int = 0, **more) -> Frame:
    return dataclasses.replace(DATA, step=step, part=part, **more)


@pytest.fixture
def ring(request):
    """(duplex of rank 1, rank 0's sending Link to it, rank 2's receiving Link from it)."""
    model = getattr(request, "param", None) or LinkModel()
    a0, a1 = tcp_pair()  # rank 0 -> rank 1
    b1, b2 = tcp_pair()  # rank 1 -> rank 2
    left = Link(a1, rank=1, peer=0, timeout=TIMEOUT, model=model)
    right = Link(b1, rank=1, peer=2, timeout=TIMEOUT, model=model)
    rank0 = Link(a0, rank=0, peer=1, timeout=5.0, model=model)
    rank2 = Link(b2, rank=2, peer=1, timeout=5.0, model=model)
    yield Duplex(left, right), rank0, rank2
    for link in (left, right, rank0, rank2):
        link.close()


def in_thread(fn, *args) -> threading.Thread:
    t = threading.Thread(target=fn, args=args, daemon=True)
    t.start()
    return t


def receive_all(link: Link, sizes: list[int], into: list) -> None:
    """Rank 2: read DATA frames of these payload sizes, skipping heartbeats."""
    for size in sizes:
        got = link.recv_header("test")
        while got.kind == Kind.HEARTBEAT:
            got = link.recv_header("test")
        buf = np.empty(size, np.uint8)
        link.recv_payload_into(got, memoryview(buf), "test")
        into.append((got, buf))


def test_frames_flow_both_ways_larger_than_the_socket_buffers(ring):
    duplex, rank0, rank2 = ring
    n = 3 << 20  # 12 MB of float32 each way: far more than a socket buffer holds
    outgoing = [np.arange(n, dtype=np.float32) + k for k in range(2)]
    incoming = [np.full(n, k + 0.5, np.float32) for k in range(2)]
    landed = [np.zeros(n, np.float32) for _ in range(2)]
    order = []
    for k in range(2):
        duplex.send(at(k), as_bytes(outgoing[k]), "test send")
        duplex.expect(at(k), as_bytes(landed[k]), "test recv", lambda k=k: order.append(k))
    got = []
    reader = in_thread(receive_all, rank2, [n * 4, n * 4], got)
    writer = in_thread(lambda: [rank0.send(at(k), as_bytes(incoming[k])) for k in range(2)])
    duplex.run()
    reader.join(10)
    writer.join(10)
    assert order == [0, 1]
    for k in range(2):
        assert np.array_equal(landed[k], incoming[k])
        frame, buf = got[k]
        assert (frame.step, frame.seq, frame.nbytes) == (k, 7, n * 4)
        assert np.array_equal(buf.view(np.float32), outgoing[k])
    assert duplex.right.bytes_sent == 2 * (HEADER.size + n * 4)
    assert duplex.left.bytes_received == 2 * (HEADER.size + n * 4)
    assert not duplex.right.half_sent


def test_each_frame_is_handled_before_the_next_is_read(ring):
    """Every expected frame may land in the same buffer: its `then` sees its own bytes."""
    duplex, rank0, _ = ring
    scratch = np.zeros(1000, np.float32)
    seen = []
    for k in range(5):
        duplex.expect(at(k), as_bytes(scratch), "test", lambda: seen.append(scratch[0]))
    for k in range(5):  # all five are in the socket before the duplex reads any
        rank0.send(at(k), as_bytes(np.full(1000, k, np.float32)))
    duplex.run()
    assert seen == [0, 1, 2, 3, 4]


def test_heartbeats_from_the_left_are_skipped(ring):
    duplex, rank0, _ = ring
    out = np.zeros(4, np.float32)
    duplex.expect(at(0), as_bytes(out), "test")
    rank0.send(Frame(kind=Kind.HEARTBEAT))
    rank0.send(Frame(kind=Kind.HEARTBEAT))
    rank0.send(at(0), as_bytes(np.ones(4, np.float32)))
    duplex.run()
    assert out.tolist() == [1, 1, 1, 1]


def test_a_silent_left_times_out_naming_it_while_the_right_hears_heartbeats(ring):
    duplex, _, rank2 = ring
    duplex.expect(at(0), as_bytes(np.zeros(4, np.float32)), "allreduce #7 step 0")
    start = time.monotonic()
    with pytest.raises(PeerTimeout) as caught:
        duplex.run()
    waited = time.monotonic() - start
    assert TIMEOUT <= waited < TIMEOUT + 1.0
    text = str(caught.value)
    assert text.startswith("rank 1: no data from rank 0 for 1.0 s during allreduce #7 step 0")
    assert "is rank 0 alive" in text and caught.value.origin == 0
    beats = rank2.recv_header("test")  # sent while waiting: only rank 1 itself times out
    assert beats.kind == Kind.HEARTBEAT


def test_a_right_that_reads_nothing_times_out_naming_it(ring):
    duplex, _, _ = ring
    big = np.zeros(16 << 20, np.uint8)  # more than both socket buffers take
    duplex.send(at(0), as_bytes(big), "allreduce #7 reduce-scatter")
    with pytest.raises(PeerTimeout) as caught:
        duplex.run()
    text = str(caught.value)
    assert "rank 1: rank 2 accepted no data for 1.0 s during allreduce #7" in text
    assert caught.value.origin == 2
    assert duplex.right.half_sent  # a half frame: Communicator.abort must not add another


def test_abort_news_from_the_left_names_the_rank_at_fault(ring):
    duplex, rank0, _ = ring
    duplex.expect(at(0), as_bytes(np.zeros(4, np.float32)), "allreduce #7 step 0")
    rank0.send_json(Kind.ABORT, {"origin": 3, "reason": "rank 3 ran out of memory"}, "test")
    with pytest.raises(PeerAborted) as caught:
        duplex.run()
    assert caught.value.origin == 3
    assert "rank 3 failed, so allreduce #7 step 0 cannot finish" in str(caught.value)
    assert "ran out of memory" in str(caught.value)


def test_garbage_is_a_protocol_error_naming_the_sender(ring):
    duplex, rank0, _ = ring
    duplex.expect(at(0), as_bytes(np.zeros(4, np.float32)), "test")
    rank0.sock.sendall(b"GET / HTTP/1.1\r\n" * 3)
    with pytest.raises(ProtocolError, match="bad frame from rank 0") as caught:
        duplex.run()
    assert caught.value.origin == 0


@pytest.mark.parametrize(
    "sent, words",
    [
        (at(1), "(step 1, segment 0) while this rank is in allreduce_sum #7"),
        (at(0, seq=8), "allreduce_sum #8 of 4194304 float32"),
        (at(0, dtype=2), "float64"),
    ],
)
def test_a_frame_of_another_collective_is_a_mismatch(ring, sent, words):
    duplex, rank0, _ = ring
    duplex.expect(at(0), as_bytes(np.zeros(4, np.float32)), "test")
    rank0.send(sent, as_bytes(np.zeros(4, np.float32)))
    with pytest.raises(CollectiveMismatch, match="same order, with the same dtype") as caught:
        duplex.run()
    assert words in str(caught.value)


def test_a_wrong_length_is_a_mismatch(ring):
    duplex, rank0, _ = ring
    duplex.expect(at(0), as_bytes(np.zeros(4, np.float32)), "test")
    rank0.sock.sendall(raw_header(seq=7, total_len=1 << 22, nbytes=8) + bytes(8))
    with pytest.raises(CollectiveMismatch, match="sent 8 bytes during test, this rank expected 16"):
        duplex.run()


def test_a_closed_left_is_named(ring):
    duplex, rank0, _ = ring
    duplex.expect(at(0), as_bytes(np.zeros(1000, np.float32)), "test")
    rank0.sock.sendall(raw_header(seq=7, total_len=1 << 22, nbytes=4000) + bytes(100))
    rank0.sock.close()
    with pytest.raises(PeerClosed, match="rank 0 closed the connection during test") as caught:
        duplex.run()
    assert "after 100 of 4000 bytes" in str(caught.value)


@pytest.mark.parametrize("ring", [LinkModel(latency=0.05, bandwidth=40e6)], indirect=True)
def test_emulated_link_paces_sends_and_delays_arrivals(ring):
    """Three 400 kB frames on a 40 MB/s, 50 ms link: they leave 10 ms apart (b / B) and each
    counts as arrived alpha after its last byte, however fast loopback moved it."""
    duplex, rank0, rank2 = ring
    size = 400_000
    got = []
    reader = in_thread(receive_all, rank2, [size] * 3, got)
    start = time.monotonic()
    for k in range(3):
        duplex.send(at(k), as_bytes(np.zeros(size, np.uint8)), "test")
    arrived = []
    duplex.expect(at(0), as_bytes(np.zeros(4, np.float32)), "test",
                  lambda: arrived.append(time.monotonic()))  # fmt: skip
    rank0.send(at(0), as_bytes(np.zeros(4, np.float32)))  # rank 0's emulator stamps it
    duplex.run()
    reader.join(10)
    delivers = [frame.deliver_at for frame, _ in got]
    wire = (HEADER.size + size) / 40e6
    assert delivers[0] == pytest.approx(start + wire + 0.05, abs=0.01)
    gaps = np.diff(delivers)
    assert gaps.tolist() == pytest.approx([wire] * 2, abs=1e-9)
    assert arrived[0] - start >= 0.05  # the 16-byte frame took its latency
