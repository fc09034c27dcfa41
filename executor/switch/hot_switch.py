"""Hot switching: one optimizer step whose sequences run under several strategies (HotSPa).

A pool (:mod:`planner.varlen.pool`) lists plans over the same devices; the job's ranks are
numbered by the *home* plan, whose :class:`~executor.train.engine.Engine` holds the fp32 master weights,
the gradients and the AdamW state (ZeRO-1 included) — they never move. Each other strategy has a
:class:`WorkingLayout` on every rank: its stage module, p2p and TP groups, and two transfers
(:mod:`executor.switch.layout_exchange`). One step (:meth:`HotSwitchEngine.train_step`) of a
:class:`~planner.varlen.step_layout.StepLayout`:

1. home gradients set to zero;
2. for every phase, in order: under the home strategy, its schedule adds to the home gradients
   directly; under another strategy ``k``: *working weights in* (the home layout's values copied
   into ``k``'s layout: local copies where a rank holds the slice in both, else one message per
   pair of ranks), ``k``'s schedule on the phase's micro-batches (gradients accumulate in ``k``'s
   layout), *gradients out* (each of ``k``'s pipelines that trained adds its partial gradients
   into one home pipeline's), and ``k``'s working weights and gradients are freed — so at most one
   working copy exists at a time;
3. :meth:`Engine.apply_gradients` of the home engine: the home layout's cross-pipeline reduction
   sums every contribution, then the global norm, clipping and one AdamW step.

Every micro-batch loss is ``Σ CE / global_tokens`` whatever its phase, so the step equals the
single-device update on the whole global batch (``tests/executor/test_exec_hot_switch.py``).

Process groups (NCCL rule 1 of :mod:`executor.parallel.groups`): the home plan's groups, then for every other
strategy in pool order its TP and stage-boundary groups (it never reduces gradients itself), then
one group of all ranks that carries nothing but the transfers, and one gloo group of all ranks for
the step layouts rank 0 broadcasts (:mod:`executor.data.step_prefetch`) — all created and connected by
every rank in this order before the first step. Phases run in the same order on every rank.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from executor.data.packed_batch import pack_micro_batches
from executor.model.fast_path import synchronize
from executor.model.gemm_check import ensure_right_products, stage_shapes
from executor.model.llama import StageModule
from executor.parallel.groups import ProcessGroups
from executor.parallel.p2p import StageComm
from executor.parallel.schedules import run_schedule
from executor.switch.layout_exchange import Reshard
from executor.train.engine import Engine, StepStats
from executor.train.optim import OptimConfig
from planner.errors import SpecError
from planner.layout import Topology
from planner.layout_moves import grad_moves, weight_moves
from planner.plan import Plan
from planner.strategy_topology import strategy_topology
from planner.varlen.step_layout import StepLayout


@dataclass(frozen=True)
class HotStepStats:
    step: StepStats
    switch_s: float  # seconds in working-weight and gradient transfers (device synchronised)
    phase_s: tuple[float, ...]  # seconds of each phase, its transfers included
    sent_elements: int  # elements this rank sent to other ranks in transfers


def _grad(p: torch.nn.Parameter) -> torch.Tensor:
    assert p.grad is not None
    return p.grad


class WorkingLayout:
    """A non-home strategy on this rank (see the module docstring)."""

    def __init__(self, plan: Plan, topo: Topology, groups: ProcessGroups, home: Engine, reshard_group: Any,
                 wire_dtype: torch.dtype | None):
        rank, device = home.rank, home.device
        self.plan, self.topo, self.home, self.rank = plan, topo, home, rank
        self.stage = topo.stage_of(rank)
        self.tp_rank = self.stage.ranks.index(rank)
        self.module = StageModule(plan.model, layers=self.stage.layers, first=self.stage.is_first,
                                  last=self.stage.is_last, tp=self.stage.tp, tp_rank=self.tp_rank,
                                  group=groups.tp_group, device=device, recompute=plan.options.recompute,
                                  residual=plan.options.residual_dtype)
        self.params = dict(self.module.named_parameters())
        self.shapes = {n: p.shape for n, p in self.params.items()}
        self.comm = StageComm(self.stage, rank, groups.tp_group, device=device,
                              prev_group=groups.boundary(self.stage.prev_leader, self.stage.leader),
                              next_group=groups.boundary(self.stage.leader, self.stage.next_leader))
        self.group = reshard_group
        self.weights_in = Reshard(weight_moves(home.topology, topo), rank, home.topology, topo, group=reshard_group,
                                  wire_dtype=wire_dtype)
        self._grads_out: dict[tuple[int, ...], Reshard] = {}
        self.release()

    def grads_out(self, active: tuple[int, ...]) -> Reshard:
        if active not in self._grads_out:
            self._grads_out[active] = Reshard(grad_moves(self.topo, self.home.topology, active), self.rank, self.topo,
                                              self.home.topology, group=self.group)
        return self._grads_out[active]

    def materialize(self) -> None:
        for n, p in self.params.items():
            p.data = torch.empty(self.shapes[n], device=self.home.device)
            p.grad = None

    def release(self) -> None:
        for p in self.params.values():
            p.data = torch.empty(0, device=self.home.device)
            p.grad = None


@dataclass
class SwitchGroups:
    """Every process group of a pool (module docstring), created by :func:`switch_groups`."""

    topologies: list[Topology]
    home: ProcessGroups
    working: dict[int, ProcessGroups]
    reshard: Any  # all ranks, transfers only (None for one rank)
    layouts: Any  # all ranks, gloo: the step layouts rank 0 broadcasts (executor.data.step_prefetch)

    def hand_over_extra(self) -> list[Any]:
        """The groups beside the home plan's (working layouts, transfers, step layouts), forgotten
        here: an elastic switch retires them with the home engine's (:mod:`executor.parallel.group_retire`)."""
        out = [g for w in self.working.values() for g in w.hand_over()]
        out += [g for g in (self.reshard, self.layouts) if g is not None]
        self.working, self.reshard, self.layouts = {}, None, None
        return out

    def close(self) -> None:
        """Collective over the default group: destroy them all."""
        for g in reversed(list(self.working.values())):
            g.close()
        self.home.close()
        for group in (self.reshard, self.layouts):
            if group is not None and group is not dist.GroupMember.NON_GROUP_MEMBER:
                dist.destroy_process_group(group)


