"""The codecs against their definitions (pipesgd_ref/codecs/): documented error bounds,
independent rounding oracles, special values, and Numba bitwise equal to the NumPy reference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipesgd_ref.codecs import CODECS, get_codec
from pipesgd_ref.codecs.reference import q8_scale
from strategies import lengths, random_array, seeds

BACKENDS = ("numpy", "numba")
# (codec, stochastic): every way a codec can round
VARIANTS = [(name, False) for name in CODECS] + [("q8", True)]
EVERY = [(name, backend, sto) for name, sto in VARIANTS for backend in BACKENDS]
ids = [f"{n}-{b}" + ("-stochastic" if s else "") for n, b, s in EVERY]

# Magnitudes 1e-30 .. 1e30: every float32 binade of normal numbers gets visited.
magnitudes = st.integers(-30, 30).map(lambda e: 10.0**e)

F32_MAX = np.finfo(np.float32).max
TINY = np.finfo(np.float32).tiny  # the smallest normal float32, 2^-126


def f32(*bits: int) -> np.ndarray:
    """float32 values from their bit patterns."""
    return np.array(bits, np.uint32).view(np.float32)


def random_bits(seed: int, n: int) -> np.ndarray:
    """float32 from uniformly random bit patterns: every sign, exponent (denormals, Inf, NaN)."""
    return np.random.default_rng(seed).integers(0, 2**32, size=n, dtype=np.uint32).view(np.float32)


def encode(codec, x: np.ndarray, offset: int = 0) -> np.ndarray:
    # offset > 0 puts the wire at an odd address inside a larger buffer, as in a framed message
    buf = np.full(codec.wire_bytes(x.size) + offset, 0xAB, np.uint8)
    wire = buf[offset:]
    codec.encode(x, wire)
    return wire


def decode(codec, wire: np.ndarray, n: int) -> np.ndarray:
    out = np.full(n, np.nan, np.float32)  # NaN-filled: a decode that skips an element fails
    codec.decode(wire, out)
    return out


def scale_of(wire: np.ndarray) -> float:
    return float(wire[:4].view(np.float32)[0])


def assert_within(x, got, bound, what: str) -> None:
    """|got - x| <= bound elementwise (float64 arithmetic); on failure show the worst element."""
    x64, got64 = x.astype(np.float64), got.astype(np.float64)
    err = np.abs(got64 - x64)
    bound = np.broadcast_to(np.asarray(bound, np.float64), err.shape)
    over = err - bound
    if x.size and not np.all(over <= 0):
        i = int(np.nanargmax(np.where(np.isnan(over), np.inf, over)))
        raise AssertionError(
            f"{what}: element {i} of {x.size}: x = {x64[i]!r}, decoded = {got64[i]!r}, "
            f"|error| = {err[i]:.3e} > bound {bound[i]:.3e}"
        )


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32) if a.dtype == np.float32 else a


def assert_bits_equal(got, want, what: str) -> None:
    """Bitwise equality (NaN payloads and the sign of zero included); shows the first miss."""
    g, w = _bits(got), _bits(want)
    if not np.array_equal(g, w):
        i = int(np.flatnonzero(g != w)[0])
        raise AssertionError(
            f"{what}: {int(np.sum(g != w))} of {g.size} differ; first at {i}: "
            f"got 0x{int(g[i]):08X}, want 0x{int(w[i]):08X}"
        )


# --- sizes and the roundtrip error of every codec --------------------------------------------


@pytest.mark.parametrize("name", CODECS)
@given(n=lengths)
def test_wire_bytes_exact(name, n):
    header, per_value = {"none": (0, 4), "trunc16": (0, 2), "bf16": (0, 2), "q8": (4, 1)}[name]
    codec = get_codec(name)
    assert codec.wire_bytes(n) == header + per_value * n
    assert codec.name == name and codec.ratio == {"none": 1, "q8": 4}.get(name, 2)


@pytest.mark.parametrize("name,backend,stochastic", EVERY, ids=ids)
@given(n=lengths, seed=seeds, magnitude=magnitudes)
def test_roundtrip_error_is_as_documented(name, backend, stochastic, n, seed, magnitude):
    codec = get_codec(name, backend, stochastic=stochastic, seed=seed)
    x = random_array(seed, n, np.float32, scale=magnitude)
    wire = encode(codec, x)
    got = decode(codec, wire, n)
    what = f"{codec} at length {n}, magnitude {magnitude:g}"
    if name == "none":
        assert_bits_equal(got, x, what)
    elif name in ("trunc16", "bf16"):
        normal = np.abs(x) >= TINY  # the relative bound holds for normal numbers
        rel = 2.0**-7 if name == "trunc16" else 2.0**-8
        assert_within(x[normal], got[normal], rel * np.abs(x[normal].astype(np.float64)), what)
        if name == "trunc16":  # strictly below 2^-7, toward zero, the sign kept
            assert np.all(np.abs(got[normal] - x[normal]) < rel * np.abs(x[normal])), what
            assert np.all(np.abs(got) <= np.abs(x)), f"{what}: trunc16 rounded away from zero"
            assert np.array_equal(np.signbit(got), np.signbit(x)), f"{what}: sign changed"
    else:
        scale = scale_of(wire)
        want_scale = np.float32(np.abs(x).max()) / np.float32(127) if n else 0.0
        assert scale == want_scale, f"{what}: scale {scale!r}, want max|x|/127 = {want_scale!r}"
        # Half a step (a whole step when stochastic), plus float32 rounding of x/scale and of
        # code * scale: at most 254 * 2^-24 * scale < 2^-15 * scale.
        step = 1.0 if stochastic else 0.5
        assert_within(x, got, scale * (step + 2.0**-15), what)


@pytest.mark.parametrize("name", ["trunc16", "bf16"])
@pytest.mark.parametrize("backend", BACKENDS)
@given(n=lengths, seed=seeds)
def test_half16_exact_for_values_with_zero_low_bits(name, backend, n, seed):
    """Every non-NaN 16-bit pattern (zeros, denormals, Inf included) survives bitwise."""
    high = np.random.default_rng(seed).integers(0, 2**16, size=n, dtype=np.uint32)
    high = high[(high & 0x7FFF) <= 0x7F80]  # drop the NaN patterns: they get the quiet bit
    x = (high << 16).view(np.float32)
    codec = get_codec(name, backend)
    assert_bits_equal(decode(codec, encode(codec, x), x.size), x, f"{codec} on bf16 values")


def half16_oracle(x: np.ndarray, rounding: str) -> np.ndarray:
    """An independent definition in float64: of the two 16-bit values around x (toward zero
    and the next one up in magnitude), trunc16 takes the first, bf16 the nearest, ties to the
    one whose last kept bit is 0; past the largest finite one lies Inf, at 2^128 for rounding
    purposes (IEEE overflow). Finite, non-NaN x only."""
    bits = x.view(np.uint32)
    down = bits & np.uint32(0xFFFF0000)
    up = down + np.uint32(0x10000)
    if rounding == "trunc":
        return down.view(np.float32)
    lo = np.abs(down.view(np.float32).astype(np.float64))
    hi = np.abs(up.view(np.float32).astype(np.float64))
    hi[np.isinf(hi)] = 2.0**128
    mag = np.abs(x.astype(np.float64))
    d_lo, d_hi = mag - lo, hi - mag
    take_up = (d_hi < d_lo) | ((d_hi == d_lo) & ((down >> 16) & 1 == 1))
    return np.where(take_up, up, down).view(np.float32)


@pytest.mark.parametrize("name", ["trunc16", "bf16"])
@pytest.mark.parametrize("backend", BACKENDS)
@given(n=lengths, seed=seeds)
def test_half16_against_float64_oracle(name, backend, n, seed):
    x = random_bits(seed, n)
    x = x[np.isfinite(x)]
    codec = get_codec(name, backend)
    want = half16_oracle(x, "trunc" if name == "trunc16" else "nearest")
    assert_bits_equal(decode(codec, encode(codec, x), x.size), want, f"{codec} vs oracle")


def test_bf16_matches_torch_bfloat16():
    """bf16 is the bfloat16 of ML frameworks (optional: only where torch is installed)."""
    torch = pytest.importorskip("torch")
    x = random_bits(0, 200_000)
    x = x[~np.isnan(x)]  # torch makes every NaN the canonical 0x7FC0; ours keep sign/payload
    x = np.concatenate([x, f32(0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x00000001, 0x007FFFFF)])
    want = torch.from_numpy(x.copy()).to(torch.bfloat16).to(torch.float32).numpy()
    codec = get_codec("bf16")
    assert_bits_equal(decode(codec, encode(codec, x), x.size), want, "bf16 vs torch.bfloat16")


# --- Numba against the NumPy reference, bitwise ----------------------------------------------


@pytest.mark.parametrize("name,stochastic", [v for v in VARIANTS if v[0] != "none"])
@given(n=lengths, seed=seeds, magnitude=magnitudes, offset=st.sampled_from([0, 1]))
def test_numba_equals_numpy_bitwise(name, stochastic, n, seed, magnitude, offset):
    # 16-bit codecs: any bit pattern (NaN, Inf, denormals). q8: values of one magnitude (random
    # bits would put a NaN in almost every chunk, and the chunk is then simply all NaN).
    if name == "q8":
        x = random_array(seed, n, np.float32, scale=magnitude)
    else:
        x = random_bits(seed, n)
    dst = random_array(seed + 1, n, np.float32)
    results = {}
    for backend in BACKENDS:
        codec = get_codec(name, backend, stochastic=stochastic, seed=seed)
        wire = encode(codec, x, offset)
        added = dst.copy()
        with np.errstate(invalid="ignore"):  # NaN inputs of the 16-bit codecs
            codec.add_decoded_into(wire, added)
        results[backend] = (wire, decode(codec, wire, n), added)
    parts = ("wire", "decode", "add_decoded_into")
    for part, ref, fast in zip(parts, results["numpy"], results["numba"], strict=True):
        assert_bits_equal(fast, ref, f"numba {name} {part} vs numpy, length {n}")


# --- add_decoded_into is dst + decode ---------------------------------------------------------


@pytest.mark.parametrize("name,backend,stochastic", EVERY, ids=ids)
@given(n=lengths, seed=seeds, magnitude=magnitudes)
def test_add_decoded_into_is_dst_plus_decode(name, backend, stochastic, n, seed, magnitude):
    codec = get_codec(name, backend, stochastic=stochastic, seed=seed)
    wire = encode(codec, random_array(seed, n, np.float32, scale=magnitude))
    dst = random_array(seed + 1, n, np.float32, scale=magnitude)
    want = dst + decode(codec, wire, n)
    codec.add_decoded_into(wire, dst)
    assert_bits_equal(dst, want, f"{codec} add_decoded_into at length {n}")


# --- stochastic rounding ----------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_stochastic_q8_is_unbiased(backend):
    """Mean of R = 2000 independent roundings of 256 fixed values, each within 5 standard
    errors of x. A rounding of q = x/scale is floor(q) or floor(q)+1 with variance
    f(1-f) <= 1/4 (f = frac(q)), so SE <= scale / (2 sqrt(R)). The mean of 2000 draws is close
    to normal: a false alarm at 5 SE has probability about 6e-7 per element, 2e-4 for all 256
    (and the seed is fixed, so the test is deterministic)."""
    R, n = 2000, 256
    x = np.random.default_rng(1).uniform(-1, 1, n).astype(np.float32)
    x[0] = 1.0  # max |x| = 1 in every copy: one scale for the whole tiled chunk
    codec = get_codec("q8", backend, stochastic=True, seed=7)
    tiled = np.tile(x, R)  # R copies in one chunk: R independent draws per value
    wire = encode(codec, tiled)
    scale = scale_of(wire)
    decoded = decode(codec, wire, tiled.size).reshape(R, n).astype(np.float64)
    se = scale / (2 * np.sqrt(R))
    tolerance = 5 * se + scale * 2.0**-15  # plus float32 rounding of x/scale and code*scale
    assert_within(x, decoded.mean(axis=0), tolerance, f"{codec} mean over {R} draws")
    # Power check: deterministic rounding (bias up to scale/2) fails the same tolerance.
    det = get_codec("q8", backend)
    bias = np.abs(decode(det, encode(det, x), n).astype(np.float64) - x)
    caught = np.mean(bias > tolerance)
    assert caught > 0.5, f"deterministic q8 beats the tolerance on {caught:.0%}: a weak test"
    # Every draw is one of the two neighbours of x/scale (error < one step).
    assert np.all(np.abs(decoded - x) < scale * (1 + 2.0**-15))


def test_stochastic_q8_reproducible_from_seed():
    x = random_array(3, 1000, np.float32)
    a, b = get_codec("q8", stochastic=True, seed=5), get_codec("q8", stochastic=True, seed=5)
    first = encode(a, x)
    assert np.array_equal(first, encode(b, x)), "same seed, same first codes"
    assert not np.array_equal(first, encode(a, x)), "a second call draws new rounding"
    assert not np.array_equal(first, encode(get_codec("q8", stochastic=True, seed=6), x))


# --- special values: zeros, denormals, float32 max, Inf, NaN ----------------------------------

# input bits -> (trunc16 decoded bits, bf16 decoded bits); NaN rows: any NaN of that sign.
HALF16_SPECIALS = {
    0x00000000: (0x00000000, 0x00000000),  # +0.0
    0x80000000: (0x80000000, 0x80000000),  # -0.0 keeps its sign
    0x00000001: (0x00000000, 0x00000000),  # smallest denormal: its bit is in the dropped half
    0x00018000: (0x00010000, 0x00020000),  # denormal tie: bf16 goes to even
    0x00028000: (0x00020000, 0x00020000),  # denormal tie: already even
    0x007FFFFF: (0x007F0000, 0x00800000),  # largest denormal: bf16 rounds up to 2^-126
    0x00800000: (0x00800000, 0x00800000),  # smallest normal
    0x3F808000: (0x3F800000, 0x3F800000),  # 1 + 2^-8: a tie, kept bit even -> down
    0x3F818000: (0x3F810000, 0x3F820000),  # 1 + 3 * 2^-8: a tie, kept bit odd -> up
    0x3F807FFF: (0x3F800000, 0x3F800000),  # just below the tie -> down
    0x7F7FFFFF: (0x7F7F0000, 0x7F800000),  # float32 max: trunc16 finite, bf16 overflows to Inf
    0x7F7F7FFF: (0x7F7F0000, 0x7F7F0000),  # just below bf16's overflow threshold
    0xFF7FFFFF: (0xFF7F0000, 0xFF800000),  # -float32 max: -Inf in bf16
    0x7F800000: (0x7F800000, 0x7F800000),  # +Inf
    0xFF800000: (0xFF800000, 0xFF800000),  # -Inf
    0x7FC00000: (None, None),  # quiet NaN
    0xFFC00000: (None, None),  # negative quiet NaN
    0x7F800001: (None, None),  # NaN with its payload in the low half only: not Inf
    0xFF80FFFF: (None, None),  # same, negative, with low bits that would round bf16 up
}


@pytest.mark.parametrize("name", ["trunc16", "bf16"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_half16_special_values(name, backend):
    codec = get_codec(name, backend)
    x = f32(*HALF16_SPECIALS)
    got = decode(codec, encode(codec, x), x.size).view(np.uint32)
    column = 0 if name == "trunc16" else 1
    for i, (bits, want) in enumerate(HALF16_SPECIALS.items()):
        g = int(got[i])
        what = f"{codec}: input 0x{bits:08X} decoded to 0x{g:08X}"
        if want[column] is None:
            assert (g & 0x7FFFFFFF) > 0x7F800000, f"{what}, want a NaN"
            assert g >> 31 == bits >> 31, f"{what}, want the NaN's sign kept"
        else:
            assert g == want[column], f"{what}, want 0x{want[column]:08X}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("stochastic", [False, True])
def test_q8_special_values(backend, stochastic):
    codec = get_codec("q8", backend, stochastic=stochastic)

    def roundtrip(*values):
        x = np.array(values, np.float32)
        wire = encode(codec, x)
        return scale_of(wire), decode(codec, wire, x.size), wire

    # n = 0: the scale alone, 0
    scale, got, wire = roundtrip()
    assert wire.size == 4 and scale == 0.0 and got.size == 0
    # All zeros: scale 0, codes 0, and zeros come back as +0.0 (q8 drops the sign of zero)
    scale, got, wire = roundtrip(0.0, -0.0, 0.0)
    assert scale == 0.0 and not wire[4:].any()
    assert_bits_equal(got, np.zeros(3, np.float32), f"{codec} on zeros")
    # NaN or Inf anywhere: the whole chunk decodes to NaN, and so does dst after the add
    for bad in (np.nan, np.inf, -np.inf):
        scale, got, wire = roundtrip(1.0, bad, -2.0, 0.0)
        assert np.isnan(scale) and np.all(np.isnan(got)), f"{codec} with {bad}: {got}"
        dst = np.ones(4, np.float32)
        codec.add_decoded_into(wire, dst)
        assert np.all(np.isnan(dst)), f"{codec} add_decoded_into with {bad}: {dst}"
    # float32 max: 127 * scale would round up to Inf; the capped scale keeps it finite
    scale, got, _ = roundtrip(F32_MAX, -F32_MAX, 1.0)
    assert np.all(np.isfinite(got)), f"{codec}: a chunk holding float32 max decoded to {got}"
    assert_within(np.array([F32_MAX, -F32_MAX], np.float32), got[:2], scale, f"{codec} at max")
    # Denormal chunk: a coarse denormal scale; finite, sign kept or 0, |decoded| <= 127 * scale
    x = f32(200, 0x80000000 | 190, 3, 0x80000000 | 1)  # multiples of 2^-149
    scale, got, _ = roundtrip(*x)
    assert 0 < scale < TINY and np.all(np.isfinite(got))
    assert np.all((np.sign(got) == np.sign(x)) | (got == 0)), f"{codec} denormals: {x} -> {got}"
    assert np.all(np.abs(got) <= 127 * np.float64(scale)), f"{codec} denormals: {got}"
    # So small that max|x| / 127 underflows to 0: every code 0
    scale, got, _ = roundtrip(*f32(10, 0x80000000 | 7))
    assert scale == 0.0 and not got.any(), f"{codec}: scale {scale}, decoded {got}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_q8_rounds_half_to_even(backend):
    # max |x| = 127 gives scale exactly 1: x / scale is x, and the ties are exact.
    x = np.array([127, 2.5, 3.5, -2.5, -3.5, 0.5, -0.5, 1.4999999, -127], np.float32)
    codec = get_codec("q8", backend)
    wire = encode(codec, x)
    assert scale_of(wire) == 1.0
    assert wire[4:].view(np.int8).tolist() == [127, 2, 4, -2, -4, 0, 0, 1, -127]


@given(n=st.integers(0, 40), seed=seeds, magnitude=magnitudes)
@settings(max_examples=50)
def test_q8_reference_is_its_docstring_loop(n, seed, magnitude):
    """The vectorised reference against the plain loop in q8_encode's docstring."""
    x = random_array(seed, n, np.float32, scale=magnitude)
    amax = max((abs(v) for v in x), default=np.float32(0))
    scale = q8_scale(amax)
    codes = [
        int(np.clip(np.rint(v / scale), -127, 127)) if scale > 0 else 0 for v in x
    ]  # float32 v / float32 scale, as documented
    wire = encode(get_codec("q8"), x)
    assert scale_of(wire) == scale and wire[4:].view(np.int8).tolist() == codes


