from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.dist_testing import DistPool

POOL_RANKS = 8


@pytest.fixture(scope="session")
def dist_pool() -> Iterator[DistPool]:
    """Eight gloo ranks shared by the multi-process executor tests of this pytest (xdist worker)
    process. The tests carry ``xdist_group("executor-pool")`` so that ``--dist loadgroup`` could
    send them all to one worker; with pytest 9.2 + xdist 3.8 the grouping has no effect (checked),
    so each of the two CI workers may start its own pool — correct either way, one start more."""
    pool = DistPool(POOL_RANKS, timeout=240, preload=("executor.engine", "tests.support.reference", "exec_jobs"))
    yield pool
    pool.close()
