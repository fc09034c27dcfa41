"""The rank side of ``benchmarks/executor/mixed_length.py``: one method's steps on every rank of a
:class:`~tests.support.dist_testing.DistPool` job (gloo on CPU, NCCL on GPUs)."""

from __future__ import annotations

import gc
import time
from typing import Any

import numpy as np


def run_job(pool_dict: dict[str, Any], costs: list[Any], assign: str, hist_dict: dict[str, Any], step_tokens: int,
            steps: int, warmup: int, seed: int, wire_bf16: bool) -> dict[str, Any] | None:
    """On every rank: ``warmup + steps`` hot-switching steps of ``pool`` (one strategy = static
    training: dispatch and packing, no switches). Rank 0 returns the measurements, the others None."""
    import torch
    import torch.distributed as dist

    from executor.data.doc_source import SyntheticDocs
    from executor.data.step_prefetch import LayoutStream
    from executor.model.fast_path import synchronize
    from executor.switch.hot_switch import HotSwitchEngine, switch_groups
    from executor.train.optim import OptimConfig
    from planner.varlen.histogram import histogram_from_dict
    from planner.varlen.pool import pool_from_dict

    pool = pool_from_dict(pool_dict)
    plans = [s.plan for s in pool.strategies]
    cuda = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    t_setup = time.perf_counter()
    groups = switch_groups(plans, pool.home)
    eng = HotSwitchEngine(plans, pool.home, groups, device=device, seed=seed,
                          optim=OptimConfig(lr=1e-4, min_lr=1e-5, warmup_steps=1, total_steps=max(2, steps + warmup)),
                          wire_dtype=torch.bfloat16 if (cuda and wire_bf16) else None)
    source = SyntheticDocs(histogram_from_dict(hist_dict), pool.context, pool.model.vocab_size, seed=seed)
    stream = LayoutStream(source, costs, step_tokens=step_tokens, group=groups.layouts, assign=assign, seed=seed)
    setup_s = time.perf_counter() - t_setup
    rows = []
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    for k in range(warmup + steps):
        plan = stream.next()
        synchronize(device)
        t0 = time.perf_counter()
        st = eng.train_step(plan.docs, plan.layout, global_tokens=plan.docs.label_tokens, timed=True)
        synchronize(device)
        rows.append({"step": k, "s": time.perf_counter() - t0, "tokens": plan.docs.label_tokens,
                     "sequences": len(plan.docs), "longest": max(plan.docs.lengths),
                     "phases": len(plan.layout.phases), "switch_s": st.switch_s, "solve_s": plan.solve_s,
                     "wait_s": plan.wait_s, "loss": st.step.loss, "estimate_s": plan.layout.time_s})
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else float("nan")
    gathered = [torch.tensor([peak], device=device)]
    if dist.get_world_size() > 1:
        mine = gathered[0]
        gathered = [torch.zeros(1, device=device) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, mine)
    del eng, stream
    groups.close()
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    if dist.get_rank() != 0:
        return None
    timed = rows[warmup:]
    tot_s = sum(r["s"] for r in timed)
    return {"steps": rows, "setup_s": setup_s, "tokens_per_s": sum(r["tokens"] for r in timed) / tot_s,
            "step_s": tot_s / len(timed), "switch_s": float(np.mean([r["switch_s"] for r in timed])),
            "solve_s": float(np.mean([r["solve_s"] for r in timed])),
            "wait_s": float(np.mean([r["wait_s"] for r in timed])), "peak_gib": [float(p.item()) for p in gathered],
            "estimate_step_s": float(np.mean([r["estimate_s"] for r in timed]))}
