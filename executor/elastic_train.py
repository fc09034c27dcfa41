"""``hexiscale train`` under an elastic supervisor: the job's devices change while it trains, and
every change is an in-process switch between two steps (no step is lost, no staying process
restarts).

A rank is a *device* (``HEXISCALE_DEVICE``) more than a rank number: its rank changes with each
epoch's plan. Order of events on a rank of the launch plan: the pre-flight of :mod:`executor.train`
(plan, store, local checks, agreement) -> epoch 0's process group, engine, resume -> steps; after
each step :meth:`executor.elastic_channel.Channel.switch_due` says whether the next epoch starts
now; once the next epoch is published, each rank plans its state move between two steps (the
reshard plan of a 1.3B model takes ~0.1 s of Python), so the switch itself does not pay for it.
Then: complete any checkpoint in flight, stop the epoch's watchdog, read the new plan, move the
state (:func:`executor.switch.switch`), and either leave (a device that is not in the new plan
exits 0 once its state is handed over) or build the new epoch — groups, ``Engine(init=False)``, the
installed state, the same data position, a watchdog under the epoch's own store prefix — and go on
with the next step. Right after that step comes the *retire point*: the old plan's groups and the
default groups the switch left, kept alive through it, are destroyed there
(:mod:`executor.group_retire`), and the new rank 0 reports the switch with that destroy's time
(``retire_s``) beside the switch's own.

A joining rank (``HEXISCALE_ELASTIC_JOIN=e``, started by the supervisor with epoch ``e``'s plan)
runs the local checks, pays its one-off first-use costs (:mod:`executor.warm_up`), reports
``ready``, waits for epoch ``e`` and the data position, receives its state in the same switch and
trains from there.

Each epoch's rank numbering follows its plan; its heartbeats and verdicts live under
``<prefix>/e<e>`` (:mod:`executor.launch.watchdog`). Any failure is one job-wide verdict as in
``hexiscale train``; the supervisor then recovers from the newest checkpoint
(:mod:`hexiscale.launch.elastic`).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch
import torch.distributed as dist

from executor import checkpoint, fast_path
from executor.data import BatchStream, DataPosition, pipeline_rows
from executor.elastic_channel import Channel
from executor.engine import Engine
from executor.epoch_world import World
from executor.group_retire import Retired
from executor.groups import ProcessGroups
from executor.launch import flight
from executor.launch.env import RankEnv, connect_store, rank_env
from executor.launch.faults import maybe_inject, parse_fault
from executor.launch.watchdog import EXIT_INTERRUPTED, EXIT_USER_ERROR, Watchdog, log_error
from executor.metrics import StepLogger
from executor.optim import OptimConfig
from executor.preflight import Prepared, agree, local_checks
from executor.progress import note, step_starting
from executor.resume import choose_checkpoint
from executor.saving import Saver
from executor.switch import SWITCH_PARTS, switch
from executor.tensorboard_sink import TensorBoardSink
from executor.train_config import TrainConfig
from executor.train_setup import check_world, classify, init_process_group, optim_config, pg_timeout, resolve_plan
from executor.warm_up import warm_up
from planner.cluster import ClusterSpec
from planner.errors import SpecError
from planner.layout import build_topology
from planner.plan import Plan
from planner.reshard import ReshardPlan, reshard_plan


@dataclass
class _Job:
    """What stays the same on this process across epochs."""

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
    move: _Move | None = None  # the next epoch's move, planned as soon as it was published
    tensorboard: TensorBoardSink | None = None  # made once this process is an epoch's rank 0 (--tensorboard)


@dataclass(frozen=True)
class _Move:
    """Epoch ``e``'s plans and the state move between them (:func:`planner.reshard.reshard_plan`,
    the same on every rank), computed between two steps once the epoch is published, so that the
    switch itself does not pay for it."""

    e: int
    old: Plan
    new: Plan
    rp: ReshardPlan
    plan_s: float


@dataclass
class _Report:
    """A switch's report, sent once the retired groups are destroyed after the first step."""

    rp: ReshardPlan
    stats: dict[str, Any]  # this rank's times of the switch
    step: int
    retired: list[Retired]  # what this rank retired in the switch, in order (executor.switch)


@dataclass
class _Epoch:
    index: int
    plan: Plan
    renv: RankEnv
    engine: Engine
    stream: BatchStream
    logger: StepLogger
    saver: Saver
    report: _Report | None = None  # the switch into this epoch, until its retire point


