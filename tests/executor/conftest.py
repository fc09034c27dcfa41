from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.dist_testing import DistPool

POOL_RANKS = 8
_POOL = pytest.StashKey[DistPool]()


@pytest.fixture(scope="session")
def dist_pool(request: pytest.FixtureRequest) -> Iterator[DistPool]:
    """Eight gloo ranks shared by the multi-process executor tests of this pytest (xdist worker)
    process. The tests carry ``xdist_group("executor-pool")``, inert under CI's ``--dist worksteal``
    (and under loadgroup with pytest 9.2 + xdist 3.8): the modules run first and whole on one worker
    (tests/conftest.py), and the other worker starts its own pool only if it takes some of them over
    at the end — correct either way, one start more."""
    pool = DistPool(POOL_RANKS, timeout=240, preload=("executor.train.engine", "tests.support.reference", "exec_jobs"))
    request.config.stash[_POOL] = pool
    yield pool
    pool.close()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the pool's ranks as this worker leaves the executor tests. Idle ranks are not free:
    each keeps a gloo thread per process group its jobs created, and the two workers' 16 ranks
    burned about one of CI's two cores for the rest of the suite. An executor test that comes later
    starts them again (``DistPool.run`` starts ranks when it has none)."""
    pool = item.config.stash.get(_POOL, None)
    if pool is not None and (nextitem is None or nextitem.path.parent != Path(__file__).parent):
        pool.close()
