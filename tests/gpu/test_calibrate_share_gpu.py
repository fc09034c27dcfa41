"""GPU half of ``hexiscale calibrate --sm-percent`` (issue 32; the CPU half is
tests/profiler/test_calibrate_shares.py): ``--sm-percent 50,100`` measures the GPU as a 50 % MPS share
and whole, each in its own child process under the MPS daemon, and writes ``<type>-mps50-measured``
beside ``<type>-measured``; the share's layer is slower than the whole GPU's at every micro-batch, and a
cluster naming the share type is planned with the host's share entry. Starts the MPS daemon, so it runs
alone (``gpu_alone``); about two calibrations of llama-1.3b at 1K tokens without the link sweep."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu, pytest.mark.gpu_alone,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              pytest.mark.skipif(shutil.which("nvidia-cuda-mps-control") is None, reason="needs MPS")]

ROOT = Path(__file__).resolve().parents[2]


def _layer_s(entry: dict) -> dict[int, float]:
    """Forward + backward seconds of the single-GPU layer (TP 1, no recompute) per micro-batch."""
    return {r["micro_batch"]: r["forward_s"] + r["backward_s"] for r in entry["measured"]["layer"]
            if r["tp"] == 1 and r["recompute"] == "none" and not r.get("collectives")}


def test_a_50_percent_share_is_calibrated_slower_than_the_whole_gpu(tmp_path: Path) -> None:
    import json

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", None)
    r = subprocess.run([sys.executable, "-m", "hexiscale", "calibrate", "--sm-percent", "50,100", "--model",
                        "llama-1.3b", "--seq-len", "1024", "--comm-ranks", "0", "--quiet", "--force",
                        "--home", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    print(r.stdout[-4000:], r.stderr[-4000:])
    assert r.returncode == 0
    share = sorted((tmp_path / "devices").glob("*-mps50-measured.json"))
    assert len(share) == 1
    full = tmp_path / "devices" / share[0].name.replace("-mps50-measured", "-measured")
    half, whole = json.loads(share[0].read_text()), json.loads(full.read_text())
    assert half["sm_percent"] == 50.0 and half["measured"]["meta"]["sm_percent"] == 50.0
    cal = json.loads((tmp_path / "calibration" / share[0].name).read_text())
    assert cal["applies_to"] == [half["key"], half["key"].removesuffix("-measured")]
    slow, fast = _layer_s(half), _layer_s(whole)
    assert slow.keys() == fast.keys() and slow
    assert all(slow[mb] > 1.2 * fast[mb] for mb in slow), (slow, fast)
