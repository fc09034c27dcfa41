"""benchmarks/executor/p2p_connect.py, the NCCL connection set-up diagnostic: its summary (the
slowest rank's figure of each part, per pair the slower end's), its refusal of an unknown variant,
and the CPU smoke end to end (4 gloo processes of the default variant: a table and JSON)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.executor.p2p_connect import main, summarise


def _rank(scale: float) -> dict[str, float]:
    out = {"init_s": 0.1 * scale, "batch_s": 0.02 * scale, "split_s": 0.03 * scale, "transfer_bytes": 4e9}
    for p, t in (("0-1", 0.5), ("0-2", 0.25), ("1-2", 0.125)):
        out.update({f"connect/{p}": t * scale, f"warm/{p}": t * scale / 100, f"transfer/{p}": t * scale / 10})
    return out


def test_summary_is_the_slowest_ranks_per_part() -> None:
    s = summarise([_rank(1.0), _rank(2.0)])
    assert s["init_s"] == pytest.approx(0.2) and s["batch_s"] == pytest.approx(0.04)
    assert s["connect_max_s"] == pytest.approx(1.0) and s["connect_sum_s"] == pytest.approx(1.75)
    assert s["warm_max_s"] == pytest.approx(0.01)
    assert s["gbps_min"] == pytest.approx(4e9 / 0.1 / 1e9)  # the slowest pair (0-1) at the slower end
    assert s["share_s"] is None and s["lazy_s"] is None  # not measured: none reported
    assert s["pairs"]["0-2"] == {"connect_s": pytest.approx(0.5), "warm_s": pytest.approx(0.005)}


def test_unknown_variant_is_one_line(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    assert main(["--variants", "default,nchannels-9", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --variants: unknown nchannels-9; choose from default,") and "\n" not in err


@pytest.mark.slow
def test_smoke_runs_four_gloo_ranks(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    assert main(["--smoke", "--out", str(tmp_path)]) == 0
    assert "| default |" in capsys.readouterr().out
    [path] = tmp_path.glob("p2p_connect_cpu_smoke_*.json")
    [row] = json.loads(path.read_text())["variants"]
    assert row["variant"] == "default" and set(row["pairs"]) == {"0-1", "0-2", "0-3", "1-2", "1-3", "2-3"}
    assert row["init_s"] > 0 and row["connect_max_s"] > 0 and row["split_s"] > 0 and row["gbps_min"] > 0
