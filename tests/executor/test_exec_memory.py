"""The memory model's per-device state (:func:`planner.cost.memory.state_bytes`) against what an
``Engine`` really holds.

On gloo ranks, each plan trains one step (so the Adam moments exist), then a second one in two
halves; at the end of its backward and after its update, every tensor storage reachable from the
engine is counted once (by storage: a view holds its whole storage) and sorted into weights (the
parameters and ZeRO-1's all-gather buffers), gradients (``.grad`` and the flat bucket buffers),
reduced gradient chunks (ZeRO-1's reduce-scatter outputs), optimizer state and module buffers
(the RoPE tables, which the model leaves out: ``2·s·d`` fp32 elements). Nothing else may be
reachable, and every term must be within 2 % of the model's: ZeRO-0 and ZeRO-1 with 2, 3 and 4
pipelines, one pipeline, TP and PP, whole shards and shards cut into several sync slices (a TP-1
pipeline beside a TP-2 one), fp32 and bf16 (computed in fp32 on CPU; the state is fp32 either way).
The 2 % covers what the model leaves out on purpose: ZeRO-1's padding (under ``k`` elements a
bucket), Adam's step counters (one scalar a tensor) and the norm-scale state TP ranks other than
the leader do not hold under ZeRO-1.
"""

from __future__ import annotations

import gc
import weakref
from dataclasses import replace
from typing import Any

import pytest
import torch
import torch.distributed as dist
from exec_jobs import TINY, global_batches, make_plan, pipeline_rows, pool_engine
from torch import nn

from executor.train.engine import Engine
from planner.cost.memory import stage_params, state_bytes
from planner.cost.partial_params import partial_params
from planner.plan import Plan

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("executor-pool")]

TERMS = ("weights", "gradients", "reduced", "optimizer", "buffers")


def _with(plan: Plan, **options: Any) -> Plan:
    return replace(plan, options=replace(plan.options, **options))


PLANS: dict[str, Plan] = {
    "one-pipeline-tp2-pp2": make_plan(TINY, [(4, 2, "1f1b", [(2, 2), (2, 2)])]),
    "zero0-dp2-tp2": make_plan(TINY, [(2, 2, "1f1b", [(2, 4)])] * 2),
    "zero0-dp4-pp2": make_plan(TINY, [(2, 2, "1f1b", [(1, 2), (1, 2)])] * 4),
    "zero0-tp2-vs-tp1-cut": make_plan(TINY, [(2, 2, "1f1b", [(2, 4)]), (2, 2, "gpipe", [(1, 1), (1, 3)])]),
    "zero1-dp2-tp2-bf16": _with(make_plan(TINY, [(2, 2, "1f1b", [(2, 4)])] * 2, dtype="bf16"), zero=1),
    "zero1-dp3-tp1": _with(make_plan(TINY, [(2, 2, "1f1b", [(1, 4)])] * 3), zero=1),
    "zero1-dp4-pp2": _with(make_plan(TINY, [(2, 2, "1f1b", [(1, 2), (1, 2)])] * 4), zero=1),
    "zero1-tp2-vs-tp1-cut": _with(make_plan(TINY, [(2, 2, "1f1b", [(2, 4)]), (2, 2, "gpipe", [(1, 1), (1, 3)])]),
                                  zero=1),
}


def reachable(root: object) -> dict[int, int]:
    """Bytes of every tensor storage reachable from ``root`` through modules, optimizers, the
    executor's and planner's objects and their containers (parameters' ``.grad`` included), by
    storage address."""
    seen: set[int] = set()
    out: dict[int, int] = {}
    todo = [root]
    while todo:
        obj = todo.pop()
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            if storage.nbytes():
                out[storage.data_ptr()] = storage.nbytes()
            todo.append(obj.grad)
        elif isinstance(obj, dict):
            todo += [*obj.keys(), *obj.values()]
        elif isinstance(obj, (list, tuple, set, frozenset)):
            todo += list(obj)
        elif isinstance(obj, (nn.Module, torch.optim.Optimizer)) or type(obj).__module__.split(".")[0] in (
                "executor", "planner"):
            todo += list(vars(obj).values())
    return out


def _ptrs(tensors: list[torch.Tensor | None]) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors if t is not None and t.untyped_storage().nbytes()}


def sync_of(eng: Engine) -> Any:
    return eng.zero.sync if eng.zero is not None else eng.grad_sync


