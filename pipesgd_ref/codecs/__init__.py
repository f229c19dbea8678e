"""Gradient codecs for the compressed ring AllReduce (docs/paper.md, section 3, eq. (2)).

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

The rungs, side by side (same names, same signatures, each tested bitwise against the first):

    bits.py           the wire layouts and the bit constants every rung uses
    reference.py      "numpy": the definitions, each with its meaning as a plain loop
    numba_cpu.py      "numba": `njit(nogil=True, cache=True)` loops over the same bit operations,
                      bitwise equal to the reference for every codec (stochastic q8 included:
                      both draw from the codec's own `np.random.Generator`, which Numba's
                      compiled code advances exactly like NumPy); the loops release the GIL, so
                      a communication thread encodes while the compute thread runs
    cuda_kernels.py   "cuda": the same definitions as CUDA kernels on device arrays, bitwise
                      equal as well; imported (with numba.cuda) only when asked for
    cuda_codec.py     `CudaCodec`: the codec object of the cuda rung, its buffers on the GPU
    codec.py          `Codec`, the object the rings hold: dispatch and buffer checks

A stochastic codec owns its generator: use one codec object per thread.
"""

from __future__ import annotations

from pipesgd_ref.codecs.codec import Codec

__all__ = ["BACKENDS", "CODECS", "Codec", "get_codec"]

CODECS = ("none", "trunc16", "bf16", "q8")
BACKENDS = ("numpy", "numba", "cuda")  # cuda: device arrays, codecs/cuda_codec.py


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
        # Imported here: numba.cuda loads only when asked for (and after the caller has chosen
        # the simulator or a GPU: NUMBA_ENABLE_CUDASIM is read when numba.cuda first loads).
        from pipesgd_ref.codecs.cuda_codec import CudaCodec

        return CudaCodec(name, stochastic=stochastic, seed=seed)
    return Codec(name, backend, stochastic=stochastic, seed=seed)
