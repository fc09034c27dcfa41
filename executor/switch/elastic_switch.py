"""An elastic job's epochs as the :class:`~executor.train.loop.Boundary` of the one training loop:
after each step the loop asks whether the next epoch is due; if so the state moves into the new
layout, which may be a plan or a strategy pool (:mod:`executor.train.loop` runs either).

Once the next epoch is *planned* (``plan/<e>``: its layout and the running one, written before
its joining processes start, :meth:`Channel.planned`), each rank plans its state move between two
steps (the reshard plan of a 1.3B model takes ~0.1 s of Python), so the switch itself does not pay
for it; a joiner plans it before it reports ready. A rank that reaches the switch before the go
(a trace's boundary while the joiners still start) plans the move and builds its engine while it
waits (:meth:`ElasticJob.while_waiting`); each counts as ahead only if the go was still not given
when it was done, else it is charged to the switch (``plan_late_s``, ``engine_late_s``). The go's
layouts are compared with the planned ones: a change that failed before its go and was planned
again under the same epoch number is planned anew (4x H100, 2026-11-27 09:31: the join's old ranks
planned in the switch, 56-105 ms, and waited 104 ms for the joiner, which planned after the go). A rank of
the new layout also builds its engine there, when the old one still has a step to train before the
switch (a joiner: before it waits for the switch): modules, parameters and optimizer on the device,
without initial values and without process groups, which the new layout's world does not have yet
(:meth:`ElasticJob.build_early`; ``Engine(..., groups=None)``, :meth:`Engine.attach` after the
switch). The switch then writes the moved state straight into that engine's tensors
(:class:`~executor.state.state_pieces.NewState`, whose docstring weighs the memory of two engines
alive at once; the build ahead is skipped where it would not fit, :func:`fits_beside`). A rank
that could not build ahead builds in the switch, before the exchange, and the report says so
(``engine_late_s``, ``engine_ahead``). The state
lives in a plan's engine, or in a pool's home engine (:attr:`HotSwitchEngine.home`): the move is
:func:`planner.state_move_plan.reshard_plan` between the two *home plans*, carried out by
:func:`executor.switch.state_move.switch` on that engine (a pool's other groups retire with its own). Then:
either leave (a device that is not in the new layout exits 0 once its state is handed over) or
go on into the new epoch — its groups, given to the engine built early (for a pool: a new
``HotSwitchEngine`` around that home engine), the step count installed, the same data position (a pool's
:class:`~executor.data.step_prefetch.LayoutStream` goes on at the same sequence), a watchdog under the
epoch's own store prefix — and go on with the next step. Right after that step comes the *retire
point*: the old layout's groups and the default groups the switch left, kept alive through it,
are destroyed there (:mod:`executor.parallel.group_retire`), and the new rank 0 reports the switch with
that destroy's time (``retire_s``) beside the switch's own. There, too, every pair of the new
world is connected ahead of the next switch (:meth:`~executor.switch.epoch_world.World.connect_all`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist

from executor.data.doc_source import DocSource
from executor.data.stream import DataPosition
from executor.job.env import RankEnv
from executor.job.watchdog import Watchdog
from executor.parallel.group_retire import Retired
from executor.state.state_pieces import NewState
from executor.switch.elastic_channel import Channel, layouts
from executor.switch.epoch_world import World
from executor.switch.state_move import SWITCH_PARTS, holdings, switch
from executor.train import plan_runner, pool_runner
from executor.train.config import TrainConfig
from executor.train.engine import Engine
from executor.train.loop import StepRunner
from executor.train.optim import OptimConfig
from executor.train.plan_runner import PlanRunner
from executor.train.pool_runner import PoolRunner
from executor.train.preflight import Prepared
from executor.train.tensorboard_sink import TensorBoardSink
from planner.cluster import ClusterSpec
from planner.errors import SpecError
from planner.state_layout import RankState
from planner.state_move_plan import ReshardPlan, reshard_plan
from planner.strategy_topology import strategy_topology
from planner.varlen.layout_doc import Layout, home_plan
from planner.varlen.pool import StrategyPool


@dataclass(frozen=True)
class Move:
    """Epoch ``e``'s layouts and the state move between their home plans (the same on every rank),
    computed between two steps once the epoch is published."""

    e: int
    old: Layout
    new: Layout
    rp: ReshardPlan
    plan_s: float
    states: tuple[RankState | None, RankState | None]  # this device's holdings in the old and the new plan
    ahead: bool = False  # planned off the switch's path: between two steps, or before the go (module docstring)

    def of(self, e: int, old: Layout, new: Layout) -> bool:
        """Whether this is epoch ``e``'s move from ``old`` to ``new``."""
        return (self.e, self.old, self.new) == (e, old, new)


