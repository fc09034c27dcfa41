"""What ``hexiscale plan`` writes and prints about a plan (issue 31): the plan file records the
calibration each GPU type was estimated with, and the seed-style flags are printed only up to
``SEED_FLAGS_CHARS`` characters unless ``--seed-flags`` asks (8,192 GPUs: a 100 KB line)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hexiscale.cli import cmd_plan
from hexiscale.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
CLUSTERS = ROOT / "examples" / "clusters"


def test_the_plan_file_records_the_calibration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HEXISCALE_HOME", str(tmp_path / "home"))  # the packaged calibrations only
    out = tmp_path / "plan.json"
    assert main(["plan", str(CLUSTERS / "h100x4.yaml"), "--model", "llama-1.3b", "--seq-len", "1024",
                 "--global-batch", "8", "-o", str(out)]) == 0
    capsys.readouterr()
    estimate = json.loads(out.read_text())["estimate"]
    assert estimate["profile_sources"] == {"h100-sxm": "measured"}
    assert estimate["calibration"]["h100-sxm"].startswith("packaged calibration 'h100'")


def test_long_seed_flags_are_printed_only_when_asked(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", str(CLUSTERS / "demo-cpu-6.yaml"), "--model", "tiny", "--global-batch", "8"]
    assert main(args) == 0
    assert "seed-style flags: --hetero_configs" in capsys.readouterr().out  # short: printed
    monkeypatch.setattr(cmd_plan, "SEED_FLAGS_CHARS", 40)
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "--hetero_configs" not in text and "characters (--seed-flags prints them" in text
    assert main([*args, "--seed-flags"]) == 0
    assert "seed-style flags: --hetero_configs" in capsys.readouterr().out
