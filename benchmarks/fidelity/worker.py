"""Runs plans with the executor and measures step time and peak memory per GPU (device side).

``run_launch(launch_plans, sm, cpu, out)`` starts one process per GPU (``sm[k]`` = MPS SM share of GPU
``k``, set before its CUDA context exists). For every plan, the processes whose device the plan uses
form a fresh process group (a ``FileStore`` per plan; the plan rank of a process is the index of its
device ``g<k>:0`` in the plan), build the :class:`executor.train.engine.Engine`, run ``warmup`` steps and
``steps`` timed steps on synthetic tokens, and record:

* where the plan's wall time goes (``phases_s``: groups, initial weights, GEMM check, engine build,
  warm-up, timed steps, teardown; :mod:`benchmarks.fidelity.phases`), printed with the step time; a
  rank draws the initial weights on its GPU, once per model, before the plan's peak-memory window
  (:mod:`benchmarks.fidelity.engine_start`);
* step time: every step starts after a barrier; each rank times it (device synchronised), the step's
  time is the slowest rank's (one scalar all-reduce after the step, outside its clock), and the
  plan's figure is the median over the timed steps: ``steps`` of them, or from ``min_steps`` on as
  soon as the last ones agree (:mod:`benchmarks.fidelity.steady`);
* what a plan leaves allocated after its engine and groups are dropped (``left_allocated_gib``; 0
  when nothing leaks) and what earlier plans left before it (``allocated_before_gib``);
* memory per GPU, per process: ``max_memory_allocated`` and ``max_memory_reserved`` (reset per plan:
  the caching allocator's own figures, exact for this process whatever else runs on the GPU) and
  ``comm_gib``, the device memory the plan's NCCL communicators take outside the allocator: the
  growth of the device's memory in use across the creation and first use of the plan's groups less
  the allocator's growth in that window (only this process allocates on its GPU then: one process
  per GPU). Also the device memory in use after the steps (``total - free``), kept for reference:
  it is device-wide, and under MPS it counts the MPS server and the other clients, so it is not
  what this process needs (:func:`benchmarks.fidelity.accuracy.device_memory` says what is compared).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.fidelity import engine_start, phases, steady, traced_step
from benchmarks.fidelity.phases import PhaseClock
from executor.job.spawn import spawn
from planner.plan import plan_from_dict

GIB = float(1 << 30)
SEED = 0  # of every plan's initial weights


def _device_in_use(device: torch.device) -> float:
    if device.type != "cuda":
        return 0.0
    free, total = torch.cuda.mem_get_info(device)
    return (total - free) / GIB


def _reserved(device: torch.device) -> float:
    return torch.cuda.memory_reserved(device) / GIB if device.type == "cuda" else 0.0


def _packed_inputs(engine: Any, plan: Any, packed: list[list[list[int]]], gen: torch.Generator,
                   device: torch.device) -> tuple[list[Any], int]:
    """One step's packed micro-batches of this rank's pipeline and the step's label count:
    ``packed[p][j]`` lists the document lengths (labels) of micro-batch ``j`` of pipeline ``p``, each
    document random tokens of that length + 1. Made before the step's clock starts, as the
    unpacked rows are (drawing every pipeline's tokens is data loading, not the step)."""
    from executor.data.packed_batch import pack_documents

    mine = packed[engine.stage.pipeline]
    micro = []
    for p, pipe in enumerate(packed):
        for lengths in pipe:
            docs = [torch.randint(0, plan.model.vocab_size, (n + 1,), generator=gen) for n in lengths]
            if p == engine.stage.pipeline:
                micro.append(pack_documents(docs, device))
    assert len(micro) == len(mine)
    return micro, sum(n for pipe in packed for mb in pipe for n in mb)


def _run_plan(plan_dict: dict[str, Any], gpu: int, device: torch.device, store_dir: str, index: int,
              warmup: int, steps: int, clock: PhaseClock,
              packed: list[list[list[int]]] | None = None, min_steps: int = 0,
              trace: bool = False, weights: engine_start.InitCache | None = None) -> dict[str, Any] | None:
    from executor.parallel.groups import ProcessGroups
    from executor.train.engine import Engine
    from executor.train.optim import OptimConfig
    from planner.layout import build_topology, stage_params

    plan = plan_from_dict(plan_dict)
    mine = f"g{gpu}:0"
    if mine not in plan.devices:
        return None
    rank, world = plan.devices.index(mine), plan.world_size
    backend = "nccl" if device.type == "cuda" else "gloo"
    store = dist.FileStore(os.path.join(store_dir, f"plan{index}"), world)
    t_start = time.perf_counter()
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timedelta(seconds=300))
    clock.add("groups", time.perf_counter() - t_start)
    rec: dict[str, Any] = {"rank": rank, "device": mine, "phases_s": clock.seconds}
    teardown = contextlib.ExitStack()
    try:
        topo = build_topology(plan)
        if weights is not None:  # the initial weights drawn before the peak window opens (engine_start)
            st = topo.stage_of(rank)
            with clock.phase("weights"):
                weights.fill(plan.model, SEED, [p.name for p in stage_params(plan.model, st.layers, st.is_first,
                                                                            st.is_last, st.chunks)])
        if device.type == "cuda":
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
            rec["in_use_before_gib"] = _device_in_use(device)
            rec["allocated_before_gib"] = torch.cuda.memory_allocated(device) / GIB
        reserved0 = _reserved(device)
        with clock.phase("groups"):
            groups = ProcessGroups.create(topo)
            dist.barrier()
        if device.type == "cuda":  # the communicators exist and are connected (executor.parallel.groups); settle them
            rec["comm_gib"] = max(0.0, _device_in_use(device) - rec["in_use_before_gib"]
                                  - (_reserved(device) - reserved0))
        checked = clock.seconds.get("gemm_check", 0.0)
        with clock.phase("build"):
            engine = Engine(plan, topo, groups, device=device,
                            optim=OptimConfig(warmup_steps=1, total_steps=1000), seed=SEED)
            if plan.options.compile:  # as training does (executor.switch.elastic); a CPU run stays eager
                from executor.model.fast_path import compile_blocks

                rec["compiled_blocks"] = compile_blocks(engine.module)
        clock.add("build", checked - clock.seconds.get("gemm_check", 0.0))  # the check is its own phase
        pipe_idx = engine.stage.pipeline
        offset = sum(p.batch_size for p in plan.pipelines[:pipe_idx])
        gen = torch.Generator().manual_seed(1234)
        seq = plan.model.seq_len

        def next_step(eng: Any = engine) -> Callable[[], Any]:
            """The next step's inputs (made here, before its clock) and the call that trains on them."""
            if packed is None:
                tokens = torch.randint(0, plan.model.vocab_size, (plan.global_batch_size, seq + 1), generator=gen)
                rows = tokens[offset:offset + plan.pipelines[pipe_idx].batch_size]
                return lambda: eng.train_step(rows)
            micro, labels = _packed_inputs(eng, plan, packed, gen, device)
            return lambda: eng.train_micro_batches(micro, labels)

        times: list[float] = []  # the slowest rank's time of each timed step
        for step in range(warmup + steps):
            t_phase = time.perf_counter()
            train = next_step()
            dist.barrier()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            stats = train()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t1 = time.perf_counter()
            clock.add("warmup" if step < warmup else "steps", t1 - t_phase)
            rec["loss"] = stats.loss
            if step >= warmup:  # every rank holds the same figures, so every rank stops at the same step
                slowest = torch.tensor([t1 - t0], dtype=torch.float64, device=device)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
                times.append(float(slowest.item()))
                if steady.enough(times, min_steps=min_steps or steps, max_steps=steps):
                    break
        rec.update(step_times_s=times, step_time_s=statistics.median(times))
        if device.type == "cuda":
            rec.update(max_allocated_gib=torch.cuda.max_memory_allocated(device) / GIB,
                       max_reserved_gib=torch.cuda.max_memory_reserved(device) / GIB,
                       in_use_gib=_device_in_use(device))
        if trace:
            with clock.phase("traced"):
                try:  # a diagnostic: its failure leaves the plan's measured figures standing
                    rec["traced_s"] = traced_step.trace_one_step(engine, plan, rank=rank, device=device,
                                                                 folder=store_dir, index=index, step=next_step())
                except Exception as exc:  # noqa: BLE001
                    rec["traced_error"] = f"{type(exc).__name__}: {exc}"[:200]
        teardown.enter_context(clock.phase("teardown"))
        del engine, next_step, train  # the step closures hold the engine too
        groups.close()
    except Exception:  # noqa: BLE001 - an OOM or a failing plan is a result, not the end of the launch
        rec["error"] = traceback.format_exc()[-2000:]
    finally:
        with teardown:
            dist.destroy_process_group()
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if device.type == "cuda":
            # what this plan left allocated once its engine and groups are gone: 0 unless something
            # keeps a dropped Engine alive (a hook cycle did, and inflated every later plan's peak)
            rec["left_allocated_gib"] = torch.cuda.memory_allocated(device) / GIB - rec.get("allocated_before_gib", 0.0)
    return rec


