"""Every TP layer against its dense twin, forward and backward, on 2 and 4 gloo ranks."""

from __future__ import annotations

import pytest
from exec_jobs import tp_layers_job

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("executor-pool")]


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_layers_match_dense(dist_pool, tp: int) -> None:
    done = dist_pool.run(tp_layers_job, tp)
    assert done[:tp] == [done[0]] * tp and done[0] >= 20
    assert done[tp:] == [0] * (8 - tp)