def new_move(e: int, old: Layout, new: Layout, *, cluster: ClusterSpec | None, me: str, ahead: bool) -> Move:
    """Epoch ``e``'s :class:`Move` from ``old`` to ``new`` (their home plans), timed."""
    t0 = time.perf_counter()
    rp = reshard_plan(home_plan(old), home_plan(new), cluster)
    states = holdings(rp, me)
    return Move(e, old, new, rp, time.perf_counter() - t0, states, ahead)


# communicator set-up, reported apart from the switch: default groups created, the exchanging pairs
# connected on the switch world, the new plan's groups created
COMM_PARTS = ("world_setup_s", "connect_s", "groups_s")
# the rest of a rank's switch_s, in the order it happens: the move planned and the new engine built
# (each only if not done ahead, between two steps), the state move's parts
# (executor.switch.state_move.SwitchStats), the wait for the new plan's last rank, the groups
# attached to the engine (their creation apart: groups_s), the step count installed; other_s:
# everything between
PARTS = ("plan_late_s", "engine_late_s", *(k for k in SWITCH_PARTS if k != "other_s"), "groups_wait_s", "attach_s",
         "install_s", "other_s")


@dataclass
class Early:
    """Epoch ``e``'s engine on this device, built before the switch without its process groups,
    and the state's tensors in it (:class:`~executor.state.state_pieces.NewState`)."""

    e: int
    layout: Layout  # the layout it was built for (an epoch planned again gets another)
    engine: Engine
    into: NewState
    build_s: float  # seconds to build both (device synchronised)
    ahead: bool  # built between two steps (or before a joiner's wait for the switch), not in the switch
    in_wait: bool = False  # built at the switch point while waiting for the go, not between two steps


def build_early(e: int, layout: Layout, state: RankState, *, args: TrainConfig, device: torch.device,
                optim: OptimConfig, ahead: bool) -> Early:
    """Epoch ``e``'s engine of ``layout`` (a pool's home engine) on the device holding ``state``
    (its holdings in the layout's home plan), built without process groups and initial values, and
    the state's tensors in it: the switch moves the state straight into them."""
    t0 = time.perf_counter()
    plan = home_plan(layout)
    topo = strategy_topology(plan, plan.devices) if isinstance(layout, StrategyPool) else None
    engine = plan_runner.engine_without_groups(plan, args, rank=state.rank, device=device, optim=optim, topology=topo)
    into = NewState(state, engine)
    if engine.device.type == "cuda":  # the build's own kernels; not the old engine's weight all-gathers in flight
        torch.cuda.current_stream(engine.device).synchronize()
    return Early(e, layout, engine, into, time.perf_counter() - t0, ahead)


def plan_joined(channel: Channel, e: int, layout: Layout, *, cluster: ClusterSpec | None, me: str
                ) -> tuple[Move | None, str | None]:
    """A joiner's move into epoch ``e`` (started with its ``layout``), planned from ``plan/<e>``
    before it reports ready, and that record (None, None where there is none or it is another
    layout's: the joiner then plans after the go, as :meth:`ElasticJob.join` checks)."""
    text = channel.planned(e)
    if text is None:
        return None, None
    old, new = layouts(text)
    if new != layout:
        return None, None
    return new_move(e, old, new, cluster=cluster, me=me, ahead=True), text


