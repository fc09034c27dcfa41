"""Closed-form schedules against the discrete-event simulator, and the simulator by hand."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cost import (
    bubble_fraction,
    fold_p2p,
    gpipe_time,
    in_flight,
    one_f_one_b_lower_bound,
    one_f_one_b_time,
    pipeline_time,
    simulate,
)
from planner.schedules import schedule_named

times = st.floats(0.01, 5.0)


@st.composite
def pipelines(draw: st.DrawFn, max_stages: int = 6) -> tuple[list[float], list[float], int]:
    s = draw(st.integers(1, max_stages))
    f = draw(st.lists(times, min_size=s, max_size=s))
    b = draw(st.lists(times, min_size=s, max_size=s))
    return f, b, draw(st.integers(1, 16))


def test_simulator_two_stages_by_hand() -> None:
    # stage 0: F0 0-1, F1 1-2, (B0 waits for stage 1) 7-9, B1 13-15
    # stage 1: F0 1-3, B0 3-7, F1 7-9, B1 9-13
    r = simulate([1.0, 2.0], [2.0, 4.0], 2, "1f1b", record=True)
    assert r.makespan == pytest.approx(15.0)
    assert [(k, j, s, e) for k, j, s, e in r.ops[1]] == [("F", 0, 1, 3), ("B", 0, 3, 7), ("F", 1, 7, 9),
                                                        ("B", 1, 9, 13)]
    assert [(k, j) for k, j, _, _ in r.ops[0]] == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    assert r.busy == [6.0, 12.0]
    assert r.last_backward_end == [15.0, 13.0]
    assert one_f_one_b_time([1, 2], [2, 4], 2) == pytest.approx(15.0)
    # GPipe on the same: forward flow shop 1+2+1*2 = 5, backward 2+4+1*4 = 10
    assert simulate([1.0, 2.0], [2.0, 4.0], 2, "gpipe").makespan == pytest.approx(15.0)
    assert gpipe_time([1, 2], [2, 4], 2) == pytest.approx(15.0)


def stage_order(schedule: str, stages: int, stage: int, m: int) -> list[tuple[str, int]]:
    """The registry's op order as (kind, micro-batch) pairs."""
    return [(op.kind, op.micro_batch) for op in schedule_named(schedule).ops(stages, stage, m)]


def test_stage_orders() -> None:
    assert stage_order("1f1b", 4, 0, 6)[:4] == [("F", 0), ("F", 1), ("F", 2), ("F", 3)]
    assert stage_order("1f1b", 4, 3, 6)[:3] == [("F", 0), ("B", 0), ("F", 1)]
    assert stage_order("1f1b", 4, 0, 2) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    assert in_flight("1f1b", 4, 0, 8) == 4 and in_flight("1f1b", 4, 3, 8) == 1 and in_flight("1f1b", 4, 0, 2) == 2
    assert in_flight("gpipe", 4, 3, 8) == 8
    assert stage_order("gpipe", 2, 1, 3) == [("F", 0), ("F", 1), ("F", 2), ("B", 2), ("B", 1), ("B", 0)]


@settings(max_examples=200, deadline=None)
@given(pipelines())
def test_gpipe_closed_form_is_exact(case: tuple[list[float], list[float], int]) -> None:
    f, b, m = case
    assert gpipe_time(f, b, m) == pytest.approx(simulate(f, b, m, "gpipe").makespan, rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(pipelines())
def test_1f1b_exact_when_the_last_stage_is_the_bottleneck(case: tuple[list[float], list[float], int]) -> None:
    f, b, m = case
    top = max(x + y for x, y in zip(f, b, strict=True))
    f[-1], b[-1] = f[-1] + top, b[-1] + top  # make the last stage the slowest
    assert one_f_one_b_time(f, b, m) == pytest.approx(simulate(f, b, m, "1f1b").makespan, rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), times, times, st.integers(1, 16))
def test_1f1b_exact_for_equal_stages(s: int, f: float, b: float, m: int) -> None:
    assert one_f_one_b_time([f] * s, [b] * s, m) == pytest.approx((m + s - 1) * (f + b), rel=1e-9)
    assert simulate([f] * s, [b] * s, m).makespan == pytest.approx((m + s - 1) * (f + b), rel=1e-9)


@settings(max_examples=300, deadline=None)
@given(pipelines(), st.floats(0.5, 4.0))
def test_1f1b_upper_bound_for_equal_backward_ratio(case: tuple[list[float], list[float], int], r: float) -> None:
    f, _, m = case
    b = [r * x for x in f]
    assert simulate(f, b, m, "1f1b").makespan <= one_f_one_b_time(f, b, m) * (1 + 1e-9)


@settings(max_examples=300, deadline=None)
@given(pipelines())
def test_1f1b_lower_bound_always_holds(case: tuple[list[float], list[float], int]) -> None:
    f, b, m = case
    assert one_f_one_b_lower_bound(f, b, m) <= simulate(f, b, m, "1f1b").makespan * (1 + 1e-9)


def test_1f1b_closed_form_is_not_a_bound_in_general() -> None:
    """The documented limitation: a middle bottleneck with unequal ratios can exceed the closed form."""
    f, b, m = [0.37, 1.49, 0.49, 1.85, 0.32, 0.35], [3.75, 0.4, 0.54, 2.14, 0.16, 0.47], 2
    assert simulate(f, b, m).makespan > one_f_one_b_time(f, b, m)
    assert simulate(f, b, m).makespan >= one_f_one_b_lower_bound(f, b, m)


@settings(max_examples=100, deadline=None)
@given(pipelines(), st.sampled_from(["1f1b", "gpipe"]))
def test_more_micro_batches_shrink_the_bubble_fraction(case: tuple[list[float], list[float], int],
                                                       schedule: str) -> None:
    f, b, m = case
    assert bubble_fraction(f, b, m + 1, schedule) <= bubble_fraction(f, b, m, schedule) + 1e-12
    # and in the simulator (equal stages: the fraction (S-1)/(m+S-1))
    s = len(f)
    sims = [simulate([f[0]] * s, [b[0]] * s, k, schedule) for k in (m, m + 1)]
    fracs = [1 - max(r.busy) / r.makespan for r in sims]
    assert fracs[1] <= fracs[0] + 1e-12


def test_fold_p2p_and_pipeline_time() -> None:
    f, b = fold_p2p([1.0, 1.0, 1.0], [2.0, 2.0, 2.0], [0.5, 0.25], [0.1, 0.2])
    assert f == [1.5, 1.25, 1.0] and b == [2.0, 2.1, 2.2]
    assert pipeline_time(f, b, 4, "1f1b") == one_f_one_b_time(f, b, 4)
    assert pipeline_time(f, b, 4, "gpipe") == gpipe_time(f, b, 4)
    with pytest.raises(ValueError):
        pipeline_time(f, b, 4, "zb")


def test_simulator_uneven_micro_batches() -> None:
    # one stage: the makespan is the sum of every micro-batch's forward and backward
    r = simulate([[3.0, 3.0, 2.0]], [[6.0, 6.0, 4.0]], 3)
    assert r.makespan == pytest.approx(24.0)
