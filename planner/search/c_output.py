"""Keep C libraries' prints off standard output (:func:`stdout_to_stderr`).

METIS (through pymetis) prints ``***Cannot bisect a graph with 0 vertices!`` with ``printf`` when a
recursive bisection runs out of vertices (a partition into nearly as many parts as units); the
partition is still returned and used. Python's ``sys.stdout`` never sees those lines, so
``hexiscale plan --json`` printed them into its JSON. Around such calls file descriptor 1 points
at descriptor 2, and C's stdio buffers are flushed before it is restored (a pipe's ``printf`` output
sits in libc's buffer until then and would reach the real stdout after all)."""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager


def _flush_c_stdio() -> None:
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):  # no libc to load (not Linux/macOS): nothing buffered we can reach
        pass


@contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """While the block runs, what C code writes to file descriptor 1 goes to descriptor 2."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError, AttributeError):  # no descriptor 1 (embedded, closed): leave it be
        yield
        return
    try:
        os.dup2(2, 1)
        yield
    finally:
        _flush_c_stdio()
        os.dup2(saved, 1)
        os.close(saved)
