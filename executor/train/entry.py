"""``hexiscale train``: one process per plan rank, driven by a :class:`TrainConfig`.

Order of events on every rank: read the launcher environment and the plan (world size checked) ->
connect to the job's TCPStore -> local pre-flight (device, data, checkpoint) -> agree through the
store (any failure: every rank exits 1 with the same message, nothing trained) -> process group ->
heartbeat watchdog -> engine (+ resume) -> steps (log, checkpoint) -> clean finish. From the process
group on, any failure is turned into one job-wide verdict and exit code by the watchdog (see
:mod:`executor.job.watchdog` for the codes and the time bound). A strategy pool as the plan
trains mixed-length data with hot switching. The steps are :mod:`executor.train.loop`'s, over a
plan's runner (:mod:`executor.train.plan_runner`) or a pool's (:mod:`executor.train.pool_runner`).
"""

from __future__ import annotations

import faulthandler
import io
import os
import signal
import sys
from dataclasses import replace
from functools import partial
from typing import Any

import torch.distributed as dist

from executor.data.doc_source import DocSource
from executor.data.stream import DataPosition
from executor.job import flight
from executor.job.bounded_store import BoundedStore, StoreError, StoreTimeout
from executor.job.env import RankEnv, connect_store, rank_env
from executor.job.faults import parse_fault
from executor.job.watchdog import EXIT_INTERRUPTED, EXIT_RANK_FAILURE, EXIT_USER_ERROR, Watchdog, log_error
from executor.model import allocator
from executor.state.resume import choose_checkpoint
from executor.train import plan_runner, pool_runner
from executor.train.config import TrainConfig
from executor.train.loop import StepRunner, run_loop
from executor.train.optim import OptimConfig
from executor.train.plan_runner import PlanRunner
from executor.train.pool_runner import PoolRunner
from executor.train.preflight import Prepared, agree, rank_checks, wait_all_seen
from executor.train.progress import note, step_starting
from executor.train.setup import (
    check_world,
    classify,
    init_process_group,
    optim_config,
    pg_timeout,
    resolve_plan,
)
from executor.train.tensorboard_sink import TensorBoardSink
from executor.train.trace import StepTrace, trace_window
from planner.cluster import ClusterSpec
from planner.errors import SpecError
from planner.plan import Plan
from planner.varlen.pool import StrategyPool


def _stacks_on_sigusr1() -> None:
    """``kill -USR1 <pid>`` prints every thread's Python stack to stderr: where a hung rank waits.
    Not where stderr is no file (a caller that captures it, as tests do)."""
    if not hasattr(signal, "SIGUSR1"):
        return
    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    except (AttributeError, ValueError, io.UnsupportedOperation):
        return


def run_training(args: TrainConfig) -> int:
    """Train per ``args`` on this rank; returns the exit code (never hangs; see module docstring)."""
    allocator.use_default()  # before this rank's first CUDA allocation
    _stacks_on_sigusr1()
    if os.environ.get("HEXISCALE_ELASTIC") == "1":  # started by an elastic supervisor
        from executor.switch.elastic import run_elastic

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
        prep, docs, error = rank_checks(plan, renv, args, pool)
        # bounded: a store host that froze during start-up must not block this rank forever
        bounded = BoundedStore.around(store, args.faults.startup_timeout + 30.0, what="the rendezvous store")
        agree(bounded, renv, error, args.faults.startup_timeout)
        assert prep is not None
        prep.resume = choose_checkpoint(bounded, renv, plan, args.checkpoint.resume, args.run.steps,
                                        args.faults.startup_timeout) \
            if args.checkpoint.resume else None
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
        _train(args, plan, pool, docs, cluster, renv, prep, opt, wd, backend, fault)
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
    ``--compile`` (refused by :mod:`executor.train.flag_modes`) or a strategy's ``options.compile`` asks."""
    for i, st in enumerate(pool.strategies):
        if st.plan.options.compile:
            raise SpecError(f"strategies[{i}].plan.options.compile", "is not supported with a strategy pool yet "
                            "(hot switching builds its working layouts per step)",
                            "set it to false, or train one plan of the pool")


