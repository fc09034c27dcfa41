"""Corrupted checkpoints never load silently. Pre-flight verification (executor.state.checkpoint_verify)
names what is wrong with a flipped byte, a truncated or missing file, another step's file, a wrong
shape, another model, a step that disagrees with its folder, NaN weights under a valid checksum, a
damaged DCP index or meta.json, an index edited to drop or move a tensor (its checksum updated);
``--resume DIR`` then falls back to the newest intact checkpoint with one line saying which was
skipped and why, and a checkpoint named directly is refused."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import zlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from executor.state.checkpoint_index import read_index
from executor.state.checkpoint_verify import verify_files, verify_meta
from planner.errors import SpecError
from planner.model import PRESETS
from tests.support.checkpoint_damage import nan_item_with_valid_checksum

ROOT = Path(__file__).resolve().parents[2]
SEED_FLAGS = ("--cluster", str(ROOT / "examples" / "clusters" / "demo-cpu-6.yaml"), "--model", "tiny",
              "--hetero_configs", "[[1]]", "--layer_partitions", "[[4]]", "--global_bsz_size", "4", "--chunks", "2",
              "--dtype", "fp32", "--device", "cpu")
TINY = PRESETS["tiny"]
DATA = "__0_0.distcp"


def train(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HEXISCALE_", "TORCHELASTIC_"))}
    env.update(OMP_NUM_THREADS="1", WORLD_SIZE="1")
    return subprocess.run([sys.executable, "-m", "hexiscale", "train", *SEED_FLAGS, *argv], env=env,
                          capture_output=True, text=True, timeout=240, cwd=ROOT)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """step-000001 .. step-000003 of a one-rank run (latest: step 3)."""
    ck = tmp_path_factory.mktemp("ck") / "ck"
    run = train("--steps", "3", "--save-every", "1", "--checkpoint-dir", str(ck))
    assert run.returncode == 0, run.stdout + run.stderr
    return ck


def _meta(ck: Path) -> dict:
    return json.loads((ck / "meta.json").read_text())


def _first_item(ck: Path) -> tuple[int, int]:
    off, (length, _) = min(_meta(ck)["checksums"][DATA].items(), key=lambda kv: int(kv[0]))
    return int(off), length


def _flip_byte(ck: Path) -> None:
    off, length = _first_item(ck)
    with open(ck / DATA, "r+b") as f:
        f.seek(off + length // 2)
        byte = f.read(1)
        f.seek(off + length // 2)
        f.write(bytes([byte[0] ^ 0xFF]))


def _edit_meta(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(ck: Path) -> None:
        meta = _meta(ck)
        edit(meta)
        (ck / "meta.json").write_text(json.dumps(meta))
    return apply


def _truncate(ck: Path) -> None:
    with open(ck / DATA, "r+b") as f:
        f.truncate(1000)


def _other_steps_file(ck: Path) -> None:
    shutil.copy(ck.parent / "step-000001" / DATA, ck / DATA)


def _damage_index(ck: Path) -> None:
    size = (ck / ".metadata").stat().st_size  # same length: only the checksum can tell
    (ck / ".metadata").write_bytes(b"cos\nsystem\n(S'touch pwned'\ntR.".ljust(size))  # a pickle that runs a command


def _edit_index(edit: Callable[[Any], None]) -> Callable[[Path], None]:
    """Edit DCP's index and record its new checksum: only comparing it with meta.json can tell."""
    def apply(ck: Path) -> None:
        md = read_index((ck / ".metadata").read_bytes(), ck)
        edit(md)
        data = pickle.dumps(md)
        (ck / ".metadata").write_bytes(data)
        _edit_meta(lambda m: m["checksums"].update({".metadata": {"0": [len(data), zlib.crc32(data)]}}))(ck)
    return apply


def _move_item(md: Any) -> None:
    key = next(k for k in md.storage_data if k.fqn == "model/layers.1.attn.wq.weight")
    md.storage_data[key] = replace(md.storage_data[key], offset=md.storage_data[key].offset + 8)


