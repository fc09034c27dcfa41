"""Jobs of the switch oracle on a DistPool (the shared gloo pool, or 4 NCCL ranks with one GPU
each): pool rank ``p`` plays device ``UNIVERSE[p]``; each epoch re-creates the default group for
its plan's devices (:class:`executor.switch.epoch_world.World`, as an elastic job does), and the job
gives the pool its default group of every rank back at the end."""

from __future__ import annotations

import gc
import uuid
import weakref
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from executor.parallel.group_release import distinct, subgroups
from executor.parallel.group_retire import Retired, detach_world
from executor.parallel.groups import ProcessGroups
from executor.state import checkpoint
from executor.state.state_pieces import NewState, held_tensors
from executor.switch.epoch_world import World
from executor.switch.state_move import holdings as holdings_of
from executor.switch.state_move import switch, switch_members
from executor.switch.warm_up import warm_up
from executor.train.engine import Engine
from executor.train.optim import OptimConfig
from planner.layout import build_topology
from planner.plan import Plan
from planner.state_layout import rank_states
from planner.state_move_plan import ReshardPlan, reshard_plan
from tests.support.random_plans import UNIVERSE

_STORES: list[Any] = []  # the restored default groups use these stores: they live as long as the pool
_POOL: list[int] = []  # the pool's size, read before the first epoch replaces the default group


def _device() -> torch.device:
    """This pool rank's device: its GPU on an NCCL pool (DistPool binds rank r to GPU r), else the CPU."""
    if torch.cuda.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def shared_world(prefix: str, timeout_s: float = 600.0) -> World:
    """A :class:`World` for this pool process on a store served by pool rank 0 (collective)."""
    rank = dist.get_rank()
    if not _POOL:
        _POOL.append(dist.get_world_size())
    device = _device()
    if rank == 0:
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        info: list[Any] = [store.port, uuid.uuid4().hex]
    else:
        info = [None, None]
    dist.broadcast_object_list(info, src=0, device=device)
    if rank != 0:
        store = dist.TCPStore("127.0.0.1", info[0], is_master=False, wait_for_workers=False)
    _STORES.append(store)
    return World(store, f"{prefix}/{info[1]}", device, UNIVERSE[rank], timeout_s=timeout_s)


def restore_pool(world: World) -> None:
    """Give the pool its default group of every rank back (pool rank order)."""
    world.enter(UNIVERSE[:_POOL[0]], "restore")


def holdings(engine: Engine) -> list[tuple[str, Any, torch.Tensor]]:
    """(state tensor, rectangle, values) of everything ``engine``'s rank holds."""
    state = rank_states(engine.plan)[engine.rank]
    return [(h.tensor, h.chunk, t.detach().cpu().clone()) for h, t in zip(state.holdings, held_tensors(engine, state))]


def _build(plan: Plan, optim: OptimConfig, seed: int = 0, init: bool = True) -> Engine:
    topo = build_topology(plan)
    return Engine(plan, topo, ProcessGroups.create(topo), device=_device(), optim=optim, seed=seed, init=init)


def _alive(refs: list[weakref.ref]) -> int:
    """How many of the groups behind ``refs`` still exist (after a garbage collection)."""
    gc.collect()
    return sum(r() is not None for r in refs)


def _retired(retired: list[Retired]) -> list[dict[str, Any]]:
    """What the holder says about each group set it retired, and whether torch still lists or uses
    any of its groups (as a subgroup or as the default group)."""
    listed = {id(g) for g in subgroups()}
    return [{"count": r.count, "pending": r.pending, "held": len(r.groups),
             "listed_by_torch": sum(id(g) in listed or g is dist.group.WORLD for g in r.groups)} for r in retired]


def worlds_left(rp: ReshardPlan, me: str) -> list[tuple[str, ...]]:
    """The default groups ``me`` leaves in a switch per ``rp`` (their members): the old world if the
    switch world differs, the switch world if the new plan's does (:mod:`executor.switch.state_move`)."""
    old, via, new = tuple(rp.old.devices), switch_members(rp), tuple(rp.new.devices)
    return [a for a, b in ((old, via), (via, new)) if a != b and me in a]


def _sum_on_worlds(rp: ReshardPlan, me: str, retired: list[Retired]) -> list[float]:
    """An all-reduce of ones on each retired world whose members all trained the first step (the
    others' holders are waiting at their retire point): the detached group still works."""
    sums: list[float] = []
    worlds = worlds_left(rp, me)
    if len(retired) != (me in rp.old.devices) + len(worlds):
        return sums  # not what check_retired expects (it fails there): no collective on an unknown group
    for members, r in zip(worlds, retired[len(retired) - len(worlds):]):
        if set(members) <= set(rp.new.devices):
            one = torch.ones(1, device=_device())
            r.groups[-1].allreduce([one]).wait()
            sums.append(float(one))
    return sums


def _registry_is(engine: Engine) -> bool:
    """torch.distributed lists exactly ``engine``'s groups besides the default group."""
    mine = distinct(g for _, _, g in engine.groups.order)
    return sorted(map(id, subgroups())) == sorted(map(id, mine))


def _train(engine: Engine, batches: list[torch.Tensor]) -> list[float]:
    off = sum(p.batch_size for p in engine.plan.pipelines[:engine.stage.pipeline])
    rows = engine.pipeline.batch_size
    return [engine.train_step(b[off:off + rows]).loss for b in batches]


