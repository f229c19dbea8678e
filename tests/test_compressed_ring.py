"""Ring AllReduce with a codec on every hop: bitwise the one-process simulation on every rank,
within the documented error bound of the exact sum, and M/r bytes on the wire."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipesgd_ref.codecs import get_codec
from pipesgd_ref.comm.collectives import allreduce
from pipesgd_ref.comm.schedule import simulate_compressed_allreduce
from pipesgd_ref.comm.wire import HEADER_BYTES
from pipesgd_ref.commands.cli import main
from pipesgd_ref.runtime.launch import launch_local
from strategies import ring_sizes

LOSSY = ["trunc16", "bf16", "q8"]


def _inputs(seed, rank, n):
    return np.random.default_rng([seed, rank]).normal(size=n).astype(np.float32)


def _job(comm, n, codec_name, op, seed, segment_bytes, warm_up=False):
    codec = get_codec(codec_name, "numba")
    if warm_up:  # compile the codec first: a rank waiting > 0.2 s sends heartbeat frames
        allreduce(comm, _inputs(seed, comm.rank, n), op, codec=codec)
    x = _inputs(seed, comm.rank, n)
    sent0 = comm.bytes_sent
    allreduce(comm, x, op, codec=codec, segment_bytes=segment_bytes)
    return x, comm.bytes_sent - sent0


@pytest.mark.slow
@pytest.mark.timeout(120)
@settings(max_examples=25)
@given(
    sizes=ring_sizes(max_p=5, max_n=400),
    codec=st.sampled_from(LOSSY),
    op=st.sampled_from(["sum", "mean"]),
    seed=st.integers(0, 2**16),
    segment_bytes=st.sampled_from([16, 256, 1 << 20]),
)
def test_compressed_ring_equals_its_simulation_bitwise(sizes, codec, op, seed, segment_bytes):
    p, n = sizes
    results = launch_local(p, _job, (n, codec, op, seed, segment_bytes), start_method="fork",
                           timeout=20)  # fmt: skip
    inputs = [_inputs(seed, r, n) for r in range(p)]
    want = simulate_compressed_allreduce(inputs, get_codec(codec), op, segment_bytes)[0]
    for rank, (x, _) in enumerate(results):
        np.testing.assert_array_equal(x, want, err_msg=f"rank {rank} of {p}, {codec}")
    exact = np.sum(np.array(inputs, np.float64), axis=0) / (p if op == "mean" else 1)
    if n and p > 1:
        # Every partial sum S_k of a chunk (k = 1..p terms, in ring order) is encoded once,
        # and |S_k| <= sum_j |x_j|: so the error is at most p times one rounding of that.
        total_abs = np.sum(np.abs(np.array(inputs, np.float64)), axis=0)
        scale = 1 / p if op == "mean" else 1
        if codec == "trunc16":  # relative 2^-7 per encoding
            bound = 2.0**-7 * p * total_abs * scale * 1.01 + 1e-6
        elif codec == "bf16":  # relative 2^-8 per encoding
            bound = 2.0**-8 * p * total_abs * scale * 1.01 + 1e-6
        else:  # q8: half a step, max|S_k| / 254, per encoding (the step is chunk-wide)
            bound = np.full(n, p * total_abs.max() / 254 * scale * 1.01 + 1e-6)
        err = np.abs(want.astype(np.float64) - exact)
        assert np.all(err <= bound), f"{codec}: error {err.max():.3g} above the bound"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("codec, ratio", [("trunc16", 2), ("q8", 4)])
def test_bytes_on_the_wire(codec, ratio):
    """About M/r * 2(p-1)/p per rank, plus a header per segment (and q8's 4-byte scales)."""
    p, n = 4, 100_000
    M = 4 * n
    results = launch_local(p, _job, (n, codec, "sum", 0, 1 << 20, True), start_method="fork")
    frames = 2 * (p - 1)  # one segment per step at this size
    extra = frames * HEADER_BYTES + (frames * 4 if codec == "q8" else 0)
    for rank, (_, sent) in enumerate(results):
        chunk = n // p
        payload = 2 * (p - 1) * chunk * 4 // ratio
        assert sent == payload + extra, (rank, sent, payload + extra)
        assert sent < 2 * (p - 1) / p * M / ratio * 1.01 + extra


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_digits_pipe_accuracy_with_compression(tmp_path):
    """trunc16 within 0.5 point of the uncompressed run; q8 within 1 point."""
    acc = {}
    for codec in ("none", "trunc16", "q8"):
        out = tmp_path / codec
        rc = main(["train", "--preset=laptop", "--algo=pipe", f"--codec={codec}", "--no-progress",
                   f"--out={out}"])  # fmt: skip
        assert rc == 0
        summary = json.loads((out / "summary.json").read_text())
        assert summary["codec"] == codec
        acc[codec] = summary["test_accuracy"]
    assert abs(acc["trunc16"] - acc["none"]) <= 0.005, acc
    assert abs(acc["q8"] - acc["none"]) <= 0.01, acc
