"""Profile files — this host's measured device entries and calibrations (``$HEXISCALE_HOME``), a
``--params`` file and a Hugging Face ``config.json`` — mutated, through the commands that read
them (``estimate``, ``devices``, ``convert --from-flags``): exit 0 or one error line, never a
traceback or a hang."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.catalog import _cached
from planner.cost.params import CostParams
from tests.support.cli_run import run_cli
from tests.support.fuzz_settings import fuzz
from tests.support.fuzz_strategies import mutated

ROOT = Path(__file__).resolve().parents[2]
DEVICES = ROOT / "planner" / "profiles" / "devices"
MEASURED = json.loads((DEVICES / "h100-sxm-measured.json").read_text())
SPEC = json.loads((DEVICES / "a100-sxm-80g.json").read_text())
CALIBRATION = json.loads((ROOT / "planner" / "profiles" / "calibration" / "h100.json").read_text())
PLAN = str(ROOT / "examples" / "plans" / "h100x4-mps-llama2-13b.json")
CLUSTER = str(ROOT / "examples" / "clusters" / "h100x4-mps-100-100-50-50.yaml")
DEMO_CLUSTER = str(ROOT / "examples" / "clusters" / "demo-cpu-6.yaml")
HF_CONFIG = {"num_hidden_layers": 4, "hidden_size": 64, "intermediate_size": 176, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 32, "rope_theta": 10000.0,
             "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
FUZZ = fuzz(400)


@pytest.fixture
def home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path_factory.mktemp("home")
    (folder / "devices").mkdir()
    (folder / "calibration").mkdir()
    monkeypatch.setenv("HEXISCALE_HOME", str(folder))
    return folder


def _write(path: Path, doc: Any) -> bool:
    try:
        path.write_text(json.dumps(doc))
    except (ValueError, OverflowError):
        return False
    if path.parent.name == "devices":
        _cached.cache_clear()  # the catalog is cached per folder: read the new entry
    return True


@FUZZ
@given(entry=mutated(MEASURED), command=st.sampled_from(["estimate", "devices"]))
def test_mutated_measured_profile(home: Path, entry: Any, command: str) -> None:
    if _write(home / "devices" / "h100-sxm-measured.json", entry):
        run_cli(["estimate", PLAN, "--cluster", CLUSTER] if command == "estimate" else ["devices"])


@FUZZ
@given(entry=mutated(SPEC))
def test_mutated_datasheet_profile(home: Path, entry: Any) -> None:
    if _write(home / "devices" / "a100-sxm-80g.json", entry):
        run_cli(["validate", DEMO_CLUSTER])


@FUZZ
@given(calibration=mutated(CALIBRATION))
def test_mutated_calibration(home: Path, calibration: Any) -> None:
    if _write(home / "calibration" / "h100.json", calibration):
        run_cli(["estimate", PLAN, "--cluster", CLUSTER])


@FUZZ
@given(params=mutated({k: v for k, v in CostParams().to_dict().items() if k in ("gemm_efficiency", "comm_gib",
                                                                                 "fp32_residual", "allreduce_algo")}))
def test_mutated_params_file(home: Path, params: Any) -> None:
    path = home / "params.json"
    if _write(path, params):
        run_cli(["estimate", PLAN, "--cluster", CLUSTER, "--params", str(path)])


@FUZZ
@given(config=mutated(HF_CONFIG))
def test_mutated_hf_config(home: Path, config: Any) -> None:
    path = home / "model" / "config.json"
    path.parent.mkdir(exist_ok=True)
    if _write(path, config):
        run_cli(["convert", "--from-flags", "--cluster", DEMO_CLUSTER, "--model", str(path), "--hetero_configs",
                 "[[2], [1, 2, 1]]", "--layer_partitions", "[[4], [1, 2, 1]]", "--global_bsz_size", "5", "3",
                 "--chunks", "2", "3"])


# a measured row's field -> values outside its range; each is refused naming the row's field
ROW_OUT_OF_RANGE: dict[str, list[Any]] = {
    "micro_batch": [0, -1, 1 << 25, 10**400, 1.5, True], "seq_len": [0, 1 << 25], "tp": [0, 1 << 17],
    "chain": [0, 1001, 2.0], "recompute": ["some", 1],
}


@pytest.mark.parametrize("field", sorted(ROW_OUT_OF_RANGE))
def test_out_of_range_measured_rows_are_refused(home: Path, field: str) -> None:
    for value in ROW_OUT_OF_RANGE[field]:
        entry = json.loads(json.dumps(MEASURED))
        entry["measured"]["layer"][1][field] = value
        assert _write(home / "devices" / "h100-sxm-measured.json", entry)
        outcome = run_cli(["estimate", PLAN, "--cluster", CLUSTER])
        assert outcome.code == 1 and f"measured.layer[1].{field}" in outcome.error, (value, outcome.err)


def test_unreadable_host_calibrations_are_skipped_at_once(home: Path) -> None:
    """A FIFO (``open`` would block for ever) and a document nested 100,000 deep in the calibration
    folder are not calibrations: skipped (the default terms apply), never a hang or a traceback."""
    os.mkfifo(home / "calibration" / "fifo.json")
    (home / "calibration" / "deep.json").write_text('{"applies_to": ["h100-sxm"], "x": ' + "[" * 100_000
                                                    + "]" * 100_000 + "}")
    outcome = run_cli(["estimate", PLAN, "--cluster", CLUSTER], timeout_s=20)
    assert outcome.code == 0 and "calibration" in outcome.out, outcome.err


@pytest.mark.parametrize("command", [["devices"], ["validate", DEMO_CLUSTER], ["estimate", PLAN, "--cluster", CLUSTER]])
def test_profiles_variable_pointing_nowhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]
                                            ) -> None:
    """``$HEXISCALE_PROFILES`` naming a missing folder gave an empty device table and exit 0."""
    monkeypatch.setenv("HEXISCALE_PROFILES", str(tmp_path / "nowhere"))
    _cached.cache_clear()
    try:
        outcome = run_cli(command)
    finally:
        _cached.cache_clear()
    assert outcome.code == 1 and outcome.error.startswith(f"error: HEXISCALE_PROFILES: '{tmp_path / 'nowhere'}'")
