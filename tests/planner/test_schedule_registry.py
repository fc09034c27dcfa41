"""The schedule registry (planner.schedules): op orders by hand, the rules derived from them, and
one clear error for an unknown name wherever a schedule can be given."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hexiscale.cli.main import main
from planner.cost import held_with_grads, in_flight, simulate
from planner.errors import SpecError
from planner.interleave import interleaved
from planner.plan import load_plan, save_plan
from planner.schedules import SCHEDULE_NAMES, StageOp, schedule_named
from planner.search.config import PlannerConfig

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "examples" / "plans" / "seed-32gpu-4types-llama2-7b.json"


def _order(text: str) -> list[StageOp]:
    """``"F0 F1 B0"`` as ops."""
    return [StageOp(tok[0], int(tok[1:])) for tok in text.split()]  # type: ignore[arg-type]


def _times(draw: st.DrawFn, stages: int) -> tuple[list[float], list[float], list[float]]:
    """Per-stage forward, backward and its weight-gradient part (W = forward, B the rest)."""
    f = draw(st.lists(st.floats(0.1, 3.0), min_size=stages, max_size=stages))
    b = [x * draw(st.floats(1.8, 3.0)) for x in f]
    return f, b, list(f)


def test_1f1b_orders_by_hand() -> None:
    s = schedule_named("1f1b")
    assert s.ops(3, 0, 4) == _order("F0 F1 F2 B0 F3 B1 B2 B3")
    assert s.ops(3, 1, 4) == _order("F0 F1 B0 F2 B1 F3 B2 B3")
    assert s.ops(3, 2, 4) == _order("F0 B0 F1 B1 F2 B2 F3 B3")
    assert s.ops(4, 0, 2) == _order("F0 F1 B0 B1")  # fewer micro-batches than warm-up slots
    assert s.ops(1, 0, 1) == _order("F0 B0")


def test_gpipe_orders_by_hand() -> None:
    for stage in range(3):
        assert schedule_named("gpipe").ops(3, stage, 3) == _order("F0 F1 F2 B2 B1 B0")


@pytest.mark.parametrize(("name", "stages", "stage", "m", "held", "with_grads"), [
    ("1f1b", 4, 0, 8, 4, 4),  # F0..F3 before B0; a forward follows it
    ("1f1b", 4, 0, 4, 4, 3),  # no forward after the first backward
    ("1f1b", 4, 3, 8, 1, 1),
    ("1f1b", 4, 0, 2, 2, 1),
    ("1f1b", 1, 0, 1, 1, 0),
    ("gpipe", 4, 3, 8, 8, 7),
    ("gpipe", 2, 0, 1, 1, 0),
])
def test_in_flight_and_memory_rules(name: str, stages: int, stage: int, m: int, held: int, with_grads: int) -> None:
    s = schedule_named(name)
    assert (s.in_flight(stages, stage, m), s.held_with_grads(stages, stage, m)) == (held, with_grads)
    assert (in_flight(name, stages, stage, m), held_with_grads(name, stages, stage, m)) == (held, with_grads)


def test_simulator_runs_the_registry_ops() -> None:
    for name in SCHEDULE_NAMES:
        r = simulate([1.0, 2.0, 1.5], [2.0, 3.0, 2.5], 6, name, record=True, wgrad=[0.5, 1.0, 0.5])
        for i in range(3):
            assert [(k, j) for k, j, _, _ in r.ops[i]] == [(op.kind, op.micro_batch)
                                                           for op in schedule_named(name).ops(3, i, 6)]


def _one_line(err: SpecError, field: str) -> None:
    text = str(err)
    assert "\n" not in text and text.startswith(f"{field}: ") and "'zb'" in text
    assert all(n in text for n in SCHEDULE_NAMES), text


def test_unknown_name_is_one_error_everywhere() -> None:
    """Today's cost rules priced an unknown schedule as 1F1B; the search took any name."""
    with pytest.raises(SpecError) as e:
        schedule_named("zb", "pipelines[1].schedule")
    _one_line(e.value, "pipelines[1].schedule")
    for call in (lambda: in_flight("zb", 4, 0, 8), lambda: held_with_grads("zb", 4, 0, 8),
                 lambda: simulate([1.0], [2.0], 2, "zb")):
        with pytest.raises(SpecError) as e:
            call()
        _one_line(e.value, "schedule")
    with pytest.raises(SpecError) as e:
        PlannerConfig(schedules=("1f1b", "zb")).check()
    _one_line(e.value, "schedules")


