"""Checkpoints through pre-flight verification (executor.state.checkpoint_verify, what ``train --resume``
runs before anything loads): a mutated ``meta.json``, any flipped byte inside a stored item or
DCP's index, and any truncation is a ``SpecError`` naming ``--resume``, never another exception;
a flip can never pass unnoticed. DCP's index rewritten with random bytes under an updated checksum
(only reading it can tell) is refused the same way, and nothing in it runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from executor.state.checkpoint_verify import verify_files, verify_meta
from planner.errors import SpecError
from planner.model import PRESETS
from tests.support.cli_run import CASE_TIMEOUT_S
from tests.support.deadline import deadline
from tests.support.fuzz_settings import fuzz
from tests.support.fuzz_strategies import mutated

pytestmark = pytest.mark.slow  # the fixture trains two steps in a subprocess
ROOT = Path(__file__).resolve().parents[2]
FUZZ = fuzz(250)
TINY = PRESETS["tiny"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ck = tmp_path_factory.mktemp("ck") / "ck"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HEXISCALE_", "TORCHELASTIC_"))}
    env.update(OMP_NUM_THREADS="1", WORLD_SIZE="1")
    run = subprocess.run([sys.executable, "-m", "hexiscale", "train", "--cluster",
                          str(ROOT / "examples" / "clusters" / "demo-cpu-6.yaml"), "--model", "tiny",
                          "--hetero_configs", "[[1]]", "--layer_partitions", "[[4]]", "--global_bsz_size", "4",
                          "--chunks", "2", "--dtype", "fp32", "--device", "cpu", "--steps", "2",
                          "--checkpoint-dir", str(ck)], env=env, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    return ck / "step-000002"


@pytest.fixture(scope="module")
def work(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    ck = tmp_path_factory.mktemp("work") / "step-000002"
    shutil.copytree(checkpoint, ck)
    return ck


def _verify(ck: Path) -> None:
    with deadline(CASE_TIMEOUT_S, f"verify {ck}"):
        meta = verify_meta(ck, TINY)
        verify_files(ck, meta, 0, 1)


@contextmanager
def damaged(checkpoint: Path, work: Path, name: str) -> Iterator[Path]:
    """``work``'s file ``name`` to damage; put back from ``checkpoint`` afterwards."""
    try:
        yield work / name
    finally:
        shutil.copyfile(checkpoint / name, work / name)


@FUZZ
@given(data=st.data())
def test_mutated_meta_json(checkpoint: Path, work: Path, data: st.DataObject) -> None:
    meta: Any = data.draw(mutated(json.loads((work / "meta.json").read_text())))
    with damaged(checkpoint, work, "meta.json") as path:
        try:
            path.write_text(json.dumps(meta))
        except (ValueError, OverflowError):
            return
        try:
            _verify(work)
        except SpecError as exc:
            assert exc.path == "--resume" and exc.message


@FUZZ
@given(data=st.data())
def test_every_flipped_byte_is_caught(checkpoint: Path, work: Path, data: st.DataObject) -> None:
    meta = json.loads((work / "meta.json").read_text())
    name = data.draw(st.sampled_from(sorted(meta["checksums"])))
    ranges = [(int(off), int(off) + v[0]) for off, v in meta["checksums"][name].items()]
    start, end = data.draw(st.sampled_from(ranges))
    at = data.draw(st.integers(start, end - 1))
    with damaged(checkpoint, work, name) as path:
        raw = bytearray(path.read_bytes())
        raw[at] ^= data.draw(st.integers(1, 255))
        path.write_bytes(bytes(raw))
        with pytest.raises(SpecError) as err:
            _verify(work)
    assert err.value.path == "--resume"


@FUZZ
@given(data=st.data())
def test_every_truncation_is_caught(checkpoint: Path, work: Path, data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(sorted(p.name for p in work.iterdir() if p.name != "meta.json")))
    with damaged(checkpoint, work, name) as path:
        with open(path, "r+b") as f:
            f.truncate(data.draw(st.integers(0, path.stat().st_size - 1)))
        with pytest.raises(SpecError) as err:
            _verify(work)
    assert err.value.path == "--resume"


@fuzz(80)
@given(data=st.data())
def test_index_edited_under_a_valid_checksum(checkpoint: Path, work: Path, data: st.DataObject) -> None:
    raw = bytearray((work / ".metadata").read_bytes())
    for _ in range(data.draw(st.integers(1, 6))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(raw))))
    edited = bytes(raw[:cut])
    meta = json.loads((work / "meta.json").read_text())
    meta["checksums"][".metadata"] = {"0": [len(edited), zlib.crc32(edited)]}
    with damaged(checkpoint, work, ".metadata") as path, damaged(checkpoint, work, "meta.json") as meta_path:
        path.write_bytes(edited)
        meta_path.write_text(json.dumps(meta))
        try:
            _verify(work)
        except SpecError as exc:
            assert exc.path == "--resume" and exc.message