# --- errors a caller can act on ---------------------------------------------------------------


@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_wrong_buffers_are_refused(name, backend):
    codec = get_codec(name, backend)
    x = np.ones(5, np.float32)
    good = np.empty(codec.wire_bytes(5), np.uint8)
    for out in (good[:-1], np.empty(good.size + 1, np.uint8)):
        with pytest.raises(ValueError, match=rf"out has {out.size} bytes.*wire_bytes\(5\)"):
            codec.encode(x, out)
    with pytest.raises(ValueError, match="out must be a 1-D C-contiguous uint8"):
        codec.encode(x, np.empty(good.size, np.int8))
    with pytest.raises(ValueError, match="src must be a 1-D C-contiguous float32"):
        codec.encode(x.astype(np.float64), good)
    with pytest.raises(ValueError, match="src must be a 1-D C-contiguous float32"):
        codec.encode(np.ones((5, 1), np.float32), good)
    with pytest.raises(ValueError, match="non-contiguous"):
        codec.encode(np.ones(10, np.float32)[::2], good)
    codec.encode(x, good)
    with pytest.raises(ValueError, match=r"src has .* bytes, but 4 float32 values"):
        codec.decode(good, np.empty(4, np.float32))
    with pytest.raises(ValueError, match="out must be a 1-D C-contiguous float32"):
        codec.decode(good, np.empty(5, np.float64))
    with pytest.raises(ValueError, match="dst must be a 1-D C-contiguous float32"):
        codec.add_decoded_into(good, [1.0] * 5)


def test_get_codec_errors():
    with pytest.raises(
        ValueError, match="unknown codec 'fp8'; choose one of: none, trunc16, bf16, q8"
    ):
        get_codec("fp8")
    with pytest.raises(
        ValueError, match="unknown codec backend 'tpu'; choose one of: numpy, numba, cuda"
    ):
        get_codec("q8", "tpu")
    for name in ("none", "trunc16", "bf16"):
        with pytest.raises(ValueError, match="stochastic rounding is defined only for q8"):
            get_codec(name, stochastic=True)
    assert repr(get_codec("q8", "numba", stochastic=True)) == (
        "Codec('q8', backend='numba', stochastic=True)"
    )
