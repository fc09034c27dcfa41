"""``benchmarks/executor/long_context.py`` (issue 35's 64K benchmark): its plan set at 64K on 4x H100
(every layout the issue names, the least recompute that fits, no-recompute rows predicted OOM and not
run), the GPU-time budget, the verdict lines, OOM rows, the CP capability check, one-line errors, and
``--smoke`` end to end on 4 gloo ranks (a CP plan joins automatically once the executor lays out cp)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from benchmarks.executor import long_context_plans as lcp
from benchmarks.executor.long_context import main
from benchmarks.executor.long_context_plans import CP_LAYOUTS, TP_LAYOUTS, Candidate, cp_refusal, ladder
from benchmarks.executor.long_context_report import OOM_MEASURED, result_row, summary, summary_lines
from benchmarks.fidelity.host4 import cluster_for
from planner.cost import ProfileSet
from planner.model import PRESETS
from planner.validate import validate

MODEL = replace(PRESETS["llama-1.3b"], seq_len=65536)


def test_64k_plans_take_the_least_recompute_that_fits_and_say_the_rest_is_predicted_oom() -> None:
    cluster = cluster_for((100,) * 4, "h100-sxm-measured", cpu=False)
    predict = lcp.predictor(cluster, ProfileSet(cluster.catalog))

    def fits(plan: Any) -> bool:
        _, peak, cap, over = predict(plan)
        return not over and peak <= (1 - lcp.HEADROOM) * cap

    assert {lay.name for lay in (*CP_LAYOUTS, *TP_LAYOUTS)} >= {"cp4", "cp2xtp2", "tp4", "tp2xdp2", "tp2xpp2", "pp4"}
    assert [(lay.cp, lay.tp) for lay in CP_LAYOUTS] == [(4, 1), (2, 2)]
    needed_recompute = 0
    for lay in (*CP_LAYOUTS, *TP_LAYOUTS):
        rows = ladder(MODEL, lay, 4, predict)
        for r in rows:
            validate(r.plan, cluster)
            stages = [s for p in r.plan.pipelines for s in p.stages]
            assert {(s.cp, s.tp) for s in stages} == {(lay.cp, lay.tp)} and len(stages) == lay.dp * lay.pp
        run = [r for r in rows if not r.status]
        assert len(run) <= 1 and all(r.status in (lcp.PREDICTED_OOM, lcp.PREDICTED_TIGHT) for r in rows if r not in run)
        assert all(fits(r.plan) for r in run) and not any(fits(r.plan) for r in rows if r not in run)
        if run and run[0].plan.options.recompute != "none":  # the no-recompute sibling is listed, not run
            needed_recompute += 1
            assert rows[0].plan.options.recompute == "none" and rows[0].status
    assert needed_recompute >= 3  # 64K x one sequence per micro-batch: most layouts need recompute to fit 80 GB


def test_a_plan_within_the_headroom_is_not_run_and_the_next_recompute_is() -> None:
    peaks = {"none": 78.0, "selective": 77.0, "full": 40.0}  # of 80 GiB: none over 95 %, none OOM

    def predict(plan: Any) -> tuple[float, float, float, bool]:
        return 1.0, peaks[plan.options.recompute], 80.0, False

    rows = ladder(PRESETS["tiny-8l"], TP_LAYOUTS[0], 4, predict)
    assert [(r.name, r.status) for r in rows] == [("tp4", "predicted within 5% of memory, not run"), ("tp4-full", "")]


def _cand(name: str, source: str, step: float, status: str = "") -> Candidate:
    plan = lcp.layout_plan(PRESETS["tiny-8l"], TP_LAYOUTS[0], 4, "none")
    return Candidate(name, plan, source, step, 1.0, 80.0, status)


def test_budget_keeps_the_planner_and_cp_plans_and_drops_the_slowest_no_cp_first() -> None:
    rows = [_cand("planner", "planner", 10), _cand("tp4", "no-cp", 30), _cand("cp4", "cp", 12),
            _cand("dp4", "no-cp", 9), _cand("pp4", "no-cp", 8, "predicted OOM, not run")]
    # 2 steps each: planner 20 + 10, cp4 24 + 10, dp4 18 + 10 = 92; tp4 would add 70
    out = {r.name: r.status for r in lcp.within_budget(rows, 2, 100)}
    assert out == {"planner": "", "cp4": "", "dp4": "", "tp4": "skipped: over --budget-s 100",
                   "pp4": "predicted OOM, not run"}
    assert [r.status for r in lcp.within_budget(rows[:1], 2, 0)] == [""]  # the first always runs


def _row(name: str, uses_cp: bool, measured: float | None, predicted: float, status: str = "measured",
         source: str = "cp") -> dict[str, Any]:
    r: dict[str, Any] = {"plan": name, "uses_cp": uses_cp, "status": status, "source": source, "predicted_s": predicted,
                         "dp": 1, "pp": 1, "cp": "4" if uses_cp else "1", "tp": "1", "recompute": "none"}
    if measured is not None:
        r.update(measured_s=measured, time_err=predicted / measured - 1)
    return r


def test_verdict_compares_the_planners_cp_plan_with_the_fastest_no_cp_plan() -> None:
    rows = [_row("planner", True, 10.0, 10.5, source="planner"), _row("tp2xdp2-full", False, 14.0, 13.0),
            _row("tp4-full", False, 16.0, 15.0), _row("tp4", False, None, 7.0, "predicted OOM, not run"),
            _row("pp4-full", False, None, 20.0, "skipped: over --budget-s 180")]
    s = summary(rows)
    assert s["best_no_cp_plan"] == "tp2xdp2-full" and s["no_cp_over_cp"] == pytest.approx(1.4)
    assert s["met_speed"] and s["met_prediction"] and s["no_cp_predicted_oom"] == ["tp4"]
    text = "\n".join(summary_lines(s))
    assert "1.40x slower (target >= 1.3x: met)" in text and "pp4-full" in text and "+5.0 %" in text
    rows[1] = _row("tp2xdp2-full", False, 12.0, 10.0)  # 1.2x, and predicted 16.7 % under
    s = summary(rows)
    assert not s["met_speed"] and not s["met_prediction"]


def test_verdict_when_every_no_cp_plan_runs_out_of_memory_or_the_planner_uses_no_cp() -> None:
    rows = [_row("planner", True, 10.0, 10.2, source="planner"),
            _row("tp4-full", False, None, 9.0, OOM_MEASURED), _row("dp4", False, None, 5.0, "predicted OOM, not run")]
    s = summary(rows)
    assert s["met_speed"] and s["no_cp_oom"] == ["tp4-full"]
    assert "every no-CP plan ran out of memory" in "\n".join(summary_lines(s))
    rows = [{**_row("planner", False, 9.0, 9.0, source="planner"), "dp": 4, "recompute": "full", "same_as": "dp4-full"},
            _row("cp4-full", True, 8.0, 8.0)]
    s = summary(rows)
    assert s["cp_plan"] == "cp4-full" and s["best_no_cp_plan"] == "planner"
    assert summary_lines(s)[0].startswith("the planner's plan (dp 4 x pp 1, cp 1, tp 1, recompute full = dp4-full) "
                                          "uses no CP")


def test_an_out_of_memory_error_is_recorded_as_oom_and_others_as_failed() -> None:
    cand = _cand("tp4", "no-cp", 1.0)
    err = "Traceback ...\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB"
    assert result_row(cand, {"error": err, "ranks": []})["status"] == OOM_MEASURED
    failed = result_row(cand, {"error": "Traceback ...\nRuntimeError: boom", "ranks": []})
    assert failed["status"] == "failed: RuntimeError: boom"
    ok = result_row(cand, {"step_time_s": 2.0, "ranks": [{"max_reserved_gib": 3.0, "comm_gib": 0.5,
                                                          "context_gib": 0.5, "max_allocated_gib": 2.5}]})
    assert ok["status"] == "measured" and ok["time_err"] == pytest.approx(-0.5) and ok["measured_peak_gib"] == 4.0
    assert ok["measured_allocated_gib"] == 2.5  # the live-tensor peak beside the reserve


def test_cp_plans_run_only_when_the_layout_places_every_cp_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    import planner.layout

    def covers(plan: Any) -> Any:
        return SimpleNamespace(world_size=2, pipelines=((SimpleNamespace(ranks=(0, 1)),),))

    def refuses(plan: Any) -> Any:
        raise ValueError("stages[0].cp: context parallelism is not trained yet\nmore")

    monkeypatch.setattr(planner.layout, "build_topology", covers)
    assert cp_refusal() is None
    monkeypatch.setattr(planner.layout, "build_topology", refuses)
    assert cp_refusal() == "the executor's layout refuses cp: stages[0].cp: context parallelism is not trained yet"
    monkeypatch.setattr(planner.layout, "build_topology",
                        lambda plan: SimpleNamespace(world_size=1, pipelines=((SimpleNamespace(ranks=(0,)),),)))
    assert "places 1 of a cp=2 stage's 2 ranks" in str(cp_refusal())


def test_bad_arguments_and_a_machine_without_4_gpus_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--plans", "tp3", "--out", str(tmp_path)])
    assert exc.value.code == 2
    if torch.cuda.device_count() < 4:
        with pytest.raises(SystemExit, match="needs 4 GPUs, found .*--smoke.*--dry-run"):
            main(["--out", str(tmp_path)])


def test_dry_run_prices_64k_and_writes_the_table_without_launching(tmp_path: Path, capsys: Any) -> None:
    assert main(["--dry-run", "--out", str(tmp_path)]) == 0
    [path] = tmp_path.glob("long_context_dry-run_*.json")
    data = json.loads(path.read_text())
    rows = data["rows"]
    assert rows[0]["source"] == "planner" and data["meta"]["model"]["seq_len"] == 65536
    assert {r["source"] for r in rows} == {"planner", "cp", "no-cp"}
    assert not any("measured_s" in r for r in rows) and data["meta"]["date"] and data["meta"]["torch"]
    assert any(r["status"] == "predicted OOM, not run" for r in rows)
    # the planner's plan is the fastest that fits (at 64K on H100 DP with full recompute, as 4x H100
    # measured: benchmarks/results/long_context_cuda_20261127T042301Z.json, dp4-full 5.35 s, cp4-full 8.99 s)
    fits = [r for r in rows[1:] if "OOM" not in r["status"]]
    assert fits and rows[0]["predicted_s"] <= min(r["predicted_s"] for r in fits) * 1.001
    reason = data["meta"]["cp_refusal"]
    assert rows[0]["status"] == (f"not run: {reason}" if reason and rows[0]["uses_cp"] else "would run (dry run)")
    assert "| plan | cp | tp |" in capsys.readouterr().out


def test_dry_run_prices_with_a_given_calibration(tmp_path: Path) -> None:
    from planner.calibration.store import save_calibration
    from planner.cost.params import DEFAULT_PARAMS

    cal = tmp_path / "home" / "calibration" / "h100-sxm-measured.json"
    save_calibration(cal, DEFAULT_PARAMS, fitted={}, fits={}, provenance={"date": "2026-11-27"},
                     applies_to=["h100-sxm-measured"])
    out = tmp_path / "out"
    assert main(["--dry-run", "--plans", "tp4", "--calibration", str(cal), "--out", str(out)]) == 0
    [path] = out.glob("long_context_dry-run_*.json")
    assert str(out / "hexiscale-home") in json.loads(path.read_text())["meta"]["priced_by"]


def test_a_planner_cp_plan_is_not_started_before_the_executor_lays_out_cp(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import planner.search

    cp_plan = lcp.layout_plan(MODEL, CP_LAYOUTS[0], 4, "full")
    monkeypatch.setattr(planner.search, "make_plan", lambda *a, **k: cp_plan)
    assert main(["--dry-run", "--plans", "planner", "--out", str(tmp_path)]) == 0
    [path] = tmp_path.glob("long_context_dry-run_*.json")
    data = json.loads(path.read_text())
    [row] = data["rows"]
    assert row["uses_cp"] and row["cp"] == "4"
    reason = data["meta"]["cp_refusal"]
    assert row["status"] == (f"not run: {reason}" if reason else "would run (dry run)")


@pytest.mark.slow
def test_smoke_runs_the_benchmark_on_4_gloo_ranks(tmp_path: Path, capsys: Any) -> None:
    assert main(["--smoke", "--plans", "planner,tp2xdp2,cp4", "--warmup", "0", "--steps", "1",
                 "--out", str(tmp_path)]) == 0
    [path] = tmp_path.glob("long_context_cpu-smoke_*.json")
    data = json.loads(path.read_text())
    rows = {r["plan"]: r for r in data["rows"]}
    measured = [r for r in rows.values() if r["status"] == "measured"]
    assert rows["planner"] in measured and rows["planner"]["vs_planner"] == 1.0
    assert any(r["plan"].startswith("tp2xdp2") for r in measured) or rows["planner"].get("same_as", "") == "tp2xdp2"
    for r in measured:
        assert r["time_err"] == pytest.approx(r["predicted_s"] / r["measured_s"] - 1)
    cp_rows = [r for r in rows.values() if r["uses_cp"]]
    if cp_refusal() is None:  # the executor lays out cp: the smoke measures a CP plan
        assert cp_rows and all(r["status"] == "measured" for r in cp_rows)
    else:
        assert not cp_rows and data["meta"]["cp_refusal"]
    assert "| planner |" in capsys.readouterr().out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 4, reason="needs 4 CUDA GPUs")
def test_the_gpu_path_on_4_gpus_with_a_tiny_model(tmp_path: Path) -> None:
    """The program's CUDA path (GPU type, NCCL ranks, per-process peaks) in ~1 min; the 64K run itself is
    ``python -m benchmarks.executor.long_context --out $OUT`` (one call of about 4 minutes)."""
    assert main(["--model", "tiny-8l", "--seq-len", "2048", "--plans", "planner,tp2xdp2,cp4", "--warmup", "0",
                 "--steps", "1", "--out", str(tmp_path)]) == 0
    [path] = tmp_path.glob("long_context_cuda_*.json")
    data = json.loads(path.read_text())
    measured = [r for r in data["rows"] if r["status"] == "measured"]
    assert data["rows"][0]["source"] == "planner" and data["rows"][0] in measured and data["meta"]["nccl"]
    assert all(r["measured_peak_gib"] > 0 and r["measured_s"] > 0 for r in measured)
    cp_rows = [r for r in data["rows"] if r["uses_cp"]]
    if data["meta"]["cp_refusal"] is None:
        assert cp_rows and all(r in measured for r in cp_rows)
    else:
        assert all(r["status"].startswith(("not run", "predicted")) for r in cp_rows)
