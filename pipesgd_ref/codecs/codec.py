"""The codec object the rings use: one codec on one backend, with the buffer checks.

`Codec` dispatches encode / decode / add_decoded_into to a rung's functions (reference.py:
NumPy, numba_cpu.py: Numba loops; cuda_codec.CudaCodec subclasses it for device buffers) and
checks the caller's buffers first, so that a wrong buffer is a ValueError that says what to
pass, never a silent reinterpretation of the wrong bytes. Get one with `codecs.get_codec`.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from pipesgd_ref.codecs import numba_cpu, reference
from pipesgd_ref.codecs.bits import LAYOUT

# backend -> codec -> (encode, decode, add_decoded_into), for the host backends.
_FUNCTIONS = {"numpy": reference.FUNCTIONS, "numba": numba_cpu.FUNCTIONS}


def _describe(a) -> str:
    if not isinstance(a, np.ndarray):
        return f"a {type(a).__name__}"
    layout = "C-contiguous" if a.flags.c_contiguous else "non-contiguous"
    return f"a {layout} {a.dtype} array of shape {a.shape}"


class Codec:
    """One codec on one backend; get one with `get_codec`.

    Attributes: `name` (one of CODECS), `ratio` (the nominal compression ratio r of the timing
    model), `backend`, `stochastic`. Buffers are the caller's, preallocated (the ring reuses
    them): float32 values are 1-D C-contiguous float32 arrays, wire bytes 1-D C-contiguous
    uint8 arrays of exactly `wire_bytes(n)` bytes. Wrong buffers raise ValueError.
    """

    def __init__(self, name: str, backend: str, stochastic: bool = False, seed: int = 0):
        self.name = name
        self.backend = backend
        self.stochastic = stochastic
        self._header, self._per_value, self.ratio = LAYOUT[name]
        encode, self._decode, self._add = self._functions()
        if stochastic:  # the codec owns its generator: one stream, reproducible from `seed`
            encode = partial(encode, rng=np.random.default_rng(seed))
        self._encode = encode

    def _functions(self):
        """(encode, decode, add_decoded_into) of this codec and backend (CudaCodec overrides)."""
        return _FUNCTIONS[self.backend][self.name]

    def __repr__(self) -> str:
        extra = ", stochastic=True" if self.stochastic else ""
        return f"Codec({self.name!r}, backend={self.backend!r}{extra})"

    def wire_bytes(self, n: int) -> int:
        """Bytes of the encoding of n float32 values (exact: header + bytes per value * n)."""
        return self._header + self._per_value * n

    def encode(self, src: np.ndarray, out: np.ndarray) -> None:
        """out (uint8, wire_bytes(n)) = the encoding of src (float32, n values)."""
        self._check_values("encode", "src", src)
        self._check_wire("encode", "out", out, src.size)
        self._encode(src, out)

    def decode(self, src: np.ndarray, out: np.ndarray) -> None:
        """out (float32, n values, overwritten) = the values encoded in src (wire_bytes(n))."""
        self._check_values("decode", "out", out)
        self._check_wire("decode", "src", src, out.size)
        self._decode(src, out)

    def add_decoded_into(self, src: np.ndarray, dst: np.ndarray) -> None:
        """dst += decode(src), fused in one pass (a reduce-scatter hop of the ring)."""
        self._check_values("add_decoded_into", "dst", dst)
        self._check_wire("add_decoded_into", "src", src, dst.size)
        self._add(src, dst)

    def _check_values(self, op: str, role: str, a) -> None:
        if not (
            isinstance(a, np.ndarray)
            and a.dtype == np.float32
            and a.ndim == 1
            and a.flags.c_contiguous
        ):
            raise ValueError(
                f"{self.name} {op}: {role} must be a 1-D C-contiguous float32 array, got "
                f"{_describe(a)}; pass a flat float32 view (x.reshape(-1)) of contiguous data"
            )

    def _check_wire(self, op: str, role: str, a, n: int) -> None:
        want = self.wire_bytes(n)
        if not (
            isinstance(a, np.ndarray)
            and a.dtype == np.uint8
            and a.ndim == 1
            and a.flags.c_contiguous
        ):
            raise ValueError(
                f"{self.name} {op}: {role} must be a 1-D C-contiguous uint8 array of "
                f"wire_bytes({n}) = {want} bytes, got {_describe(a)}"
            )
        if a.size != want:
            raise ValueError(
                f"{self.name} {op}: {role} has {a.size} bytes, but {n} float32 values take "
                f"wire_bytes({n}) = {want} bytes; allocate np.empty(codec.wire_bytes({n}), "
                f"np.uint8), or slice the buffer to that length"
            )
