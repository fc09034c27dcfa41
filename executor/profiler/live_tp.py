"""Live TP layer rows: the layer timed the way a TP stage runs it, on ``t`` ranks with its real
all-reduces (``"collectives": true`` in the measured ``layer`` table).

Why: the shard-only rows (:func:`executor.profiler.compute.measure_layer` with no group) time one
rank's compute, and the cost model adds all-reduces from the link model plus a host cost per
collective. At small micro-batches eager TP is host-bound, and there the sum falls far short: on
4 x H200 (llama-1.3b, seq 2048, TP 2, micro-batch 1) a live stage ran ~2.35 ms forward and ~3.2 ms
backward per layer against 0.7-0.8 / 1.1-1.9 ms shard-only plus ~0.2 ms of modelled all-reduces.
The live rows measure that directly; :mod:`planner.cost.measured` (rule 6) reads them and
:mod:`planner.cost.stage` then adds none of the layer's all-reduces again.

How: one :func:`executor.job.spawn.spawn` of ``world = max(tps)`` processes (one per local GPU with
NCCL, the default group bound to its device so every communicator is created eagerly; gloo
processes on the CPU), the store hosted by the parent on a port the OS picks. For each TP degree
``t`` in order, every rank creates the group of ranks ``0..t-1`` (the default group when ``t`` is the
world) — the same groups in the same order on every rank, as :mod:`executor.parallel.groups` requires —
connects it with one all-reduce, and its members time each point with ``measure_layer(...,
group=...)``: chained layers, forward then backward, warm-up then the median of the repeats, each
repetition started together. On CUDA each repetition is issued behind a GPU spin of this rank's own
length (host-free device times, :func:`executor.profiler.timing.phase_times`); the leading one-element
all-reduce, queued behind the spin, starts every member's timed region after the slowest member's spin,
so a peer's wait stays outside the interval and every rank issues the same collectives in the same order
as without the spin. The row is the slowest member's median (``MAX`` over the group), of the
host's issue times too. The other ranks wait in a barrier. (A TP-2 point runs while GPUs 2 and 3 idle,
as on a host whose other pipelines are elsewhere.)
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from executor.job.spawn import spawn
from executor.profiler import compute
from planner.model import ModelSpec, model_from_dict

TIMEOUT_S = 600.0  # a whole live run (ranks blocked in a collective never hang calibrate)


def _worker(rank: int, world: int, port: int, backend: str, model: dict[str, Any], points: list[dict[str, Any]],
            dtype: str, warmup: int, repeats: int, chain: int, sm_percent: float | None, out: str) -> None:
    if sm_percent is not None:  # MPS reads this when the CUDA context is created, i.e. after this line
        os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(int(sm_percent))
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:  # the ranks share the host's cores, as TP ranks on one CPU would
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    store = dist.TCPStore("127.0.0.1", port, world + 1, False, timeout=timedelta(seconds=TIMEOUT_S))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=TIMEOUT_S), device_id=device if device.type == "cuda" else None)
    spec = model_from_dict(model)
    rows: list[dict[str, Any]] = []
    try:
        for tp in sorted({p["tp"] for p in points}):  # every rank, every group, one order
            group = dist.group.WORLD if tp == world else dist.new_group(list(range(tp)))
            if rank < tp:
                dist.all_reduce(torch.ones(1, device=device), group=group)  # connect before timing
                for p in (p for p in points if p["tp"] == tp):
                    torch.manual_seed(0)  # the same input on every rank: activations are replicated in TP
                    res = compute.measure_layer(spec, micro_batch=p["micro_batch"], seq_len=p["seq_len"], tp=tp,
                                                recompute=p["recompute"], dtype=dtype, device=device, warmup=warmup,
                                                repeats=repeats, chain=chain, group=group)
                    slowest = torch.tensor([res[k] for k in compute.TIME_KEYS], dtype=torch.float64, device=device)
                    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
                    rows.append({**p, **dict(zip(compute.TIME_KEYS, (float(v) for v in slowest.cpu()), strict=True)),
                                 "chain": chain, "ranks": tp, "backend": backend})
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
            dist.barrier()
        if rank == 0:
            Path(out).write_text(json.dumps(rows))
    finally:
        dist.destroy_process_group()


def live_points(model: ModelSpec, tps: list[int], micro_batches: list[int]) -> list[dict[str, Any]]:
    """The live points: every TP degree of ``tps`` at every micro-batch, the model's sequence length,
    no recompute (the cost model derives the other modes: :mod:`planner.cost.measured` rule 6)."""
    return [{"micro_batch": mb, "seq_len": model.seq_len, "tp": tp, "recompute": "none", "collectives": True}
            for tp in tps for mb in micro_batches]


def measure_live_layers(model: ModelSpec, points: list[dict[str, Any]], *, cpu: bool, dtype: str, warmup: int,
                        repeats: int, chain: int, sm_percent: float | None = None) -> list[dict[str, Any]]:
    """Time every point of :func:`live_points` on ``max(tp)`` ranks (module docstring); the rows, in the
    order measured (by TP degree, then as given)."""
    if not points:
        return []
    world = max(p["tp"] for p in points)
    if world < 2 or (not cpu and torch.cuda.device_count() < world):
        raise ValueError(f"live TP rows at tp={world} need {world} ranks (devices: "
                         f"{'gloo processes' if cpu else torch.cuda.device_count()})")
    store = dist.TCPStore("127.0.0.1", 0, world + 1, True, timeout=timedelta(seconds=TIMEOUT_S),
                          wait_for_workers=False)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "live.json"
        spawn(_worker, world, (world, store.port, "gloo" if cpu else "nccl", model.to_dict(), points, dtype, warmup,
                               repeats, chain, sm_percent, str(out)), timeout=TIMEOUT_S)
        rows: list[dict[str, Any]] = json.loads(out.read_text())
    return rows
