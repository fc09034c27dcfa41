from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.catalog import default_catalog, load_catalog_dir
from planner.errors import SpecError

REQUIRED = ["a100-sxm-40g", "a100-sxm-80g", "a100-pcie-40g", "a100-pcie-80g", "h100-sxm", "h100-pcie", "h800",
            "h20", "a800", "l40s", "v100-sxm2-32g", "rtx3080ti", "rtx3090", "rtx4090", "a10", "t4"]


def test_catalog_has_every_required_type_marked_spec() -> None:
    cat = default_catalog()
    for key in REQUIRED:
        entry = cat.get(key)
        assert entry.memory_gib > 0 and entry.memory_bandwidth_GBps > 0
        assert "datasheet" in entry.source or "whitepaper" in entry.source or "brief" in entry.source
        if entry.derived == "spec":
            assert entry.measured is None
    assert cat.get("H100").key == "h100-sxm"  # alias, case-insensitive
    assert cat.get("rtx4090").peak("bf16") > cat.get("rtx3090").peak("bf16")


def test_unknown_type_suggests() -> None:
    with pytest.raises(SpecError, match="did you mean"):
        default_catalog().get("rtx409")


def test_bad_entry_names_file(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text(json.dumps({"key": "x", "name": "X", "memory_gib": -1, "peak_tflops": {"bf16": 1},
                                                 "memory_bandwidth_GBps": 1, "source": "s", "derived": "spec"}))
    with pytest.raises(SpecError) as info:
        load_catalog_dir(tmp_path)
    assert "x.json" in str(info.value) and info.value.path == "memory_gib"


@pytest.mark.parametrize("where, message", [("missing", "is not a folder"), ("empty", "holds no device profiles")])
def test_profiles_variable_pointing_nowhere_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str,
                                                        message: str) -> None:
    """``$HEXISCALE_PROFILES`` naming no profiles folder would give an empty catalog (every GPU
    type unknown, ``hexiscale devices`` an empty table with exit 0): refused, naming the variable."""
    (tmp_path / "empty" / "devices").mkdir(parents=True)
    monkeypatch.setenv("HEXISCALE_PROFILES", str(tmp_path / where))
    with pytest.raises(SpecError) as info:
        default_catalog()
    assert info.value.path == "HEXISCALE_PROFILES" and message in str(info.value) and str(tmp_path / where) in str(
        info.value)
