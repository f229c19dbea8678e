"""Gradient codecs for the compressed ring AllReduce (shared/PAPER.md section 3, "codecs").

Compression is Pipe-SGD's second lever: fewer bytes per hop. Codes cannot be added, so every
reduce-scatter hop of the ring decodes what arrives, adds it to its own chunk and encodes the
sum again (`add_decoded_into` fuses the first two); the all-gather forwards the final codes.

    name      wire layout for n float32 values            bytes       r     rounding
    none      n float32, as they are                      4n          1     exact
    trunc16   n uint16: the high half of each float32     2n          2     toward zero
    bf16      n uint16: bfloat16, rounded                 2n          2     to nearest, ties even
    q8        [scale: float32][n int8 codes]              4 + n       ~4    to nearest, ties even
                                                                            (or stochastic)

The 16-bit formats keep sign, the full 8-bit exponent and 7 mantissa bits: float32's range, so
they never underflow or overflow where float32 does not (except bf16's rounding up at the very
top, below). Per element, for normal numbers: trunc16 |error| < 2^-7 |x|, bf16 <= 2^-8 |x|.
q8 spends one scale per call (per chunk), scale = max|x| / 127, and |error| <= scale / 2
(deterministic) or < scale (stochastic, unbiased: E[decode(encode(x))] = x).

Cost per call: one pass over the n inputs (q8 encode: two, the max-abs then the codes); the
ring pays (p-1) decode-add + encode passes over M/p bytes per AllReduce on top of the
M/(r B) wire time (the "+ codec cost" of the T_ar formula).

Special values, as built (tested in tests/test_codecs.py):
- zeros: trunc16 and bf16 keep 0.0 and -0.0 (the sign bit is in the high half). q8 decodes
  every zero as +0.0 (code 0 times the scale).
- denormals: trunc16 and bf16 apply their bit rule unchanged, which is exactly float32's
  denormal grid cut to 7 mantissa bits (bf16 may round the largest up to the smallest normal).
  q8: when max|x| is so small that the scale is itself denormal (max|x| < 127 * 2^-126, about
  1.5e-36) the scale is coarse and the scale/2 bound no longer holds; values stay finite, keep
  their sign or become 0, and |decoded| <= 127 * scale. If the scale rounds to 0 all codes are 0.
- huge values: trunc16 never overflows (it rounds toward zero). bf16 rounds values within half
  a bfloat16 step of float32's max (|x| >= 0x7F7F8000 as bits, about 3.39e38) to +-Inf, exactly
  as a bfloat16 conversion does. q8's scale is capped so that 127 * scale stays finite: a chunk
  holding float32's max decodes finite.
- NaN and Inf: trunc16 and bf16 keep Inf as Inf, and NaN as a NaN of the same sign with the quiet
  bit set (bit 22; plain truncation would turn a NaN whose payload lies only in the low 16 bits
  into Inf). q8: one NaN or Inf in a chunk makes the scale NaN and the whole decoded chunk NaN,
  so a blown-up gradient is never silently turned into numbers, and the training's NaN check
  fires.

Byte order: the wire holds the host's native order; every platform the project runs on (x86-64,
arm64) is little-endian.

Backends: "numpy" is the reference (the definitions below, each with its meaning as a plain
loop); "numba" runs `njit(nogil=True, cache=True)` loops over the same bit operations, bitwise
equal to the reference for every codec (stochastic q8 included: both draw from the codec's own
`np.random.Generator`, which Numba's compiled code advances exactly like NumPy). The compiled
loops release the GIL, so a communication thread encodes while the compute thread runs.
"cuda" (ops/cuda_codecs.py) runs the same definitions as CUDA kernels on device arrays, bitwise
equal as well; it loads numba.cuda only when asked for.
A stochastic codec owns its generator: use one codec object per thread.
"""

from __future__ import annotations

from functools import partial

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

CODECS = ("none", "trunc16", "bf16", "q8")
BACKENDS = ("numpy", "numba", "cuda")  # cuda: device arrays, ops/cuda_codecs.py

# Per codec: (header bytes, bytes per value, nominal ratio r). wire_bytes(n) = header + per * n.
_LAYOUT = {
    "none": (0, 4, 1.0),
    "trunc16": (0, 2, 2.0),
    "bf16": (0, 2, 2.0),
    "q8": (4, 1, 4.0),  # 4n / (4 + n) -> 4 for long chunks
}

# Bit patterns of float32 (as uint32) and of the 16-bit high half.
_ABS = np.uint32(0x7FFF_FFFF)  # everything but the sign
_INF = np.uint32(0x7F80_0000)  # exponent all ones, mantissa 0; larger magnitudes are NaN
_HALF = np.uint32(16)  # the shift between a float32 and its high half
_LOW_ONES = np.uint32(0x7FFF)  # bf16 rounding: just under half of the dropped 16 bits
_ONE = np.uint32(1)
_QUIET16 = np.uint32(0x0040)  # float32's quiet-NaN bit (bit 22), as seen in the high half

