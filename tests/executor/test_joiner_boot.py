"""A joiner's start-up line: where its seconds went, from the supervisor's spawn clock."""

from __future__ import annotations

import pytest

from executor.switch.joiner_boot import JoinerBoot


def test_the_parts_add_up_to_the_time_since_the_spawn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXISCALE_STARTED_AT", "1000.0")
    boot = JoinerBoot.since_start()
    assert boot.started_at == 1000.0
    boot = JoinerBoot(1000.0, 1008.0)  # checks ended 8 s after the spawn
    line = boot.line(2, 1.2, 1.0, now=1014.5)
    assert line == ("ready for epoch 2 14.5 s after its start: process start, imports and checks 8.0 s, "
                    "warm-up 1.2 s, NCCL 1.0 s, move and engine 4.3 s")


@pytest.mark.parametrize("raw", [None, "", "soon"])
def test_without_a_spawn_clock_the_line_starts_at_the_checks(monkeypatch: pytest.MonkeyPatch, raw: str | None) -> None:
    if raw is None:
        monkeypatch.delenv("HEXISCALE_STARTED_AT", raising=False)
    else:
        monkeypatch.setenv("HEXISCALE_STARTED_AT", raw)
    boot = JoinerBoot.since_start()
    assert boot.started_at is None
    line = boot.line(3, None, None, now=boot.checked_at + 2.0)
    assert line == "ready for epoch 3 2.0 s after its checks: move and engine 2.0 s"
