"""A checkpoint never runs code. DCP's index (``.metadata``) is a pickle; a tampered one whose CRC in
``meta.json`` was updated as pre-flight computes it (so only its contents can tell) is refused with
one line by ``train --resume`` (pre-flight), by loading itself (DCP's path, pre-flight bypassed) and
by ``hf export``, and its payload (``os.system``, ``builtins.exec``, hidden inside real metadata or
not) never runs. The indexes torch 2.11 writes (saved on the GPU machine) still read."""

from __future__ import annotations

import builtins
import json
import os
import pickle
import shutil
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from executor.state.checkpoint import read_logical, write_logical
from executor.state.checkpoint_index import read_index
from executor.state.checkpoint_verify import verify_files, verify_meta
from hexiscale.cli.main import main
from planner.errors import SpecError
from planner.layout import logical_params
from planner.model import PRESETS
from tests.faults.test_corrupted_checkpoint import train

TINY = PRESETS["tiny"]
HERE = Path(__file__).parent


class _Call:
    """Pickles as a call of ``fn(*args)``: what a tampered index does when plainly unpickled."""

    def __init__(self, fn: Callable[..., Any], *args: Any):
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple[Any, ...]:
        return self.fn, self.args


def _payloads(marker: Path) -> dict[str, Callable[[bytes], bytes]]:
    """Each turns a real index into a tampered one that would create ``marker``."""
    def hidden(real: bytes) -> bytes:  # a valid index with the call tucked into one field
        md = pickle.loads(real)
        md.planner_data = _Call(os.system, f"touch {marker}")
        return pickle.dumps(md)
    return {
        "os.system": lambda real: pickle.dumps(_Call(os.system, f"touch {marker}")),
        "builtins.exec": lambda real: pickle.dumps(_Call(builtins.exec, f"open({str(marker)!r}, 'w').close()")),
        "os.system inside real metadata": hidden,
    }


def _tamper(ck: Path, make: Callable[[bytes], bytes]) -> None:
    data = make((ck / ".metadata").read_bytes())
    (ck / ".metadata").write_bytes(data)
    meta = json.loads((ck / "meta.json").read_text())
    meta["checksums"][".metadata"] = {"0": [len(data), zlib.crc32(data)]}  # as pre-flight computes it
    (ck / "meta.json").write_text(json.dumps(meta))


@pytest.fixture(scope="module")
def logical(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ck = tmp_path_factory.mktemp("logical") / "ck"
    write_logical(ck, TINY, {i.name: torch.randn(i.shape) for i in logical_params(TINY)})
    return ck


@pytest.mark.parametrize("payload", list(_payloads(Path("x"))))
def test_a_tampered_index_never_runs(logical: Path, tmp_path: Path, payload: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    marker = tmp_path / "pwned"
    ck = tmp_path / "ck"
    shutil.copytree(logical, ck)
    _tamper(ck, _payloads(marker)[payload])
    with pytest.raises(SpecError, match="index .metadata is refused"):
        verify_meta(ck, TINY)  # pre-flight
    with pytest.raises(SpecError, match="index .metadata is refused"):
        dict(read_logical(ck)[1])  # DCP's own load path, pre-flight bypassed
    assert main(["hf", "export", str(ck), "-o", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip()
    assert "index .metadata is refused" in err and "\n" not in err and "Traceback" not in err
    assert not marker.exists() and not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.xdist_group("hexiscale-jobs")
def test_resume_refuses_a_tampered_index(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    assert train("--steps", "1", "--checkpoint-dir", str(ck)).returncode == 0
    marker = tmp_path / "pwned"
    _tamper(ck / "step-000001", _payloads(marker)["os.system inside real metadata"])
    run = train("--steps", "2", "--resume", str(ck / "step-000001"))
    err = run.stderr.strip()
    assert run.returncode == 1 and "index .metadata is refused" in err and "posix.system" in err, err
    assert "\n" not in err and "Traceback" not in err
    assert not marker.exists()


@pytest.mark.parametrize("name", ["torch-2.11-bf16.metadata", "torch-2.11-plain.metadata"])
def test_indexes_of_torch_2_11_still_read(name: str) -> None:
    md = read_index((HERE / "dcp_index" / name).read_bytes(), HERE)
    assert md.state_dict_metadata and md.storage_data


def test_our_own_index_reads_and_verifies(logical: Path) -> None:
    meta = verify_meta(logical, TINY)
    verify_files(logical, meta)
    _, stream = read_logical(logical)
    assert len(list(stream)) == len(logical_params(TINY))
