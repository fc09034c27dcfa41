"""The elastic supervisor's worker environment: NCCL's legacy IPC buffers on GPUs unless the user chose."""

from __future__ import annotations

import pytest

from hexiscale.launch.elastic_procs import Processes


def _base(kind: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    return Processes(port=29500, run_id="t", device_kind=kind, gpu_index={"a:0": 0}, extra_env=extra).base


def test_gpu_workers_connect_through_legacy_ipc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NCCL_CUMEM_ENABLE", raising=False)
    assert _base("cuda")["NCCL_CUMEM_ENABLE"] == "0"
    assert "NCCL_CUMEM_ENABLE" not in _base("cpu")


def test_the_users_setting_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NCCL_CUMEM_ENABLE", "1")
    assert _base("cuda")["NCCL_CUMEM_ENABLE"] == "1"
    monkeypatch.delenv("NCCL_CUMEM_ENABLE")
    assert _base("cuda", {"NCCL_CUMEM_ENABLE": "1"})["NCCL_CUMEM_ENABLE"] == "1"  # launch --env