CORRUPTIONS: dict[str, tuple[Callable[[Path], None], str]] = {
    "flipped byte": (_flip_byte, "does not match its checksum"),
    "truncated file": (_truncate, "truncated"),
    "missing file": (lambda ck: (ck / DATA).unlink(), f"file {DATA} is missing"),
    "another step's file": (_other_steps_file, "does not match its checksum"),
    "NaN weights, valid checksum": (lambda ck: nan_item_with_valid_checksum(ck, DATA), "NaN or infinite values"),
    "damaged DCP index": (_damage_index, "file .metadata does not match its checksum"),
    "wrong shape": (_edit_meta(lambda m: m["tensors"].update({"model/embed.weight": [1, 2]})), "tensors"),
    "another model": (_edit_meta(lambda m: m["model"].update(num_layers=8)), "differ in num_layers"),
    "step of another folder": (_edit_meta(lambda m: m.update(step=2)), "named for step 3 but holds step 2"),
    "data position": (_edit_meta(lambda m: m["extra"]["data"].update(step=1)), "data position is at step 1"),
    "no checksums": (_edit_meta(lambda m: m.pop("checksums")), "no valid checksums"),
    "index drops a tensor": (_edit_index(lambda md: md.state_dict_metadata.pop("optim/exp_avg/lm_head.weight")),
                             "index .metadata has no tensor optim/exp_avg/lm_head.weight (meta.json lists it"),
    "index moves a stored item": (_edit_index(_move_item), "places model/layers.1.attn.wq.weight at offset [0, 0] "
                                  "where meta.json has no stored item"),
    "meta.json garbage": (lambda ck: (ck / "meta.json").write_bytes(b"\xff{"), "meta.json"),
}


def test_intact_checkpoint_verifies(checkpoints: Path) -> None:
    ck = checkpoints / "step-000003"
    meta = verify_meta(ck, TINY)
    verify_files(ck, meta)
    assert sorted(meta["checksums"]) == [".metadata", DATA]


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_every_corruption_is_named(checkpoints: Path, tmp_path: Path, name: str) -> None:
    corrupt, expected = CORRUPTIONS[name]
    ck = tmp_path / "step-000003"
    shutil.copytree(checkpoints / "step-000003", ck)
    shutil.copytree(checkpoints / "step-000001", tmp_path / "step-000001")
    corrupt(ck)
    with pytest.raises(SpecError) as err:
        meta = verify_meta(ck, TINY)
        for rank in range(2):  # two ranks' shares cover every file
            verify_files(ck, meta, rank, 2)
    assert err.value.path == "--resume" and expected in err.value.message, err.value.message
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


@pytest.mark.slow
@pytest.mark.xdist_group("hexiscale-jobs")
def test_resume_falls_back_to_the_newest_intact_checkpoint(checkpoints: Path, tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    shutil.copytree(checkpoints, ck)
    _flip_byte(ck / "step-000003")
    run = train("--steps", "4", "--resume", str(ck))
    assert run.returncode == 0, run.stdout + run.stderr
    lines = [ln for ln in run.stderr.splitlines() if "resume: skipped" in ln]
    assert len(lines) == 1 and "step-000003: file __0_0.distcp does not match its checksum" in lines[0]
    assert f"using {ck / 'step-000002'} (step 2)" in lines[0]
    assert "steps 2..4" in run.stdout and "step 3/4" in run.stdout
    named = train("--steps", "4", "--resume", str(ck / "step-000003"))
    assert named.returncode == 1
    err = named.stderr.strip()
    assert "pre-flight" not in err and "does not match its checksum" in err and "\n" not in err
    assert "Traceback" not in err


@pytest.mark.slow
@pytest.mark.xdist_group("hexiscale-jobs")
def test_resume_at_or_past_steps_is_refused_in_preflight(checkpoints: Path) -> None:
    run = train("--steps", "3", "--resume", str(checkpoints))
    assert run.returncode == 1
    assert "--steps: 3, but the checkpoint" in run.stderr and "already at step 3; nothing was trained" in run.stderr
