"""``benchmarks/executor/residual_quality.py --cpu-smoke``: both trainings run on real text and the
JSON records them; on CPU (no autocast) the residual option must change nothing, bit for bit."""

from __future__ import annotations

import json
import math
from pathlib import Path

from benchmarks.executor.residual_quality import batches, corpus_bytes, main


def test_the_corpus_is_real_text_and_the_batches_are_seeded() -> None:
    stream = corpus_bytes(1 << 16)
    assert len(stream) == 1 << 16 and b"def " in stream.tobytes()
    a, b = batches(stream, steps=2, batch=3, seq=8, seed=0), batches(stream, steps=2, batch=3, seq=8, seed=0)
    assert a.shape == (2, 3, 9) and a.equal(b) and int(a.max()) < 256


def test_cpu_smoke_writes_both_runs(tmp_path: Path) -> None:
    assert main(["--cpu-smoke", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("residual_quality_cpu-smoke_*.json")
    data = json.loads(path.read_text())
    fp32, bf16 = data["losses"]["fp32"], data["losses"]["bf16"]
    assert len(fp32) == data["steps"] == 4 and all(math.isfinite(x) for x in fp32)
    assert fp32 == bf16 and data["last_window_gap"] == 0.0
    assert fp32[-1] < fp32[0]
