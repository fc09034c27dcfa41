"""``benchmarks/executor/mixed_length.py --smoke``: the GPU benchmark's whole path (pool proposal,
HotSPa hand strategies, layouts computed one step ahead and broadcast, hot-switching steps on 4
gloo ranks, the table and the JSON) on tiny shapes. It measures nothing."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.executor.mixed_length import main

pytestmark = [pytest.mark.slow]


def test_smoke_runs_the_benchmark(tmp_path, capsys) -> None:
    assert main(["--smoke", "--dists", "code", "--methods", "hot", "hand", "--out", str(tmp_path)]) == 0
    [path] = tmp_path.glob("mixed_length_cpu-smoke_*.json")
    res = json.loads(path.read_text())
    assert set(res["runs"]) == {"256/code/hot", "256/code/hand"}
    hand = res["runs"]["256/code/hand"]
    assert hand["strategies"] == ["<4,1,1>", "<2,2,1>", "<1,4,1>"] and hand["switch_s"] > 0
    for r in res["runs"].values():
        assert r["tokens_per_s"] > 0 and r["solve_s"] >= 0 and len(r["steps"]) == 2
        assert all(math.isfinite(s["loss"]) and s["tokens"] <= 1024 for s in r["steps"])
    assert res["environment"]["torch"] and res["environment"]["date"]
    assert "| 256 | code | hand |" in capsys.readouterr().out


def test_a_method_past_the_budget_is_skipped_and_said(tmp_path, capsys) -> None:
    assert main(["--smoke", "--dists", "uniform", "--methods", "static", "hand", "--budget-s", "0",
                 "--out", str(tmp_path)]) == 0
    [path] = tmp_path.glob("mixed_length_cpu-smoke_*.json")
    runs = json.loads(path.read_text())["runs"]
    assert "tokens_per_s" in runs["256/uniform/static"]  # the first always runs
    assert runs["256/uniform/hand"]["skipped"].startswith("skipped: past --budget-s")
    assert "skipped: past --budget-s 0" in capsys.readouterr().out