def fits_beside(device: torch.device, nbytes: int) -> bool:
    """Whether ``nbytes`` more fit on ``device`` next to the running engine's next step: the free
    device memory and the allocator's free cache against ``nbytes`` plus the largest transient
    the process has allocated so far (the peak above what is allocated now). Always on a CPU."""
    if device.type != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info(device)
    allocated = torch.cuda.memory_allocated(device)
    cached = torch.cuda.memory_reserved(device) - allocated
    return nbytes + torch.cuda.max_memory_allocated(device) - allocated <= free + cached


@dataclass
class _Report:
    """A switch's report, sent once the retired groups are destroyed after the first step."""

    rp: ReshardPlan
    stats: dict[str, Any]  # this rank's times of the switch
    step: int
    retired: list[Retired]  # what this rank retired in the switch, in order (executor.switch.state_move)


@dataclass
class ElasticJob:
    """What stays the same on this process across epochs, and the loop's boundary (module docstring)."""

    args: TrainConfig
    me: str
    base: RankEnv
    store: Any
    channel: Channel
    world: World
    prep: Prepared
    opt: OptimConfig
    cluster: ClusterSpec | None
    fault: tuple[int, int, str] | None
    wd: Watchdog
    docs: DocSource | None = None  # a pool's sequences (executor.data.pool_source)
    index: int = 0  # the running epoch
    move: Move | None = None  # the next epoch's move, planned as soon as it was planned (plan/<e>)
    planned: str | None = None  # the plan/<e> record the move was planned from (read again each step)
    tensorboard: TensorBoardSink | None = None  # made once this process is an epoch's rank 0 (--tensorboard)
    report: _Report | None = None  # the switch into the running epoch, until its retire point
    early: Early | None = None  # the next epoch's engine, built before its switch
    left: bool = False  # this device handed its state over and left the job

    # ------------------------------------------------------------------ the loop's boundary
    def after_step(self, runner: StepRunner, step: int) -> None:
        if self.report is not None:
            self._retire(runner, step)

    def due(self, runner: StepRunner, step: int) -> bool:
        e = self.index + 1
        self.plan_ahead(e, between_steps=True)
        now = self.channel.switch_due(e, step, rank0=runner.rank == 0)
        move = self.move
        if not now and move is not None and move.e == e and move.states[1] is not None \
                and fits_beside(self.prep.device, move.states[1].numel * 4):
            self.build_early(move, ahead=True)  # the old engine trains another step before the switch
        return now

    def switch(self, runner: StepRunner) -> StepRunner | None:
        """Switch to the next epoch after the current step; None if this device leaves."""
        self.wd.finish()
        e = self.index + 1
        t0 = time.perf_counter()
        self.while_waiting(e)
        move = self.plan_move(e, self.args.faults.hang_after)
        late_s = self.late_s(move)
        wait_s = time.perf_counter() - t0 - late_s
        old = home_plan(move.old)
        if (old.pipelines, old.options) != (runner.plan.pipelines, runner.plan.options):
            raise RuntimeError(f"epoch {e} switches from another layout than the running one")
        step, offset = runner.position()
        if runner.rank == 0:
            self.channel.set_state(e, step, offset)
        return self.switch_into(move, runner, (step, offset), wait_s)

    # ------------------------------------------------------------------ epochs
    def plan_ahead(self, e: int, *, between_steps: bool) -> Move | None:
        """Epoch ``e``'s :class:`Move` from ``plan/<e>`` before its go (None while not planned):
        ahead if ``between_steps``, else if the go was still not given once it was computed."""
        text = self.channel.planned(e)
        if text is None:
            if self.planned is not None:  # the change failed before its go: drop what was made for it
                self.move = self.early = self.planned = None
            return None
        if self.move is None or self.move.e != e or text != self.planned:
            old, new = layouts(text)
            move = new_move(e, old, new, cluster=self.cluster, me=self.me, ahead=True)
            self.move, self.planned = replace(move, ahead=between_steps or not self.channel.published(e)), text
        return self.move

    def while_waiting(self, e: int) -> None:
        """At the switch point before epoch ``e``'s go (the joiners still start): plan the move and
        build this device's engine of the new layout now, off the switch's path (module docstring)."""
        if self.channel.published(e):
            return
        self.channel.wait_planned(e, self.args.faults.hang_after)  # a trace's boundary may come before that
        move = self.plan_ahead(e, between_steps=False)
        if move is not None and move.states[1] is not None and not self.channel.published(e):
            before = self.early
            early = self.build_early(move, ahead=True)
            if early is not before:  # built just now: ahead only if the go is still not given
                early.ahead, early.in_wait = not self.channel.published(e), True

    def late_s(self, move: Move) -> float:
        """What of ``move``'s planning and its engine's build, both done before the switch proper,
        falls on the switch's path (:meth:`switch_into` charges it to the switch)."""
        early = self.early if self.early is not None and self.early.e == move.e and self.early.layout == move.new \
            else None
        return (0.0 if move.ahead else move.plan_s) + (early.build_s if early is not None and not early.ahead else 0.0)

    def plan_move(self, e: int, timeout_s: float) -> Move:
        """Epoch ``e``'s :class:`Move` from its go (waits up to ``timeout_s`` for it); the one
        planned ahead if its layouts are the go's."""
        old, new = self.channel.epoch(e, timeout_s)
        if self.move is None or not self.move.of(e, old, new):
            self.move = new_move(e, old, new, cluster=self.cluster, me=self.me, ahead=False)
        return self.move

    def build(self, layout: Layout, *, init: bool, engine: Engine | None = None) -> tuple[Any, Engine, int]:
        """The layout's engine (a plan's; a pool's with its groups), the engine holding the state,
        and how many blocks were compiled; ``engine``: the one holding the state, built before the
        groups (:meth:`build_early`), which gets them."""
        if isinstance(layout, StrategyPool):
            hot, groups = pool_runner.build_engine(layout, self.args, device=self.prep.device, optim=self.opt,
                                                   init=init, home=engine)
            return (hot, groups), hot.home, 0
        engine, compiled = plan_runner.build_engine(layout, self.args, device=self.prep.device, optim=self.opt,
                                                    init=init, engine=engine)
        return engine, engine, compiled

    def build_early(self, move: Move, *, ahead: bool) -> Early:
        """This device's engine of ``move``'s new layout, built once per epoch (:func:`build_early`)."""
        if self.early is None or self.early.e != move.e or self.early.layout != move.new:
            assert move.states[1] is not None, f"{self.me} is not in epoch {move.e}'s layout"
            self.early = build_early(move.e, move.new, move.states[1], args=self.args, device=self.prep.device,
                                     optim=self.opt, ahead=ahead)
        return self.early

    def start(self, index: int, layout: Layout, built: Any, position: tuple[int, int]) -> StepRunner:
        """Epoch ``index``'s watchdog and runner, reading from ``position`` (steps, data offset)."""
        plan = home_plan(layout)
        renv = self.base if index == 0 else replace(self.base, rank=plan.devices.index(self.me),
                                                    world_size=plan.world_size, prefix=f"{self.base.prefix}/e{index}")
        self.index = index
        self.wd = Watchdog(renv, interval=self.args.faults.heartbeat, dead_after=self.args.faults.dead_after,
                           hang_after=self.args.faults.hang_after)
        self.wd.start(self.store)
        if self.args.metrics.tensorboard and renv.rank == 0 and self.tensorboard is None:
            self.tensorboard = TensorBoardSink(self.args.metrics.tensorboard)
        sink = self.tensorboard if renv.rank == 0 else None
        if isinstance(layout, StrategyPool):
            assert self.docs is not None and self.cluster is not None
            hot, groups = built
            return PoolRunner(hot, groups, layout, self.args, source=self.docs, cluster=self.cluster,
                              cursor=position[1], tensorboard=sink)
        return PlanRunner(built, self.args, source=self.prep.source, position=DataPosition(*position),
                          cluster=self.cluster, tensorboard=sink)

    def switch_into(self, move: Move, runner: StepRunner | None, position: tuple[int, int],
                    wait_s: float) -> StepRunner | None:
        """The switch proper, timed from here (``wait_s``: how long this rank waited for the epoch to be
        published, reported apart: a trace boundary reached before the joiners were ready; the move's
        planning and the engine's build count in the switch unless they were done ahead, :meth:`late_s`)."""
        t0 = time.perf_counter() - self.late_s(move)
        e, rp, plan_s, ahead = move.e, move.rp, move.plan_s, move.ahead
        self.move = self.planned = None
        early = self.build_early(move, ahead=False) if move.states[1] is not None else None
        self.early = None
        engine_late_s = early.build_s if early is not None and not early.ahead else 0.0
        staying = runner is not None
        also: list[Any] = runner.groups.hand_over_extra() if isinstance(runner, PoolRunner) else []
        res = switch(rp, me=self.me, world=self.world, engine=runner.engine if runner is not None else None,
                     into=early.into if early is not None else None, tag=f"e{e}", also=also, states=move.states)
        del runner
        if res.state is None or early is None:
            print(f"[{self.me}] handed its state over at step {position[0]}; leaving the job", flush=True)
            self.left = True
            return None
        t1 = time.perf_counter()
        self.world.settle(f"e{e}/groups", len(rp.new.devices))  # the groups' set-up below starts together
        t2 = time.perf_counter()
        built, engine, _ = self.build(move.new, init=False, engine=early.engine)
        t3 = time.perf_counter()
        res.state.install(position[0])
        if engine.device.type == "cuda":
            torch.cuda.synchronize(engine.device)
        t4 = time.perf_counter()
        stats = part_times(res.stats.to_dict(), switch_s=t4 - t0, plan_late_s=0.0 if ahead else plan_s,
                           engine_late_s=engine_late_s, groups_wait_s=t2 - t1, attach_total_s=t3 - t2,
                           groups_s=engine.groups.setup_s, install_s=t4 - t3)
        # a staying rank's build ahead ran between two steps of the old engine: the job waited for it there
        between = early.build_s if early.ahead and staying and not early.in_wait else 0.0
        stats.update(device=self.me, plan_s=plan_s, wait_s=wait_s, planned_ahead=ahead, engine_s=early.build_s,
                     engine_ahead=early.ahead, engine_between_steps_s=between)
        new_runner = self.start(e, move.new, built, position)
        self.report = _Report(rp, stats, position[0], res.retired)
        return new_runner

    def join(self, e: int, layout: Layout) -> StepRunner | None:
        """A joining device: wait for epoch ``e``, receive its state, start training."""
        move = self.plan_move(e, self.args.faults.hang_after)
        if move.new != layout:
            raise SpecError("--plan", f"the joining process was started with another layout than epoch {e}'s",
                            "let the supervisor start joining devices")
        # planned and built before it said it was ready (executor.switch.elastic); a joiner's time before
        # it arrives at the switch world is no staying rank's switch: ahead either way
        move = replace(move, ahead=True)
        self.build_early(move, ahead=True)
        step, offset = self.channel.state(e, self.args.faults.hang_after)
        return self.switch_into(move, None, (step, offset), 0.0)

    def _retire(self, runner: StepRunner, step: int) -> None:
        """The retire point, after the new layout's first step (every rank of it, in step): the groups
        the switch retired destroyed in order where nothing is in flight (:mod:`executor.parallel.group_retire`),
        then the switch's report with that time, from the new rank 0. The next step waits for this."""
        rep, self.report = self.report, None
        assert rep is not None
        retire_s = 0.0
        if rep.retired:
            runner.engine.drain()
            retire_s = sum(r.release() for r in rep.retired)
        stats = dict(rep.stats, retire_s=retire_s, connect_ahead_s=self.world.connect_all())
        every = [None] * runner.plan.world_size
        dist.all_gather_object(every, stats, group=runner.engine.groups.world)
        if runner.engine.rank == 0:
            self.channel.report(self.index, dict(switch_report(rep.rp, every, rep.step, self.cluster),
                                                 retire_after_step=step))


