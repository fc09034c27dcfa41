"""Jobs of the switch oracle on a DistPool (the shared gloo pool, or 4 NCCL ranks with one GPU
each): pool rank ``p`` plays device ``UNIVERSE[p]``; each epoch re-creates the default group for
its plan's devices (:class:`executor.epoch_world.World`, as an elastic job does), and the job
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

from executor import checkpoint
from executor.engine import Engine
from executor.epoch_world import World
from executor.group_release import distinct, subgroups
from executor.group_retire import Retired
from executor.groups import ProcessGroups
from executor.optim import OptimConfig
from executor.state_pieces import held_tensors
from executor.switch import switch
from executor.warm_up import warm_up
from planner.layout import build_topology
from planner.plan import Plan
from planner.reshard import reshard_plan
from planner.state_layout import rank_states
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


def _retired(retired: Retired | None, refs: list[weakref.ref]) -> dict[str, Any]:
    """What the holder says about the old plan's groups, and whether torch still lists any."""
    listed = {id(g) for g in subgroups()}
    return {"pending": retired is not None and retired.pending, "held": len(retired.groups) if retired else 0,
            "alive": _alive(refs), "listed_by_torch": sum(r() is not None and id(r()) in listed for r in refs)}


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
    first, :mod:`executor.warm_up`), train the rest; then the baseline: ``new`` loaded from a
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
        res = switch(reshard_plan(old, new), me=me, world=world, engine=engine, tag="switch")
        engine = None
        out["stats"] = res.stats.to_dict()
        out["old_groups"] = len(old_groups)
        if res.state is not None:
            engine = _build(new, optim, init=False)
            res.state.install(engine, split)
            out["after_state"] = holdings(engine)
            # the first step runs with the old plan's groups retired but alive (executor.group_retire)
            out["new_losses"] = _train(engine, batches[split:split + 1])
            out["retired_after_first_step"] = _retired(res.retired, old_groups)
            if res.retired is not None:
                engine.drain()
                res.stats.retire_s = res.retired.release()
            out["stats"] = res.stats.to_dict()
            out["old_groups_left"] = _alive(old_groups)
            out["registry_is_the_new_plans"] = _registry_is(engine)
            out["new_losses"] += _train(engine, batches[split + 1:])
            out["final_state"] = holdings(engine)
            engine.groups.close()
        else:
            out["old_groups_left"] = _alive(old_groups)
    if world.enter(new.devices, "restart"):
        engine = _build(new, optim, seed=99)  # another initialisation: the checkpoint must replace it
        checkpoint.load(engine, Path(ckpt))
        out["restart_losses"] = _train(engine, batches[split:])
        out["restart_state"] = holdings(engine)
        engine.groups.close()
    restore_pool(world)
    return out


def retire_job() -> dict[str, Any]:
    """A group retired on one world (executor.group_retire) is no longer torch's, outlives that
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
