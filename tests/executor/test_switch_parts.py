"""A rank's elastic switch, part by part (executor.switch.elastic_switch.part_times), and the
supervisor's report of it (switch_report): every interval of a rank's switch is in exactly one part
— waits, communicator set-up and a remainder (``other_s``) included — and the report names the
slowest rank with parts that add up to the switch time the target is judged on."""

from __future__ import annotations

from typing import Any

import pytest

from executor.switch.elastic_switch import COMM_PARTS, PARTS, part_times, switch_report
from executor.switch.state_move import SWITCH_PARTS, SwitchStats
from planner.state_move_plan import reshard_plan
from tests.support.random_plans import TINY, named_plan

OLD = named_plan(TINY, [(3, [(["a:0"], 4)]), (3, [(["a:1"], 4)])], zero=1, micro=1)
NEW = named_plan(TINY, [(6, [(["a:0"], 4)])], zero=1, micro=1)


def _moved(scale: float) -> dict[str, Any]:
    """A state move's stats whose parts (distinct values) add up to its total_s."""
    st = SwitchStats(world_setup_s=0.5 * scale, connect_s=0.25 * scale)
    for i, k in enumerate(SWITCH_PARTS):
        setattr(st, k, (i + 1) * 1e-3 * scale)
    st.total_s = sum(getattr(st, k) for k in SWITCH_PARTS) + st.comm_s
    return st.to_dict()


def _rank(device: str, scale: float, engine_late_s: float = 0.0) -> dict[str, Any]:
    """A rank's switch; its engine built ahead (0.35 s, outside the switch) unless ``engine_late_s``."""
    moved = _moved(scale)
    out = part_times(moved, switch_s=moved["total_s"] + 0.9 * scale + engine_late_s, plan_late_s=0.0,
                     engine_late_s=engine_late_s, groups_wait_s=0.05 * scale, attach_total_s=0.4 * scale,
                     groups_s=0.3 * scale, install_s=0.02 * scale)
    return dict(out, device=device, plan_s=0.1, wait_s=0.0, planned_ahead=True, retire_s=0.2,
                connect_ahead_s=0.01, engine_s=engine_late_s or 0.35, engine_ahead=not engine_late_s,
                engine_between_steps_s=0.0 if engine_late_s else 0.35)


@pytest.mark.parametrize("engine_late_s", [0.0, 0.35])
def test_parts_and_comm_parts_add_up_to_the_switch(engine_late_s: float) -> None:
    r = _rank("a:0", 1.0, engine_late_s)
    assert sum(r[k] for k in PARTS) + sum(r[k] for k in COMM_PARTS) == pytest.approx(r["switch_s"], rel=1e-12)
    assert r["switch_excl_comm_s"] == pytest.approx(sum(r[k] for k in PARTS), rel=1e-12)
    assert r["attach_s"] == pytest.approx(0.1) and r["groups_s"] == 0.3  # the groups' creation apart from it
    assert r["engine_late_s"] == engine_late_s  # an engine built in the switch is one of its parts
    # 0.9 s outside the state move: 0.05 waiting, 0.4 creating and attaching groups, 0.02 installing,
    # the rest in other_s (a late engine build is not: it has its own part)
    assert r["other_s"] == pytest.approx(_moved(1.0)["other_s"] + 0.9 - 0.05 - 0.4 - 0.02)


def test_report_gives_the_engine_build_apart_and_says_where_it_ran() -> None:
    ahead = [_rank("a:0", 1.0), _rank("a:1", 2.0)]
    rep = switch_report(reshard_plan(OLD, NEW), ahead, step=5, cluster=None)
    assert rep["engine_s"] == 0.35 and rep["engine_ahead"] and rep["engine_late_s"] == 0.0
    assert rep["engine_between_steps_s"] == 0.35  # where the job waited for it instead
    late = [_rank("a:0", 1.0), _rank("a:1", 2.0, engine_late_s=0.5)]
    rep = switch_report(reshard_plan(OLD, NEW), late, step=5, cluster=None)
    assert rep["engine_s"] == 0.5 and not rep["engine_ahead"]
    assert rep["critical"]["engine_late_s"] == 0.5  # on the slowest rank's path, inside its parts
    assert sum(rep["critical"][k] for k in PARTS) == pytest.approx(rep["switch_excl_comm_s"], rel=1e-12)


def test_report_names_the_slowest_rank_and_its_parts() -> None:
    every = [_rank("a:0", 1.0), _rank("a:1", 3.0)]
    rep = switch_report(reshard_plan(OLD, NEW), every, step=5, cluster=None)
    crit = rep["critical"]
    assert crit["device"] == "a:1"
    assert sum(crit[k] for k in PARTS) == pytest.approx(rep["switch_excl_comm_s"], rel=1e-12)
    assert rep["switch_excl_comm_s"] == every[1]["switch_excl_comm_s"]
    assert {k: rep[k] for k in COMM_PARTS} == {k: every[1][k] for k in COMM_PARTS}
