"""The frame parser and Link: what a peer can send us, and what we make of it.

No processes here: a Link is tested over a real loopback TCP connection made in this process
(`tcp_pair`). Every receive has a short timeout, so a test that would hang fails instead.

Why not `socket.socketpair()`: on Linux it gives AF_UNIX sockets, and `Link.__init__` sets
TCP_NODELAY, which an AF_UNIX socket refuses (OSError: Operation not supported). Links are TCP
by contract, so the tests use TCP too.
"""

import ast
import inspect
import math
import socket
import time
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipesgd_ref.comm import links as link_module
from pipesgd_ref.comm import sender, wire
from pipesgd_ref.comm.activity import doing
from pipesgd_ref.comm.links import Link
from pipesgd_ref.comm.wire import (
    DEFAULT_MAX_FRAME_BYTES,
    DTYPE_CODES,
    HEADER,
    MAGIC,
    VERSION,
    Frame,
    Kind,
    Op,
    as_bytes,
    decode_header,
)
from pipesgd_ref.errors import CollectiveMismatch, CommError, PeerClosed, PeerTimeout, ProtocolError

U16, U32, U64 = 2**16 - 1, 2**32 - 1, 2**64 - 1

pytestmark = pytest.mark.timeout(60)  # a socket test that would hang fails instead

# --- helpers ---------------------------------------------------------------------------------


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    """Two connected loopback TCP sockets (what the ring's links are made of)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        a = socket.create_connection(server.getsockname(), timeout=2)
        b, _ = server.accept()
    return a, b


@pytest.fixture
def links():
    """(sending Link of rank 0 -> rank 1, receiving Link of rank 1 <- rank 0), 2 s timeouts."""
    a, b = tcp_pair()
    tx, rx = Link(a, rank=0, peer=1, timeout=2), Link(b, rank=1, peer=0, timeout=2)
    yield tx, rx
    tx.close()
    rx.close()


def raw_header(**fields) -> bytes:
    """48 header bytes with any field set to anything, valid or not (for the error cases)."""
    values = dict(magic=MAGIC, version=VERSION, kind=Kind.DATA, op=Op.ALLREDUCE_SUM, dtype=1,
                  seq=1, step=0, part=0, src=0, total_len=10, nbytes=40,
                  deliver_at=0.0)  # fmt: skip
    values.update(fields)  # field order: the header layout, see wire.HEADER
    return HEADER.pack(*values.values())


def pending_bytes(sock: socket.socket) -> bytes:
    """What is waiting unread in `sock`'s receive buffer (peeked: left there)."""
    time.sleep(0.05)  # loopback delivery is immediate, but let the kernel settle
    try:
        return sock.recv(1 << 16, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except BlockingIOError:
        return b""


# --- frames: pack and decode -----------------------------------------------------------------


@st.composite
def valid_frames(draw) -> Frame:
    """Any frame decode_header must accept: every field anywhere in its valid range."""
    dtype = draw(st.sampled_from(sorted(DTYPE_CODES)))
    itemsize = DTYPE_CODES[dtype].itemsize
    return Frame(
        kind=draw(st.sampled_from(list(Kind))),
        op=draw(st.sampled_from(list(Op))),
        dtype=dtype,
        seq=draw(st.integers(0, U64)),
        step=draw(st.integers(0, U16)),
        part=draw(st.integers(0, U16)),
        src=draw(st.integers(0, U32)),
        total_len=draw(st.integers(0, U64)),
        nbytes=itemsize * draw(st.integers(0, DEFAULT_MAX_FRAME_BYTES // itemsize)),
        deliver_at=draw(st.floats(min_value=0.0, allow_nan=False, allow_infinity=False)),
    )


@given(valid_frames())
def test_pack_then_decode_is_the_identity(frame):
    data = frame.pack()
    assert len(data) == HEADER.size == 48
    assert decode_header(data) == frame, f"{frame} did not survive pack/decode"


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(magic=b"GET "), "bad magic"),
        (dict(version=VERSION + 1), "protocol version"),
        (dict(version=0), "protocol version"),
        (dict(kind=0), "unknown frame kind 0"),
        (dict(kind=max(Kind) + 1), "unknown frame kind"),
        (dict(op=max(Op) + 1), "unknown op"),
        (dict(dtype=max(DTYPE_CODES) + 1), "unknown dtype code"),
        (dict(dtype=255), "unknown dtype code 255"),
        (dict(nbytes=DEFAULT_MAX_FRAME_BYTES + 4), "exceeds the maximum"),
        (dict(nbytes=U64 - 3), "exceeds the maximum"),
        (dict(dtype=1, nbytes=6), "not a whole number of float32"),  # 6 bytes: 1.5 float32
        (dict(dtype=2, nbytes=12), "not a whole number of float64"),
        (dict(deliver_at=math.nan), "bad deliver_at"),
        (dict(deliver_at=-1.0), "bad deliver_at"),
    ],
)
def test_decode_header_names_what_is_wrong(fields, message):
    with pytest.raises(ProtocolError, match=message):
        decode_header(raw_header(**fields))


