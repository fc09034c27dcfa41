from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from planner.cluster import load_cluster
from planner.errors import SpecError
from planner.model import PRESETS
from planner.plan import load_plan, uses_chunks
from planner.seed_flags import pad_to, parse_literal, plan_from_flags, plan_to_flags

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = load_cluster(ROOT / "examples" / "clusters" / "demo-cpu-6.yaml")
TINY = PRESETS["tiny"]


def build(**kw):  # noqa: ANN003, ANN201
    args = dict(model=TINY, cluster=CLUSTER, hetero_configs="[[2], [1, 2, 1]]", layer_partitions="[[4], [1, 2, 1]]",
                global_bsz_size=["5", "3"], chunks=["2", "3"], devices_id="[[[0, 0]], [[1], [1, 1], [1]]]")
    args.update(kw)
    return plan_from_flags(**args)


def test_flags_match_the_example_plan() -> None:
    plan = load_plan(ROOT / "examples" / "plans" / "demo-cpu-6-tiny.json")
    built = build()
    assert built.pipelines == plan.pipelines


def test_round_trip_plan_flags_plan() -> None:
    for path in sorted((ROOT / "examples" / "plans").glob("*.json")):
        plan = load_plan(path)
        cluster = load_cluster(ROOT / "examples" / "clusters" / f"{plan.cluster}.yaml")
        if uses_chunks(plan):  # interleaved: the seed flags have one layer range per stage
            with pytest.raises(SpecError, match=r"layer chunks: the seed flags have one layer range per stage"):
                plan_to_flags(plan, cluster)
            continue
        flags = plan_to_flags(plan, cluster)
        again = plan_from_flags(model=plan.model, cluster=cluster, hetero_configs=str(flags.hetero_configs),
                                layer_partitions=str(flags.layer_partitions),
                                global_bsz_size=list(map(str, flags.global_bsz_size)),
                                chunks=" ".join(map(str, flags.chunks)), devices_id=str(flags.devices_id),
                                options=plan.options)
        assert again.pipelines == plan.pipelines, path.name


def test_trailing_commas_and_flat_single_pipeline() -> None:
    plan = build(hetero_configs="[[1, 2, 1],]", layer_partitions="[[1, 2, 1],]", global_bsz_size="4",
                 chunks="2", devices_id=None)
    assert [s.devices for s in plan.pipelines[0].stages] == [("a100:0",), ("a100:1", "r4090:0"), ("r4090:1",)]
    flat = build(hetero_configs="[1, 2, 1]", layer_partitions="[1, 2, 1]", global_bsz_size="4", chunks="2",
                 devices_id=None)
    assert flat.pipelines == plan.pipelines


def test_padding_rule() -> None:
    assert pad_to([8], 3) == [8, 8, 8]
    assert pad_to([8, 4, 2, 1], 2) == [8, 4]
    plan = build(global_bsz_size="[4]", chunks="[2, 1, 1, 1]")  # short batch padded, long chunks truncated
    assert [p.batch_size for p in plan.pipelines] == [4, 4]
    assert [p.micro_batches for p in plan.pipelines] == [2, 1]
    assert plan.global_batch_size == 8


def test_devices_id_local_numbering_in_order_of_appearance() -> None:
    plan = build(devices_id="[[[1, 1]], [[0], [1, 1], [0]]]")
    devs = [s.devices for p in plan.pipelines for s in p.stages]
    assert devs == [("r4090:0", "r4090:1"), ("a100:0",), ("r4090:2", "r4090:3"), ("a100:1",)]


@pytest.mark.parametrize("kw, path", [
    ({"hetero_configs": "[[2], [1, 2"}, "--hetero_configs"),
    ({"layer_partitions": "[[4], [1, 2]]"}, "--layer_partitions[1]"),
    ({"layer_partitions": "[[3], [1, 2, 1]]"}, "--layer_partitions[0]"),
    ({"global_bsz_size": "four"}, "--global_bsz_size"),
    ({"global_bsz_size": "5 ²"}, "--global_bsz_size"),  # a Unicode digit int() refuses
    ({"chunks": "[0]"}, "--chunks[0]"),
    ({"devices_id": "[[[0, 0]], [[1], [1, 1], [7]]]"}, "--devices_id[1][2][0]"),
    ({"devices_id": "[[[0, 0]], [[0], [1, 1], [1]]]"}, "--devices_id[1][0][0]"),
    ({"devices_id": "[[[0]], [[1], [1, 1], [1]]]"}, "--devices_id[0][0]"),
    ({"hetero_configs": "__import__('os')"}, "--hetero_configs"),
])
def test_flag_errors_name_the_flag(kw: dict, path: str) -> None:
    with pytest.raises(SpecError) as info:
        build(**kw)
    assert info.value.path == path, str(info.value)


def test_to_flags_refuses_unexpressible_device_order() -> None:
    plan = build(devices_id="[[[0, 0]], [[1], [1, 1], [1]]]")
    from dataclasses import replace

    from planner.plan import Stage
    p1 = plan.pipelines[1]
    swapped = replace(p1, stages=(Stage(("r4090:1",), 1, (0, 1)), Stage(("r4090:0", "r4090:2"), 2, (1, 3)),
                                  p1.stages[2]))
    bad = replace(plan, pipelines=(plan.pipelines[0], swapped))
    with pytest.raises(SpecError, match="seed's numbering"):
        plan_to_flags(bad, CLUSTER)
    assert plan_to_flags(bad).devices_id is None  # without a cluster: no --devices_id


def test_seed_layout_from_command_line_flags() -> None:
    import argparse

    from planner.seed_layout import SeedLayout, add_seed_flag_arguments

    parser = argparse.ArgumentParser()
    add_seed_flag_arguments(parser)
    parser.set_defaults(model="tiny", seq_len=None, recompute="full", zero=1, dtype="fp32")
    args = parser.parse_args(["--hetero_configs", "[[2], [1, 2, 1]]", "--layer_partitions", "[[4], [1, 2, 1]]",
                              "--global_bsz_size", "5", "3", "--chunks", "2", "3",
                              "--devices_id", "[[[0, 0]], [[1], [1, 1], [1]]]"])
    layout = SeedLayout.from_args(args)
    assert layout.given() == ["hetero_configs", "layer_partitions", "global_bsz_size", "chunks"]
    plan = layout.plan(str(ROOT / "examples" / "clusters" / "demo-cpu-6.yaml"))
    assert plan.pipelines == build().pipelines
    assert (plan.options.recompute, plan.options.zero, plan.options.dtype) == ("full", 1, "fp32")
    assert SeedLayout().given() == []
    with pytest.raises(SpecError, match="--cluster"):
        layout.plan(None)
    with pytest.raises(SpecError, match="--chunks"):
        SeedLayout(hetero_configs="[[1]]", layer_partitions="[[4]]", global_bsz_size=("1",)).plan("x.yaml")


@pytest.mark.parametrize("text,want", [("[[1a]]", None), ("[1and 2]", None), ("[1if 2]", None), ("'\\d'", "\\d")])
def test_literal_parsing_shows_no_python_warning(text: str, want: str | None) -> None:
    """Python 3.12 warns (SyntaxWarning, printed on stderr) while parsing ``1and 2`` or ``'\\d'``: the
    user must see our one line (or nothing, for a valid value) and no Python warning."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        if want is None:
            with pytest.raises(SpecError, match="--devices_id"):
                parse_literal(text, "--devices_id")
        else:
            assert parse_literal(text, "--devices_id") == want
    assert [str(w.message) for w in seen] == []
