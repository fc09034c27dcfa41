"""``hexiscale train``: one process per plan rank, driven by a :class:`TrainConfig`.

Order of events on every rank: read the launcher environment and the plan (world size checked) ->
connect to the job's TCPStore -> local pre-flight (device, data, checkpoint) -> agree through the
store (any failure: every rank exits 1 with the same message, nothing trained) -> process group ->
heartbeat watchdog -> engine (+ resume) -> steps (log, checkpoint) -> clean finish. From the process
group on, any failure is turned into one job-wide verdict and exit code by the watchdog (see
:mod:`executor.launch.watchdog` for the codes and the time bound). A strategy pool as the plan
trains mixed-length data with hot switching (:mod:`executor.train_varlen`) in place of the plan's steps.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from functools import partial
from typing import Any

import torch.distributed as dist

from executor import allocator, checkpoint, fast_path
from executor.data import BatchStream, DataPosition, pipeline_rows
from executor.engine import Engine
from executor.groups import ProcessGroups
from executor.launch import flight
from executor.launch.bounded_store import BoundedStore, StoreError, StoreTimeout
from executor.launch.env import RankEnv, connect_store, rank_env
from executor.launch.faults import maybe_inject, parse_fault
from executor.launch.watchdog import EXIT_INTERRUPTED, EXIT_RANK_FAILURE, EXIT_USER_ERROR, Watchdog, log_error
from executor.metrics import StepLogger
from executor.optim import OptimConfig
from executor.preflight import Prepared, agree, local_checks, wait_all_seen
from executor.progress import note, step_starting
from executor.resume import choose_checkpoint
from executor.saving import Saver
from executor.tensorboard_sink import TensorBoardSink
from executor.trace import StepTrace, trace_window
from executor.train_config import TrainConfig
from executor.train_setup import (
    check_world,
    classify,
    init_process_group,
    optim_config,
    pg_timeout,
    resolve_plan,
)
from executor.train_varlen import doc_source, train_pool
from planner.cluster import ClusterSpec
from planner.errors import SpecError
from planner.layout import build_topology
from planner.plan import Plan
from planner.varlen.pool import StrategyPool


def run_training(args: TrainConfig) -> int:
    """Train per ``args`` on this rank; returns the exit code (never hangs; see module docstring)."""
    allocator.use_default()  # before this rank's first CUDA allocation
    if os.environ.get("HEXISCALE_ELASTIC") == "1":  # started by an elastic supervisor
        from executor.elastic_train import run_elastic

        return run_elastic(args)
    renv: RankEnv | None = None
    store = None
    try:
        renv = rank_env()
        plan, cluster, pool = resolve_plan(args, say=partial(_say, renv.rank))
        if pool is not None:
            _refuse_compiled_pool(pool)
        check_world(plan, renv)
        opt = optim_config(args)
        timeout_s = pg_timeout(args)
        fault = parse_fault(os.environ.get("HEXISCALE_FAULT"))
        store = connect_store(renv, args.faults.startup_timeout)
        if renv.master_port == 0:
            renv = replace(renv, master_port=store.port)
        error, prep, docs = None, None, None
        try:
            prep = local_checks(plan, renv, args, pool=pool is not None)
            docs = doc_source(args, pool, scan=renv.rank == 0) if pool is not None else None
        except SpecError as exc:
            error = exc
        # bounded: a store host that froze during start-up must not block this rank forever
        bounded = BoundedStore.around(store, args.faults.startup_timeout + 30.0, what="the rendezvous store")
        agree(bounded, renv, error, args.faults.startup_timeout)
        assert prep is not None
        prep.resume = choose_checkpoint(bounded, renv, plan, args.checkpoint.resume, args.run.steps,
                                        args.faults.startup_timeout) if args.checkpoint.resume else None
    except StoreError as exc:  # the store's host froze or died before the watchdog runs: a rank failure
        where = "the launcher that hosts it" if renv and renv.store_hosted else "rank 0, which hosts it,"
        how = "froze or its host is unreachable" if isinstance(exc, StoreTimeout) else "died"
        text = f"stopping during set-up: {exc}: {where} {how}"
        if renv is not None:
            log_error(renv, text)
        return EXIT_RANK_FAILURE
    except SpecError as exc:
        if renv is not None:
            log_error(renv, str(exc))
            if store is not None and renv.rank == 0 and not renv.store_hosted:
                wait_all_seen(store, renv, "preflight-seen", 30.0)  # let everyone read it first
        else:
            print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_USER_ERROR

    wd = Watchdog(renv, interval=args.faults.heartbeat, dead_after=args.faults.dead_after,
                  hang_after=args.faults.hang_after)
    try:
        flight.enable()
        wd.start(store)  # before the process group: a peer or store host that freezes in set-up is named too
        note(renv.rank, f"pre-flight passed on {renv.world_size} ranks; connecting the process group...")
        backend = init_process_group(renv, store, prep.device, timeout_s)
        if pool is not None:
            assert docs is not None
            train_pool(args, pool, cluster, docs, rank=renv.rank, device=prep.device, optim=opt,
                       resume=str(prep.resume.path) if prep.resume else None, wd=wd, fault=fault)
        else:
            _train_plan(args, plan, cluster, renv, prep, opt, wd, backend, fault)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BaseException as exc:  # noqa: BLE001 - every failure becomes one job-wide verdict
        reason, code, suspect_peer = classify(exc)
        wd.fail(reason, code, suspect_peer=suspect_peer)  # exits the process
    wd.finish()
    dist.destroy_process_group()
    if renv.rank == 0 and not renv.store_hosted:
        wait_all_seen(store, renv, "wd/done", args.faults.startup_timeout)
    return 0


def _say(rank: int, text: str) -> None:
    if rank == 0:
        print(f"hexiscale train: {text}", flush=True)


def _refuse_compiled_pool(pool: StrategyPool) -> None:
    """Hot switching builds its working layouts per step: no compiled blocks there yet, whether
    ``--compile`` (refused by :mod:`executor.flag_modes`) or a strategy's ``options.compile`` asks."""
    for i, st in enumerate(pool.strategies):
        if st.plan.options.compile:
            raise SpecError(f"strategies[{i}].plan.options.compile", "is not supported with a strategy pool yet "
                            "(hot switching builds its working layouts per step)",
                            "set it to false, or train one plan of the pool")