def test_decode_header_max_frame_bytes_is_inclusive_and_configurable():
    assert decode_header(raw_header(nbytes=DEFAULT_MAX_FRAME_BYTES)).nbytes == 1 << 31
    assert decode_header(raw_header(nbytes=64), max_frame_bytes=64).nbytes == 64
    with pytest.raises(ProtocolError, match="68 bytes exceeds the maximum of 64"):
        decode_header(raw_header(nbytes=68), max_frame_bytes=64)


@pytest.mark.parametrize("length", [0, 1, 47, 49, 96])
def test_decode_header_refuses_a_header_of_the_wrong_length(length):
    with pytest.raises(ProtocolError, match=f"truncated header: {length} of 48 bytes"):
        decode_header((raw_header() * 2)[:length])


def assert_in_range(frame: Frame) -> None:
    assert frame.kind in Kind._value2member_map_, frame
    assert frame.op in Op._value2member_map_, frame
    assert frame.dtype in DTYPE_CODES, frame
    assert 0 <= frame.seq <= U64 and 0 <= frame.total_len <= U64, frame
    assert 0 <= frame.step <= U16 and 0 <= frame.part <= U16 and 0 <= frame.src <= U32, frame
    assert 0 <= frame.nbytes <= DEFAULT_MAX_FRAME_BYTES, frame
    assert frame.nbytes % DTYPE_CODES[frame.dtype].itemsize == 0, frame
    assert frame.deliver_at >= 0, frame  # also false for NaN


# Random bytes almost never start with b"PSGD"; also fuzz behind a right magic (and version),
# so the checks after the magic see random values too.
header_like_bytes = st.one_of(
    st.binary(min_size=48, max_size=48),
    st.binary(min_size=44, max_size=44).map(lambda b: MAGIC + b),
    st.binary(min_size=43, max_size=43).map(lambda b: MAGIC + bytes([VERSION]) + b),
    st.binary(max_size=100),
)


@settings(max_examples=500)
@given(header_like_bytes)
def test_decode_header_fuzz_returns_a_valid_frame_or_raises_protocol_error(data):
    try:
        frame = decode_header(data)
    except ProtocolError:
        return
    assert_in_range(frame)


# --- Link over a real TCP connection ---------------------------------------------------------


def test_send_then_receive_into_a_preallocated_buffer_without_copy(links):
    tx, rx = links
    sent = np.arange(1000, dtype=np.float32) * 0.5
    tx.send(Frame(Kind.DATA, Op.ALLREDUCE_SUM, 1, seq=7, step=3, part=2, src=0, total_len=1000),
            as_bytes(sent))  # fmt: skip
    frame = rx.recv_header()
    assert (frame.kind, frame.op, frame.seq, frame.step, frame.part, frame.total_len) == (
        Kind.DATA, Op.ALLREDUCE_SUM, 7, 3, 2, 1000,
    )  # fmt: skip
    assert frame.nbytes == sent.nbytes and frame.deliver_at == 0.0  # send() fills nbytes in
    # Receive into the middle of a bigger buffer: the bytes must land exactly there.
    big = np.full(1200, -1.0, np.float32)
    view = as_bytes(big[100:1100])
    assert np.shares_memory(np.asarray(view), big), "as_bytes copied the slice"
    rx.recv_payload_into(frame, view)
    np.testing.assert_array_equal(big[100:1100], sent, err_msg="payload bytes differ")
    assert (big[:100] == -1).all() and (big[1100:] == -1).all(), "wrote outside the slice"
    assert tx.bytes_sent == rx.bytes_received == 48 + sent.nbytes


def test_empty_payload_frame(links):
    tx, rx = links
    tx.send(Frame(Kind.DATA, Op.BARRIER, 1, seq=1))
    frame = rx.recv_header()
    assert frame.nbytes == 0
    rx.recv_payload_into(frame, as_bytes(np.empty(0, np.float32)))


def test_payload_of_another_length_is_a_collective_mismatch(links):
    tx, rx = links
    tx.send(Frame(Kind.DATA, Op.ALLREDUCE_SUM, 1, seq=1), as_bytes(np.ones(11, np.float32)))
    frame = rx.recv_header()
    with pytest.raises(CollectiveMismatch, match="rank 0 sent 44 bytes .* expected 40"):
        rx.recv_payload_into(frame, as_bytes(np.empty(10, np.float32)))
    assert len(pending_bytes(rx.sock)) == 44, "the payload was read before the length check"


