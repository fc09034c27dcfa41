"""Every ``hexiscale train`` flag is checked before the first step: out-of-range counts, non-finite
numbers, inconsistent seconds and unusable output paths are one error line naming the flag (exit
1), never a late failure or a silent acceptance."""

from __future__ import annotations

from pathlib import Path

import pytest

from executor.train.preflight_paths import check_output_dir, check_output_file
from hexiscale.cli.main import main
from planner.errors import SpecError

ROOT = Path(__file__).resolve().parents[2]
PLAN = str(ROOT / "examples" / "plans" / "demo-cpu-4-tiny.json")
SEED_FLAGS = ["--cluster", str(ROOT / "examples" / "clusters" / "demo-cpu-6.yaml"), "--model", "tiny",
              "--hetero_configs", "[[1]]", "--layer_partitions", "[[4]]", "--global_bsz_size", "4", "--chunks", "2",
              "--dtype", "fp32", "--device", "cpu"]

BAD = [
    ("--steps", ["--steps", "0"]), ("--steps", ["--steps", "-3"]), ("--save-every", ["--save-every", "-2"]),
    ("--log-every", ["--log-every", "0"]), ("--seed", ["--seed", "-1"]), ("--seed", ["--seed", str(2**64)]),
    ("--warmup", ["--warmup", "-1"]), ("--lr", ["--lr", "0"]), ("--lr", ["--lr", "nan"]), ("--lr", ["--lr", "inf"]),
    ("--min-lr", ["--min-lr", "-1"]), ("--min-lr", ["--lr", "0.1", "--min-lr", "0.2"]),
    ("--weight-decay", ["--weight-decay", "nan"]), ("--clip", ["--clip", "inf"]),
    ("--heartbeat", ["--heartbeat", "-1"]), ("--heartbeat", ["--heartbeat", "inf"]),
    ("--dead-after", ["--dead-after", "1", "--heartbeat", "1"]), ("--hang-after", ["--hang-after", "0"]),
    ("--startup-timeout", ["--startup-timeout", "nan"]), ("--pg-timeout", ["--pg-timeout", "-5"]),
]


@pytest.mark.parametrize(("flag", "argv"), BAD, ids=[" ".join(a) for _, a in BAD])
def test_bad_flag_values_are_one_line_naming_the_flag(flag: str, argv: list[str],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--plan", PLAN, *argv]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {flag}:") and "\n" not in err


def test_output_paths(tmp_path: Path) -> None:
    a_file = tmp_path / "f"
    a_file.write_text("x")
    check_output_dir(str(tmp_path / "new" / "deeper"), "--checkpoint-dir")
    check_output_file(str(tmp_path / "m.jsonl"), "--log-jsonl")
    assert (tmp_path / "m.jsonl").exists()
    for bad in (str(a_file), str(a_file / "sub")):
        with pytest.raises(SpecError, match="--checkpoint-dir"):
            check_output_dir(bad, "--checkpoint-dir")
    for bad in (str(tmp_path), str(tmp_path / "missing" / "m.jsonl"), str(a_file / "m.jsonl")):
        with pytest.raises(SpecError, match="--log-jsonl"):
            check_output_file(bad, "--log-jsonl")


def test_bad_output_paths_fail_in_preflight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "HEXISCALE_FAULT"):
        monkeypatch.delenv(key, raising=False)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["train", *SEED_FLAGS, "--steps", "2", "--checkpoint-dir", str(blocker)]) == 1
    assert "pre-flight: rank 0" in capsys.readouterr().err
    assert main(["train", *SEED_FLAGS, "--steps", "2", "--log-jsonl", str(tmp_path / "no" / "m.jsonl")]) == 1
    assert "--log-jsonl" in capsys.readouterr().err
