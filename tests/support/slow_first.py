"""The suite's run order: test modules with multi-process (``slow``) tests first, the rest after.

CI runs ``pytest -n 2 --dist worksteal``: a worker that runs out of tests takes queued ones from
the other's tail. Collected in path order, the slowest jobs (``tests/train``, seconds to a minute
each) came last, so the run ended with one worker on a long job and the other idle. Started first,
they overlap the quick tests, and what is left to share at the end is quick tests. The order is
stable: modules stay whole and in path order within each half, so a module's fixtures and the
executor's rank pool (closed when a worker leaves ``tests/executor``) are set up as before."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, TypeVar


class _Item(Protocol):
    @property
    def path(self) -> Path: ...

    def get_closest_marker(self, name: str) -> object | None: ...


T = TypeVar("T", bound=_Item)


def slow_modules_first(items: Sequence[T]) -> list[T]:
    """``items`` reordered: every module holding a ``slow`` test before every module holding none."""
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    return sorted(items, key=lambda item: item.path not in slow)
