"""``hexiscale plan`` on every example cluster (small model, short time limit)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hexiscale.cli.main import main
from planner.cluster import load_cluster
from planner.plan import load_plan
from planner.validate import validate

ROOT = Path(__file__).resolve().parents[2]
CLUSTERS = sorted((ROOT / "examples" / "clusters").glob("*.yaml"))


@pytest.mark.parametrize("cluster", CLUSTERS, ids=lambda p: p.stem)
def test_plan_every_example_cluster(cluster: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    code = main(["plan", str(cluster), "--model", "llama-1.3b", "--seq-len", "1024", "--global-batch", "32",
                 "--time-limit", "3", "-o", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    plan = load_plan(out)
    # the seed flags hold one layer range per stage: an interleaved plan (the search places it where
    # it pays, planner.search.interleaved_variant) says why they cannot express it
    flags = ("seed-style flags: not expressible (pipelines[" if any(p.chunks > 1 for p in plan.pipelines)
             else "seed-style flags: --hetero_configs")
    assert "estimate: step time" in text and flags in text, text
    assert ("layer chunks" in text) == any(p.chunks > 1 for p in plan.pipelines)
    validate(plan, load_cluster(cluster))
    assert plan.estimate is not None and plan.estimate["oom"] == []
    assert plan.model.seq_len == 1024 and plan.global_batch_size == 32


def test_plan_explain_prints_the_search_log(capsys: pytest.CaptureFixture[str]) -> None:
    cluster = ROOT / "examples" / "clusters" / "demo-cpu-6.yaml"
    assert main(["plan", str(cluster), "--model", "tiny", "--global-batch", "8", "--explain"]) == 0
    text = capsys.readouterr().out
    assert "search log" in text and "finalist" in text


def test_plan_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    cluster = ROOT / "examples" / "clusters" / "demo-cpu-6.yaml"
    assert main(["plan", str(cluster), "--model", "llama2-70b", "--global-batch", "8", "--time-limit", "5"]) == 1
    err = capsys.readouterr().err
    assert "error:" in err and "add at least" in err and "Traceback" not in err
    assert main(["plan", str(cluster), "--model", "nope", "--global-batch", "8"]) == 1
    assert "--model" in capsys.readouterr().err


def test_plan_compile_sets_the_option_and_estimate_honors_it(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    cluster = ROOT / "examples" / "clusters" / "demo-cpu-6.yaml"
    out = tmp_path / "plan.json"
    assert main(["plan", str(cluster), "--model", "llama-1.3b", "--seq-len", "1024", "--global-batch", "8",
                 "--time-limit", "3", "--compile", "-o", str(out)]) == 0
    assert "compiled" in capsys.readouterr().out  # the plan table's title
    plan = load_plan(out)
    assert plan.options.compile is True
    from dataclasses import replace

    from planner.cost import GIB, estimate

    eager = replace(plan, options=replace(plan.options, compile=False))
    c = load_cluster(cluster)
    acts = {p.options.compile: max(m.activations for m in estimate(p, c).memory.values()) for p in (plan, eager)}
    assert acts[True] < acts[False]  # estimate/whatif read the option from the plan
    assert main(["estimate", str(out), "--cluster", str(cluster), "--json"]) == 0
    text = capsys.readouterr().out
    got = json.loads(text[text.index("{"):])["memory_detail_gib"]
    assert max(d["activations"] for d in got.values()) == pytest.approx(acts[True] / GIB, abs=1e-3)
    assert main(["estimate", str(out), "--cluster", str(cluster)]) == 0
    assert "compiled blocks (options.compile)" in capsys.readouterr().out


def test_plan_compile_refuses_a_strategy_pool(capsys: pytest.CaptureFixture[str]) -> None:
    cluster = ROOT / "examples" / "clusters" / "demo-cpu-6.yaml"
    assert main(["plan", str(cluster), "--model", "tiny", "--lengths", "synthetic:github", "--step-tokens", "256",
                 "--compile"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --compile:") and "\n" not in err