def run_elastic(args: TrainConfig) -> int:
    """One elastic rank (module docstring); returns the exit code."""
    renv: RankEnv | None = None
    try:
        renv = rank_env()
        me = os.environ.get("HEXISCALE_DEVICE", "")
        joining = int(os.environ.get("HEXISCALE_ELASTIC_JOIN", "0"))
        if not renv.store_hosted:
            raise SpecError("HEXISCALE_ELASTIC", "elastic training needs the store of a supervisor",
                            "start it with 'hexiscale launch PLAN --local --elastic' (or --trace)")
        plan, cluster, pool = resolve_plan(args, elastic=True)
        if pool is not None:
            raise SpecError("--plan", "is a strategy pool; an elastic job trains one plan at a time",
                            "pass a plan file (hexiscale plan -o PLAN.json)")
        check_world(plan, renv)
        if plan.devices[renv.rank] != me:
            raise SpecError("HEXISCALE_DEVICE", f"{me!r} is not rank {renv.rank}'s device of the plan "
                            f"({plan.devices[renv.rank]})", "let the supervisor start elastic ranks")
        opt, timeout_s, fault = optim_config(args), pg_timeout(args), parse_fault(os.environ.get("HEXISCALE_FAULT"))
        store = connect_store(renv, args.faults.startup_timeout)
        channel = Channel(store, renv.prefix)
        error, prep = None, None
        try:
            prep = local_checks(plan, renv, args)
        except SpecError as exc:
            error = exc
        if joining:
            if prep is not None:
                warm_s = warm_up(plan, me, prep.device, opt)
                if warm_s is not None:
                    print(f"[{me}] warmed up in {warm_s:.2f} s (one block's training step)", flush=True)
            channel.ready(joining, me, None if error is None else str(error))
            if error is not None:
                raise error
        else:
            agree(store, renv, error, args.faults.startup_timeout)
        assert prep is not None
        if args.checkpoint.resume and not joining:  # chosen and verified by the starting ranks together
            prep.resume = choose_checkpoint(store, renv, plan, args.checkpoint.resume, args.run.steps,
                                            args.faults.startup_timeout)
    except SpecError as exc:
        if renv is not None:
            log_error(renv, str(exc))
        else:
            print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_USER_ERROR

    wd = Watchdog(renv, interval=args.faults.heartbeat, dead_after=args.faults.dead_after,
                  hang_after=args.faults.hang_after)
    job = _Job(args, me, renv, store, channel, World(store, f"{renv.prefix}/elastic/pg", prep.device, me,
                                                     timeout_s=timeout_s), prep, opt, cluster, fault, wd)
    try:
        flight.enable()
        if not joining:
            note(renv.rank, f"pre-flight passed on {renv.world_size} ranks (elastic); connecting the process group...")
        epoch = _join(job, joining, plan) if joining else _first(job, plan, timeout_s)
        while epoch is not None and not _train(job, epoch):
            epoch = _next(job, epoch)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BaseException as exc:  # noqa: BLE001 - every failure becomes one job-wide verdict
        reason, code, suspect_peer = classify(exc)
        job.wd.fail(reason, code, suspect_peer=suspect_peer)  # exits the process
    if epoch is not None:
        job.wd.finish()
    job.world.leave()
    return 0


def _epoch_env(job: _Job, index: int, plan: Plan) -> RankEnv:
    if index == 0:
        return job.base
    return replace(job.base, rank=plan.devices.index(job.me), world_size=plan.world_size,
                   prefix=f"{job.base.prefix}/e{index}")


def _build(job: _Job, plan: Plan, *, init: bool) -> tuple[Engine, int]:
    """The epoch's engine and how many of its blocks were compiled."""
    topology = build_topology(plan)
    groups = ProcessGroups.create(topology)
    engine = Engine(plan, topology, groups, device=job.prep.device, optim=job.opt, seed=job.args.run.seed, init=init,
                    on_nonfinite=job.args.faults.on_nonfinite)
    # every epoch's engine: its blocks are new modules (Dynamo reuses the traced code)
    compiled = fast_path.compile_blocks(engine.module) if job.args.layout.compile or plan.options.compile else 0
    return engine, compiled


def _start(job: _Job, index: int, plan: Plan, engine: Engine, position: DataPosition) -> _Epoch:
    """The epoch's watchdog, data stream, logger and saver."""
    renv = _epoch_env(job, index, plan)
    job.wd = Watchdog(renv, interval=job.args.faults.heartbeat, dead_after=job.args.faults.dead_after,
                      hang_after=job.args.faults.hang_after)
    job.wd.start(job.store)
    pipeline = engine.stage.pipeline
    if job.args.metrics.tensorboard and renv.rank == 0 and job.tensorboard is None:
        job.tensorboard = TensorBoardSink(job.args.metrics.tensorboard)
    stream = BatchStream(job.prep.source, global_batch_size=plan.global_batch_size,
                         rows=pipeline_rows(plan, pipeline), position=position, device=job.prep.device)
    logger = StepLogger(plan, renv.rank, pipeline, leader=engine.stage.is_first and engine.tp_rank == 0,
                        device=job.prep.device, cluster=job.cluster, jsonl=job.args.metrics.log_jsonl,
                        every=job.args.metrics.log_every, tensorboard=job.tensorboard if renv.rank == 0 else None)
    saver = Saver(engine, job.args.checkpoint.dir, job.args.checkpoint.save_every, job.args.checkpoint.async_save)
    return _Epoch(index, plan, renv, engine, stream, logger, saver)


