"""How the watchdog tells waiting from working when the host shows no difference (NCCL): the
flight recorder's unfinished collectives, the device-wait verdict, and the process-group timeout
rule. The recorder is real here (gloo records too); NCCL's half runs in the GPU suite."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from executor.job import flight
from executor.job.watchdog import device_wait
from executor.train.config import TrainConfig
from executor.train.setup import pg_timeout
from planner.errors import SpecError
from tests.support.dist_testing import run_distributed


def pending_job() -> tuple[list[str] | None, list[str] | None] | None:
    """Rank 0 starts an all-reduce that rank 1 joins 1.5 s later; rank 0 reads the recorder
    while it waits and after."""
    group = dist.new_group([0, 1])
    if dist.get_rank() == 1:
        time.sleep(1.5)
        dist.all_reduce(torch.ones(4), group=group)
        return None
    work = dist.all_reduce(torch.ones(4), group=group, async_op=True)
    time.sleep(0.3)
    during = flight.pending()
    work.wait()
    deadline = time.monotonic() + 5.0  # the recorder marks completion asynchronously
    while (after := flight.pending()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return during, after


@pytest.mark.slow
def test_recorder_lists_the_unfinished_collective_with_its_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "100")
    during, after = run_distributed(pending_job, 2, timeout=120)[0]
    assert during == ["gloo:all_reduce[0,1]#1"]
    assert after == []


def test_pending_reads_only_active_entries_oldest_first() -> None:
    trace = {"pg_config": {"3": {"ranks": "[0, 3]"}},
             "entries": [{"process_group": ["3", ""], "profiling_name": "nccl:all_reduce", "collective_seq_id": 9,
                          "state": "started", "time_created_ns": 20},
                         {"process_group": ["3", ""], "profiling_name": "nccl:send 0->3", "is_p2p": True,
                          "p2p_seq_id": 4, "state": "scheduled", "time_created_ns": 10},
                         {"process_group": ["3", ""], "profiling_name": "nccl:broadcast", "collective_seq_id": 8,
                          "state": "completed", "time_created_ns": 5}]}
    assert flight.pending([trace]) == ["nccl:send0->3[0,3]#4", "nccl:all_reduce[0,3]#9"]
    # an empty generic recorder next to NCCL's own does not hide NCCL's entries
    assert flight.pending([{"entries": [], "pg_config": {}}, trace])[0] == "nccl:send0->3[0,3]#4"


def test_pending_falls_back_to_the_group_counters() -> None:
    """A recorder without entries (buffer size 0) still counts enqueued vs completed per group."""
    trace = {"pg_config": {"5": {"ranks": "[1, 2]"}}, "entries": [],
             "pg_status": {"5": {"last_enqueued_collective": "7", "last_completed_collective": "6"},
                           "0": {"last_enqueued_collective": "3", "last_completed_collective": "3"}}}
    assert flight.pending([trace]) == ["collective[1,2]#7"]
    assert flight.pending([]) is None


def test_device_wait_counts_an_unfinished_collective_as_waiting() -> None:
    assert device_wait(["nccl:all_reduce[0,3]#9"]) == "comm:nccl:all_reduce[0,3]#9"
    assert device_wait([]) == "device"  # the GPU computes: this rank is the busy one
    assert device_wait(None) == "comm"  # no recorder: a device wait on NCCL is most likely a peer


def _args(pg: float | None, hang: float) -> TrainConfig:
    return TrainConfig.flat(pg_timeout=pg, hang_after=hang)


def test_pg_timeout_outlasts_the_hang_verdict() -> None:
    assert pg_timeout(_args(None, 1800)) == 2100
    assert pg_timeout(_args(900, 60)) == 900
    with pytest.raises(SpecError, match="--pg-timeout.*not longer than --hang-after"):
        _args(600, 1800)  # refused when the config is made, before any process group
