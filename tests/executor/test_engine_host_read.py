"""Where a training step waits for the device (:mod:`executor.parallel.host_sync`, ``Engine.apply_gradients``).

With a fused AdamW (the GPU default; fused on CPU here too) the step's one host read comes after
the update is queued, so the device runs from the last backward through AdamW without waiting for
the host; the read is the only one per step. A non-finite step still stops, or is skipped, at that
step with nothing of it applied: the queued update is gated on the device (``found_inf``).
One gloo rank in this process; the multi-rank guard (CPU's unfused AdamW) is test_exec_nonfinite."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from exec_jobs import TINY, global_batches, make_plan

from executor.parallel.groups import ProcessGroups
from executor.parallel.host_sync import HostRead
from executor.train.engine import Engine
from executor.train.nonfinite import NonFiniteStep
from executor.train.optim import OptimConfig
from planner.layout import build_topology

PLAN = make_plan(TINY, [(4, 2, "1f1b", [(1, TINY.num_layers)])])
FUSED = OptimConfig(lr=1e-2, warmup_steps=0, grad_clip=0.5, fused=True)


@pytest.fixture
def one_rank() -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _engine(optim: OptimConfig = FUSED, **kw: Any) -> Engine:
    topo = build_topology(PLAN)
    return Engine(PLAN, topo, ProcessGroups.create(topo), device=torch.device("cpu"), optim=optim, seed=0, **kw)


def _record(eng: Engine, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Order of the optimizer's steps and the host's reads of the step's values."""
    events: list[str] = []
    eng.optimizer.register_step_pre_hook(lambda *_: events.append("update"))
    wait = HostRead.wait

    def read(self: HostRead) -> list[float]:
        events.append("read")
        return wait(self)

    monkeypatch.setattr(HostRead, "wait", read)
    return events


def _state(eng: Engine) -> list[torch.Tensor]:
    return [t.detach().clone() for t in eng.params.values()] + [
        t.clone() for st in eng.optimizer.state.values() for t in st.values()]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_fused_update_is_queued_before_the_one_host_read(one_rank: None, monkeypatch: pytest.MonkeyPatch) -> None:
    eng = _engine()
    events = _record(eng, monkeypatch)
    for tokens in global_batches(TINY, 4, 2, seed=1):
        eng.train_step(tokens)
    assert events == ["update", "read"] * 2


def test_unfused_optimizer_reads_first(one_rank: None, monkeypatch: pytest.MonkeyPatch) -> None:
    eng = _engine(OptimConfig(lr=1e-2, warmup_steps=0, fused=False))
    events = _record(eng, monkeypatch)
    eng.train_step(global_batches(TINY, 4, 1, seed=1)[0])
    assert events == ["read", "update"]


def test_gated_update_trains_like_the_host_decided_one(one_rank: None, monkeypatch: pytest.MonkeyPatch) -> None:
    batches = global_batches(TINY, 4, 3, seed=2)
    gated, plain = _engine(), _engine()
    ours = [gated.train_step(t) for t in batches]
    monkeypatch.setattr("executor.train.engine._gates_on_device", lambda _opt: False)
    theirs = [plain.train_step(t) for t in batches]
    assert [(s.loss, s.grad_norm) for s in ours] == [(s.loss, s.grad_norm) for s in theirs]
    assert _same(_state(gated), _state(plain))


@pytest.mark.parametrize("policy", ["stop", "skip"])
def test_nonfinite_step_is_caught_at_its_step_and_nothing_of_it_is_applied(one_rank: None, policy: str) -> None:
    eng = _engine(on_nonfinite=policy)
    batches = global_batches(TINY, 4, 3, seed=3)
    eng.train_step(batches[0])
    before = _state(eng)
    handle = next(iter(eng.params.values())).register_hook(lambda g: g * float("nan"))
    try:
        if policy == "stop":
            with pytest.raises(NonFiniteStep, match="not finite"):
                eng.train_step(batches[1])
        else:
            assert eng.train_step(batches[1]).skipped
    finally:
        handle.remove()
    assert _same(_state(eng), before)  # weights, moments and AdamW's step count
    if policy == "skip":
        stats = eng.train_step(batches[2])
        assert not stats.skipped and torch.isfinite(torch.tensor(stats.loss))
        assert not _same(_state(eng), before)
