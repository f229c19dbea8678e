"""The codecs' NumPy reference: the definition of each codec, the rung the others must equal.

Every function takes the caller's preallocated buffers (float32 values, uint8 wire; the checks
are `Codec`'s, codecs/codec.py) and states its meaning as a plain loop in its docstring; the
Numba loops (numba_cpu.py) and the CUDA kernels (cuda_kernels.py) are tested bitwise against
these. The bit constants come from bits.py. `q8_scale` is shared: the Numba rung calls it, and
the q8 kernel writes its formula again on the device.
"""

from __future__ import annotations

import numpy as np

from pipesgd_ref.codecs.bits import (
    ABS_MASK,
    HALF_SHIFT,
    INF_BITS,
    LOW_ONES,
    ONE,
    Q8_LEVELS,
    Q8_MAX_SCALE,
    QUIET16,
)


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
    high = (bits >> HALF_SHIFT).astype(np.uint16)
    high[(bits & ABS_MASK) > INF_BITS] |= np.uint16(QUIET16)
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
    rounded = ((bits + (LOW_ONES + ((bits >> HALF_SHIFT) & ONE))) >> HALF_SHIFT).astype(np.uint16)
    nan = (bits & ABS_MASK) > INF_BITS
    rounded[nan] = ((bits[nan] >> HALF_SHIFT) | QUIET16).astype(np.uint16)
    out.view(np.uint16)[:] = rounded


def half16_decode(src: np.ndarray, out: np.ndarray) -> None:
    """trunc16 and bf16 decode alike: the 16 bits become the high half, the low half zeros.

    As a loop: for i in range(n): bits(out[i]) = src16[i] << 16.
    """
    out.view(np.uint32)[:] = src.view(np.uint16).astype(np.uint32) << HALF_SHIFT


def half16_add_decoded_into(src: np.ndarray, dst: np.ndarray) -> None:
    """for i in range(n): dst[i] += float32_from_bits(src16[i] << 16)."""
    dst += (src.view(np.uint16).astype(np.uint32) << HALF_SHIFT).view(np.float32)


def q8_scale(amax: np.float32) -> np.float32:
    """The scale of a q8 chunk from its max |x|; shared by every backend (written once).

    scale = max|x| / 127 in float32, capped at the largest value whose 127 multiple is
    finite; NaN when max|x| is NaN or Inf (the whole chunk then decodes to NaN);
    0 when the chunk is all zeros (or so tiny that max|x| / 127 underflows).
    """
    if not np.isfinite(amax):
        return np.float32(np.nan)
    return min(np.float32(amax) / Q8_LEVELS, Q8_MAX_SCALE)


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


# codec -> (encode, decode, add_decoded_into), the table `Codec` dispatches through.
FUNCTIONS = {
    "none": (none_encode, none_decode, none_add_decoded_into),
    "trunc16": (trunc16_encode, half16_decode, half16_add_decoded_into),
    "bf16": (bf16_encode, half16_decode, half16_add_decoded_into),
    "q8": (q8_encode, q8_decode, q8_add_decoded_into),
}