def _first(job: _Job, plan: Plan, timeout_s: float) -> _Epoch:
    """Epoch 0: the launch plan's process group and engine (resumed if asked)."""
    init_process_group(job.base, job.store, job.prep.device, timeout_s)
    job.world.adopt(plan.devices)
    rank = job.base.rank
    note(rank, f"building the model ({plan.model.name}, rank 0's stage: layers "
               f"{plan.pipelines[0].stages[0].layers[0]}-{plan.pipelines[0].stages[0].layers[1] - 1})...")
    engine, compiled = _build(job, plan, init=True)
    position = DataPosition()
    if job.prep.resume is not None:
        note(rank, f"loading checkpoint {job.prep.resume.path}...")
        extra = checkpoint.load(engine, job.prep.resume.path)
        position = DataPosition.from_dict(extra["data"], str(job.prep.resume.path)) if "data" in extra \
            else DataPosition(engine.step, engine.step * plan.global_batch_size)
    if job.base.rank == 0:
        print(f"hexiscale train: elastic, {plan.world_size} ranks, model {plan.model.name}, steps "
              f"{engine.step}..{job.args.run.end}" + (f", resumed from {job.prep.resume.path}" if job.prep.resume
                                                     else ""), flush=True)
    note(rank, f"loading data ({job.args.data.path or 'synthetic tokens'})...")
    epoch = _start(job, 0, plan, engine, position)
    step_starting(rank, engine.step + 1, compiled=compiled > 0)
    return epoch


def _train(job: _Job, ep: _Epoch) -> bool:
    """Steps until the job ends (True) or the next epoch is due (False)."""
    args, engine, rank = job.args, ep.engine, ep.renv.rank
    start = k = engine.step
    while k < args.run.end:
        job.wd.begin_step(k + 1)
        maybe_inject(job.fault, rank, k)
        t0 = time.perf_counter()
        stats = engine.train_step(ep.stream.next())
        ep.logger.step(k, args.run.steps, stats, time.perf_counter() - t0)
        if ep.report is not None:  # before the step's checkpoint: no save in flight while groups are destroyed
            _retire(job, ep, k + 1)
        state = {"data": ep.stream.position.to_dict(), "plan_world_size": ep.plan.world_size}
        ep.saver.after_step(k + 1, k + 1 == args.run.end, state,
                            partial(maybe_inject, job.fault, rank, k, in_save=True))
        k += 1
        if k < args.run.end and job.channel.published(ep.index + 1):
            _plan_move(job, ep.index + 1, 0.0)
        if k < args.run.end and job.channel.switch_due(ep.index + 1, k, rank0=rank == 0):
            return False
    engine.drain()
    ep.saver.finish()
    ep.logger.summary(start, ep.plan.global_batch_size * ep.plan.model.seq_len)
    return True


def _next(job: _Job, ep: _Epoch) -> _Epoch | None:
    """Switch to epoch ``ep.index + 1`` after the current step (module docstring); None if this
    device leaves."""
    ep.saver.finish()
    job.wd.finish()
    e = ep.index + 1
    ahead = job.move is not None and job.move.e == e
    t0 = time.perf_counter()
    move = _plan_move(job, e, job.args.faults.hang_after)
    wait_s = time.perf_counter() - t0 - (0.0 if ahead else move.plan_s)
    if (move.old.pipelines, move.old.options) != (ep.plan.pipelines, ep.plan.options):
        raise RuntimeError(f"epoch {e} switches from another plan than the running one")
    position = ep.stream.position
    if ep.renv.rank == 0:
        job.channel.set_state(e, position.step, position.samples)
    return _switch_into(job, move, ahead, ep.engine, position, wait_s)


def _plan_move(job: _Job, e: int, timeout_s: float) -> _Move:
    """Epoch ``e``'s :class:`_Move` (computed once; waits up to ``timeout_s`` for the go)."""
    if job.move is None or job.move.e != e:
        old, new = job.channel.epoch(e, timeout_s)
        t0 = time.perf_counter()
        rp = reshard_plan(old, new, job.cluster)
        job.move = _Move(e, old, new, rp, time.perf_counter() - t0)
    return job.move


