"""Checkpoints through pre-flight verification (executor.checkpoint_verify, what ``train --resume``
runs before anything loads): a mutated ``meta.json``, any flipped byte inside a stored item or
DCP's index, and any truncation is a ``SpecError`` naming ``--resume``, never another exception;
a flip can never pass unnoticed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from executor.checkpoint_verify import verify_files, verify_meta
from planner.errors import SpecError
from planner.model import PRESETS
from tests.support.deadline import deadline
from tests.support.fuzz_settings import fuzz
from tests.support.fuzz_strategies import mutated

pytestmark = pytest.mark.slow  # the fixture trains two steps in a subprocess
ROOT = Path(__file__).resolve().parents[2]
FUZZ = fuzz(400)
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
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("work") / "step-000002"


def _verify(ck: Path) -> None:
    with deadline(20, f"verify {ck}"):
        meta = verify_meta(ck, TINY)
        verify_files(ck, meta, 0, 1)


def _fresh(checkpoint: Path, work: Path) -> Path:
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(checkpoint, work)
    return work


@FUZZ
@given(data=st.data())
def test_mutated_meta_json(checkpoint: Path, work: Path, data: st.DataObject) -> None:
    ck = _fresh(checkpoint, work)
    meta: Any = data.draw(mutated(json.loads((ck / "meta.json").read_text())))
    try:
        (ck / "meta.json").write_text(json.dumps(meta))
    except (ValueError, OverflowError):
        return
    try:
        _verify(ck)
    except SpecError as exc:
        assert exc.path == "--resume" and exc.message


@FUZZ
@given(data=st.data())
def test_every_flipped_byte_is_caught(checkpoint: Path, work: Path, data: st.DataObject) -> None:
    ck = _fresh(checkpoint, work)
    meta = json.loads((ck / "meta.json").read_text())
    name = data.draw(st.sampled_from(sorted(meta["checksums"])))
    ranges = [(int(off), int(off) + v[0]) for off, v in meta["checksums"][name].items()]
    start, end = data.draw(st.sampled_from(ranges))
    at = data.draw(st.integers(start, end - 1))
    raw = bytearray((ck / name).read_bytes())
    raw[at] ^= data.draw(st.integers(1, 255))
    (ck / name).write_bytes(bytes(raw))
    with pytest.raises(SpecError) as err:
        _verify(ck)
    assert err.value.path == "--resume"


@FUZZ
@given(data=st.data())
def test_every_truncation_is_caught(checkpoint: Path, work: Path, data: st.DataObject) -> None:
    ck = _fresh(checkpoint, work)
    name = data.draw(st.sampled_from(sorted(p.name for p in ck.iterdir() if p.name != "meta.json")))
    size = (ck / name).stat().st_size
    with open(ck / name, "r+b") as f:
        f.truncate(data.draw(st.integers(0, size - 1)))
    with pytest.raises(SpecError) as err:
        _verify(ck)
    assert err.value.path == "--resume"
