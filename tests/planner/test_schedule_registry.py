"""The schedule registry (planner.schedules): op orders by hand, the rules derived from them, and
one clear error for an unknown name wherever a schedule can be given."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hexiscale.cli.main import main
from planner.cost import held_with_grads, in_flight, simulate
from planner.errors import SpecError
from planner.schedules import SCHEDULE_NAMES, StageOp, schedule_named
from planner.search.config import PlannerConfig

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "examples" / "plans" / "seed-32gpu-4types-llama2-7b.json"


def _order(text: str) -> list[StageOp]:
    """``"F0 F1 B0"`` as ops."""
    return [StageOp(tok[0], int(tok[1:])) for tok in text.split()]  # type: ignore[arg-type]


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
        r = simulate([1.0, 2.0, 1.5], [2.0, 3.0, 2.5], 5, name, record=True)
        for i in range(3):
            assert [StageOp(k, j) for k, j, _, _ in r.ops[i]] == schedule_named(name).ops(3, i, 5)  # type: ignore[arg-type]


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
