"""A per-call time bound for in-process tests: code that runs past it raises :class:`Hang` (a hang
becomes a test failure instead of a stuck suite). Main thread, POSIX only (SIGALRM). ``Hang`` is a
``BaseException``, so no ``except Exception`` (or ``except OSError``, which ``TimeoutError`` is) in
the code under test can swallow it."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


class Hang(BaseException):
    """The code under test ran past its deadline."""


@contextmanager
def deadline(seconds: float, what: str = "call") -> Iterator[None]:
    def expired(signum: int, frame: object) -> None:
        raise Hang(f"{what} ran longer than {seconds:g} s (a hang)")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
