"""The profiler end to end on the CPU (tiny shapes): catalog entry, resume, CLI, link fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from executor.profiler.comm import fit_link  # noqa: E402
from executor.profiler.runner import ProfileConfig, plan_points, run_profile  # noqa: E402
from hexiscale.cli.main import main  # noqa: E402
from planner.catalog import parse_device_entry  # noqa: E402
from planner.model import PRESETS  # noqa: E402


def _cfg(comm_world: int = 0) -> ProfileConfig:
    return ProfileConfig(model=PRESETS["tiny"], dtype="fp32", micro_batches=[1, 2], seq_lens=[16, 32], tps=[1, 2, 3],
                         recompute_points=[(1, 1)], optimizer_layers=[1, 2], warmup=0, repeats=1,
                         comm_world=comm_world, comm_sizes=[2**10, 2**14], cpu=True, sm_percent=None,
                         gemm_dim=32, copy_mib=1)


def test_profile_writes_a_catalog_entry_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "cpu-test.json"
    seen: list[str] = []
    run_profile(_cfg(), out, key="cpu-test", progress=False, on_point=lambda t, p, r: seen.append(t))
    entry = parse_device_entry(json.loads(out.read_text()))
    assert entry.key == "cpu-test" and entry.derived == "measured"
    m = entry.measured
    assert m is not None and m["format"] == "hexiscale.measured/1"
    assert {"gpu_name", "driver", "torch", "date", "sm_percent", "mode"} <= set(m["meta"])
    assert m["meta"]["mode"] == "cpu"
    # tp=3 does not divide the tiny model's heads: skipped; everything else measured once
    expected = plan_points(_cfg())
    assert all(p["tp"] in (1, 2) for _, p in expected)
    assert len(seen) == len(expected)
    layers = m["layer"]
    assert {(r["micro_batch"], r["seq_len"], r["tp"]) for r in layers if r["recompute"] == "none"} == {
        (b, s, t) for b in (1, 2) for s in (16, 32) for t in (1, 2)}
    assert all(r["forward_s"] > 0 and r["backward_s"] > 0 for r in layers)
    assert {r["recompute"] for r in layers} == {"none", "selective", "full"}
    assert all(r["num_params"] > 0 and r["seconds"] > 0 for r in m["optimizer"])
    assert m["ceilings"]["gemm_tflops"] > 0 and m["ceilings"]["copy_GBps"] > 0

    # resume: nothing left to measure, the file is unchanged
    before = out.read_text()
    seen.clear()
    run_profile(_cfg(), out, key="cpu-test", progress=False, on_point=lambda t, p, r: seen.append(t))
    assert seen == [] and out.read_text() == before

    # a partially written file is completed, not redone
    data = json.loads(before)
    data["measured"]["layer"] = data["measured"]["layer"][:3]
    out.write_text(json.dumps(data))
    run_profile(_cfg(), out, key="cpu-test", progress=False, on_point=lambda t, p, r: seen.append(t))
    assert seen == ["layer"] * (len(layers) - 3)


@pytest.mark.slow
def test_profile_comm_sweep_on_two_gloo_ranks(tmp_path: Path) -> None:
    cfg = _cfg(comm_world=2)
    cfg.micro_batches, cfg.seq_lens, cfg.tps, cfg.recompute_points, cfg.optimizer_layers = [1], [16], [1], [], [1]
    out = tmp_path / "c.json"
    run_profile(cfg, out, key="c", progress=False)
    comm = json.loads(out.read_text())["measured"]["comm"]
    assert comm["world"] == 2 and comm["backend"] == "gloo"
    assert [p["bytes"] for p in comm["points"]["p2p"]] == [2**10, 2**14]
    assert [p["bytes"] for p in comm["points"]["allreduce"]] == [2**10, 2**14]
    assert comm["fit"]["allreduce"]["bandwidth_GBps"] > 0
    # the host cost of one TP all-reduce as executor.parallel.tp_layers issues it (the cost model's collective_host_s)
    assert 0 < comm["tp_issue_s"] < 0.1 and "tp_issue_s" not in comm["points"]


@pytest.mark.slow
def test_live_tp_rows_are_measured_on_gloo_ranks_once_beside_the_shard_rows(tmp_path: Path) -> None:
    cfg = _cfg()
    cfg.seq_lens, cfg.tps, cfg.recompute_points, cfg.optimizer_layers = [32], [1, 2], [], [1]
    cfg.live_tps = [1, 2, 3, 4]  # 1 is no TP; 3 and 4 do not divide the tiny model's 2 KV heads
    assert cfg.available_live_tps() == [2]
    assert [p for _, p in plan_points(cfg) if p.get("collectives")] == [
        {"micro_batch": b, "seq_len": 32, "tp": 2, "recompute": "none", "collectives": True} for b in (1, 2)]
    out = tmp_path / "live.json"
    seen: list[dict[str, object]] = []
    run_profile(cfg, out, key="live", progress=False, on_point=lambda t, p, r: seen.append(p))
    layer = json.loads(out.read_text())["measured"]["layer"]
    live = [r for r in layer if r.get("collectives")]
    assert [(r["tp"], r["micro_batch"]) for r in live] == [(2, 1), (2, 2)]
    assert all(r["forward_s"] > 0 and r["backward_s"] > 0 and r["ranks"] == 2 for r in live)
    assert all(r["forward_host_s"] > 0 and r["backward_host_s"] > 0 for r in layer)  # the slowest rank's, live
    assert {(r["tp"], r["micro_batch"]) for r in layer if not r.get("collectives")} == {(1, 1), (1, 2), (2, 1), (2, 2)}
    assert sum(1 for p in seen if p.get("collectives")) == 2
    # resume: a live row and the shard-only row of the same point are two rows; only the missing one runs
    data = json.loads(out.read_text())
    data["measured"]["layer"] = [r for r in layer if not (r.get("collectives") and r["micro_batch"] == 2)]
    out.write_text(json.dumps(data))
    seen.clear()
    run_profile(cfg, out, key="live", progress=False, on_point=lambda t, p, r: seen.append(p))
    assert seen == [{"micro_batch": 2, "seq_len": 32, "tp": 2, "recompute": "none", "collectives": True}]


def test_live_tps_need_the_devices() -> None:
    cfg = _cfg()
    cfg.live_tps = [2]
    cfg.cpu = False  # a GPU profile on a host without as many CUDA devices: no live rows
    import torch

    assert cfg.available_live_tps() == ([2] if torch.cuda.device_count() >= 2 else [])


def test_fit_link_recovers_latency_and_bandwidth() -> None:
    sizes = [4.0**k for k in range(5, 14)]
    lat, bw = 12e-6, 80e9
    p2p = [lat + s / bw for s in sizes]
    fit = fit_link(sizes, p2p, "p2p", 2)
    assert fit["latency_us"] == pytest.approx(12.0, rel=1e-6)
    assert fit["bandwidth_GBps"] == pytest.approx(80.0, rel=1e-6)
    n = 4  # ring all-reduce over 4 ranks: 2(n-1)·α + 2(n-1)/n · B/bw
    ar = [2 * (n - 1) * lat + 2 * (n - 1) / n * s / bw for s in sizes]
    fit = fit_link(sizes, ar, "allreduce", n)
    assert fit["latency_us"] == pytest.approx(12.0, rel=1e-6)
    assert fit["bandwidth_GBps"] == pytest.approx(80.0, rel=1e-6)


def test_cli_profile_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.json"
    rc = main(["profile", "--model", "tiny", "--cpu", "--out", str(out), "--tp", "1", "--micro-batches", "1",
               "--seq-lens", "16", "--repeats", "1", "--quiet", "--sm-percent", "50"])
    assert rc == 0
    entry = json.loads(out.read_text())
    assert entry["sm_percent"] == 50 and entry["measured"]["meta"]["sm_percent"] == 50
    assert "layer forward/backward" in capsys.readouterr().out
    # another SM share into the same file is refused with a hint, not overwritten
    assert main(["profile", "--model", "tiny", "--cpu", "--out", str(out), "--tp", "1", "--quiet",
                 "--micro-batches", "1", "--seq-lens", "16", "--repeats", "1"]) == 1
    assert "--no-resume" in capsys.readouterr().err


@pytest.mark.parametrize("argv, flag", [
    (["--tp", "1,x"], "--tp"), (["--sm-percent", "0"], "--sm-percent"), (["--micro-batches", "0"], "--micro-batches"),
])
def test_cli_profile_bad_input_is_one_line(argv: list[str], flag: str, capsys: pytest.CaptureFixture[str],
                                           tmp_path: Path) -> None:
    assert main(["profile", "--model", "tiny", "--cpu", "--out", str(tmp_path / "x.json"), *argv]) == 1
    err = capsys.readouterr().err
    assert flag in err and "Traceback" not in err
