"""What this rank is doing: named once where an operation starts, read where an error is raised.

Every error of the wire says what was under way, so that a reader of one line knows where the
job stood: "rank 3: no data from rank 2 for 30.0 s during allreduce #7 step 1 (reduce-scatter)".
The operation is named where it starts,

    with doing(f"allreduce #{seq} step {step} (reduce-scatter)"):
        ...receive a segment, add it, forward it...

and an error raised anywhere below reads the name (`current()`), instead of it being passed
down through every call in between.

Each thread has its own name (a context variable): pipe's communication thread runs the ring
while the main thread computes. A link's sending thread sends each frame under the name its
caller had when it queued the frame (comm/sender.py).
"""

from __future__ import annotations

from contextvars import ContextVar, Token

UNNAMED = "a point-to-point message"  # a link used directly, with no operation named

_current: ContextVar[str] = ContextVar("pipesgd_activity", default=UNNAMED)


class doing:
    """Name what this thread does inside the block (the previous name comes back after it).

    A class with __enter__ and __exit__ (named as the function it is used as), not a
    @contextmanager generator: the ring enters one for every frame it sends, and a generator
    costs about three times as much (a generator, a wrapper object, next() twice)."""

    __slots__ = ("what", "token")

    def __init__(self, what: str):
        self.what = what
        self.token: Token[str] | None = None

    def __enter__(self) -> None:
        self.token = _current.set(self.what)

    def __exit__(self, *exc: object) -> None:
        assert self.token is not None  # set by __enter__
        _current.reset(self.token)


def current() -> str:
    """What this thread is doing, as the innermost `doing` named it."""
    return _current.get()