def _train_plan(args: TrainConfig, plan: Plan, cluster: ClusterSpec | None, renv: RankEnv, prep: Prepared,
                opt: OptimConfig, wd: Watchdog, backend: str, fault: Any) -> None:
    """Steps of one plan on this rank (groups, engine, resume, data, logs, checkpoints, trace)."""
    topology = build_topology(plan)
    note(renv.rank, "creating the communicators...")
    groups = ProcessGroups.create(topology, backend)
    if renv.rank == 0:
        print(f"hexiscale train: rank 0 connected {groups.members()} communicators in {groups.setup_s:.2f} s"
              + (f" ({groups.device_mib:.0f} MiB of device memory)" if backend == "nccl" else ""), flush=True)
    note(renv.rank, f"building the model ({plan.model.name}, rank 0's stage: layers "
                    f"{plan.pipelines[0].stages[0].layers[0]}-{plan.pipelines[0].stages[0].layers[1] - 1})...")
    engine = Engine(plan, topology, groups, device=prep.device, optim=opt, seed=args.run.seed,
                    on_nonfinite=args.faults.on_nonfinite)
    # --compile forces compilation; a plan whose options.compile is set asks for it itself
    want = args.layout.compile or plan.options.compile
    compiled = fast_path.compile_blocks(engine.module) if want else 0
    if want and renv.rank == 0:
        source = "--compile" if args.layout.compile else "the plan's options.compile"
        print(f"hexiscale train: {source}: " + (f"{compiled} blocks of rank 0's stage compiled (the first step "
              "compiles them)" if compiled else "the CPU runs eager (torch.compile is used on CUDA only)"), flush=True)
    position = DataPosition()
    if prep.resume is not None:
        note(renv.rank, f"loading checkpoint {prep.resume.path}...")
        extra = checkpoint.load(engine, prep.resume.path)
        gbs = plan.global_batch_size
        position = DataPosition.from_dict(extra["data"], str(prep.resume.path)) if "data" in extra \
            else DataPosition(engine.step, engine.step * gbs)
    pipeline = engine.stage.pipeline
    note(renv.rank, f"loading data ({args.data.path or 'synthetic tokens'})...")
    stream = BatchStream(prep.source, global_batch_size=plan.global_batch_size,
                         rows=pipeline_rows(plan, pipeline), position=position, device=prep.device)
    logger = StepLogger(plan, renv.rank, pipeline, leader=engine.stage.is_first and engine.tp_rank == 0,
                        device=prep.device, cluster=cluster, jsonl=args.metrics.log_jsonl, every=args.metrics.log_every,
                        tensorboard=TensorBoardSink(args.metrics.tensorboard)
                        if args.metrics.tensorboard and renv.rank == 0 else None)
    saver = Saver(engine, args.checkpoint.dir, args.checkpoint.save_every, args.checkpoint.async_save)
    start = engine.step
    trace = StepTrace(path=args.metrics.trace, plan=plan, device=prep.device, rank=renv.rank, world=groups.world,
                      window=trace_window(start, args.run.steps, args.metrics.trace_steps)) \
        if args.metrics.trace else None
    if trace is not None:
        engine.set_trace(trace)
    if renv.rank == 0:
        print(f"hexiscale train: {plan.world_size} ranks, {len(plan.pipelines)} pipelines, model "
              f"{plan.model.name}, {prep.device.type} ({backend}), data {args.data.path or 'synthetic'}, steps "
              f"{start}..{args.run.end}" + (f", resumed from {prep.resume.path}" if prep.resume else ""), flush=True)
    step_starting(renv.rank, start + 1, compiled=bool(compiled))
    for k in range(start, args.run.end):
        wd.begin_step(k + 1)
        maybe_inject(fault, renv.rank, k)
        if trace is not None:
            trace.begin_step(k)
        t0 = time.perf_counter()
        stats = engine.train_step(stream.next())
        logger.step(k, args.run.steps, stats, time.perf_counter() - t0)
        if trace is not None:
            trace.end_step(k)
        state = {"data": stream.position.to_dict(), "plan_world_size": plan.world_size}
        saver.after_step(k + 1, k + 1 == args.run.end, state,
                         partial(maybe_inject, fault, renv.rank, k, in_save=True))
    engine.drain()
    saver.finish()
    logger.summary(start, plan.global_batch_size * plan.model.seq_len)
