"""Which groups share the default communicator's resources (executor.parallel.split_share): the
gradient-sync groups, never a TP group, TP broadcast, stage-boundary pair or the plan's ranks (a
traffic class issued in another order than the sync groups'); on gloo nothing is split at all."""

from __future__ import annotations

import torch.distributed as dist

from executor.parallel.split_share import shared_sets, split_share_options
from planner.layout import build_topology
from tests.support.random_plans import TINY, named_plan


def test_sync_groups_share_tp_and_p2p_groups_do_not() -> None:
    # pipeline 0: TP 2 on ranks 0-1; pipeline 1: two stages on ranks 2 and 3 (a p2p pair)
    topo = build_topology(named_plan(TINY, [(3, [(["a:0", "a:1"], 4)]), (3, [(["a:2"], 2), (["a:3"], 2)])],
                                     zero=1, micro=1))
    assert shared_sets(topo) == {(0, 2), (0, 3), (1, 2), (1, 3)}
    assert not shared_sets(topo) & {(0, 1), (2, 3), (0, 1, 2, 3)}


def test_a_sync_group_of_the_plans_ranks_is_the_world_not_shared() -> None:
    # three one-rank pipelines: their one sync group is every rank of the plan (the default group)
    topo = build_topology(named_plan(TINY, [(2, [(["a:0"], 4)]), (2, [(["a:1"], 4)]), (2, [(["a:2"], 4)])],
                                     zero=1, micro=1))
    assert {g.ranks for g in topo.sync_groups} == {(0, 1, 2)} and shared_sets(topo) == set()


def test_no_split_options_without_nccl() -> None:
    assert not dist.is_initialized()
    assert split_share_options() is None
