"""What creating and destroying a process group costs, per group, on 4 ranks (the elastic switch's
largest parts on 4x H200 were closing the old plan's groups, 0.7-0.8 s, and destroying its pair
groups, ~0.95 s: benchmarks/README.md, "Elastic training"). Decides how to take tear-down off the
switch's critical path: is it a fixed cost per communicator, does it grow with the traffic a
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
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.executor.run_meta import run_versions

RANKS = 4


def teardown_job(kind: str, groups: int, mib: float) -> dict[str, Any]:
    """On every pool rank: ``groups`` groups of ``kind`` ('pair': ranks 2j, 2j+1 and so on, every rank
    in one group per round; 'all': every rank), created, connected, used, destroyed; seconds."""
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
        dist.destroy_process_group(g)
        destroy_s.append(time.perf_counter() - t0)
    return {"create_s": create_s, "traffic_s": traffic_s, "destroy_s": destroy_s}


def measure(pool: Any, kind: str, groups: int, mib: float) -> dict[str, Any]:
    per_rank = pool.run(teardown_job, kind, groups, mib)
    worst = {k: [max(r[k][i] for r in per_rank) for i in range(groups)] for k in ("create_s", "traffic_s", "destroy_s")}
    return {"kind": kind, "groups": groups, "mib": mib, "per_rank": per_rank,
            **{f"{k}_median": statistics.median(v) for k, v in worst.items()},
            **{f"{k}_max": max(v) for k, v in worst.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--groups", type=int, default=6, help="groups per kind and size")
    ap.add_argument("--mib", type=float, default=256.0, help="the large message, MiB")
    ap.add_argument("--cpu-smoke", action="store_true", help="gloo, 2 groups, small messages: checks the program")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)
    if args.groups < 1 or args.mib <= 0:
        print("error: --groups must be >= 1 and --mib > 0", file=sys.stderr)
        return 2
    from tests.support.dist_testing import DistPool

    gpu = not args.cpu_smoke
    groups, big = (2, 1.0) if args.cpu_smoke else (args.groups, args.mib)
    rows = []
    with DistPool(RANKS, backend="nccl" if gpu else "gloo", timeout=300) as pool:
        for kind in ("pair", "all"):
            for mib in (4 / 2**20, big):
                rows.append(measure(pool, kind, groups, mib))
    print("\n| group | traffic | create + connect ms (median / max) | traffic ms | destroy ms (median / max) |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        size = "1 element" if r["mib"] < 1e-3 else f"{r['mib']:g} MiB"
        group = "2 ranks" if r["kind"] == "pair" else "4 ranks"
        ms = {k: r[k] * 1e3 for k in r if k.endswith(("_median", "_max"))}
        print(f"| {group} | {size} | {ms['create_s_median']:.1f} / {ms['create_s_max']:.1f} | "
              f"{ms['traffic_s_median']:.2f} | {ms['destroy_s_median']:.1f} / {ms['destroy_s_max']:.1f} |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = run_versions(gpu)
    path = out / f"group_teardown_{'gpu' if gpu else 'cpu_smoke'}_{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    path.write_text(json.dumps(dict(meta, rows=rows), indent=1) + "\n")
    print(f"\nJSON {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
