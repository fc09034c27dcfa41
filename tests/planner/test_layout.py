"""planner.layout's shared rules: the finest common slices and the tensors a stage holds (the cost
model, the search's surrogate and the executor all take them from here)."""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from planner.layout import finest_slices, layer_numel, shard_range, stage_params, stage_tensors
from planner.model import PRESETS


def test_worked_example() -> None:
    assert finest_slices([2, 4]) == [(0, 0), (0, 1), (1, 2), (1, 3)]
    assert finest_slices([3]) == [(0,), (1,), (2,)]


@given(st.lists(st.sampled_from([1, 2, 3, 4, 6, 8]), min_size=1, max_size=5))
def test_every_finest_slice_lies_in_one_shard_of_every_holder(tps: list[int]) -> None:
    slices = finest_slices(tps)
    size = math.lcm(*tps) * 5  # a dimension every degree divides
    width = size // len(slices)
    for j, owners in enumerate(slices):
        for t, r in zip(tps, owners):
            lo, hi = shard_range(size, t, r)
            assert lo <= j * width and (j + 1) * width <= hi


def test_stage_tensors_and_layer_elements_follow_the_parameter_list() -> None:
    for model in (PRESETS["llama2-7b"], PRESETS["tiny"], replace(PRESETS["tiny"], tie_embeddings=True)):
        for first, last in ((True, False), (False, False), (False, True), (True, True)):
            infos = stage_params(model, (0, 3), first, last)
            assert stage_tensors(model, 3, first, last) == len(infos)
        sharded, replicated = layer_numel(model)
        assert sharded + replicated == model.layer_params() and replicated == 2 * model.hidden_size
