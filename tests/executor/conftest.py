from __future__ import annotations

from collections.abc import Iterator

import pytest

from executor.dist_testing import DistPool

POOL_RANKS = 8


@pytest.fixture(scope="session")
def dist_pool() -> Iterator[DistPool]:
    """Eight gloo ranks shared by every multi-process executor test of this xdist worker (tests
    that use it carry ``xdist_group("executor-pool")`` so one worker runs them all)."""
    pool = DistPool(POOL_RANKS, timeout=240, preload=("executor.engine", "executor.reference", "exec_jobs"))
    yield pool
    pool.close()
