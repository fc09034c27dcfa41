"""``hexiscale train`` under an elastic supervisor: the job's devices change while it trains, and
every change is an in-process switch between two steps (no step is lost, no staying process
restarts). The layout is a plan or a strategy pool (mixed-length data with hot switching), and
each epoch's may be either.

A rank is a *device* (``HEXISCALE_DEVICE``) more than a rank number: its rank changes with each
epoch's layout. Order of events on a rank of the launch layout: the pre-flight of
:mod:`executor.train.entry` (plan, store, local checks, agreement) -> epoch 0's process group, engine,
resume -> the steps of the one training loop (:mod:`executor.train.loop`), whose boundary between
two steps is :class:`executor.switch.elastic_switch.ElasticJob`: after each step
:meth:`executor.switch.elastic_channel.Channel.switch_due` says whether the next epoch starts now, and the
switch moves the state and hands the loop the next epoch's runner (module docstring there).

A joining rank (``HEXISCALE_ELASTIC_JOIN=e``, started by the supervisor with epoch ``e``'s layout)
runs the local checks, pays its one-off first-use costs (:mod:`executor.switch.warm_up`; NCCL's,
:mod:`executor.switch.nccl_warm`), plans its state move (from ``plan/<e>``), builds
the engine its state will move into (:func:`executor.switch.elastic_switch.build_early`), reports
``ready``, waits for epoch ``e`` and the data position, receives its state in the same switch and
trains from there.

Each epoch's rank numbering follows its (home) plan; its heartbeats and verdicts live under
``<prefix>/e<e>`` (:mod:`executor.job.watchdog`). Any failure is one job-wide verdict as in
``hexiscale train``; the supervisor then recovers from the newest checkpoint
(:mod:`hexiscale.launch.elastic`).
"""

from __future__ import annotations

import os
import sys

from executor.job import flight
from executor.job.env import RankEnv, connect_store, rank_env
from executor.job.faults import parse_fault
from executor.job.watchdog import EXIT_INTERRUPTED, EXIT_USER_ERROR, Watchdog, log_error
from executor.state.resume import choose_checkpoint
from executor.switch.elastic_channel import Channel
from executor.switch.elastic_switch import ElasticJob, build_early, plan_joined
from executor.switch.epoch_world import World
from executor.switch.joiner_boot import JoinerBoot
from executor.switch.nccl_warm import warm_nccl
from executor.switch.warm_up import warm_up
from executor.train import plan_runner, pool_runner
from executor.train.config import TrainConfig
from executor.train.loop import StepRunner, run_loop
from executor.train.preflight import agree, rank_checks
from executor.train.progress import note, step_starting
from executor.train.setup import check_world, classify, init_process_group, optim_config, pg_timeout, resolve_plan
from planner.errors import SpecError
from planner.state_layout import rank_states
from planner.varlen.layout_doc import Layout, home_plan
from planner.varlen.pool import StrategyPool


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
        layout: Layout = pool if pool is not None else plan
        check_world(plan, renv)
        if plan.devices[renv.rank] != me:
            raise SpecError("HEXISCALE_DEVICE", f"{me!r} is not rank {renv.rank}'s device of the plan "
                            f"({plan.devices[renv.rank]})", "let the supervisor start elastic ranks")
        opt, timeout_s, fault = optim_config(args), pg_timeout(args), parse_fault(os.environ.get("HEXISCALE_FAULT"))
        store = connect_store(renv, args.faults.startup_timeout)
        channel = Channel(store, renv.prefix)
        prep, docs, error = rank_checks(plan, renv, args, pool)
        early, move, planned = None, None, None
        if joining:
            boot = JoinerBoot.since_start()
            if prep is not None:
                warm_s = warm_up(plan, me, prep.device, opt)
                if warm_s is not None:
                    print(f"[{me}] warmed up in {warm_s:.2f} s (one block's training step)", flush=True)
                nccl_s = warm_nccl(prep.device)  # NCCL's one-off start-up, not in the new world's set-up
                if nccl_s is not None:
                    print(f"[{me}] NCCL warmed up in {nccl_s:.2f} s (a one-rank communicator)", flush=True)
                if error is None:  # the move and the engine the state moves into, while the job trains
                    move, planned = plan_joined(channel, joining, layout, cluster=cluster, me=me)
                    state = move.states[1] if move is not None else rank_states(plan)[plan.devices.index(me)]
                    assert state is not None, f"{me} is not in its own layout"
                    early = build_early(joining, layout, state, args=args, device=prep.device, optim=opt, ahead=True)
                print(f"[{me}] {boot.line(joining, warm_s, nccl_s)}", flush=True)
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
    job = ElasticJob(args, me, renv, store, channel, World(store, f"{renv.prefix}/elastic/pg", prep.device, me,
                                                           timeout_s=timeout_s), prep, opt, cluster, fault, wd, docs,
                     early=early, move=move, planned=planned)
    try:
        flight.enable()
        if not joining:
            note(renv.rank, f"pre-flight passed on {renv.world_size} ranks (elastic); connecting the process group...")
        runner = job.join(joining, layout) if joining else _first(job, layout, timeout_s)
        if runner is not None:
            run_loop(args, runner, wd=job.wd, fault=fault, boundary=job)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BaseException as exc:  # noqa: BLE001 - every failure becomes one job-wide verdict
        reason, code, suspect_peer = classify(exc)
        job.wd.fail(reason, code, suspect_peer=suspect_peer)  # exits the process
    if runner is not None and not job.left:
        job.wd.finish()
    job.world.leave()
    return 0


def _first(job: ElasticJob, layout: Layout, timeout_s: float) -> StepRunner:
    """Epoch 0: the launch layout's process group and engine (resumed if asked)."""
    plan = home_plan(layout)
    init_process_group(job.base, job.store, job.prep.device, timeout_s)
    job.world.adopt(plan.devices)
    job.world.connect_all()  # the first switch's pairs, if it keeps this world (epoch_world docstring)
    rank = job.base.rank
    note(rank, f"building the model ({plan.model.name}, rank 0's stage: layers "
               f"{plan.pipelines[0].stages[0].layers[0]}-{plan.pipelines[0].stages[0].layers[1] - 1})...")
    built, engine, compiled = job.build(layout, init=True)
    position = (0, 0)
    resume = str(job.prep.resume.path) if job.prep.resume is not None else None
    if resume is not None:
        note(rank, f"loading checkpoint {resume}...")
        if isinstance(layout, StrategyPool):
            position = (engine.step, pool_runner.resume(engine, resume))
        else:
            pos = plan_runner.resume(engine, resume)
            position = (pos.step, pos.samples)
    if rank == 0:
        kind = f"strategy pool of {len(layout.strategies)}, " if isinstance(layout, StrategyPool) else ""
        print(f"hexiscale train: elastic, {kind}{plan.world_size} ranks, model {plan.model.name}, steps "
              f"{engine.step}..{job.args.run.end}" + (f", resumed from {resume}" if resume else ""), flush=True)
    note(rank, f"loading data ({job.args.data.path or job.args.varlen.lengths or 'synthetic tokens'})...")
    runner = job.start(0, layout, built, position)
    step_starting(rank, engine.step + 1, compiled=compiled > 0)
    return runner
