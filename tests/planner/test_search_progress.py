"""A long ``hexiscale plan`` search says what it is doing: a line on stderr every few seconds with
the best step time so far; ``--json`` stdout stays pure JSON, and a short search prints nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import planner.search.planner as search_module
from hexiscale.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = str(ROOT / "examples" / "clusters" / "demo-cpu-6.yaml")
ARGV = ["plan", CLUSTER, "--model", "tiny", "--global-batch", "8", "--json"]


def test_a_long_search_reports_progress_on_stderr(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(search_module, "PROGRESS_EVERY_S", 0.0)  # every evaluation is "a few seconds later"
    assert main(ARGV) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["format"] == "hexiscale.plan/1"
    notes = [ln for ln in err.splitlines() if ln.startswith("hexiscale plan: searching, ")]
    assert notes and "candidates costed" in notes[-1] and "s/step so far" in notes[-1]


def test_a_short_search_prints_no_progress(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(ARGV) == 0
    assert "searching" not in capsys.readouterr().err
