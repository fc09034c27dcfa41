"""``executor.model.allocator``: executor processes run the CUDA allocator with expandable segments unless
the user chose a setting, and processes the executor starts inherit it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from executor.job.spawn import spawn
from executor.model import allocator


def _report(rank: int, out: str) -> None:
    Path(out, f"{rank}.txt").write_text(os.environ.get(allocator.ENV, "<unset>"))


def test_the_default_is_expandable_segments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(allocator.ENV, raising=False)
    assert allocator.use_default() == "expandable_segments:True" == os.environ[allocator.ENV]


def test_a_users_setting_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(allocator.ENV, "max_split_size_mb:128")
    assert allocator.use_default() == "max_split_size_mb:128"
    monkeypatch.setenv(allocator.ENV, "")  # an empty setting is a choice too: torch's own default
    assert allocator.use_default() == ""


def test_spawned_ranks_inherit_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(allocator.ENV, raising=False)
    spawn(_report, 2, (str(tmp_path),), timeout=120)
    assert [(tmp_path / f"{r}.txt").read_text() for r in range(2)] == [allocator.DEFAULT] * 2
