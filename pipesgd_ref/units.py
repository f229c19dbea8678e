"""Units people write on command lines, and the way the project prints them back.

    durations   "50us", "1ms", "0.2s", a plain number of seconds        parse_latency
    bandwidths  "1Gbit", "10Gbit/s", "125MB", "1Gbps", "unlimited"        parse_bandwidth
    sizes       "4KB", "16MB", "1MiB", a plain number of bytes           parse_size

Bits and bytes both appear in the wild (network people write Gbit/s, storage people MB/s); the
parsers accept both and turn them into SI bytes per second, and the formatters print bandwidths
in both. A bad value raises ValueError with examples of what is accepted, so a CLI can show it
as one line. Used by the link emulation, the timing models, `predict` and the tutorials.
"""

from __future__ import annotations

import math
import re

__all__ = [
    "MAX_SECONDS",
    "format_bandwidth",
    "format_bytes",
    "format_seconds",
    "parse_bandwidth",
    "parse_latency",
    "parse_size",
]


_LATENCY_EXAMPLES = "expected a latency like 50us, 1ms, 0.2s (a plain number is seconds)"
_BANDWIDTH_EXAMPLES = (
    "expected a bandwidth like 1Gbit, 10Gbit, 125MB (bits: bit, Kbit, Mbit, Gbit, Tbit, Mbps; "
    "bytes: B, KB, MB, GB, KiB, MiB, GiB; optional '/s'; a plain number is bytes/s; "
    "or 'unlimited')"
)
_SIZE_EXAMPLES = "expected a size like 4KB, 1MB, 64MB, 1MiB or 4096 (a plain number is bytes)"

# The longest latency (and --timeout) accepted: about 11.6 days. Not a network any more, and far
# inside what time.sleep and queue waits accept (int64 nanoseconds: 292 years; a latency of
# 1e12 s there is an OverflowError deep inside a worker, not a message).
MAX_SECONDS = 1e6

# A number (sign allowed so that "-1ms" reports "negative", not "unreadable"), then a unit.
_QUANTITY = re.compile(r"^\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*(\S*?)\s*$")

# Divisors, not factors: 50 / 1e6 rounds to the float 5e-05 that people expect, 50 * 1e-6 does not.
_UNITS_PER_SECOND = {
    "": 1.0,
    "s": 1.0,
    "ms": 1e3,
    "us": 1e6,
    "\u00b5s": 1e6,  # MICRO SIGN, what most keyboards type
    "\u03bcs": 1e6,  # GREEK SMALL LETTER MU, what some fonts and editors produce
    "ns": 1e9,
}

# Byte units: SI prefixes are powers of 1000 (as disks and network specs use them),
# binary prefixes (KiB, MiB, ...) powers of 1024.
_BYTES_PER_UNIT = {
    "": 1,
    "B": 1,
    "KB": 1000,
    "kB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "TiB": 1024**4,
}

# Bit units, as tc and network specs write them: kilo..tera are powers of 1000.
_BIT_PREFIX = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def _split(text: str | float, examples: str) -> tuple[float, str]:
    """Number and unit of `text`; a number passed as a number has the empty unit."""
    if isinstance(text, bool):  # bool is an int subclass; True is not a quantity
        raise ValueError(f"cannot read {text!r}: {examples}")
    if isinstance(text, (int, float)):
        value, unit = float(text), ""
    else:
        match = _QUANTITY.match(str(text))
        if match is None:
            raise ValueError(f"cannot read {text!r}: {examples}")
        value, unit = float(match.group(1)), match.group(2)
    if math.isnan(value):
        raise ValueError(f"cannot read {text!r} (not a number): {examples}")
    return value, unit


def parse_latency(text: str | float) -> float:
    """Seconds in `text`: "0", "50us", "50µs", "1ms", "0.5s", "2e-3" (plain number = seconds)."""
    value, unit = _split(text, _LATENCY_EXAMPLES)
    if unit not in _UNITS_PER_SECOND:
        raise ValueError(f"unknown latency unit {unit!r} in {text!r}: {_LATENCY_EXAMPLES}")
    seconds = value / _UNITS_PER_SECOND[unit]
    if seconds < 0 or not math.isfinite(seconds):
        raise ValueError(f"latency must be finite and >= 0, got {text!r}: {_LATENCY_EXAMPLES}")
    if seconds > MAX_SECONDS:
        raise ValueError(
            f"latency {text!r} is {seconds:.3g} s per message, more than the {MAX_SECONDS:.0e} s "
            f"(11.6 days) this emulator accepts: is the unit right? {_LATENCY_EXAMPLES}"
        )
    return seconds


