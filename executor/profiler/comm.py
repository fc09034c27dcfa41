"""Communication measurements between ranks with ``torch.distributed``: p2p and all-reduce over message sizes.

``measure_comm`` spawns ``world`` processes (one per GPU with NCCL, or CPU processes with gloo), and
times, for each message size ``B``:

* p2p — a ping-pong between ranks 0 and 1 (``send``/``recv``), ``K`` round trips; one message takes
  ``elapsed / (2K)``;
* all-reduce (SUM) over all ranks, ``K`` calls; one takes ``elapsed / K``.

* TP collective issue — the host seconds one tensor-parallel all-reduce takes to issue as the
  executor issues it (:func:`executor.parallel.tp_layers.reduce_from_tp`: the autograd Function, the local
  copy, c10d's ``all_reduce`` and the backend's enqueue), timed on the host clock WITHOUT waiting
  for the device over ``K`` calls on a small tensor (the slowest rank's figure): the cost model's
  ``collective_host_s`` (:mod:`planner.cost.stage`), which a launch-bound pass pays on its host.

Each series is fitted to the link model of :mod:`planner.cost.links` by least squares on the relative
error (so small messages count as much as large ones)::

    p2p:         t = α + B / bw                          -> latency_us = α,   bandwidth_GBps = bw
    all-reduce:  t = 2(n-1)·α + 2(n-1)/n · B / bw        (ring) -> the same per-link α and bw ("bus" bw)
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from executor.job.spawn import free_port, spawn


def fit_link(sizes: list[float], times: list[float], kind: str, world: int) -> dict[str, float]:
    """Least-squares fit of ``t = a + b·B`` weighted by ``1/t``; returns latency (µs) and bandwidth (GB/s)
    per link (for all-reduce, undoing the ring factors)."""
    s, t = np.asarray(sizes, float), np.asarray(times, float)
    rows = np.stack([1.0 / t, s / t], axis=1)
    (a, b), *_ = np.linalg.lstsq(rows, np.ones_like(t), rcond=None)
    a, b = max(float(a), 0.0), max(float(b), 1e-30)
    if kind == "allreduce" and world > 1:
        a /= 2 * (world - 1)
        b /= 2 * (world - 1) / world
    return {"latency_us": a * 1e6, "bandwidth_GBps": 1.0 / b / 1e9}


def _worker(rank: int, world: int, port: int, backend: str, sizes: list[int], iters: list[int], out: str,
            sm_percents: list[float | None]) -> None:
    sm = sm_percents[rank] if rank < len(sm_percents) else None
    if sm is not None:  # MPS reads this when the CUDA context is created, i.e. after this line
        os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(int(sm))
    use_cuda = backend == "nccl"
    device = torch.device("cuda", rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    results: dict[str, list[dict[str, float]]] = {"p2p": [], "allreduce": []}

    def sync() -> None:
        if use_cuda:
            torch.cuda.synchronize(device)

    def timed(op: Callable[[], None], reps: int) -> float:
        """Seconds for ``reps`` calls of ``op``, started together on every rank, device work included."""
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            op()
        sync()
        return time.perf_counter() - t0

    def ping_pong(buf: torch.Tensor) -> None:
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        elif rank == 1:
            dist.recv(buf, 0)
            dist.send(buf, 0)

    try:
        for nbytes, k in zip(sizes, iters):
            buf = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
            p2p, all_reduce = partial(ping_pong, buf), partial(dist.all_reduce, buf)
            if world >= 2:
                timed(p2p, 2)  # warm-up
                elapsed = timed(p2p, k)
                if rank == 0:
                    results["p2p"].append({"bytes": buf.numel() * 4, "seconds": elapsed / (2 * k)})
            timed(all_reduce, 2)  # warm-up
            slowest = torch.tensor([timed(all_reduce, k)], dtype=torch.float64).to(device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            if rank == 0:
                results["allreduce"].append({"bytes": buf.numel() * 4, "seconds": float(slowest.cpu()) / k})
        issue = torch.tensor([tp_issue_seconds(device, sync)], dtype=torch.float64).to(device)
        dist.all_reduce(issue, op=dist.ReduceOp.MAX)
        if rank == 0:
            Path(out).write_text(json.dumps({**results, "tp_issue_s": float(issue.cpu())}))
    finally:
        dist.destroy_process_group()


def tp_issue_seconds(device: torch.device, sync: Callable[[], None], calls: int = 50) -> float:
    """Host seconds per call of :func:`executor.parallel.tp_layers.reduce_from_tp` over the default group on a
    small tensor, the device not waited for inside the timed loop (module docstring)."""
    from executor.parallel.tp_layers import reduce_from_tp

    x = torch.ones(1024, dtype=torch.float32, device=device)
    group = dist.group.WORLD
    for _ in range(3):
        reduce_from_tp(x, group)
    sync()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        reduce_from_tp(x, group)
    elapsed = time.perf_counter() - t0
    sync()
    return elapsed / calls


def measure_comm(world: int, sizes: list[int], *, cpu: bool, out_file: Path, iters: list[int] | None = None,
                 sm_percents: list[float | None] | None = None) -> dict[str, Any]:
    """Run the p2p and all-reduce sweep over ``world`` processes; returns raw points and fitted links."""
    if world < 2:
        raise ValueError("communication profiling needs at least 2 ranks")
    backend = "gloo" if cpu else "nccl"
    iters = iters or [20 if s < 2**20 else 10 if s < 2**26 else 5 for s in sizes]
    spawn(_worker, world, (world, free_port(), backend, sizes, iters, str(out_file), sm_percents or []))
    raw = json.loads(out_file.read_text())
    issue = raw.pop("tp_issue_s", None)
    fits = {kind: fit_link([p["bytes"] for p in pts], [p["seconds"] for p in pts], kind, world)
            for kind, pts in raw.items() if len(pts) >= 2}
    out = {"world": world, "backend": backend, "points": raw, "fit": fits}
    if issue is not None:
        out["tp_issue_s"] = issue
    return out
