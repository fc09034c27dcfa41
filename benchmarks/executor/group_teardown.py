"""What creating and destroying a process group costs, per group, on 4 ranks (the elastic switch's
largest parts on 4x H200 were closing the old plan's groups, 0.7-0.8 s, and destroying its pair
groups, ~0.95 s: the first run of benchmarks/executor/elastic.py, 2026-11-26). Decides how to take
tear-down off the switch's critical path: is it a fixed cost per communicator, does it grow with the traffic a
communicator carried, and how much of it is waiting for the peers.

For each group kind — a pair (2 ranks), all 4 ranks — and each traffic size (one element, or a
message of ``--mib`` MiB that makes NCCL open its large-message channels): create ``--groups``
groups, connect each with one all-reduce, run the traffic, then destroy them one by one; every
rank times creation (``new_group`` + the first collective) and each destroy. Prints a table (the
slowest rank, per group) and writes JSON with device, versions and date.

    # on the GPU machine (4 GPUs, about a minute):
    NCCL_NVLS_ENABLE=0 python -m benchmarks.executor.group_teardown --out benchmarks/results
    # CPU smoke (gloo; tests/executor/test_bench_group_teardown.py):
    python -m benchmarks.executor.group_teardown --cpu-smoke --out /tmp/teardown
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.executor.run_meta import run_versions

RANKS = 4


def _end(group: Any, how: str) -> None:
    """Release one group: ``destroy`` (``destroy_process_group``) or ``abort`` (``ncclCommAbort``
    through torch's ``_abort_process_group``: no flush of queued work; every operation is done here)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if how == "abort" and dist.get_backend() == "nccl":
        c10d._abort_process_group(group)
    else:
        dist.destroy_process_group(group)


def teardown_job(kind: str, groups: int, mib: float, how: str = "destroy") -> dict[str, Any]:
    """On every pool rank: ``groups`` groups of ``kind`` ('pair': ranks 2j, 2j+1 and so on, every rank
    in one group per round; 'all': every rank), created, connected, used, released (``how``, see
    :func:`_end`); seconds."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    cuda = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    members = [[0, 1], [2, 3]] if kind == "pair" else [list(range(RANKS))]
    numel = max(1, int(mib * 2**20 / 4))
    made, create_s, traffic_s, destroy_s = [], [], [], []
    for _ in range(groups):
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        mine = None
        for ranks in members:  # every rank creates every group, in the same order (NCCL rule 1)
            g = dist.new_group(ranks)
            if rank in ranks:
                mine = g
        assert mine is not None
        dist.all_reduce(torch.ones(1, device=device), group=mine)
        sync()
        create_s.append(time.perf_counter() - t0)
        made.append(mine)
    buf = torch.ones(numel, device=device)
    for g in made:
        sync()
        t0 = time.perf_counter()
        dist.all_reduce(buf, group=g)
        sync()
        traffic_s.append(time.perf_counter() - t0)
    for g in made:
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        _end(g, how)
        destroy_s.append(time.perf_counter() - t0)
    return {"create_s": create_s, "traffic_s": traffic_s, "destroy_s": destroy_s}


def _connected_groups(groups: int) -> tuple[Any, list[Any]]:
    """This rank's CUDA device and ``groups`` 4-rank groups, each connected by one all-reduce."""
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", torch.cuda.current_device())
    made = []
    for _ in range(groups):
        g = dist.new_group(list(range(RANKS)))
        dist.all_reduce(torch.ones(1, device=device), group=g)
        made.append(g)
    return device, made


def background_job(groups: int, iters: int) -> dict[str, Any]:
    """Can tear-down leave the critical path? Each rank creates ``groups`` 4-rank groups, then runs
    ``iters`` training-like iterations (two 4096^2 matmuls + a 64 MiB all-reduce on the default group)
    alone, then again while a background thread destroys the groups; seconds per iteration each
    way, and the thread's total."""
    import threading

    import torch
    import torch.distributed as dist

    device, made = _connected_groups(groups)
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    buf = torch.ones(16 * 2**20, device=device)

    def loop(n: int = iters) -> list[float]:
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            (a @ a) @ a
            dist.all_reduce(buf)
            torch.cuda.synchronize(device)
            out.append(time.perf_counter() - t0)
        return out

    loop()  # warm
    alone = loop()
    torch.cuda.synchronize(device)
    dist.barrier()
    done: dict[str, float] = {}

    def tear() -> None:
        t0 = time.perf_counter()
        for g in made:
            dist.destroy_process_group(g)
        done["s"] = time.perf_counter() - t0

    th = threading.Thread(target=tear, daemon=True)
    th.start()
    during: list[float] = []
    while th.is_alive() or len(during) < iters:  # training-like work for as long as the thread runs
        during += loop(1)
    th.join()
    return {"alone_s": alone, "during_s": during, "thread_s": done["s"]}


def parallel_job(groups: int) -> dict[str, Any]:
    """``groups`` 4-rank groups created and connected, then all destroyed at once by
    :func:`executor.parallel.group_release.release` (a thread per group); seconds in all."""
    import torch
    import torch.distributed as dist

    from executor.parallel.group_release import release

    device, made = _connected_groups(groups)
    torch.cuda.synchronize(device)
    dist.barrier()
    t0 = time.perf_counter()
    release(made)
    return {"release_s": time.perf_counter() - t0}


def measure(pool: Any, kind: str, groups: int, mib: float, how: str = "destroy") -> dict[str, Any]:
    per_rank = pool.run(teardown_job, kind, groups, mib, how)
    worst = {k: [max(r[k][i] for r in per_rank) for i in range(groups)] for k in ("create_s", "traffic_s", "destroy_s")}
    return {"kind": kind, "groups": groups, "mib": mib, "how": how, "per_rank": per_rank,
            **{f"{k}_median": statistics.median(v) for k, v in worst.items()},
            **{f"{k}_max": max(v) for k, v in worst.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--groups", type=int, default=6, help="groups per kind and size")
    ap.add_argument("--mib", type=float, default=256.0, help="the large message, MiB")
    ap.add_argument("--cpu-smoke", action="store_true", help="gloo, 2 groups, small messages: checks the program")
    ap.add_argument("--variants", action="store_true",
                    help="GPU: also release by abort, and destroy in a background thread beside training-like "
                         "work (split-shared communicators: run with NCCL_COMM_SPLIT_SHARE_RESOURCES=1)")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)
    if args.groups < 1 or args.mib <= 0:
        print("error: --groups must be >= 1 and --mib > 0", file=sys.stderr)
        return 2
    from tests.support.dist_testing import DistPool

    gpu = not args.cpu_smoke
    groups, big = (2, 1.0) if args.cpu_smoke else (args.groups, args.mib)
    rows, extra = [], {}
    with DistPool(RANKS, backend="nccl" if gpu else "gloo", timeout=300) as pool:
        for kind in ("pair", "all"):
            for mib in (4 / 2**20, big):
                rows.append(measure(pool, kind, groups, mib))
        if gpu and args.variants:
            rows += [measure(pool, kind, groups, big, "abort") for kind in ("pair", "all")]
            extra["background"] = pool.run(background_job, groups, 20)
            extra["parallel"] = pool.run(parallel_job, groups)
    print("\n| group | traffic | release | create + connect ms (median / max) "
          "| traffic ms | release ms (median / max) |")
    print("|---|---:|---|---:|---:|---:|")
    for r in rows:
        size = "1 element" if r["mib"] < 1e-3 else f"{r['mib']:g} MiB"
        group = "2 ranks" if r["kind"] == "pair" else "4 ranks"
        ms = {k: r[k] * 1e3 for k in r if k.endswith(("_median", "_max"))}
        print(f"| {group} | {size} | {r['how']} | {ms['create_s_median']:.1f} / {ms['create_s_max']:.1f} | "
              f"{ms['traffic_s_median']:.2f} | {ms['destroy_s_median']:.1f} / {ms['destroy_s_max']:.1f} |")
    if "background" in extra:
        bg = extra["background"]
        alone = statistics.median(t for r in bg for t in r["alone_s"]) * 1e3
        during = max(max(r["during_s"]) for r in bg) * 1e3
        thread = max(r["thread_s"] for r in bg) * 1e3
        mean_during = max(statistics.mean(r["during_s"]) for r in bg) * 1e3
        print(f"\nbackground destroy of {groups} 4-rank groups: iteration {alone:.2f} ms alone, {mean_during:.2f} ms "
              f"on average beside the thread (slowest {during:.1f} ms, {max(len(r['during_s']) for r in bg)} "
              f"iterations); the thread took {thread:.1f} ms")
    if "parallel" in extra:
        par = max(r["release_s"] for r in extra["parallel"]) * 1e3
        print(f"{groups} 4-rank groups destroyed at once, a thread each (executor.parallel.group_release): "
              f"{par:.1f} ms")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = run_versions(gpu)
    path = out / f"group_teardown_{'gpu' if gpu else 'cpu_smoke'}_{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    nccl_env = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
    path.write_text(json.dumps(dict(meta, rows=rows, nccl_env=nccl_env, **extra), indent=1) + "\n")
    print(f"\nNCCL environment: {nccl_env}\nJSON {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
