"""The elastic benchmark's CPU smoke mode (benchmarks/executor/elastic.py --smoke): a 4 -> 3 -> 4
trace end to end as one elastic job (r4090:2 hands its state over and exits after step 2; a new
process joins after step 4, warms up and receives it; TP 2 -> 1, 1F1B -> GPipe, ZeRO 0 -> 1 -> 0),
and the same events as checkpoint-restart. Both paths' losses equal the dense single-process
reference; the job (two switches, each retiring the old plan's groups after the next step) exits 0."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_elastic_jobs import reference_losses

from benchmarks.executor.elastic import main
from executor.switch.elastic_switch import PARTS

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("hexiscale-jobs")]


def test_smoke_trace_4_to_3_to_4_switches_in_process_and_equals_the_reference(tmp_path: Path,
                                                                               capsys: pytest.CaptureFixture) -> None:
    """The program in its two commands (``--elastic-only``, then ``--restart-only``), and the same elastic
    half continued by ``--plain-steady`` (one elastic job for both: it is most of the CPU time)."""
    assert main(["--smoke", "--elastic-only", "--out", str(tmp_path)]) == 0, capsys.readouterr().out
    capsys.readouterr()
    plain = tmp_path / "plain"
    shutil.copytree(tmp_path / "elastic_work", plain / "elastic_work")
    assert main(["--smoke", "--restart-only", "--out", str(tmp_path)]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "The slowest rank's switch (excl. comm), part by part" in out
    assert "| 1 after step 2 (-r4090:2) | 4 -> 3 |" in out and "| 2 after step 4 (+r4090:2) | 3 -> 4 |" in out
    [res] = [r for r in map(json.loads, (p.read_text() for p in tmp_path.glob("elastic_cpu_smoke_*.json")))
             if r["halves"]]  # the restart half's result (the elastic half wrote its own)
    log = (tmp_path / "elastic_work" / "elastic.log").read_text()
    assert "[r4090:2] handed its state over at step 2; leaving the job" in log
    assert "[r4090:2] warmed up in" in log  # the joiner's warm-up ran (and the losses below are the reference's)
    assert [(e["after_step"], e["ranks"], e["leave"], e["join"]) for e in res["events"]] == [
        (2, "4 -> 3", ["r4090:2"], []), (4, "3 -> 4", [], ["r4090:2"])]
    for e in res["events"]:
        assert e["moved_bytes"] > 0 and e["local_bytes"] > 0 and e["lower_bound_s"] > 0
        assert e["transfer_s"] <= e["switch_s"] and e["comm_setup_s"] > 0
        # the pairs' connecting is reported with the communicator set-up (slowest rank of each part)
        assert set(e["comm_parts_s"]) == {"world_setup_s", "connect_s", "groups_s"}
        assert 0 < e["comm_parts_s"]["connect_s"] <= e["comm_setup_s"], e
        # the slowest rank's switch (excl. comm) part by part, 'other' included: nothing unaccounted
        crit = e["critical_parts_s"]
        assert sum(crit[k] for k in PARTS) == pytest.approx(e["switch_excl_comm_s"], rel=1e-9), e
        # the new plan's engine build is reported apart; where a rank could not build it ahead (the
        # epoch published at the boundary itself: joiners ready late) it is a part of the switch
        assert e["engine_build_s"] > 0 and (e["parts_s"]["engine_late_s"] == 0.0) == e["engine_built_ahead"], e
        assert e["elastic_downtime_s"] is not None and e["restart_downtime_s"] > 0
        # the old plan's groups were destroyed after the new plan's first step, and that time is reported
        assert e["retire_after_step"] == e["after_step"] + 1 and e["retire_s"] > 0, e
        # and every pair of the new world was connected there, ahead of the next switch
        assert e["connect_ahead_s"] > 0, e
    # the leave is published while phase 0 trains: every rank built its next engine between two steps
    assert res["events"][0]["engine_built_ahead"], res["events"][0]
    # the join's boundary comes while the joiner still starts (seconds): the staying ranks plan the move
    # and build their engines while they wait for its go (from plan/<e>), the joiner before it says it
    # is ready: neither is a part of the switch
    join = res["events"][1]
    assert join["wait_for_joiners_s"] > 0 and join["move_planned_ahead"] and join["engine_built_ahead"], join
    assert join["parts_s"]["plan_late_s"] == join["parts_s"]["engine_late_s"] == 0.0, join
    assert [s["plain_step_s"] is not None and s["elastic_step_s"] is not None for s in res["steady"]] == [True] * 3
    ref = reference_losses(6, 6)
    elastic = {int(k): v for k, v in res["elastic_losses"].items()}
    assert sorted(elastic) == [1, 2, 3, 4, 5, 6]
    assert [elastic[k] for k in range(1, 7)] == pytest.approx(ref, rel=1e-5)
    restarted = {int(k): v for run in res["restart_losses"] for k, v in run.items()}
    assert [restarted[k] for k in range(1, 7)] == pytest.approx(ref, rel=1e-5)

    # --plain-steady: each phase's plain launch trains from a fresh start without checkpoints; its records
    # carry the phase's trace steps, the steady ratio is read, no restart downtime is
    assert main(["--smoke", "--restart-only", "--plain-steady", "--out", str(plain)]) == 0, capsys.readouterr().out
    assert "plain launches (steady state): exits [0, 0, 0]" in capsys.readouterr().out
    [path] = plain.glob("elastic_cpu_smoke_*.json")
    res = json.loads(path.read_text())
    assert res["plain_steady"] is True
    assert [sorted(int(k) for k in run) for run in res["restart_losses"]] == [[1, 2], [3, 4], [5, 6]]
    assert [s["ratio"] is not None for s in res["steady"]] == [True] * 3
    assert [e["restart_downtime_s"] for e in res["events"]] == [None, None]
    assert all(e["elastic_downtime_s"] is not None for e in res["events"])
    first = res["restart_losses"][0]
    assert [first["1"], first["2"]] == pytest.approx(reference_losses(6, 6)[:2], rel=1e-5)  # the same start
    assert not list(plain.rglob("step-0*"))  # no checkpoint written
