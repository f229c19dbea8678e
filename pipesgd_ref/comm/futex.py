"""Sleep until a word of shared memory changes: Linux's futex, through ctypes.

The shared-memory group (comm/shm_group.py) waits for other processes to write a counter. A
spin keeps a core that, with more ranks than cores, the very rank being waited for needs; a
timed sleep wakes too late. A futex does neither: `wait(address, value, timeout)` sleeps in the
kernel only while the 32-bit word at `address` still holds `value` (checked atomically, so a
write just before the call is never missed), and `wake(address)` wakes everyone asleep on it.
On a mapping shared between processes the kernel keys the word by its page, so a process can
wake another. Two system calls, each about a microsecond; no polling in between.

x86-64 only (the syscall number below; the group runs only there).
"""

from __future__ import annotations

import ctypes

SYS_FUTEX = 202  # x86-64
FUTEX_WAIT, FUTEX_WAKE = 0, 1
EVERYONE = 2**31 - 1

_libc = ctypes.CDLL(None, use_errno=True)  # ctypes releases the GIL during the call
_libc.syscall.restype = ctypes.c_long


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def wait(address: int, value: int, timeout: float) -> None:
    """Sleep while the u32 at `address` equals `value` (low 32 bits), at most `timeout` s.
    Returns on a wake, a changed word, the timeout or a signal: the caller looks again."""
    ts = _Timespec(int(timeout), int((timeout % 1) * 1e9))
    _libc.syscall(
        SYS_FUTEX,
        ctypes.c_void_p(address),
        FUTEX_WAIT,
        ctypes.c_uint32(value & 0xFFFFFFFF),
        ctypes.byref(ts),
        None,
        0,
    )


def wake(address: int) -> None:
    """Wake every process asleep on the word at `address`."""
    _libc.syscall(SYS_FUTEX, ctypes.c_void_p(address), FUTEX_WAKE, EVERYONE, None, None, 0)
