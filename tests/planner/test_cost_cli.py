"""``hexiscale estimate`` on every example plan, and ``hexiscale whatif``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hexiscale.cli.cmd_whatif import scale_batch
from hexiscale.cli.main import main
from planner.errors import SpecError
from planner.plan import load_plan

ROOT = Path(__file__).resolve().parents[2]
PLANS = sorted((ROOT / "examples" / "plans").glob("*.json"))
SEED = ROOT / "examples" / "plans" / "seed-32gpu-4types-llama2-7b.json"
SEED_CLUSTER = ROOT / "examples" / "clusters" / "seed-32gpu-4types.yaml"
FITS = ROOT / "examples" / "plans" / "h20-h800-llama2-13b.json"  # fits its cluster's memory


def _cluster_of(plan_path: Path) -> Path:
    return ROOT / "examples" / "clusters" / f"{load_plan(plan_path).cluster}.yaml"


@pytest.mark.parametrize("plan_path", PLANS, ids=lambda p: p.stem)
def test_estimate_every_example(plan_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", str(plan_path), "--cluster", str(_cluster_of(plan_path)), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["step_time_s"] > 0 and 0 < data["mfu"] <= data["hfu"] < 1
    assert sum(data["breakdown"].values()) == pytest.approx(data["step_time_s"], rel=1e-5)
    assert set(data["memory_gib"]) == set(load_plan(plan_path).devices)
    assert main(["estimate", str(plan_path), "--cluster", str(_cluster_of(plan_path))]) == 0
    out = capsys.readouterr().out
    assert "step time" in out and "bottleneck:" in out and "hint:" in out


def test_estimate_finds_the_cluster_and_saves(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "with-estimate.json"
    assert main(["estimate", str(SEED), "--save", str(out)]) == 0
    saved = load_plan(out)
    assert saved.estimate is not None and saved.estimate["step_time_s"] > 0
    params = tmp_path / "params.json"
    params.write_text(json.dumps({"gemm_efficiency": 0.4}))
    capsys.readouterr()
    assert main(["estimate", str(SEED), "--params", str(params), "--json"]) == 0
    slower = json.loads(capsys.readouterr().out)
    assert slower["step_time_s"] > saved.estimate["step_time_s"]
    params.write_text(json.dumps({"fudge": 1.8}))
    assert main(["estimate", str(SEED), "--params", str(params)]) == 1
    assert "unknown cost parameter" in capsys.readouterr().err


def _whatif(capsys: pytest.CaptureFixture[str], *changes: str) -> dict:  # type: ignore[type-arg]
    capsys.readouterr()
    assert main(["whatif", str(SEED), "--cluster", str(SEED_CLUSTER), "--json", *changes]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_whatif_link_and_gpu_changes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    slow = _whatif(capsys, "--inter-bw", "1.0")
    assert slow["after"]["step_time_s"] > slow["before"]["step_time_s"]
    assert slow["after"]["breakdown"]["dp_sync"] > slow["before"]["breakdown"]["dp_sync"]
    pair = _whatif(capsys, "--link", "a100,r4090=0.5")
    assert pair["after"]["step_time_s"] > pair["before"]["step_time_s"]
    slowed = _whatif(capsys, "--slowdown", "r4090:5=2")
    assert slowed["after"]["step_time_s"] > slowed["before"]["step_time_s"]
    capped = _whatif(capsys, "--cap", "a100:0=60")
    assert capped["after"]["step_time_s"] == capped["before"]["step_time_s"]
    added = _whatif(capsys, "--add-node", "name=x,gpu=a100-sxm-80g,gpus=8,bw=300")
    assert added["unused_devices"] == 8
    frag = tmp_path / "nodes.yaml"
    frag.write_text("- {name: y, gpu: h100, gpus: 4, intra_link: {kind: nvlink, bandwidth_GBps: 400}}\n")
    assert _whatif(capsys, "--add-node", str(frag))["unused_devices"] == 4


def test_whatif_global_batch(capsys: pytest.CaptureFixture[str]) -> None:
    plan = load_plan(SEED)
    doubled = scale_batch(plan, 128)
    assert [p.batch_size for p in doubled.pipelines] == [56, 40, 32]
    assert [p.micro_batches for p in doubled.pipelines] == [28, 40, 32]
    odd = scale_batch(plan, 65)
    assert sum(p.batch_size for p in odd.pipelines) == 65
    with pytest.raises(SpecError, match=r"--global-batch-size: .* \(hint: pass at most (\d+), or a plan") as info:
        scale_batch(plan, 10**7)  # 2,187,500 micro-batches in a pipeline: more than the 100,000 a plan may hold
    largest = int(info.value.hint.split()[3].rstrip(","))
    assert max(p.micro_batches for p in scale_batch(plan, largest).pipelines) <= 100_000  # the hint is right
    with pytest.raises(SpecError, match=f"hint: pass at most {largest},"):
        scale_batch(plan, largest + 1)
    data = _whatif(capsys, "--global-batch", "128")
    assert data["after"]["step_time_s"] > data["before"]["step_time_s"]
    assert data["after"]["tokens_per_s"] >= data["before"]["tokens_per_s"]  # same bubble over more work


@pytest.mark.parametrize("changes, message", [
    (["--remove-node", "r3090"], "no longer fits the changed cluster"),
    (["--remove-node", "nope"], "no node 'nope'"),
    (["--add-node", "name=x,gpu=a100,gpus=two,bw=3"], "bad number"),
    (["--link", "a100=3"], "NODE_A,NODE_B"),
    ([], "no change given"),
    (["--global-batch", "2"], "fewer than the plan's 3 pipelines"),
    (["--global-batch", "10000000"], "--global-batch: 10000000 would give pipelines[0] 2,187,500 micro-batches"),
])
def test_whatif_refusals(changes: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["whatif", str(SEED), "--cluster", str(SEED_CLUSTER), *changes]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_whatif_refuses_a_change_that_runs_out_of_memory(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["whatif", str(FITS), "--cap", "h800-0:3=40"]) == 1
    err = capsys.readouterr().err
    assert "no longer fits after --cap h800-0:3=40:" in err and "h800-0:3 needs" in err and "GiB over" in err
    assert main(["whatif", str(FITS), "--cap", "h800-0:3=75"]) == 0  # needs 70.8 GiB (ZeRO-1 step buffers)


def test_whatif_on_a_plan_already_out_of_memory_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["whatif", str(SEED), "--cluster", str(SEED_CLUSTER), "--inter-bw", "5"]) == 0
    assert "already out of memory" in capsys.readouterr().out
