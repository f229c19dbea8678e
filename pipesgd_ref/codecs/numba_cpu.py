"""The codecs as Numba CPU loops: the second rung (reference.py -> numba_cpu.py -> cuda_kernels.py).

Each public function has the reference's name, signature and result, bit for bit (stochastic q8
included: both draw from the codec's own `np.random.Generator`, which Numba's compiled code
advances exactly like NumPy; tests/test_codecs.py). The loops run the same integer operations
on the same constants (bits.py) as the reference. The module is `numba_cpu`, not `numba`, so
that `from numba import njit` below reads as the library it is.

Optimisations, and why:
- njit(nogil=True): encoding on the communication thread overlaps the compute thread.
- cache=True: spawned worker processes load the compiled loops instead of recompiling.
- Fusion: add_decoded_into is one pass; q8 decode-add never writes the decoded values.
- Branch-free bit arithmetic on unsigned constants (Numba widens it to 64 bits; the stores
  narrow it back): the 16-bit encode and decode loops vectorise and run at memory speed.
- q8's max |x| is an integer max over the bits with the sign cleared: for non-negative floats
  the bit patterns sort like the values (and NaN above Inf), and an integer max reduction
  vectorises where a float one (not associative with NaN) does not.
- The 16-bit decode-add reinterprets each rebuilt uint32 as a float32 in a register (LLVM's
  bitcast, which Numba does not expose for scalars: the 8-line intrinsic below), so the loop
  is one vectorised pass with no scratch buffer.
"""

from __future__ import annotations

from typing import no_type_check

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from pipesgd_ref.codecs import reference
from pipesgd_ref.codecs.bits import ABS_MASK, HALF_SHIFT, INF_BITS, LOW_ONES, ONE, QUIET16
from pipesgd_ref.codecs.reference import q8_scale

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
        h = b >> HALF_SHIFT
        if (b & ABS_MASK) > INF_BITS:
            h |= QUIET16
        out16[i] = h


@_jit
def _bf16_encode_loop(bits, out16):
    for i in range(bits.size):
        b = bits[i]
        if (b & ABS_MASK) > INF_BITS:
            out16[i] = (b >> HALF_SHIFT) | QUIET16
        else:
            out16[i] = (b + LOW_ONES + ((b >> HALF_SHIFT) & ONE)) >> HALF_SHIFT


@_jit
def _half16_decode_loop(src16, out_bits):
    for i in range(src16.size):
        out_bits[i] = np.uint32(src16[i]) << HALF_SHIFT


@_jit
@no_type_check  # compiled by Numba: its intrinsic's call is typed by Numba, not by mypy
def _half16_add_loop(src16, dst):
    for i in range(src16.size):
        dst[i] += _float32_from_bits(np.uint32(src16[i]) << HALF_SHIFT)


@_jit
def _abs_max_bits(bits):
    amax = np.uint32(0)
    for i in range(bits.size):
        a = bits[i] & ABS_MASK
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


def trunc16_encode(src: np.ndarray, out: np.ndarray) -> None:
    _trunc16_encode_loop(src.view(np.uint32), out.view(np.uint16))


def bf16_encode(src: np.ndarray, out: np.ndarray) -> None:
    _bf16_encode_loop(src.view(np.uint32), out.view(np.uint16))


def half16_decode(src: np.ndarray, out: np.ndarray) -> None:
    _half16_decode_loop(src.view(np.uint16), out.view(np.uint32))


def half16_add_decoded_into(src: np.ndarray, dst: np.ndarray) -> None:
    _half16_add_loop(src.view(np.uint16), dst)


def q8_encode(src: np.ndarray, out: np.ndarray, rng: np.random.Generator | None = None) -> None:
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


def q8_decode(src: np.ndarray, out: np.ndarray) -> None:
    _q8_decode_loop(src[4:].view(np.int8), src[:4].view(np.float32)[0], out)


def q8_add_decoded_into(src: np.ndarray, dst: np.ndarray) -> None:
    _q8_add_loop(src[4:].view(np.int8), src[:4].view(np.float32)[0], dst)


# codec -> (encode, decode, add_decoded_into). "none" has nothing to compile: a copy and an add
# are single NumPy passes (memcpy, a SIMD add) that already release the GIL.
FUNCTIONS = {
    "none": reference.FUNCTIONS["none"],
    "trunc16": (trunc16_encode, half16_decode, half16_add_decoded_into),
    "bf16": (bf16_encode, half16_decode, half16_add_decoded_into),
    "q8": (q8_encode, q8_decode, q8_add_decoded_into),
}