def _bytes_per_second_unit(unit: str, text: str | float) -> float:
    """Bytes/s of one `unit` ("Gbit", "Mbps", "MB", "MiB/s", ...)."""
    if unit.endswith("/s"):
        unit = unit[:-2]
    lower = unit.lower()
    for bits in ("bit", "bps"):
        # bit units are case-insensitive ("Mbit", "mbit", "MBit"): no one means millibits.
        if lower.endswith(bits) and lower[: -len(bits)] in _BIT_PREFIX:
            return _BIT_PREFIX[lower[: -len(bits)]] / 8
    if unit in _BYTES_PER_UNIT:
        return float(_BYTES_PER_UNIT[unit])
    if lower in ("kb", "mb", "gb", "tb"):
        # "Mb" is megabits to some and megabytes to others: make the person say which.
        prefix = unit[0].upper()
        raise ValueError(
            f"ambiguous bandwidth unit {unit!r} in {text!r}: write {prefix}bit for bits "
            f"or {prefix}B for bytes (e.g. 1Gbit == 125MB)"
        )
    raise ValueError(f"unknown bandwidth unit {unit!r} in {text!r}: {_BANDWIDTH_EXAMPLES}")


def parse_bandwidth(text: str | float) -> float:
    """Bytes per second in `text`: "1Gbit" -> 125e6, "125MB/s" -> 125e6, "unlimited" -> inf.

    Bits: bit, Kbit, Mbit, Gbit, Tbit (any case; also bps, Kbps, Mbps, Gbps). Bytes: B, KB, MB,
    GB, TB (powers of 1000) and KiB, MiB, GiB, TiB (powers of 1024). A "/s" suffix is optional;
    a plain number is bytes/s; "inf" or "unlimited" is math.inf (no bandwidth limit).
    """
    if isinstance(text, str) and text.strip().lower() in ("inf", "unlimited"):
        return math.inf
    value, unit = _split(text, _BANDWIDTH_EXAMPLES)
    bytes_per_second = value * _bytes_per_second_unit(unit, text)
    if not bytes_per_second > 0:
        raise ValueError(f"bandwidth must be > 0, got {text!r}: {_BANDWIDTH_EXAMPLES}")
    return bytes_per_second


def parse_size(text: str | int) -> int:
    """Bytes in `text`: "4KB" -> 4000, "1MiB" -> 1048576, "1.5MB" -> 1500000, "4096" -> 4096."""
    value, unit = _split(text, _SIZE_EXAMPLES)
    if unit not in _BYTES_PER_UNIT:
        raise ValueError(f"unknown size unit {unit!r} in {text!r}: {_SIZE_EXAMPLES}")
    nbytes = value * _BYTES_PER_UNIT[unit]
    if nbytes < 0 or not math.isfinite(nbytes):
        raise ValueError(f"size must be finite and >= 0, got {text!r}: {_SIZE_EXAMPLES}")
    if nbytes != round(nbytes):
        raise ValueError(f"size {text!r} is not a whole number of bytes: {_SIZE_EXAMPLES}")
    return int(round(nbytes))


# ---------------------------------------------------------------------------------------------
# Formatting, for logs and benchmark tables.
# ---------------------------------------------------------------------------------------------


def format_bytes(n: float) -> str:
    """SI size: 812 -> "812 B", 4000 -> "4.0 KB", 16e6 -> "16.0 MB", 0.125 -> "0.125 B"."""
    if 0 < abs(n) < 1:  # a bandwidth of a few bits per second
        return f"{n:.3g} B"
    if abs(n) < 1000:
        return f"{n:.0f} B"
    for unit in ("KB", "MB", "GB", "TB"):
        n /= 1000
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.1f} {unit}"
    raise AssertionError("unreachable")


def format_seconds(s: float) -> str:
    """Human time: 5e-5 -> "50 us", 1.2e-3 -> "1.20 ms", 2.5 -> "2.50 s"."""
    if s != 0 and abs(s) < 1e-6:
        return f"{s * 1e9:.0f} ns"
    if abs(s) < 1e-3:
        return f"{s * 1e6:.0f} us"
    if abs(s) < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def format_bandwidth(bps: float) -> str:
    """Bytes/s as people quote links: 125e6 -> "1 Gbit/s (125.0 MB/s)"; inf -> "unlimited"."""
    if math.isinf(bps):
        return "unlimited"
    bits = bps * 8
    value, unit = bits, "bit"
    for prefix, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(bits) >= scale:
            value, unit = bits / scale, prefix + "bit"
            break
    return f"{value:.3g} {unit}/s ({format_bytes(bps)}/s)"