def test_estimate_refuses_an_unknown_schedule_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(SEED.read_text())
    data["pipelines"][0]["schedule"] = "zb"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    assert main(["estimate", str(bad)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pipelines[0].schedule" in err and "1f1b" in err and "gpipe" in err


def test_zb_h1_orders_by_hand() -> None:
    s = schedule_named("zb-h1")
    assert s.ops(2, 0, 3) == _order("F0 F1 B0 W0 F2 B1 W1 B2 W2")
    assert s.ops(2, 1, 3) == _order("F0 B0 F1 B1 W0 F2 B2 W1 W2")  # holds back its first W
    assert s.ops(4, 3, 5) == _order("F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 W2 W3 W4")
    assert s.ops(4, 0, 2) == _order("F0 F1 B0 W0 B1 W1")
    assert (s.trained, s.chunks) == (True, 1)  # the executor trains it (executor.parallel.weight_grad_store)


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_every_order_runs_each_op_once_after_what_it_needs(name: str) -> None:
    """Per stage: each (micro-batch, chunk)'s F, then its B, then (split backward) its W, each once;
    across stages the simulator finishes every order (no stage waits on an op that waits on it)."""
    s = schedule_named(name)
    for stages in range(1, 6):
        for m in range(1, 9):
            if s.requires is not None and s.requires(stages, m):
                continue
            for i in range(stages):
                ops = s.ops(stages, i, m)
                kinds = sorted({op.kind for op in ops})
                assert sorted(ops, key=lambda o: (o.kind, o.micro_batch, o.chunk)) == [
                    StageOp(k, j, c) for k in kinds for j in range(m) for c in range(s.chunks)]  # type: ignore[arg-type]
                at = {(op.kind, op.micro_batch, op.chunk): n for n, op in enumerate(ops)}
                assert all(at["F", j, c] < at["B", j, c] for j in range(m) for c in range(s.chunks))
                assert all(at["B", j, c] < at["W", j, c] for j in range(m) for c in range(s.chunks)
                           if ("W", j, c) in at)
            simulate([1.0] * stages, [2.0] * stages, m, name, wgrad=[1.0] * stages)


def test_zb_h1_memory_rule_is_1f1b_first_stage_peak() -> None:
    """Activations held until W: every stage holds min(S, m), 1F1B's first-stage peak."""
    s = schedule_named("zb-h1")
    for stages, m in ((4, 8), (4, 2), (3, 3), (1, 1)):
        assert [s.in_flight(stages, i, m) for i in range(stages)] == [min(stages, m)] * stages
        assert max(s.in_flight(stages, i, m) for i in range(stages)) == in_flight("1f1b", stages, 0, m)


@pytest.mark.parametrize(("stages", "m"), [(2, 4), (4, 4), (4, 8), (6, 16)])
def test_zb_h1_bubble_equal_stages(stages: int, m: int) -> None:
    """Equal stages, F = B = W = 1: 1F1B idles (S-1)(F+B+W), ZB-H1 (S-1)(F+B-W) (the paper's)."""
    ones = [1.0] * stages
    zb = simulate(ones, [2.0] * stages, m, "zb-h1", wgrad=ones).makespan
    assert zb == pytest.approx(3 * m + (stages - 1) * 1.0)
    assert simulate(ones, [2.0] * stages, m, "1f1b").makespan == pytest.approx(3 * m + (stages - 1) * 3.0)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_zb_h1_never_slower_than_1f1b(data: st.DataObject) -> None:
    stages, m = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 12))
    f, b, w = _times(data.draw, stages)
    assert simulate(f, b, m, "zb-h1", wgrad=w).makespan <= simulate(f, b, m, "1f1b").makespan * (1 + 1e-9)
    with pytest.raises(ValueError, match="wgrad"):
        simulate(f, b, m, "zb-h1")