def _join(job: _Job, e: int, plan: Plan) -> _Epoch | None:
    """A joining device: wait for epoch ``e``, receive its state, start training."""
    move = _plan_move(job, e, job.args.faults.hang_after)
    if move.new != plan:
        raise SpecError("--plan", f"the joining process was started with another plan than epoch {e}'s",
                        "let the supervisor start joining devices")
    step, samples = job.channel.state(e, job.args.faults.hang_after)
    return _switch_into(job, move, True, None, DataPosition(step, samples), 0.0)


def _switch_into(job: _Job, move: _Move, ahead: bool, engine: Engine | None, position: DataPosition,
                 wait_s: float) -> _Epoch | None:
    """The switch proper, timed from here (``wait_s``: how long this rank waited for the epoch to be
    published, reported apart: a trace boundary reached before the joiners were ready; the move's
    planning counts in the switch unless it was done ``ahead``, between two steps)."""
    t0 = time.perf_counter() - (0.0 if ahead else move.plan_s)
    e, new, rp, plan_s = move.e, move.new, move.rp, move.plan_s
    job.move = None
    res = switch(rp, me=job.me, world=job.world, engine=engine, tag=f"e{e}")
    del engine
    if res.state is None:
        print(f"[{job.me}] handed its state over at step {position.step}; leaving the job", flush=True)
        return None
    t_groups = time.perf_counter()
    new_engine, _ = _build(job, new, init=False)
    groups_s = time.perf_counter() - t_groups
    t_install = time.perf_counter()
    res.state.install(new_engine, position.step)
    if new_engine.device.type == "cuda":
        torch.cuda.synchronize(new_engine.device)
    install_s = time.perf_counter() - t_install
    switch_s = time.perf_counter() - t0
    comm_s = res.stats.comm_s + new_engine.groups.setup_s  # default groups, pairs connected, the plan's groups
    stats = dict(res.stats.to_dict(), plan_s=plan_s, groups_s=new_engine.groups.setup_s, build_s=groups_s,
                 switch_s=switch_s, comm_s=comm_s, switch_excl_comm_s=switch_s - comm_s, wait_s=wait_s,
                 install_s=install_s, planned_ahead=ahead)
    epoch = _start(job, e, new, new_engine, position)
    epoch.report = _Report(rp, stats, position.step, res.retired)
    return epoch


def _retire(job: _Job, ep: _Epoch, step: int) -> None:
    """The retire point, after the new plan's first step (every rank of it, in step): the groups the
    switch retired destroyed in order where nothing is in flight (:mod:`executor.group_retire`), then
    the switch's report with that time, from the new rank 0. The next step waits for this."""
    rep, ep.report = ep.report, None
    assert rep is not None
    retire_s = 0.0
    if rep.retired:
        ep.engine.drain()
        retire_s = sum(r.release() for r in rep.retired)
    stats = dict(rep.stats, retire_s=retire_s)
    every = [None] * ep.plan.world_size
    dist.all_gather_object(every, stats, group=ep.engine.groups.world)
    if ep.engine.rank == 0:
        job.channel.report(ep.index, dict(_report(rep.rp, every, rep.step, job.cluster), retire_after_step=step))


def _report(rp: Any, every: list[Any], step: int, cluster: ClusterSpec | None) -> dict[str, Any]:
    """The switch as the supervisor prints it: bytes, the slowest rank's times (``comm_s``: default
    communicators created (``world_setup_s``), the exchanging pairs connected on them
    (``connect_s``) and the plan's communicators created (``groups_s``); ``switch_excl_comm_s``: the
    rest of the switch), the lower bound from the cluster file's link bandwidth. ``retire_s``: the
    old plan's groups and the worlds left destroyed after the new plan's first step — not in
    ``switch_s``, but on the job's critical path (the second step waits for it:
    ``retire_blocks_training``)."""
    keys = ("switch_s", "transfer_s", "world_setup_s", "connect_s", "groups_s", "build_s", "plan_s", "wait_s",
            "comm_s", "switch_excl_comm_s", "install_s", *SWITCH_PARTS, "retire_s")
    worst: dict[str, Any] = {k: max(s[k] for s in every) for k in keys}
    worst["planned_ahead"] = all(s["planned_ahead"] for s in every)
    worst["retire_blocks_training"] = True
    out = dict(worst, step=step, moved_bytes=rp.moved_bytes, local_bytes=rp.local_bytes,
               leave=list(rp.leaving), join=list(rp.joining), old_ranks=rp.old.world_size,
               new_ranks=rp.new.world_size, max_rank_bytes=max((max(rp.bytes_in(d), rp.bytes_out(d))
                                                                for d in rp.devices), default=0))
    if cluster is not None:
        out["lower_bound_s"] = rp.lower_bound_s(cluster=cluster)
    return out
