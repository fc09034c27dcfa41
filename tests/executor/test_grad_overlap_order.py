"""When the cross-pipeline collectives are issued (executor.parallel.grad_sync, executor.parallel.zero):
one rank of a two-pipeline plan in one process, its collectives replaced by recording fakes, so the
order of events is deterministic.

* gradient buckets (ZeRO-1's reduce-scatter, or the all-reduce without ZeRO) are issued DURING the
  step's backward, each as soon as its gradients are final: never before the last micro-batch's
  accumulation of every parameter in it (with ZB-H1, the W ops' weight gradients), the early ones
  before the backward ends, all in the one fixed issue order, and all waited before the optimizer;
* ZeRO-1's weight all-gathers are issued after the update in forward order and each is waited by
  the next forward just before the first layer that uses it, not all at the step's start.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import torch
from exec_jobs import TINY, global_batches, make_plan, pipeline_rows

import executor.parallel.grad_sync as grad_sync_mod
import executor.parallel.zero as zero_mod
from executor.parallel.groups import ProcessGroups, group_sets
from executor.train.engine import Engine
from planner.layout import build_topology
from planner.plan import Plan

BUCKET = 20_000  # elements: several buckets a layer of the tiny model


class _Work:
    def __init__(self, log: list[tuple[str, Any]], label: Any) -> None:
        self.log, self.label = log, label

    def wait(self) -> None:
        self.log.append(("wait", self.label))


class _Recorder:
    """Fake collectives of rank 0 (its peer's contribution taken equal to its own) and the events
    of the engine around them."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.log: list[tuple[str, Any]] = []
        order = engine.grad_sync.order
        for name, p in engine._params.items():  # fires as a gradient arrives, before it accumulates
            p.register_hook(lambda g, n=name: self.log.append(("acc", n)))
        for key, block in engine.module.layers.items():
            block.register_forward_pre_hook(lambda *_, k=key: self.log.append(("forward", "layers." + k)))
        self._bucket = lambda t: next(q for q, b in enumerate(order) if b.grad is not None and
                                      b.grad.data_ptr() == t.data_ptr())

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, group: Any = None, async_op: bool = False) -> _Work:
        q = self._bucket(inp)
        self.log.append(("reduce", q))
        out.copy_(inp.view(-1, out.numel())[0] * 2)
        return _Work(self.log, ("reduce", q))

    def all_reduce(self, t: torch.Tensor, group: Any = None, async_op: bool = False, **_: Any) -> _Work | None:
        if t.numel() == 2:  # the engine's [loss, |g|^2] statistics
            return None
        q = self._bucket(t)
        self.log.append(("reduce", q))
        t.mul_(2)
        return _Work(self.log, ("reduce", q))

    def all_gather(self, buf: torch.Tensor, chunk: torch.Tensor, group: Any = None, async_op: bool = False) -> _Work:
        q = next(q for q, w in enumerate(self.engine.zero.weights) if w.data_ptr() == buf.data_ptr())  # type: ignore[union-attr]
        self.log.append(("gather", q))
        return _Work(self.log, ("gather", q))


def _fake_groups(plan: Plan) -> ProcessGroups:
    topo = build_topology(plan)
    groups = ProcessGroups(topology=topo, rank=0, world=object())
    for kind, ranks in group_sets(topo):
        if kind == "p2p":
            groups.p2p[(ranks[0], ranks[1])] = object()
        else:
            groups.by_ranks[ranks] = object()
    return groups


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    def run(plan: Plan, steps: int) -> tuple[Engine, list[tuple[str, Any]], list[int]]:
        eng = Engine(plan, build_topology(plan), _fake_groups(plan), device=torch.device("cpu"), bucket_numel=BUCKET)
        rec = _Recorder(eng)
        monkeypatch.setattr(grad_sync_mod, "_reduce_scatter", rec.reduce_scatter)
        monkeypatch.setattr(zero_mod, "all_gather_flat", rec.all_gather)
        monkeypatch.setattr(torch.distributed, "all_reduce", rec.all_reduce)
        starts = []
        for tokens in global_batches(plan.model, plan.global_batch_size, steps):
            starts.append(len(rec.log))
            rec.log.append(("step", None))
            eng.train_step(pipeline_rows(plan, 0, tokens))
        return eng, rec.log, starts
    yield run


def _two_pipelines(schedule: str, zero: int) -> Plan:
    plan = make_plan(TINY, [(4, 2, schedule, [(1, 4)]), (4, 2, schedule, [(1, 4)])])
    return replace(plan, options=replace(plan.options, zero=zero))


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])
@pytest.mark.parametrize("zero", [1, 0])
def test_buckets_are_reduced_during_the_last_backward(recorded: Any, schedule: str, zero: int) -> None:
    eng, log, _ = recorded(_two_pipelines(schedule, zero), 1)
    order = eng.grad_sync.order
    assert len(order) > 3 and (eng.zero is not None) == bool(zero)
    reduces = [i for i, (kind, _) in enumerate(log) if kind == "reduce"]
    accs = [i for i, (kind, _) in enumerate(log) if kind == "acc"]
    assert [log[i][1] for i in reduces] == list(range(len(order)))  # every bucket once, in the issue order
    assert reduces[0] < accs[-1]  # the first buckets go out while the backward still runs
    assert sum(i < accs[-1] for i in reduces) >= len(order) // 2
    for i in reduces:  # ... and only once all of the bucket's gradients are final (2 micro-batches each)
        b = order[log[i][1]]
        done = {n: sum(1 for kind, m in log[:i] if kind == "acc" and m == n) for n in b.names}
        assert done == dict.fromkeys(b.names, 2), (schedule, log[i])
    waits = [i for i, (kind, lab) in enumerate(log) if kind == "wait" and lab[0] == "reduce"]
    assert len(waits) == len(order) and max(waits) > accs[-1]  # all waited, after the backward


def test_zero1_gathers_wait_just_before_first_use(recorded: Any) -> None:
    eng, log, starts = recorded(_two_pipelines("1f1b", 1), 2)
    step2 = log[starts[1]:]
    gathers = [lab for kind, lab in log[:starts[1]] if kind == "gather"]
    assert sorted(gathers) == list(range(len(eng.grad_sync.order)))
    assert gathers == sorted(gathers, reverse=True)  # forward order: the reverse of the reduction order
    forwards = [i for i, (kind, _) in enumerate(step2) if kind == "forward"]
    gwaits = {lab[1]: i for i, (kind, lab) in enumerate(step2) if kind == "wait" and lab[0] == "gather"}
    assert sorted(gwaits) == sorted(gathers)  # every gather waited in the next step, none before it
    assert any(i > forwards[0] for i in gwaits.values())  # not all at the step's start: in the forward
    for q, b in enumerate(eng.grad_sync.order):  # and each before the first layer that uses it
        for key in {"layers." + n.split(".")[1] for n in b.names if n.startswith("layers.")}:
            first_use = next(i for i in forwards if step2[i][1] == key)
            assert gwaits[q] < first_use, (q, key)