_Q8_LEVELS = np.float32(127)  # codes -127..127: symmetric, so -x encodes as -(code of x)
# The largest scale whose 127 multiple is finite; max|x| / 127 rounds up past it for
# max|x| = float32 max, and 127 * scale would then decode to Inf.
_Q8_MAX_SCALE = np.nextafter(np.finfo(np.float32).max / _Q8_LEVELS, np.float32(0))


# --- the NumPy reference: the definition of each codec -----------------------------------------


def none_encode(src: np.ndarray, out: np.ndarray) -> None:
    """The float32 bytes as they are: for i in range(4 * n): out[i] = bytes(src)[i]."""
    out[:] = src.view(np.uint8)


def none_decode(src: np.ndarray, out: np.ndarray) -> None:
    """for i in range(4 * n): bytes(out)[i] = src[i]."""
    out.view(np.uint8)[:] = src


def none_add_decoded_into(src: np.ndarray, dst: np.ndarray) -> None:
    """for i in range(n): dst[i] += float32_at(src, 4 * i)."""
    dst += src.view(np.float32)


def trunc16_encode(src: np.ndarray, out: np.ndarray) -> None:
    """Keep the high 16 bits of each float32 (round toward zero); NaN stays a quiet NaN.

    As a loop, with b the float32's bits as a uint32 and out16 the wire as uint16:
        for i in range(n):
            b = bits(src[i])
            h = b >> 16                          # sign, exponent, top 7 mantissa bits
            if b & 0x7FFFFFFF > 0x7F800000:      # NaN: its payload may be in the low bits only
                h |= 0x0040                      # set the quiet bit, so it stays a NaN
            out16[i] = h
    """
    bits = src.view(np.uint32)
    high = (bits >> _HALF).astype(np.uint16)
    high[(bits & _ABS) > _INF] |= np.uint16(_QUIET16)
    out.view(np.uint16)[:] = high


def bf16_encode(src: np.ndarray, out: np.ndarray) -> None:
    """Round each float32 to bfloat16 (to nearest, ties to even) and keep the 16 bits.

    As a loop:
        for i in range(n):
            b = bits(src[i])
            if b & 0x7FFFFFFF > 0x7F800000:                 # NaN: keep it, quiet
                h = (b >> 16) | 0x0040
            else:                                           # add just under (or, when the kept
                h = (b + 0x7FFF + ((b >> 16) & 1)) >> 16    # part is odd, exactly) half a step
            out16[i] = h
    The carry of the addition may ripple into the exponent: that is the rounding up to the next
    binade, and from float32's top binade (|x| >= 0x7F7F8000 as bits) up to +-Inf, as bfloat16
    does. Inf itself stays Inf (0x7F800000 + 0x7FFF carries nothing into the high half).
    """
    bits = src.view(np.uint32)
    # uint32 arithmetic; only NaN bit patterns can wrap, and those are replaced just below.
    rounded = ((bits + (_LOW_ONES + ((bits >> _HALF) & _ONE))) >> _HALF).astype(np.uint16)
    nan = (bits & _ABS) > _INF
    rounded[nan] = ((bits[nan] >> _HALF) | _QUIET16).astype(np.uint16)
    out.view(np.uint16)[:] = rounded


def half16_decode(src: np.ndarray, out: np.ndarray) -> None:
    """trunc16 and bf16 decode alike: the 16 bits become the high half, the low half zeros.

    As a loop: for i in range(n): bits(out[i]) = src16[i] << 16.
    """
    out.view(np.uint32)[:] = src.view(np.uint16).astype(np.uint32) << _HALF


def half16_add_decoded_into(src: np.ndarray, dst: np.ndarray) -> None:
    """for i in range(n): dst[i] += float32_from_bits(src16[i] << 16)."""
    dst += (src.view(np.uint16).astype(np.uint32) << _HALF).view(np.float32)


def q8_scale(amax: np.float32) -> np.float32:
    """The scale of a q8 chunk from its max |x|; shared by every backend (written once).

    scale = max|x| / 127 in float32, capped at the largest value whose 127 multiple is
    finite; NaN when max|x| is NaN or Inf (the whole chunk then decodes to NaN);
    0 when the chunk is all zeros (or so tiny that max|x| / 127 underflows).
    """
    if not np.isfinite(amax):
        return np.float32(np.nan)
    return min(np.float32(amax) / _Q8_LEVELS, _Q8_MAX_SCALE)


