"""Saving checkpoints never deletes a folder hexiscale did not write: a ``step-N`` (``step-N.tmp``)
under ``--checkpoint-dir`` that is not ours is refused in pre-flight with one line and left as it
was; only a leftover of our own killed save is cleared, and a checkpoint saved again at the same
step replaces the older one whole."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from executor.state.checkpoint import _finish, _fresh_partial, read_logical, write_logical
from executor.state.checkpoint_verify import PARTIAL, check_checkpoint_dir
from planner.errors import SpecError
from planner.layout import logical_params
from planner.model import PRESETS
from tests.faults.test_corrupted_checkpoint import train

TINY = PRESETS["tiny"]


def _notes(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text("mine\n")
    return folder / "notes.txt"


@pytest.mark.parametrize("name", ["step-000002", "step-000002.tmp"])
def test_preflight_refuses_a_folder_named_like_a_checkpoint(tmp_path: Path, name: str) -> None:
    notes = _notes(tmp_path / name)
    with pytest.raises(SpecError, match="named like a checkpoint but is not one of hexiscale's"):
        check_checkpoint_dir(str(tmp_path))
    assert notes.read_text() == "mine\n"


def test_only_our_own_leftovers_are_cleared(tmp_path: Path) -> None:
    ours = tmp_path / "step-000003.tmp"
    ours.mkdir()
    (ours / PARTIAL).touch()
    (ours / "__0_0.distcp").write_bytes(b"half")
    write_logical(tmp_path / "step-000001", TINY, {i.name: torch.zeros(i.shape) for i in logical_params(TINY)})
    check_checkpoint_dir(str(tmp_path))  # a checkpoint and an unfinished save of ours pass
    _fresh_partial(ours)
    assert sorted(p.name for p in ours.iterdir()) == [PARTIAL]
    theirs = _notes(tmp_path / "step-000004.tmp")
    with pytest.raises(SpecError, match="not an unfinished save of hexiscale's"):
        _fresh_partial(tmp_path / "step-000004.tmp")
    assert theirs.read_text() == "mine\n"


def test_a_save_never_replaces_a_folder_that_is_not_a_checkpoint(tmp_path: Path) -> None:
    write_logical(tmp_path / "new", TINY, {i.name: torch.ones(i.shape) for i in logical_params(TINY)})
    notes = _notes(tmp_path / "step-000001")
    with pytest.raises(SpecError, match="is not a hexiscale checkpoint"):
        _finish(tmp_path / "new", tmp_path / "step-000001", TINY, 1, {}, [{}])
    assert notes.read_text() == "mine\n" and (tmp_path / "new" / "meta.json").is_file()
    write_logical(tmp_path / "new", TINY, {i.name: torch.full(i.shape, 2.0) for i in logical_params(TINY)})
    assert all(bool((t == 2).all()) for _, t in read_logical(tmp_path / "new")[1])  # saved again: the new one wins
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new", "step-000001"]


@pytest.mark.slow
@pytest.mark.xdist_group("hexiscale-jobs")
def test_train_refuses_a_checkpoint_dir_holding_a_foreign_step_folder(tmp_path: Path) -> None:
    notes = _notes(tmp_path / "ck" / "step-000001")
    run = train("--steps", "1", "--checkpoint-dir", str(tmp_path / "ck"))
    err = run.stderr.strip()
    assert run.returncode == 1 and "named like a checkpoint but is not one of hexiscale's" in err, err
    assert "Traceback" not in err and notes.read_text() == "mine\n"
