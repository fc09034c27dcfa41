"""The elastic benchmark in two commands (``--elastic-only``, then ``--restart-only``: one run where a
command may not last its ~10 minutes): the restart half reads the elastic half from ``--out`` and
refuses, in one line naming the fix, a half it cannot continue (none, other arguments, another GPU or
host)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.executor.elastic import HALF, SAME, _parser, machine, main, read_half

GPU = {"gpu": "NVIDIA H100 80GB HBM3", "date": "2026-11-27T19:04:57Z"}


def _half(work: Path, host: str | None = None, **args: object) -> None:
    ns = _parser().parse_args([])
    recorded = {k: getattr(ns, k) for k in SAME} | args
    (work / HALF).write_text(json.dumps({"meta": GPU, "host": host or machine(), "args": recorded}))


def test_restart_half_reads_the_elastic_half_of_the_same_run(tmp_path: Path) -> None:
    _half(tmp_path)
    assert read_half(_parser().parse_args(["--restart-only"]), tmp_path, GPU)["meta"] == GPU


def test_restart_half_without_an_elastic_half_names_the_command_to_run_first(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no elastic half at .*; run this program with --elastic-only"):
        read_half(_parser().parse_args(["--restart-only"]), tmp_path, GPU)


def test_restart_half_refuses_a_half_run_with_other_arguments(tmp_path: Path) -> None:
    _half(tmp_path, steps="8,8,8,8")
    with pytest.raises(SystemExit, match="ran with .*'steps': '8,8,8,8'.*pass the same arguments"):
        read_half(_parser().parse_args(["--restart-only"]), tmp_path, GPU)


def test_restart_half_refuses_a_half_from_another_gpu(tmp_path: Path) -> None:
    _half(tmp_path)
    with pytest.raises(SystemExit, match="ran on NVIDIA H100 80GB HBM3, this machine is NVIDIA H200; both halves"):
        read_half(_parser().parse_args(["--restart-only"]), tmp_path, GPU | {"gpu": "NVIDIA H200"})


def test_elastic_only_with_a_restart_half_is_refused_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="--elastic-only runs no restart half"):
        main(["--smoke", "--elastic-only", "--restart-only", "--out", str(tmp_path)])
    assert not (tmp_path / "elastic_work").exists()


def test_restart_half_refuses_a_half_from_another_host(tmp_path: Path) -> None:
    _half(tmp_path, host="gpu-host-7")
    with pytest.raises(SystemExit, match="ran on host gpu-host-7, this is .*; both halves must run on the same"):
        read_half(_parser().parse_args(["--restart-only"]), tmp_path, GPU)


def test_restart_half_refuses_a_half_from_another_boot_of_a_same_named_host(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _half(tmp_path)  # lent machines may all be named "vm": a fresh one differs by its boot id
    real = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: "0123abcd-new-boot\n" if self.name == "boot_id"
                        else real(self, *a, **k))
    assert machine().endswith("/0123abcd")
    with pytest.raises(SystemExit, match="ran on host .*, this is .*/0123abcd; both halves must run on the same"):
        read_half(_parser().parse_args(["--restart-only"]), tmp_path, GPU)