def switch_groups(plans: Sequence[Plan], home: int) -> SwitchGroups:
    """Create and connect the groups of every strategy: collective over the default group (ranks
    beyond the pool's devices take part and get no engine)."""
    if not 0 <= home < len(plans):
        raise SpecError("home", f"{home} is not a strategy index (0..{len(plans) - 1})", "name the home strategy")
    devices = plans[home].devices
    topos = [strategy_topology(p, devices) for p in plans]
    home_groups = ProcessGroups.create(topos[home])
    working = {k: ProcessGroups.create(replace(t, sync_groups=(), tp_broadcasts=()))
               for k, t in enumerate(topos) if k != home}
    world = topos[home].world_size
    reshard = dist.new_group(list(range(world))) if world > 1 else None
    layouts = dist.new_group(list(range(world)), backend="gloo") if world > 1 else None
    if reshard is not None and dist.get_rank() < world:
        dist.all_reduce(torch.ones(1, device=home_groups.device()), group=reshard)
        dist.all_reduce(torch.ones(1), group=layouts)
    return SwitchGroups(topos, home_groups, working, reshard, layouts)


class HotSwitchEngine:
    """Training steps over a pool's strategies on this rank (module docstring)."""

    def __init__(self, plans: Sequence[Plan], home: int, groups: SwitchGroups, *, device: torch.device,
                 optim: OptimConfig = OptimConfig(), seed: int = 0, wire_dtype: torch.dtype | None = None,
                 on_nonfinite: str = "stop", init: bool = True, home_engine: Engine | None = None):
        self.plans = list(plans)
        self.home_index = home
        topos = groups.topologies
        # the step's update is the home engine's, and so is its NaN/Inf guard (executor.train.nonfinite)
        # home_engine: built before the groups, holding the state an elastic switch moved into it
        # (executor.switch.elastic_switch); it gets the home groups here
        if home_engine is not None:
            home_engine.attach(groups.home)
            self.home = home_engine
        else:
            self.home = Engine(plans[home], topos[home], groups.home, device=device, optim=optim, seed=seed,
                               on_nonfinite=on_nonfinite, init=init)
        self.layouts = {k: WorkingLayout(plans[k], topos[k], g, self.home, groups.reshard, wire_dtype)
                        for k, g in groups.working.items()}
        if self.home.device.type == "cuda":  # the other strategies' TP shards too, checked as one set
            stages = [self.home.stage, *(w.stage for w in self.layouts.values())]
            ensure_right_products(self.home.device, self.home.autocast_dtype or torch.float32,
                                  stage_shapes(plans[home].model, stages), ())

    def _stage(self, k: int):  # type: ignore[no-untyped-def]
        return self.home.stage if k == self.home_index else self.layouts[k].stage

    def train_step(self, docs: Sequence[np.ndarray | torch.Tensor], layout: StepLayout, *,
                   global_tokens: int | None = None, timed: bool = False) -> HotStepStats:
        """One optimizer step on ``docs`` (the global batch) laid out by ``layout``; ``global_tokens``
        (their labels) saves reading every document. With ``timed`` the device is synchronised
        around transfers and phases, so the times are real."""
        home = self.home
        dev = home.device
        if global_tokens is None:
            global_tokens = sum(len(d) - 1 for d in docs)
        for p in home.params.values():
            p.grad = torch.zeros_like(p)
        loss = torch.zeros((), dtype=torch.float32, device=dev)
        switch_s, sent, phase_s = 0.0, 0, []
        sync = (lambda: synchronize(dev)) if timed else (lambda: None)
        for ph in layout.phases:
            t_phase = time.perf_counter()
            k = ph.strategy
            stage = self._stage(k)
            micro = pack_micro_batches(docs, ph.pipelines[stage.pipeline], dev)
            if k == self.home_index:
                part = home.accumulate(micro, global_tokens)
            else:
                w = self.layouts[k]
                sync()
                t0 = time.perf_counter()
                w.materialize()
                sent += w.weights_in.run({n: p.detach() for n, p in home.params.items()},
                                         {n: p.data for n, p in w.params.items()}, add=False)
                sync()
                switch_s += time.perf_counter() - t0
                n_stages = len(w.plan.pipelines[stage.pipeline].stages)
                part = run_schedule(w.plan.pipelines[stage.pipeline].schedule, module=w.module, comm=w.comm,
                                    micro=micro, loss_scale=1.0 / global_tokens, n_stages=n_stages,
                                    autocast=home._autocast())
                for p in w.params.values():
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                sync()
                t0 = time.perf_counter()
                active = tuple(j for j, pipe in enumerate(ph.pipelines) if pipe)
                grads = {n: _grad(p) for n, p in w.params.items()}
                sent += w.grads_out(active).run(grads, {n: _grad(p) for n, p in home.params.items()}, add=True)
                w.release()
                sync()
                switch_s += time.perf_counter() - t0
            if part is not None and stage.ranks.index(home.rank) == 0:
                loss = loss + part
            sync()
            phase_s.append(time.perf_counter() - t_phase)
        stats = home.apply_gradients(loss, global_tokens, count_loss=True)
        return HotStepStats(stats, switch_s, tuple(phase_s), sent)