def count(eng: Engine) -> dict[str, int]:
    """The engine's reachable bytes by term (module docstring), ``other`` for anything else."""
    params = list(eng._params.values())  # noqa: SLF001 - not eng.params, which waits for the gathers
    sync = sync_of(eng)
    masters = [m for part in eng.zero.parts for m in part.masters] if eng.zero is not None else []
    owners = {
        "weights": _ptrs([*params, *(eng.zero.weights if eng.zero is not None else [])]),
        "gradients": _ptrs([p.grad for p in params] + [b.grad for b in sync.order]),
        "reduced": _ptrs([b.out for b in sync.order] + [m.grad for m in masters]),
        "optimizer": _ptrs([t for st in eng.optimizer.state.values() for t in st.values()
                            if isinstance(t, torch.Tensor)]),
        "buffers": _ptrs(list(eng.module.buffers())),
    }
    out = dict.fromkeys((*TERMS, "other"), 0)
    for ptr, nbytes in reachable(eng).items():
        term = next((t for t in TERMS if ptr in owners[t]), "other")
        out[term] += nbytes
    return out


def memory_job(plans: list[Plan]) -> list[dict[str, Any] | None]:
    """On every rank, per plan: the counts at the end of the second step's backward and after it."""
    out: list[dict[str, Any] | None] = []
    for plan in plans:
        eng = pool_engine(plan)
        if eng is None:
            out.append(None)
            continue
        first, second = (pipeline_rows(plan, eng.stage.pipeline, t)
                         for t in global_batches(plan.model, plan.global_batch_size, 2))
        eng.train_step(first)
        micro = eng.micro_batches(second)
        tokens = plan.global_batch_size * plan.model.seq_len
        eng.zero_grads()  # Engine.train_micro_batches, cut in two
        eng.grad_sync.arm(len(micro))
        loss = eng.accumulate(micro, tokens)
        backward = count(eng)
        eng.apply_gradients(loss, tokens)
        held = [weakref.ref(t) for t in [eng, *eng._params.values(), *(b.grad for b in sync_of(eng).order)]  # noqa: SLF001
                if t is not None]
        out.append({"end_of_backward": backward, "after_step": count(eng), "zero": eng.zero is not None})
        groups = eng.groups
        del eng
        groups.close()
        gc.collect()
        out[-1]["alive_after_release"] = sum(r() is not None for r in held)
    dist.barrier()
    return out


@pytest.fixture(scope="module")
def counted(dist_pool) -> list[list[dict[str, Any] | None]]:
    return dist_pool.run(memory_job, list(PLANS.values()))


@pytest.mark.parametrize("index,name", list(enumerate(PLANS)))
def test_state_bytes_match_the_engine(counted, index: int, name: str) -> None:
    plan = PLANS[name]
    k = len(plan.pipelines)
    zero = plan.options.zero == 1 and k > 1
    m = plan.model
    rank = 0
    for pi, pipe in enumerate(plan.pipelines):
        for si, st in enumerate(pipe.stages):
            p = stage_params(m, st.num_layers, st.tp, si == 0, si == len(pipe.stages) - 1)
            want = state_bytes(p, pipelines=k, zero_shards=k if zero else 1, partial=partial_params(plan, pi, si))
            for _ in st.devices:
                got = counted[rank][index]
                assert got is not None and got["zero"] == zero
                at_end, after = got["end_of_backward"], got["after_step"]
                where = f"{name} rank {rank}: {at_end}"
                assert at_end["other"] == 0 and after["other"] == 0, where
                assert at_end["buffers"] == after["buffers"] == 2 * m.seq_len * m.head_dim * 4, where
                for term, model_bytes in (("weights", want.weights), ("gradients", want.gradients),
                                          ("optimizer", want.optimizer), ("reduced", want.reduced)):
                    assert at_end[term] == pytest.approx(model_bytes, rel=0.02), f"{where}: {term}"
                state = sum(at_end[t] for t in TERMS if t != "buffers")
                assert state == pytest.approx(want.end_of_backward, rel=0.02), where
                kept = sum(after[t] for t in TERMS if t != "buffers")
                assert kept == pytest.approx(want.after_step, rel=0.02), f"{name} rank {rank} after the step: {after}"
                rank += 1


@pytest.mark.parametrize("index,name", list(enumerate(PLANS)))
def test_a_dropped_engine_frees_its_state(counted, index: int, name: str) -> None:
    """Once the Engine is dropped and its groups closed, nothing keeps its parameters or gradient
    buckets: the gradient hooks live in C++, outside the garbage collector's view, so a hook holding
    the gradient sync strongly made every dropped Engine leak its weights and buckets (the elastic
    switch and the fidelity benchmark drop engines)."""
    for rank, per_plan in enumerate(counted):
        got = per_plan[index]
        if got is not None:
            assert got["alive_after_release"] == 0, f"{name} rank {rank}: {got['alive_after_release']} still alive"
