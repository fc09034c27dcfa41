"""A per-call time bound for in-process tests: code that runs past it raises ``TimeoutError`` (a
hang becomes a test failure instead of a stuck suite). Main thread, POSIX only (SIGALRM)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def deadline(seconds: float, what: str = "call") -> Iterator[None]:
    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"{what} ran longer than {seconds:g} s (a hang)")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
