"""The one spawner (executor.job.spawn): exit codes by rank, a failing rank stops the others, a deadline
stops ranks that hang, and free ports bind."""

from __future__ import annotations

import socket
import sys
import time

import pytest

from executor.job.spawn import RanksFailed, free_port, spawn


def write_rank(rank: int, folder: str) -> None:
    with open(f"{folder}/rank{rank}", "w") as f:
        f.write(str(rank))


def fail_on_rank_one(rank: int, wait_s: float) -> None:
    if rank == 1:
        sys.exit(7)
    time.sleep(wait_s)


def test_every_rank_runs_with_its_rank(tmp_path) -> None:  # noqa: ANN001
    assert spawn(write_rank, 3, (str(tmp_path),), timeout=60) == [0, 0, 0]
    assert sorted(p.read_text() for p in tmp_path.iterdir()) == ["0", "1", "2"]


def test_a_failing_rank_stops_the_others_at_once() -> None:
    t0 = time.monotonic()
    with pytest.raises(RanksFailed, match=r"ranks \[0, 1, 2\]") as info:
        spawn(fail_on_rank_one, 3, (600.0,), timeout=900)
    assert info.value.codes[1] == 7 and info.value.codes[0] is None and info.value.codes[2] is None
    assert time.monotonic() - t0 < 120, "the sleeping ranks were not stopped when rank 1 failed"


def test_deadline_stops_hung_ranks() -> None:
    t0 = time.monotonic()
    codes = spawn(fail_on_rank_one, 1, (600.0,), timeout=1.0, check=False)  # rank 0 sleeps 10 minutes
    assert codes == [None] and time.monotonic() - t0 < 60


def test_free_port_can_be_bound() -> None:
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
    assert 0 < port < 65536