def test_peer_closed_mid_payload_says_how_far_it_got(links):
    tx, rx = links
    tx.sock.sendall(Frame(Kind.DATA, Op.ALLREDUCE_SUM, 1, seq=1, nbytes=400).pack() + b"\0" * 100)
    tx.close()
    frame = rx.recv_header()
    start = time.monotonic()
    with pytest.raises(PeerClosed, match="after 100 of 400 bytes") as info:
        rx.recv_payload_into(frame, as_bytes(np.empty(100, np.float32)))
    assert time.monotonic() - start < 1.0, "a closed peer must be noticed at once"
    assert info.value.origin == 0 and "rank 1: rank 0 closed the connection" in str(info.value)


def test_peer_closed_mid_header(links):
    tx, rx = links
    tx.sock.sendall(raw_header()[:20])
    tx.close()
    with pytest.raises(PeerClosed, match="after 20 of 48 bytes"):
        rx.recv_header()


def test_silent_peer_times_out_with_an_actionable_message():
    a, b = tcp_pair()
    rx = Link(b, rank=3, peer=5, timeout=0.5)
    start = time.monotonic()
    try:
        with pytest.raises(PeerTimeout) as info, doing("allreduce #1 step 0"):
            rx.recv_header()
    finally:
        elapsed = time.monotonic() - start
        a.close()
        rx.close()
    assert 0.5 <= elapsed < 0.5 + 1.0, f"timeout 0.5 s, gave up after {elapsed:.2f} s"
    text = str(info.value)
    assert text.startswith("rank 3: no data from rank 5 for 0.5 s during allreduce #1 step 0")
    assert "raise --timeout" in text and info.value.origin == 5, text


def test_progress_resets_the_timeout(links):
    """The timeout bounds silence, not the whole transfer: a slow but steady peer is fine."""
    tx, rx = links
    rx.timeout = 0.5
    data = Frame(Kind.DATA, Op.ALLREDUCE_SUM, 0, nbytes=6).pack() + b"abcdef"
    start = time.monotonic()
    for i in range(0, len(data), 6):  # 9 pieces, 0.1 s apart: 0.9 s > the 0.5 s timeout
        tx.sock.sendall(data[i : i + 6])
        time.sleep(0.1)
    frame = rx.recv_header()
    out = bytearray(6)
    rx.recv_payload_into(frame, memoryview(out))
    assert out == b"abcdef" and time.monotonic() - start > 0.5


def test_a_waiting_receive_stops_when_this_rank_fails_elsewhere(links):
    """`stop` (the sending thread's check) is polled while waiting: no full timeout to wait."""
    _, rx = links
    rx.timeout = 10.0

    def stop():
        raise CommError("the sending thread failed")

    start = time.monotonic()
    with pytest.raises(CommError, match="the sending thread failed"):
        rx.recv_header(stop=stop)
    assert time.monotonic() - start < 1.0, "stop() was not polled while waiting"


def test_oversized_frame_is_refused_before_reading_or_allocating():
    a, b = tcp_pair()
    rx = Link(b, rank=1, peer=0, timeout=2, max_frame_bytes=1 << 20)
    try:
        huge = 1 << 40  # 1 TiB announced; 16 bytes actually follow
        a.sendall(raw_header(nbytes=huge) + b"payload-payload!")
        time.sleep(0.05)
        tracemalloc.start()
        try:
            start = time.monotonic()
            with pytest.raises(ProtocolError, match="exceeds the maximum of 1048576 bytes"):
                rx.recv_header()
            elapsed = time.monotonic() - start
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert elapsed < 0.5, f"refusal took {elapsed:.2f} s: it waited for the payload"
        assert peak < 1 << 20, f"{peak} bytes allocated while refusing a {huge}-byte frame"
        assert pending_bytes(b) == b"payload-payload!", "the payload was read"
    finally:
        a.close()
        rx.close()


def test_recv_json_on_refuse_raises_with_the_reason(links):
    tx, rx = links
    tx.send_json(Kind.REFUSE, {"reason": "wrong job token"})
    with pytest.raises(CommError, match="rank 0 refused us during hello: wrong job token"):
        with doing("hello"):
            rx.recv_json(Kind.WELCOME)