def q8_encode(src: np.ndarray, out: np.ndarray, rng: np.random.Generator | None = None) -> None:
    """8-bit codes and one float32 scale: out = [scale (4 bytes)][n int8 codes].

    As a loop (all arithmetic in float32 except the stochastic sum, in float64):
        amax = max(|src[i]| for i in range(n)), 0 when n == 0     # NaN/Inf if any is
        scale = q8_scale(amax)
        for i in range(n):
            if not scale > 0:                                     # all zero, or NaN/Inf seen
                code[i] = 0
            elif rng is None:                                     # deterministic
                code[i] = clip(rint(src[i] / scale), -127, 127)   # rint: ties to even
            else:                                                 # stochastic, unbiased
                code[i] = clip(floor(src[i] / scale + rng.random()), -127, 127)
    Stochastic: floor(q + u), u ~ U[0, 1), is ceil(q) with probability frac(q), else floor(q),
    so E[code] = q and E[decode] = x. The generator is drawn n times per call (none when the
    scale is not positive).
    """
    n = src.size
    amax = np.abs(src).max() if n else np.float32(0)
    scale = q8_scale(amax)
    out[:4].view(np.float32)[0] = scale
    codes = out[4:].view(np.int8)
    if not scale > 0:  # also catches NaN: x / NaN would make codes from garbage
        codes[:] = 0
        return
    q = src / scale  # float32 / float32 scalar: float32, as in the numba loop
    if rng is None:
        np.rint(q, out=q)
    else:
        q = np.floor(q.astype(np.float64) + rng.random(n))
    np.clip(q, -127, 127, out=q)
    codes[:] = q


def q8_decode(src: np.ndarray, out: np.ndarray) -> None:
    """for i in range(n): out[i] = float32(code[i]) * scale   (NaN everywhere if scale is)."""
    scale = src[:4].view(np.float32)[0]
    np.multiply(src[4:].view(np.int8), scale, out=out)


def q8_add_decoded_into(src: np.ndarray, dst: np.ndarray) -> None:
    """for i in range(n): dst[i] += float32(code[i]) * scale   (the product rounded first)."""
    scale = src[:4].view(np.float32)[0]
    dst += src[4:].view(np.int8) * scale


# --- the Numba rung: the same bit operations as compiled loops ---------------------------------
# Optimisations, and why:
# - njit(nogil=True): encoding on the communication thread overlaps the compute thread.
# - cache=True: spawned worker processes load the compiled loops instead of recompiling.
# - Fusion: add_decoded_into is one pass; q8 decode-add never writes the decoded values.
# - Branch-free bit arithmetic on unsigned constants (Numba widens it to 64 bits; the stores
#   narrow it back): the 16-bit encode and decode loops vectorise and run at memory speed.
# - q8's max |x| is an integer max over the bits with the sign cleared: for non-negative floats
#   the bit patterns sort like the values (and NaN above Inf), and an integer max reduction
#   vectorises where a float one (not associative with NaN) does not.
# - The 16-bit decode-add reinterprets each rebuilt uint32 as a float32 in a register (LLVM's
#   bitcast, which Numba does not expose for scalars: the 8-line intrinsic below), so the loop
#   is one vectorised pass with no scratch buffer.

_jit = njit(nogil=True, cache=True)


