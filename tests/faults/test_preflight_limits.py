"""Faults and absurd sizes found before the first step, with the right exit code: a step that cannot
fit the rank's memory is a pre-flight error naming the field; a CPU allocation failure is exit 4
like a GPU one; the store of a one-machine job listens on loopback only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from executor.job.env import serve_store
from executor.job.watchdog import EXIT_OOM
from executor.train.preflight_memory import check_memory
from executor.train.setup import classify
from planner.errors import SpecError
from planner.model import PRESETS, ModelSpec
from planner.plan import Plan, plan_from_dict

ROOT = Path(__file__).resolve().parents[2]
PLAN4 = json.loads((ROOT / "examples" / "plans" / "demo-cpu-4-tiny.json").read_text())


def _plan(**pipe0: int) -> Plan:
    data = json.loads(json.dumps(PLAN4))
    data["pipelines"][0].update(pipe0)
    data["global_batch_size"] = sum(p["batch_size"] for p in data["pipelines"])
    return plan_from_dict(data)


def test_bundled_plan_fits_every_rank() -> None:
    plan = _plan()
    for rank in range(plan.world_size):
        check_memory(plan, rank, torch.device("cpu"))


def test_absurd_batch_is_refused_naming_the_batch() -> None:
    plan = _plan(batch_size=10_000_000, micro_batches=1)
    with pytest.raises(SpecError) as err:
        check_memory(plan, 0, torch.device("cpu"))
    assert err.value.path == "pipelines[0].batch_size" and "GiB on rank 0" in err.value.message


def test_absurd_sizes_in_a_model_are_spec_errors() -> None:
    base = PRESETS["tiny"].to_dict()
    for field, value in (("num_layers", 10**30), ("hidden_size", 1 << 40), ("seq_len", 10**12),
                         ("rope_theta", float("inf")), ("norm_eps", float("nan"))):
        with pytest.raises(SpecError) as err:
            ModelSpec(**{**base, field: value})
        assert err.value.path == f"model.{field}"
    with pytest.raises(SpecError, match=r"pipelines\[0\].batch_size: must be <= 16777216"):
        _plan(batch_size=10**9)


def test_host_out_of_memory_is_exit_4() -> None:
    import numpy as np

    for allocate in (lambda: torch.empty(1 << 62, dtype=torch.uint8), lambda: np.empty(1 << 62, dtype=np.uint8)):
        with pytest.raises((RuntimeError, MemoryError)) as err:
            allocate()
        reason, code, _ = classify(err.value)
        assert code == EXIT_OOM and reason.startswith("out of host memory")


def _listen_address(port: int) -> str:
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                return local.rsplit(":", 1)[0]
    raise AssertionError(f"nothing listens on port {port}")


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc/net")
def test_local_store_listens_on_loopback_only() -> None:
    store = serve_store("127.0.0.1", 0)
    assert _listen_address(store.port) == "0100007F"  # 127.0.0.1, not 0.0.0.0 or ::
    store.set("k", "v")
    assert store.get("k") == b"v"


def test_a_cp_rank_counts_its_share_of_the_sequence() -> None:
    """A CP rank holds 1/cp of every sequence: its pre-flight activations are those of seq_len / cp
    tokens, so a long-context CP plan is not refused for memory it does not use."""
    from dataclasses import replace

    from executor.train.preflight_memory import rank_need_bytes
    from planner.plan import Pipeline, PlanOptions, Stage

    model = replace(PRESETS["tiny"], seq_len=4096)

    def acts(cp: int) -> float:
        st = Stage(tuple(f"d:{i}" for i in range(cp)), 1, (0, model.num_layers), cp)
        return rank_need_bytes(Plan(model, 4, (Pipeline(4, 2, (st,)),), PlanOptions()), 0, cpu=False)[1]

    rows = 4 * (model.seq_len + 1) * 8.0  # the token rows every rank holds
    assert acts(2) - rows == pytest.approx((acts(1) - rows) / 2, rel=0.02)
