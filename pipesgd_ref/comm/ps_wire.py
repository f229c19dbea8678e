"""The parameter server's wire protocol: the messages of the star (comm/ps.py: the worker's
client and the server's links), their headers, and the buffers one message needs.

Wire protocol: every message is one frame of comm/wire.py (Kind.DATA, Op.NONE: a star link
carries nothing else, so the direction says what a frame is), after the start.

    start  worker -> server   Kind.CONTROL, JSON {ready: rank}: set up, ready for step 0
           server -> worker   Kind.CONTROL, JSON {start: true}, once every worker is ready
                              (ServerLinks.start_together, PSClient.wait_for_start): all
                              workers start step 0 at once, so the run's clock starts with
                              training, not while one worker is still setting up
    push   worker -> server   seq = version of the weights the gradient was computed on
                              src = the worker's rank, total_len = n (params),
                              part = the codec's id (index in codecs.CODECS; 0 = none)
                              codec none: dtype float32, payload n + 1 + m elements, the
                              gradient, then the worker's minibatch loss (so the server can
                              report the loss of every update without a second message per
                              push; a NaN loss also marks a gradient the worker left out,
                              --skip-nonfinite), then the model's m buffers (batch norm's
                              running statistics; m = 0 for a model without any)
                              codec trunc16 / bf16 / q8: dtype uint8, payload
                                  [codec.encode(gradient): codec.wire_bytes(n) bytes]
                                  [loss: 4 bytes, float32, native (little-endian) order]
                                  [buffers: 4 m bytes, float32, native order]
                              the loss and the buffers are never encoded: they travel exactly
                              as with none. Every worker sends its buffers, so every push of a
                              job has one size; the server keeps only worker 0's, the job's
                              statistics (as DDP keeps rank 0's), to evaluate and checkpoint
    pull   server -> worker   seq = version of the weights (= updates applied so far)
                              src = 0, total_len = n (params),
                              part = the pull codec's id (index in codecs.CODECS; 0 = none)
                              pull codec none: dtype of the weights, payload the n weights,
                              received straight into the worker's parameter buffer
                              pull codec trunc16 / bf16 / q8: dtype uint8, payload
                                  [pull_codec.encode(weights): pull_codec.wire_bytes(n) bytes]
                              received into a code buffer, then decoded into the worker's
                              parameter buffer
    abort  server -> worker   Kind.ABORT, JSON {origin, reason}: the server failed (a worker
                              died, hung, or sent a bad frame); every worker still waiting
                              raises PeerAborted naming the rank at fault

Both sides check every header (kind, version, dtype, length, codec) before reading its payload,
so a worker that is out of step (or encodes with another codec) gets an error naming it, and a
worker that expects another pull codec than the server sends gets one naming the server (rank
0), never wrong numbers.

Codes on the wire. A push is one code of the worker's whole gradient (after its error
feedback); the server decodes it (`ServerLinks.gradient`), or decode-adds it straight into a
sum (`ServerLinks.add_gradient_into`: codec.add_decoded_into, bitwise `sum += decode(codes)`).
A compressed pull is one code of the server's whole weight vector (q8: so ONE scale,
max|w| / 127, for the whole vector; no per-layer or per-chunk scales), encoded once per version
and shared by every pull of that version (the codecs are deterministic, so that is the same
bytes as one encode per message); `params` itself is never rounded. A push shrinks from 4n + 4
to wire_bytes(n) + 4 bytes (+ 4m for the statistics either way), a pull from 4n to
wire_bytes(n) (+ 48 header bytes a frame).
"""

from __future__ import annotations

import numpy as np

from pipesgd_ref.comm.wire import CODE_OF_DTYPE

CODES = CODE_OF_DTYPE[np.dtype(np.uint8)]  # header dtype of codes (compressed pushes, pulls)


def codec_and_id(codec, dtype: np.dtype):
    """(codec, id in the header's `part`): (None, 0) for no codec or codec "none"."""
    if codec is None or codec.name == "none":
        return None, 0
    from pipesgd_ref.codecs import CODECS  # here: only compressed messages need the codecs

    if dtype != np.float32:
        raise ValueError(
            f"codec {codec.name} encodes float32 values; the weights are {dtype} (use "
            f"codec none, or float32 weights)"
        )
    return codec, CODECS.index(codec.name)


def codec_name(codec_id: int) -> str:
    from pipesgd_ref.codecs import CODECS

    return CODECS[codec_id] if 0 <= codec_id < len(CODECS) else f"id {codec_id}"


def push_buffers(n: int, dtype: np.dtype, codec, n_stats: int = 0):
    """(wire buffer, gradient values, loss slot, codes, stats slot) of one push: `n_stats`
    the model's buffers (running statistics) that travel after the loss. codes is None
    without a codec (the gradient, the loss and the statistics are then views of the wire
    buffer itself)."""
    if codec is None:
        wire = np.empty(n + 1 + n_stats, dtype)  # gradient, then the loss, then the stats
        return wire, wire[:n], wire[n : n + 1], None, wire[n + 1 :]
    codes_bytes = codec.wire_bytes(n)
    wire = np.empty(codes_bytes + 4 + 4 * n_stats, np.uint8)  # codes, loss, stats (float32)
    # The loss and stats slots may be unaligned (q8: 4 + n code bytes); NumPy reads and writes
    # them anyway.
    tail = wire[codes_bytes:].view(np.float32)
    return wire, np.empty(n, np.float32), tail[:1], wire[:codes_bytes], tail[1:]


def pull_codes(n: int, codec):
    """The code buffer of one compressed pull (wire_bytes(n) bytes), or None without a codec."""
    return None if codec is None else np.empty(codec.wire_bytes(n), np.uint8)