def _worker(gpu: int, sm: list[int], plans: list[dict[str, Any]], cpu: bool, store_dir: str, out_dir: str,
            warmup: int, steps: int, min_steps: int = 0, trace: bool = False) -> None:
    if not cpu and sm[gpu] < 100:
        os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(sm[gpu])
    if cpu:
        torch.set_num_threads(1)
    device = torch.device("cpu") if cpu else torch.device("cuda", gpu)
    if not cpu:
        torch.cuda.set_device(device)
        torch.zeros(1, device=device)  # create the context now (under the SM share)
    results = []
    context_gib = _device_in_use(device)
    current: list[PhaseClock] = []
    with engine_start.installed(lambda: current[0] if current else None, device) as weights:
        for i, entry in enumerate(plans):
            current[:] = [PhaseClock(device)]
            rec = _run_plan(entry["plan"], gpu, device, store_dir, i, warmup, steps, current[0], entry.get("packed"),
                            min_steps, trace, weights)
            if rec is not None:
                rec["name"] = entry["name"]
                results.append(rec)
                msg = rec.get("error", "").strip().splitlines()[-1:] or [f"{rec['step_time_s'] * 1e3:.1f} ms"]
                print(f"[gpu{gpu} sm{sm[gpu]}] {entry['name']}: {msg[0]} ({phases.describe(rec['phases_s'])})",
                      flush=True)
    Path(out_dir, f"gpu{gpu}.json").write_text(json.dumps({"gpu": gpu, "sm_percent": sm[gpu],
                                                           "context_gib": context_gib, "results": results}))