def test_estimate_prices_the_smaller_bubbles_below_1f1b(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = load_plan(SEED)  # micro-batches a multiple of the stages, as interleaving needs
    times = {}
    for name in ("1f1b", "zb-h1", "interleaved-1f1b"):
        path = tmp_path / f"{name}.json"
        save_plan(replace(plan, pipelines=tuple(interleaved(p) if name == "interleaved-1f1b" else
                                                replace(p, schedule=name) for p in plan.pipelines)), path)
        capsys.readouterr()
        assert main(["estimate", str(path), "--json"]) == 0
        times[name] = json.loads(capsys.readouterr().out)["step_time_s"]
    assert times["zb-h1"] < times["1f1b"] and times["interleaved-1f1b"] < times["1f1b"], times


def _chunked(text: str) -> list[StageOp]:
    """``"F0.1 B0.1"`` (micro-batch.chunk) as ops."""
    return [StageOp(t[0], int(t[1:].split(".")[0]), int(t.split(".")[1])) for t in text.split()]  # type: ignore[arg-type]


def test_interleaved_orders_by_hand() -> None:
    s = schedule_named("interleaved-1f1b")
    assert s.chunks == 2 and s.trained
    assert s.ops(2, 0, 2) == _chunked("F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0")
    assert s.ops(2, 1, 2) == _chunked("F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 B0.0 B1.0")
    assert s.ops(2, 1, 4)[:6] == _chunked("F0.0 F1.0 F0.1 B0.1 F1.1 B1.1")
    assert [s.in_flight(4, i, 8) for i in range(4)] == [6, 5, 4, 3]  # 11, 9, 7, 5 chunks of 2


@pytest.mark.parametrize(("stages", "m", "v"), [(2, 4, 2), (4, 4, 2), (4, 8, 2), (3, 12, 2), (2, 4, 3), (4, 8, 3)])
def test_interleaved_bubble_equal_stages(stages: int, m: int, v: int) -> None:
    """Equal stages: the fill and drain shrink by the chunk count, (S-1)(F+B)/v (v from the plan)."""
    ones = [1.0] * stages
    t = simulate(ones, [2.0] * stages, m, "interleaved-1f1b", chunks=v).makespan
    assert t == pytest.approx(3 * m + (stages - 1) * 3.0 / v)
    assert t < simulate(ones, [2.0] * stages, m, "1f1b").makespan


def test_interleaved_shape_errors_name_the_field() -> None:
    plan = load_plan(SEED)
    pipes = list(plan.pipelines)
    il = interleaved(pipes[0])
    pipes[0] = replace(il, micro_batches=len(il.stages) * 2 + 1)
    with pytest.raises(SpecError, match=r"^pipelines\[0\]\.micro_batches: interleaved 1F1B needs micro_batches a "
                                        r"multiple of the \d+ stages"):
        replace(plan, pipelines=tuple(pipes))
    one = replace(il, stages=(replace(il.stages[0], layers=(0, 1), chunks=((0, 1),)), *il.stages[1:]))
    with pytest.raises(SpecError, match=r"^pipelines\[0\]\.stages\[0\]\.layers: holds 1 layer range\(s\), "
                                        r"schedule interleaved-1f1b runs 2 layer chunk\(s\) per stage \(hint: give "):
        replace(plan, pipelines=(one, *pipes[1:]))
    with pytest.raises(SpecError, match=r"^pipelines\[0\]\.micro_batches: interleaved 1F1B needs at least 2 stages"):
        replace(plan, pipelines=(interleaved(replace(plan.pipelines[0], stages=(
            replace(plan.pipelines[0].stages[0], layers=(0, 32)),), micro_batches=2)), *pipes[1:]))
