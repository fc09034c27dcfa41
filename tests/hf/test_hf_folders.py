"""Where ``hexiscale hf import|export`` write: a folder that is not ours is refused and never touched,
an older checkpoint or export is replaced whole (nothing of it left to be read instead) and survives
a failure before the swap, and our import reads the weights ``from_pretrained`` reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from executor.state import checkpoint as checkpoint_module
from executor.state.checkpoint import read_logical, write_logical
from executor.state.hf_convert import export_hf, import_hf
from executor.state.safetensors_io import model_entries, tensor
from hexiscale.cli.main import main
from tests.hf.test_hf_convert import tiny_hf

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hf") / "hf"
    tiny_hf(folder)
    return folder


@pytest.fixture(scope="module")
def cks(hf: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two checkpoints of the same model with different weights."""
    base = tmp_path_factory.mktemp("cks")
    import_hf(hf, base / "a")
    model, stream = read_logical(base / "a")
    write_logical(base / "b", model, {k: v * 2 for k, v in stream})
    return base / "a", base / "b"


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


def test_import_refuses_a_folder_that_is_not_a_checkpoint(hf: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("my notes\n")
    before_hf, before_notes = _tree(hf), _tree(notes)
    assert main(["hf", "import", str(hf), "-o", str(notes)]) == 1
    assert "is not a hexiscale checkpoint" in _one_error_line(capsys)
    assert main(["hf", "import", str(hf), "-o", str(hf)]) == 1  # onto its own source
    assert "is not a hexiscale checkpoint" in _one_error_line(capsys)
    assert _tree(hf) == before_hf and _tree(notes) == before_notes
    (tmp_path / "ck.tmp").mkdir()  # somebody's folder named like our temporary one is left alone
    (tmp_path / "ck.tmp" / "keep.txt").write_text("keep\n")
    assert main(["hf", "import", str(hf), "-o", str(tmp_path / "ck")]) == 0
    assert (tmp_path / "ck.tmp" / "keep.txt").read_text() == "keep\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "ck.tmp", "notes"]


def test_import_replaces_an_older_checkpoint_whole_and_keeps_it_on_failure(
        hf: Path, cks: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "ck"
    model, stream = read_logical(cks[1])
    write_logical(out, model, dict(stream))
    (out / "stale.bin").write_bytes(b"x")  # a file of the older checkpoint only
    before = _tree(out)

    def fail(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")
    monkeypatch.setattr(checkpoint_module, "_finish", fail)
    with pytest.raises(OSError):
        import_hf(hf, out)
    assert _tree(out) == before  # the old one survives a failure before the swap
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]  # no temporary folder left behind
    monkeypatch.undo()
    import_hf(hf, out)
    assert not (out / "stale.bin").exists()
    _, new = read_logical(out)
    _, want = read_logical(cks[0])
    assert all(torch.equal(a[1], b[1]) for a, b in zip(new, want, strict=True))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


@pytest.mark.parametrize("first,second", [(60_000, 2 << 30), (2 << 30, 60_000)],
                         ids=["sharded-then-single", "single-then-sharded"])
def test_export_over_an_earlier_export_reads_the_same_everywhere(cks: tuple[Path, Path], tmp_path: Path,
                                                                  first: int, second: int) -> None:
    out = tmp_path / "out"
    export_hf(cks[0], out, max_shard_bytes=first)
    files = export_hf(cks[1], out, max_shard_bytes=second)
    assert sorted(p.name for p in out.iterdir()) == sorted(f.name for f in files)  # nothing of the first left
    back = transformers.LlamaForCausalLM.from_pretrained(out).state_dict()
    ours = {name: tensor(entry) for name, entry in model_entries(out).items()}
    _, want = read_logical(cks[1])
    assert set(ours) <= set(back)
    for name, value in ours.items():
        assert torch.equal(back[name], value), name
    assert torch.equal(ours["model.embed_tokens.weight"], dict(want)["embed.weight"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_export_refuses_a_used_folder_that_is_not_an_export(hf: Path, cks: tuple[Path, Path], tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("my notes\n")
    before_hf, before_notes = _tree(hf), _tree(notes)
    for folder in (notes, hf):  # hf: transformers wrote it, not us
        assert main(["hf", "export", str(cks[0]), "-o", str(folder)]) == 1
        assert "is not an export of hexiscale hf export" in _one_error_line(capsys)
    assert _tree(hf) == before_hf and _tree(notes) == before_notes
    (tmp_path / "empty").mkdir()
    assert main(["hf", "export", str(cks[0]), "-o", str(tmp_path / "empty")]) == 0


def test_import_reads_what_from_pretrained_reads(hf: Path, cks: tuple[Path, Path], tmp_path: Path) -> None:
    """Both model.safetensors and an index: transformers 5 reads model.safetensors, so do we."""
    mixed = tmp_path / "mixed"
    export_hf(cks[1], mixed, max_shard_bytes=2 << 30)  # model.safetensors: the weights times 2
    for f in hf.iterdir():
        if f.name != "config.json":
            (mixed / f.name).write_bytes(f.read_bytes())  # the index and shards: the original weights
    back = transformers.LlamaForCausalLM.from_pretrained(mixed).state_dict()
    ours = {name: tensor(entry) for name, entry in model_entries(mixed).items()}
    for name, value in ours.items():
        assert torch.equal(back[name], value), name
    weight_map = json.loads((hf / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(ours) == set(weight_map)