@intrinsic
def _float32_from_bits(typingctx, bits):
    """The float32 whose bit pattern is the low 32 bits of the integer `bits` (free: a register
    reinterpretation; Numba widens uint32 shifts to 64 bits, hence the cast first)."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        low32 = context.cast(builder, args[0], signature.args[0], types.uint32)
        return builder.bitcast(low32, ir.FloatType())

    return types.float32(bits), codegen


@_jit
def _trunc16_encode_loop(bits, out16):
    for i in range(bits.size):
        b = bits[i]
        h = b >> _HALF
        if (b & _ABS) > _INF:
            h |= _QUIET16
        out16[i] = h


@_jit
def _bf16_encode_loop(bits, out16):
    for i in range(bits.size):
        b = bits[i]
        if (b & _ABS) > _INF:
            out16[i] = (b >> _HALF) | _QUIET16
        else:
            out16[i] = (b + _LOW_ONES + ((b >> _HALF) & _ONE)) >> _HALF


@_jit
def _half16_decode_loop(src16, out_bits):
    for i in range(src16.size):
        out_bits[i] = np.uint32(src16[i]) << _HALF


@_jit
def _half16_add_loop(src16, dst):
    for i in range(src16.size):
        dst[i] += _float32_from_bits(np.uint32(src16[i]) << _HALF)


@_jit
def _abs_max_bits(bits):
    amax = np.uint32(0)
    for i in range(bits.size):
        a = bits[i] & _ABS
        if a > amax:
            amax = a
    return amax


@_jit
def _q8_codes_loop(x, scale, codes):
    for i in range(x.size):
        q = np.rint(x[i] / scale)  # float32 division, ties to even: as NumPy's rint
        codes[i] = min(max(q, -127.0), 127.0)


@_jit
def _q8_codes_stochastic_loop(x, scale, codes, rng):
    for i in range(x.size):
        q = np.floor(np.float64(x[i] / scale) + rng.random())
        codes[i] = min(max(q, -127.0), 127.0)


@_jit
def _q8_decode_loop(codes, scale, out):
    for i in range(codes.size):
        out[i] = np.float32(codes[i]) * scale


@_jit
def _q8_add_loop(codes, scale, dst):
    for i in range(codes.size):
        dst[i] += np.float32(codes[i]) * scale


def _numba_trunc16_encode(src, out) -> None:
    _trunc16_encode_loop(src.view(np.uint32), out.view(np.uint16))


def _numba_bf16_encode(src, out) -> None:
    _bf16_encode_loop(src.view(np.uint32), out.view(np.uint16))


def _numba_half16_decode(src, out) -> None:
    _half16_decode_loop(src.view(np.uint16), out.view(np.uint32))


def _numba_half16_add_decoded_into(src, dst) -> None:
    _half16_add_loop(src.view(np.uint16), dst)


def _numba_q8_encode(src, out, rng: np.random.Generator | None = None) -> None:
    amax = np.uint32(_abs_max_bits(src.view(np.uint32))).view(np.float32)
    scale = q8_scale(amax)  # the same Python function as the reference: bitwise the same scale
    out[:4].view(np.float32)[0] = scale
    codes = out[4:].view(np.int8)
    if not scale > 0:
        codes[:] = 0
    elif rng is None:
        _q8_codes_loop(src, scale, codes)
    else:
        _q8_codes_stochastic_loop(src, scale, codes, rng)


def _numba_q8_decode(src, out) -> None:
    _q8_decode_loop(src[4:].view(np.int8), src[:4].view(np.float32)[0], out)


def _numba_q8_add_decoded_into(src, dst) -> None:
    _q8_add_loop(src[4:].view(np.int8), src[:4].view(np.float32)[0], dst)


# (codec, backend) -> (encode, decode, add_decoded_into). "none" has nothing to compile: a copy
# and an add are single NumPy passes (memcpy, a SIMD add) that already release the GIL.
_IMPLEMENTATIONS = {
    ("none", "numpy"): (none_encode, none_decode, none_add_decoded_into),
    ("none", "numba"): (none_encode, none_decode, none_add_decoded_into),
    ("trunc16", "numpy"): (trunc16_encode, half16_decode, half16_add_decoded_into),
    ("trunc16", "numba"): (
        _numba_trunc16_encode,
        _numba_half16_decode,
        _numba_half16_add_decoded_into,
    ),
    ("bf16", "numpy"): (bf16_encode, half16_decode, half16_add_decoded_into),
    ("bf16", "numba"): (_numba_bf16_encode, _numba_half16_decode, _numba_half16_add_decoded_into),
    ("q8", "numpy"): (q8_encode, q8_decode, q8_add_decoded_into),
    ("q8", "numba"): (_numba_q8_encode, _numba_q8_decode, _numba_q8_add_decoded_into),
}


# --- the codec object the ring uses -----------------------------------------------------------


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
        self._header, self._per_value, self.ratio = _LAYOUT[name]
        encode, self._decode, self._add = self._functions()
        if stochastic:  # the codec owns its generator: one stream, reproducible from `seed`
            encode = partial(encode, rng=np.random.default_rng(seed))
        self._encode = encode

    def _functions(self):
        """(encode, decode, add_decoded_into) of this codec and backend (CudaCodec overrides)."""
        return _IMPLEMENTATIONS[(self.name, self.backend)]

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


def get_codec(name: str, backend: str = "numpy", stochastic: bool = False, seed: int = 0) -> Codec:
    """The codec `name` (one of CODECS) on `backend`: "numpy" (the reference), "numba", or
    "cuda" (a CudaCodec: its buffers are Numba CUDA device arrays; needs a GPU or the simulator).

    `stochastic=True` (q8 only) rounds each value up or down at random, unbiased, drawing from
    a generator seeded with `seed`: same seed, same codes, on any backend.
    """
    if name not in CODECS:
        raise ValueError(f"unknown codec {name!r}; choose one of: {', '.join(CODECS)}")
    if backend not in BACKENDS:
        raise ValueError(f"unknown codec backend {backend!r}; choose one of: {', '.join(BACKENDS)}")
    if stochastic and name != "q8":
        raise ValueError(
            f"stochastic rounding is defined only for q8, not {name!r}; drop stochastic=True "
            f"or use get_codec('q8', stochastic=True)"
        )
    if backend == "cuda":
        from pipesgd_ref.ops.cuda_codecs import CudaCodec  # here: numba.cuda loads only if asked

        return CudaCodec(name, stochastic=stochastic, seed=seed)
    return Codec(name, backend, stochastic=stochastic, seed=seed)