def test_recv_json_protocol_errors(links):
    tx, rx = links
    tx.send_json(Kind.CONTROL, {"addrs": []})
    with pytest.raises(ProtocolError, match="expected a WELCOME frame .* got CONTROL"):
        rx.recv_json(Kind.WELCOME)
    tx.send(Frame(Kind.CONTROL), b"{not json")
    with pytest.raises(ProtocolError, match="bad JSON"):
        rx.recv_json(Kind.CONTROL)
    tx.sock.sendall(Frame(Kind.CONTROL, nbytes=(1 << 20) + 1).pack())
    with pytest.raises(ProtocolError, match="control message of 1048577 bytes"):
        rx.recv_json(Kind.CONTROL)


def test_send_to_a_closed_peer_raises_peer_closed(links):
    tx, rx = links
    rx.close()
    start = time.monotonic()
    with pytest.raises(PeerClosed) as info:
        while time.monotonic() - start < 2.0:  # the first sends may still fit in a buffer
            tx.send(Frame(Kind.DATA), b"\0" * 65536)
    assert info.value.origin == 1 and "rank 0: rank 1 closed the connection" in str(info.value)


# --- fuzz: random byte streams through a real socket -----------------------------------------

FUZZ_TIMEOUT = 0.2  # the receiving Link's timeout: a stream that stops must end in PeerTimeout


@st.composite
def byte_streams(draw) -> tuple[bytes, bool]:
    """(bytes a peer sends, whether it then keeps the connection open): valid frames and
    garbage interleaved, possibly cut anywhere."""
    pieces = []
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.booleans()):
            dtype = draw(st.sampled_from(sorted(DTYPE_CODES)))
            payload = draw(st.binary(max_size=64))
            payload = payload[: len(payload) - len(payload) % DTYPE_CODES[dtype].itemsize]
            # deliver_at in the past (or 0): a valid frame must not make the receiver sleep.
            frame = Frame(
                kind=draw(st.sampled_from(list(Kind))), op=draw(st.sampled_from(list(Op))),
                dtype=dtype, seq=draw(st.integers(0, U64)), nbytes=len(payload),
                deliver_at=draw(st.sampled_from([0.0, 1e-9, 1.0])),
            )  # fmt: skip
            pieces.append(frame.pack() + payload)
        else:
            pieces.append(draw(st.binary(min_size=1, max_size=80)))
    stream = b"".join(pieces)
    cut = draw(st.integers(0, len(stream)))
    keep_open = draw(st.sampled_from([False] * 7 + [True]))  # open: a 0.2 s wait each
    return stream[:cut], keep_open


@settings(max_examples=60)
@given(byte_streams())
@pytest.mark.slow  # 2-5 s: kept out of the fast subset
def test_random_streams_end_in_a_frame_or_a_comm_error_never_a_hang(case):
    stream, keep_open = case
    a, b = tcp_pair()
    rx = Link(b, rank=1, peer=0, timeout=FUZZ_TIMEOUT, max_frame_bytes=4096)
    frames = 0
    start = time.monotonic()
    try:
        a.sendall(stream)  # small: fits in the socket buffers, so no writer thread is needed
        if not keep_open:
            a.close()
        while True:
            try:
                frame = rx.recv_header()
                assert_in_range(frame)
                assert frame.nbytes <= 4096, frame
                rx.recv_payload_into(frame, memoryview(bytearray(frame.nbytes)))
                frames += 1
            except (ProtocolError, PeerClosed, PeerTimeout):
                break  # any other exception type fails the test
            assert frames <= len(stream) // 48 + 1, "more frames than the bytes could hold"
    finally:
        elapsed = time.monotonic() - start
        a.close()
        rx.close()
    assert elapsed < FUZZ_TIMEOUT + 1.0, f"{len(stream)} bytes took {elapsed:.2f} s to judge"


# --- no pickle, no objects -------------------------------------------------------------------


@pytest.mark.parametrize("module", [wire, link_module, sender], ids=lambda m: m.__name__)
def test_transport_never_unpickles(module):
    tree = ast.parse(inspect.getsource(module))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import | ast.ImportFrom)
                for alias in node.names}  # fmt: skip
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}  # fmt: skip
    for unsafe in ("pickle", "cPickle", "dill", "cloudpickle", "marshal", "shelve"):
        assert unsafe not in imported, f"{module.__name__} imports {unsafe}"
    assert "allow_pickle" not in inspect.getsource(module)


def test_object_arrays_cannot_become_frames():
    assert not any(dt.hasobject for dt in DTYPE_CODES.values()), "an object dtype has a code"
    with pytest.raises(TypeError):
        as_bytes(np.array([object(), 1], dtype=object))
    assert np.dtype(object) not in wire.CODE_OF_DTYPE


def test_as_bytes_refuses_a_strided_array():
    with pytest.raises(ValueError, match="contiguous"):
        as_bytes(np.arange(10, dtype=np.float32)[::2])
