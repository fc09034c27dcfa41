"""An elastic job on a strategy pool on 4 GPUs (NCCL), two of them at 50 % of their SMs (MPS
100/100/50/50, ``examples/clusters/h100x4-mps-100-100-50-50.yaml``): slow:1 leaves after step 2
(the supervisor re-plans every strategy of the pool) and joins again after step 4 (the trace gives
the launch pool back), while every step hot-switches between the pool's strategies. Skipped
without 4 CUDA devices and MPS; ``make test-gpu`` runs it on the device machine.

Oracle: the losses equal a checkpoint-restart chain under the same pools at the same step
boundaries to the NCCL suite's 1e-4 (the CPU oracle, ``test_elastic_pool.py``, holds weights and
AdamW moments to 1e-6; on CUDA the embedding backward adds with atomics in no fixed order, and
Adam turns a rounding difference of a near-zero gradient into a step of +-lr).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.train.test_train_jobs import ROOT, hexiscale
from tests.train.test_train_pool import POOL

pytestmark = [pytest.mark.gpu, pytest.mark.gpu_alone, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 4,
                                 reason="needs 4 CUDA devices"),
              pytest.mark.skipif(shutil.which("nvidia-cuda-mps-control") is None, reason="needs MPS")]
CLUSTER = ROOT / "examples" / "clusters" / "h100x4-mps-100-100-50-50.yaml"
DEVICES = {"h100:0": "fast:0", "h100:1": "fast:1", "h100:2": "slow:0", "h100:3": "slow:1"}
TRAIN = ("--step-tokens", "4096", "--lengths", "synthetic:commoncrawl", "--lr", "3e-3", "--warmup", "1",
         "--steps", "6")


@pytest.fixture(scope="module")
def mps_daemon() -> Iterator[None]:
    r = subprocess.run(["nvidia-cuda-mps-control", "-d"], capture_output=True, text=True, timeout=30)
    if r.returncode:
        pytest.skip(f"MPS daemon did not start: {r.stderr.strip() or r.stdout.strip()}")
    yield
    subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, timeout=90, check=False)


def _mps_pool(tmp_path: Path) -> Path:
    """The test pool (dp4, tp4 home) on the MPS cluster's devices, fp32 for the comparison. tp4 is
    home so that short sequences, dispatched to dp4, make a step switch layouts (with dp4 home the
    synthetic lengths all stayed on dp4: no switch, measured on 4x H100 2026-11-27)."""
    data = json.loads(POOL.read_text())
    data["home"] = [s["name"] for s in data["strategies"]].index("tp4")
    for s in data["strategies"]:
        s["plan"]["options"]["dtype"] = "fp32"
        for pipe in s["plan"]["pipelines"]:
            for st in pipe["stages"]:
                st["devices"] = [DEVICES[d] for d in st["devices"]]
    path = tmp_path / "pool-mps.json"
    path.write_text(json.dumps(data))
    return path


def _records(path: Path) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, path.read_text().splitlines())}


def _link(tmp_path: Path, layout: str, tag: str, *extra: str) -> dict[int, dict]:
    mps = ["--sm-percent", "slow=50"] if "slow:" in Path(layout).read_text() else []
    log = tmp_path / f"{tag}.jsonl"
    run = hexiscale("launch", layout, "--local", "--device", "cuda", *mps,
                    "--", "--cluster", str(CLUSTER), *TRAIN, "--checkpoint-dir", str(tmp_path / tag),
                    "--log-jsonl", str(log), *extra)
    assert run.returncode == 0, run.stdout + run.stderr
    return _records(log)


def test_gpu_elastic_pool_leave_and_join_while_hot_switching(tmp_path: Path, mps_daemon: None) -> None:
    pool = _mps_pool(tmp_path)
    trace = tmp_path / "trace.yaml"
    trace.write_text("phases:\n  - steps: 2\n  - steps: 2\n    devices: [fast:0, fast:1, slow:0]\n"
                     f"  - steps: 2\n    devices: [fast:0, fast:1, slow:0, slow:1]\n    plan: {pool.name}\n")
    events, steps = tmp_path / "events.jsonl", tmp_path / "steps.jsonl"
    run = hexiscale("launch", str(pool), "--local", "--device", "cuda", "--sm-percent", "slow=50", "--trace",
                    str(trace), "--cluster", str(CLUSTER), "--elastic-log", str(events), "--", *TRAIN[:-2],
                    "--checkpoint-dir", str(tmp_path / "elastic"), "--save-every", "2", "--log-jsonl", str(steps))
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert "elastic, strategy pool of 2" in out and "[slow:1] handed its state over at step 2" in out
    switches = [e for e in map(json.loads, events.read_text().splitlines()) if e["event"] == "switch"]
    assert [e["step"] for e in switches] == [2, 4]
    assert "slow:1" in switches[0]["leave"] and not switches[0]["join"]
    assert "slow:1" in switches[1]["join"] and not switches[1]["leave"]
    elastic = _records(steps)
    assert sorted(elastic) == [1, 2, 3, 4, 5, 6]
    assert any(r["switch_s"] > 0 for r in elastic.values()), elastic  # hot switching (dp4 <-> tp4) inside steps

    a = tmp_path / "elastic" / "step-000002"  # pool A's, saved before the first switch
    b = _link(tmp_path, switches[0]["layout_file"], "b", "--stop-at", "4", "--resume", str(a))
    c = _link(tmp_path, switches[1]["layout_file"], "c", "--resume", str(tmp_path / "b"))
    chain = {**b, **c}
    assert sorted(chain) == [3, 4, 5, 6]
    assert [elastic[k]["loss"] for k in chain] == pytest.approx([chain[k]["loss"] for k in chain], rel=1e-4)