def _train(args: TrainConfig, plan: Plan, pool: StrategyPool | None, docs: DocSource | None,
           cluster: ClusterSpec | None, renv: RankEnv, prep: Prepared, opt: OptimConfig, wd: Watchdog, backend: str,
           fault: Any) -> None:
    """This rank's runner (a plan's, or a pool's: :mod:`executor.train.loop`), resumed if asked, then the loop."""
    resume = str(prep.resume.path) if prep.resume else None
    tensorboard = TensorBoardSink(args.metrics.tensorboard) if args.metrics.tensorboard and renv.rank == 0 else None
    note(renv.rank, "creating the communicators...")
    runner: StepRunner
    if pool is not None:
        assert docs is not None and cluster is not None
        runner, compiled = _pool_runner(args, pool, docs, cluster, renv, prep, opt, resume, tensorboard), 0
    else:
        runner, compiled = _plan_runner(args, plan, cluster, renv, prep, opt, backend, resume, tensorboard)
    step_starting(renv.rank, runner.engine.step + 1, compiled=bool(compiled))
    run_loop(args, runner, wd=wd, fault=fault)


def _pool_runner(args: TrainConfig, pool: StrategyPool, docs: DocSource, cluster: ClusterSpec, renv: RankEnv,
                 prep: Prepared, opt: OptimConfig, resume: str | None,
                 tensorboard: TensorBoardSink | None) -> PoolRunner:
    note(renv.rank, f"building the model ({pool.model.name}; the hot-switching engine, home strategy "
                    f"{pool.strategies[pool.home].name})...")
    hot, groups = pool_runner.build_engine(pool, args, device=prep.device, optim=opt)
    cursor = 0
    if resume is not None:
        note(renv.rank, f"loading checkpoint {resume}...")
        cursor = pool_runner.resume(hot.home, resume)
    note(renv.rank, f"loading data ({args.data.path or args.varlen.lengths})...")
    runner = PoolRunner(hot, groups, pool, args, source=docs, cluster=cluster, cursor=cursor, tensorboard=tensorboard)
    _say(renv.rank, f"strategy pool of {len(pool.strategies)} ({', '.join(s.name for s in pool.strategies)}; "
         f"home {pool.strategies[pool.home].name}), {pool.home_plan.world_size} ranks, model {pool.model.name}, "
         f"context {pool.context:,}, {args.varlen.step_tokens:,} tokens per step, "
         f"data {args.data.path or args.varlen.lengths}, "
         f"{prep.device.type}, steps {hot.home.step}..{args.run.end}" + (f", resumed from {resume}" if resume else ""))
    return runner


def _plan_runner(args: TrainConfig, plan: Plan, cluster: ClusterSpec | None, renv: RankEnv, prep: Prepared,
                 opt: OptimConfig, backend: str, resume: str | None,
                 tensorboard: TensorBoardSink | None) -> tuple[PlanRunner, int]:
    """The plan's runner and how many blocks were compiled."""
    note(renv.rank, f"building the model ({plan.model.name}, rank 0's stage: layers "
                    f"{plan.pipelines[0].stages[0].layers[0]}-{plan.pipelines[0].stages[0].layers[1] - 1})...")
    engine, compiled = plan_runner.build_engine(plan, args, device=prep.device, optim=opt, backend=backend)
    if renv.rank == 0:
        print(f"hexiscale train: rank 0 connected {engine.groups.members()} communicators in "
              f"{engine.groups.setup_s:.2f} s" + (f" ({engine.groups.device_mib:.0f} MiB of device memory)"
                                                 if backend == "nccl" else ""), flush=True)
    # --compile forces compilation; a plan whose options.compile is set asks for it itself
    if (args.layout.compile or plan.options.compile) and renv.rank == 0:
        source = "--compile" if args.layout.compile else "the plan's options.compile"
        print(f"hexiscale train: {source}: " + (f"{compiled} blocks of rank 0's stage compiled (the first step "
              "compiles them)" if compiled else "the CPU runs eager (torch.compile is used on CUDA only)"), flush=True)
    position = DataPosition()
    if resume is not None:
        note(renv.rank, f"loading checkpoint {resume}...")
        position = plan_runner.resume(engine, resume)
    note(renv.rank, f"loading data ({args.data.path or 'synthetic tokens'})...")
    trace = StepTrace(path=args.metrics.trace, plan=plan, device=prep.device, rank=renv.rank,
                      world=engine.groups.world,
                      window=trace_window(engine.step, args.run.steps, args.metrics.trace_steps)) \
        if args.metrics.trace else None
    runner = PlanRunner(engine, args, source=prep.source, position=position, cluster=cluster,
                        tensorboard=tensorboard, trace=trace)
    _say(renv.rank, f"{plan.world_size} ranks, {len(plan.pipelines)} pipelines, model {plan.model.name}, "
         f"{prep.device.type} ({backend}), data {args.data.path or 'synthetic'}, steps {engine.step}..{args.run.end}"
         + (f", resumed from {resume}" if resume else ""))
    return runner, compiled
