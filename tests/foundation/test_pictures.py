"""Pictures of plans and steps: ``estimate --plot`` and ``show --plot`` write PNGs that show the
plan's colours, and traces are read strictly."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hexiscale.cli.main import main
from hexiscale.plots.style import UNUSED, pipeline_colour
from planner.errors import SpecError
from planner.plan import load_plan, plan_to_dict
from planner.timeline import trace_timelines

ROOT = Path(__file__).resolve().parents[2]
PLAN4 = ROOT / "examples" / "plans" / "demo-cpu-4-tiny.json"  # 4 of the cluster's 6 devices
CLUSTER6 = ROOT / "examples" / "clusters" / "demo-cpu-6.yaml"
SEED = ROOT / "examples" / "plans" / "seed-32gpu-4types-llama2-7b.json"


def colours(png: Path, min_pixels: int = 500) -> set[str]:
    """The colours (#rrggbb) that fill areas of a PNG (at least ``min_pixels``: no anti-aliasing)."""
    import matplotlib.image

    rgb = (matplotlib.image.imread(png)[..., :3] * 255).round().astype(np.uint8).reshape(-1, 3)
    values, counts = np.unique(rgb, axis=0, return_counts=True)
    return {"#" + bytes(c).hex() for c, n in zip(values, counts) if n >= min_pixels}


def test_estimate_and_show_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    assert main(["estimate", str(SEED), "--plot", str(tmp_path / "est")]) == 0
    out = capsys.readouterr().out
    for name in ("plan-map.png", "timeline-simulated.png"):
        png = tmp_path / "est" / name
        assert f"wrote {png}" in out and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert png.stat().st_size < 300_000
    seed_map = colours(tmp_path / "est" / "plan-map.png")
    assert {pipeline_colour(p) for p in range(3)} <= seed_map and UNUSED not in seed_map  # 3 pipelines, 32/32 used
    assert main(["show", str(PLAN4), "--cluster", str(CLUSTER6), "--plot", str(tmp_path / "show")]) == 0
    small = colours(tmp_path / "show" / "plan-map.png")
    assert {pipeline_colour(0), pipeline_colour(1), UNUSED} <= small and pipeline_colour(2) not in small
    assert not (tmp_path / "show" / "timeline-simulated.png").exists()
    assert main(["show", str(CLUSTER6), "--plot", str(tmp_path / "c")]) == 1
    assert "--plot: draws plans and traces" in capsys.readouterr().err


def test_missing_matplotlib_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["show", str(PLAN4), "--plot", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "pictures need the matplotlib package" in err and "hexiscale[plot]" in err
    assert not list(tmp_path.iterdir())


def _trace(**changes: Any) -> dict[str, Any]:
    events = [["forward", 0, 0.0, 0.1], ["backward", 0, 0.1, 0.3], ["optimizer", -1, 0.3, 0.31]]
    data: dict[str, Any] = {"format": "hexiscale.trace/1", "plan": plan_to_dict(load_plan(PLAN4)),
                            "steps": [{"step": 2, "ranks": [{"rank": r, "events": events} for r in range(4)]}]}
    data.update(changes)
    return data


def test_trace_reading() -> None:
    plan, timelines = trace_timelines(_trace())
    assert plan.world_size == 4 and [t.title for t in timelines] == ["measured step 2"]
    lanes = timelines[0].lanes
    assert [ln.label for ln in lanes] == ["p0 s0 r0", "p1 s0 r1", "p1 s0 r2", "p1 s1 r3"]
    assert timelines[0].makespan == pytest.approx(0.31) and lanes[0].busy("backward") == pytest.approx(0.2)
    bad = [
        (_trace(format="x"), "format"),
        (_trace(steps=[]), "steps"),
        (_trace(steps=[{"step": 1, "ranks": [{"rank": 9, "events": []}]}]), "steps[0].ranks[0].rank"),
        (_trace(steps=[{"step": 1, "ranks": [{"rank": 0, "events": [["nap", 0, 0, 1]]}]}]),
         "steps[0].ranks[0].events[0]"),
    ]
    for data, path in bad:
        with pytest.raises(SpecError) as info:
            trace_timelines(data)
        assert info.value.path == path


def test_show_trace_table_and_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(_trace()))
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "measured step 2: 310.00 ms" in out and "p1 s1 r3" in out
    assert main(["show", str(path), "--step", "5"]) == 1
    assert "step 5 was not traced" in capsys.readouterr().err
    assert main(["validate", str(path)]) == 0
    assert "OK (trace of 1 steps, 4 ranks)" in capsys.readouterr().out
