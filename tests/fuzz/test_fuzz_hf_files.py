"""Hugging Face model folders through ``hexiscale hf import``: hostile safetensors headers (a length
of 2**63 or 10**12, mutated JSON), truncated or random files, and indexes that disagree with their
shards (a tensor dropped, moved or named in a missing file) end in exit 0 or one error line naming
the file, never a traceback, a hang or an import of something else than ``from_pretrained`` reads."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from executor.state.checkpoint import write_logical
from executor.state.hf_convert import export_hf
from executor.state.safetensors_io import INDEX, SINGLE
from planner.layout import logical_params
from planner.model import PRESETS
from tests.support.cli_run import run_cli
from tests.support.fuzz_settings import fuzz
from tests.support.fuzz_strategies import mutated

FUZZ = fuzz(60)
TINY = PRESETS["tiny"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(one-file folder, sharded folder) of the tiny model, as ``hf export`` writes them."""
    base = tmp_path_factory.mktemp("hf")
    write_logical(base / "ck", TINY, {i.name: torch.randn(i.shape) for i in logical_params(TINY)})
    export_hf(base / "ck", base / "single")
    export_hf(base / "ck", base / "sharded", max_shard_bytes=100_000)
    return base / "single", base / "sharded"


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def _header_length(n: int) -> Callable[[Path], str]:
    def apply(folder: Path) -> str:
        raw = (folder / SINGLE).read_bytes()
        (folder / SINGLE).write_bytes(struct.pack("<Q", n) + raw[8:])
        return SINGLE
    return apply


def _truncate(keep: float) -> Callable[[Path], str]:
    def apply(folder: Path) -> str:
        raw = (folder / SINGLE).read_bytes()
        (folder / SINGLE).write_bytes(raw[:int(len(raw) * keep)])
        return SINGLE
    return apply


def _edit_index(edit: Callable[[dict[str, str]], None]) -> Callable[[Path], str]:
    def apply(folder: Path) -> str:
        index = json.loads((folder / INDEX).read_text())
        edit(index["weight_map"])
        (folder / INDEX).write_text(json.dumps(index))
        return INDEX
    return apply


def _move(wm: dict[str, str]) -> None:
    other = next(f for f in sorted(set(wm.values())) if f != wm["lm_head.weight"])
    wm["lm_head.weight"] = other


SINGLE_CASES: dict[str, tuple[Callable[[Path], str], str]] = {
    "header length 2**63": (_header_length(2**63), "header too large"),
    "header length 10**12": (_header_length(10**12), "header too large"),
    "header length 2**64-1": (_header_length(2**64 - 1), "header too large"),
    "truncated to 3/4": (_truncate(0.75), "not a valid safetensors file"),
    "truncated to 8 bytes": (_truncate(8 / 1e9), "not a valid safetensors file"),
    "empty": (_truncate(0), "not a valid safetensors file"),
}
SHARDED_CASES: dict[str, tuple[Callable[[Path], str], str]] = {
    "index drops a tensor": (_edit_index(lambda wm: wm.pop("model.layers.1.self_attn.q_proj.weight")),
                             "does not list model.layers.1.self_attn.q_proj.weight, which model-0000"),
    "index moves a tensor": (_move, "lists lm_head.weight in model-0000"),
    "index names a missing file": (_edit_index(lambda wm: wm.update({"lm_head.weight": "gone.safetensors"})),
                                   "lists lm_head.weight in gone.safetensors, which is missing"),
    "index names a file outside": (_edit_index(lambda wm: wm.update({"lm_head.weight": "../x.safetensors"})),
                                   "weight_map must map each tensor name to a file name in the folder"),
}


@pytest.mark.parametrize("name", list(SINGLE_CASES) + list(SHARDED_CASES))
def test_named_hostile_folders(exported: tuple[Path, Path], tmp_path: Path, name: str) -> None:
    if name in SINGLE_CASES:
        damage, expected = SINGLE_CASES[name]
        folder = _copy(exported[0], tmp_path / "hf")
    else:
        damage, expected = SHARDED_CASES[name]
        folder = _copy(exported[1], tmp_path / "hf")
        if damage is _move:
            damage = _edit_index(_move)
    file = damage(folder)
    out = run_cli(["hf", "import", str(folder), "-o", str(tmp_path / "ck")])
    assert out.code == 1 and expected in out.error and file in out.error, out.error
    assert not (tmp_path / "ck").exists()


@FUZZ
@given(data=st.data())
def test_mutated_safetensors_header(exported: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory,
                                    data: st.DataObject) -> None:
    raw = (exported[0] / SINGLE).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header: Any = data.draw(mutated(json.loads(raw[8:8 + n])))
    try:
        blob = json.dumps(header).encode()
    except (ValueError, OverflowError):
        return
    folder = tmp_path_factory.mktemp("case")
    (folder / "config.json").write_bytes((exported[0] / "config.json").read_bytes())
    (folder / SINGLE).write_bytes(struct.pack("<Q", len(blob)) + blob + raw[8 + n:])
    run_cli(["hf", "import", str(folder), "-o", str(folder / "ck")])


@FUZZ
@given(data=st.data())
def test_random_bytes_in_a_safetensors_file(exported: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory,
                                            data: st.DataObject) -> None:
    raw = bytearray((exported[0] / SINGLE).read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, 8 + n + 16))
        raw[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(raw))))
    folder = tmp_path_factory.mktemp("case")
    (folder / "config.json").write_bytes((exported[0] / "config.json").read_bytes())
    (folder / SINGLE).write_bytes(bytes(raw[:cut]))
    run_cli(["hf", "import", str(folder), "-o", str(folder / "ck")])