def part_times(moved: dict[str, Any], *, switch_s: float, plan_late_s: float, engine_late_s: float,
               groups_wait_s: float, attach_total_s: float, groups_s: float, install_s: float) -> dict[str, Any]:
    """A rank's switch by part (:data:`PARTS` and :data:`COMM_PARTS` add up to ``switch_s``):
    ``moved``, the state move's :class:`~executor.switch.state_move.SwitchStats` as a dict, and the
    seconds the caller timed around it (``attach_total_s``: the new plan's groups created, ``groups_s``
    of it, and given to its engine, ``attach_s``); what none of them covers is charged to ``other_s``."""
    out = dict(moved, switch_s=switch_s, plan_late_s=plan_late_s, engine_late_s=engine_late_s,
               groups_wait_s=groups_wait_s, groups_s=groups_s, attach_s=attach_total_s - groups_s, install_s=install_s)
    out["other_s"] += (switch_s - plan_late_s - engine_late_s - moved["total_s"] - groups_wait_s - attach_total_s
                       - install_s)
    out["comm_s"] = sum(out[k] for k in COMM_PARTS)
    out["switch_excl_comm_s"] = switch_s - out["comm_s"]
    return out


def switch_report(rp: Any, every: list[Any], step: int, cluster: ClusterSpec | None) -> dict[str, Any]:
    """The switch as the supervisor prints it: bytes, the slowest rank's times (``comm_s``: default
    communicators created (``world_setup_s``), the exchanging pairs connected on them
    (``connect_s``) and the plan's communicators created (``groups_s``); ``switch_excl_comm_s``: the
    rest of the switch), the lower bound from the cluster file's link bandwidth. ``retire_s``: the
    old plan's groups and the worlds left destroyed after the new plan's first step — not in
    ``switch_s``, but on the job's critical path (the second step waits for it:
    ``retire_blocks_training``); ``connect_ahead_s``: then every pair of the new world connected
    for the next switch (:meth:`World.connect_all`), on the same path. ``engine_s``: the new
    plan's engine built without its groups (:meth:`ElasticJob.build_early`) — outside ``switch_s``
    where every rank built it ahead (``engine_ahead``), else in it on the ranks that built it late
    (``engine_late_s``, one of :data:`PARTS`); ``engine_between_steps_s``: the build ahead on a
    staying rank, which ran between two steps of the old engine — not in the switch, but the job
    waited for it there (a joiner builds while the job trains). ``critical``: the parts of
    the rank whose ``switch_excl_comm_s`` is the largest (:data:`PARTS`, adding up to it;
    ``device`` names the rank) — the per-part maxima
    above may come from different ranks. ``adopted_bytes``: of ``local_bytes`` (kept), what the new
    engines took over in place, not copied (:mod:`executor.switch.keep_local`)."""
    keys = ("switch_s", "transfer_s", "engine_s", "plan_s", "wait_s", "comm_s", "switch_excl_comm_s", *COMM_PARTS,
            *PARTS, "retire_s", "connect_ahead_s", "engine_between_steps_s")
    worst: dict[str, Any] = {k: max(s[k] for s in every) for k in keys}
    worst["engine_ahead"] = all(s["engine_ahead"] for s in every)
    slowest = max(every, key=lambda s: s["switch_excl_comm_s"])
    worst["critical"] = {"device": slowest["device"], **{k: slowest[k] for k in PARTS}}
    worst["planned_ahead"] = all(s["planned_ahead"] for s in every)
    worst["retire_blocks_training"] = True
    out = dict(worst, step=step, moved_bytes=rp.moved_bytes, local_bytes=rp.local_bytes,
               adopted_bytes=sum(s["adopted_bytes"] for s in every),
               leave=list(rp.leaving), join=list(rp.joining), old_ranks=rp.old.world_size,
               new_ranks=rp.new.world_size, max_rank_bytes=max((max(rp.bytes_in(d), rp.bytes_out(d))
                                                                for d in rp.devices), default=0))
    if cluster is not None:
        out["lower_bound_s"] = rp.lower_bound_s(cluster=cluster)
    return out