def switch_oracle_job(old: Plan, new: Plan, batches: list[torch.Tensor], split: int, ckpt: str,
                      optim: OptimConfig) -> dict[str, Any]:
    """Train ``old`` for ``split`` steps, switch to ``new`` in process (a joining device warms up
    first, :mod:`executor.switch.warm_up`), train the rest; then the baseline: ``new`` loaded from a
    checkpoint of ``old`` at ``split`` trains the rest."""
    world = shared_world("switch-oracle")
    me = world.me
    out: dict[str, Any] = {"device": me}
    engine = None
    if world.enter(old.devices, "old"):
        engine = _build(old, optim)
        out["old_losses"] = _train(engine, batches[:split])
        checkpoint.save(engine, Path(ckpt), {})
        out["old_state"] = holdings(engine)
    if me in new.devices and me not in old.devices:  # a joiner warms up first, as in an elastic job
        out["warmed"] = warm_up(new, me, world.device, optim) is not None
    if me in old.devices or me in new.devices:
        old_groups = ([weakref.ref(g) for g in distinct(gr for _, _, gr in engine.groups.order)]
                      if engine is not None else [])
        rp = reshard_plan(old, new)
        old_world = [weakref.ref(dist.group.WORLD)] if tuple(old.devices) in worlds_left(rp, me) else []
        # the new plan's engine is built before the switch, without groups: the state lands in it
        early = (Engine(new, build_topology(new), None, rank=new.devices.index(me), device=world.device,
                        optim=optim, init=False) if me in new.devices else None)
        new_state = holdings_of(rp, me)[1]
        into = NewState(new_state, early) if early is not None and new_state is not None else None
        res = switch(rp, me=me, world=world, engine=engine, into=into, tag="switch")
        engine = None
        out["stats"] = res.stats.to_dict()
        out["old_groups"] = len(old_groups)
        if res.state is not None:
            assert early is not None
            engine = early
            engine.attach(ProcessGroups.create(engine.topology))
            res.state.install(split)
            out["after_state"] = holdings(engine)
            # the first step runs with the old plan's groups and the worlds left retired but alive
            # (executor.parallel.group_retire)
            out["new_losses"] = _train(engine, batches[split:split + 1])
            out["retired_after_first_step"] = _retired(res.retired)
            out["sums_on_retired_worlds"] = _sum_on_worlds(rp, me, res.retired)
            retired_refs = [weakref.ref(g) for r in res.retired for g in r.groups]
            if res.retired:
                engine.drain()
                res.stats.retire_s = sum(r.release() for r in res.retired)
            out["retired_after_retire_point"] = _retired(res.retired)
            out["retired_left"] = _alive(retired_refs)
            out["stats"] = res.stats.to_dict()
            out["old_groups_left"] = _alive(old_groups + old_world)
            out["registry_is_the_new_plans"] = _registry_is(engine)
            out["new_losses"] += _train(engine, batches[split + 1:])
            out["final_state"] = holdings(engine)
            engine.groups.close()
        else:
            out["retired_after_retire_point"] = _retired(res.retired)
            out["old_groups_left"] = _alive(old_groups + old_world)
    if world.enter(new.devices, "restart"):
        engine = _build(new, optim, seed=99)  # another initialisation: the checkpoint must replace it
        checkpoint.load(engine, Path(ckpt))
        out["restart_losses"] = _train(engine, batches[split:])
        out["restart_state"] = holdings(engine)
        engine.groups.close()
    restore_pool(world)
    return out


def retire_job() -> dict[str, Any]:
    """A group retired on one world (executor.parallel.group_retire) is no longer torch's, outlives that
    world's destruction and still works on its own, then is destroyed by :meth:`Retired.release`."""
    world = shared_world("retire")
    devices = UNIVERSE[:_POOL[0]]
    world.enter(devices, "old")
    group = dist.new_group(list(range(len(devices))))
    ref = weakref.ref(group)
    retired = Retired.take([group], store=world.store, key=f"{world.prefix}/retire/t", count=len(devices),
                           device=world.device, who=world.me, timeout_s=60.0)
    del group
    w = c10d._world
    tables = [w.pg_map, w.pg_names, w.pg_group_ranks, w.pg_backend_config, w.pg_to_tag, w.pg_coalesce_state,
              *w.tags_to_pg.values(), getattr(w, "pg_default_device", {})]
    out: dict[str, Any] = {"torch_knows": any(any(k is ref() for k in t) for t in tables) or ref() in subgroups()}
    world.enter(devices[::-1], "new")  # the old default group destroyed, a new one made
    one = torch.ones(1)
    g = ref()
    assert g is not None
    g.allreduce([one]).wait()
    out["sum_after_world_change"] = float(one)
    del g
    out["retire_s"] = retired.release()
    out["alive_after_release"] = _alive([ref])
    restore_pool(world)
    return out


def detach_world_job() -> dict[str, Any]:
    """A detached default group (:func:`executor.parallel.group_retire.detach_world`), and a group left
    registered beside it, are no longer torch's: torch is uninitialised with its group counter
    reset, a new default group and its subgroups are made beside them, and all of them work."""
    world = shared_world("detach-world")
    devices = UNIVERSE[:_POOL[0]]
    world.enter(devices, "old")
    old, sub = dist.group.WORLD, dist.new_group(list(range(len(devices))))
    groups = detach_world()
    out: dict[str, Any] = {"detached": [(g is sub, g is old) for g in groups], "initialized": dist.is_initialized(),
                           "group_count": c10d._world.group_count}
    del old, sub
    world.enter(devices[::-1], "new")
    new_sub = dist.new_group(list(range(len(devices))))
    sums = []
    for g in [*groups, dist.group.WORLD, new_sub]:
        one = torch.ones(1)
        g.allreduce([one]).wait()
        sums.append(float(one))
    out["sums"] = sums
    refs = [weakref.ref(g) for g in groups]
    Retired(groups, world.store, f"{world.prefix}/retire/w", len(devices), world.device, world.me, 60.0).release()
    out["alive_after_release"] = _alive(refs)
    restore_pool(world)
    return out