def run_launch(plans: list[dict[str, Any]], sm: list[int], *, cpu: bool, warmup: int = 3,
               steps: int = 6, min_steps: int = 0, trace: bool = False) -> dict[str, Any]:
    """Run ``plans`` (``[{"name", "plan": plan-dict, "packed"?}]``) with one process per GPU; merged results
    per plan. Up to ``steps`` timed steps; with ``min_steps`` (< ``steps``) a plan stops once at least
    that many are timed and the last ones agree (:mod:`benchmarks.fidelity.steady`); ``trace``: one
    more step, traced (:mod:`benchmarks.fidelity.traced_step`), per rank in ``traced_s``. ``packed``
    (optional): per pipeline, per micro-batch, the document lengths of one packed row (the executor's
    packed attention) instead of the plan's rows of ``seq_len`` tokens."""
    with tempfile.TemporaryDirectory() as store_dir, tempfile.TemporaryDirectory() as out_dir:
        spawn(_worker, len(sm), (sm, plans, cpu, store_dir, out_dir, warmup, steps, min_steps, trace))
        per_gpu = [json.loads(Path(out_dir, f"gpu{k}.json").read_text()) for k in range(len(sm))]
    merged: dict[str, Any] = {}
    for g in per_gpu:
        for rec in g["results"]:
            m = merged.setdefault(rec["name"], {"name": rec["name"], "ranks": []})
            m["ranks"].append({**rec, "gpu": g["gpu"], "sm_percent": g["sm_percent"], "context_gib": g["context_gib"]})
    out = []
    for entry in plans:
        m = merged.get(entry["name"], {"name": entry["name"], "ranks": []})
        ranks = sorted(m["ranks"], key=lambda r: r["rank"])
        errors = [r["error"] for r in ranks if "error" in r]
        rec = {"name": entry["name"], "plan": entry["plan"], "sm": sm, "ranks": ranks}
        if ranks:
            rec["phases_s"] = phases.slowest([r["phases_s"] for r in ranks])
        traced = [r["traced_s"] for r in ranks if r.get("traced_s")]
        if traced:  # the rank whose traced step took longest (the others wait for it)
            rec["traced_s"] = max(traced, key=lambda t: t.get("step_s", 0.0))
        if errors:
            rec["error"] = errors[0]
        else:
            rec["step_time_s"] = max(r["step_time_s"] for r in ranks)
        out.append(rec)
    return {"sm": sm, "plans": out}
