"""Where NCCL's connection set-up goes between 4 GPUs, and which settings cut it: a diagnostic for
the elastic switch's communicator set-up (``comm_setup_s`` in benchmarks/executor/elastic.py:
world set-up, the exchanging pairs connected, the new plan's groups; 0.2-2.8 s on 4x H200 under
MPS, 1.2 s of it connecting pairs when MPS ranks take part).

For each variant (a set of NCCL environment variables), 4 fresh processes (one per GPU; with
``--mps`` MPS clients at 100/100/50/50 % of the SMs, as the elastic benchmark runs them) time,
each part after a meeting on the store so that no rank's figure holds a peer's wait (the table
shows the slowest rank's):

* ``init``: ``init_process_group`` bound to the device (NCCL creates the communicator eagerly);
* ``connect``: the first ``batch_isend_irecv`` of one element each way between a pair (NCCL
  connects the pair inside it), every pair in turn — the slowest pair, and the sum;
* ``warm``: the same again (connected), the slowest pair;
* ``GB/s``: ``--mib`` MiB each way per pair once connected, the slowest pair;
* ``batch``: the first batch holding every peer of a rank on a fresh all-rank group (the switch's
  pattern: one batch after the world is entered);
* ``split`` / ``share``: ``new_group`` of ranks 0-1 (an ``ncclCommSplit`` of the default group;
  ``share``: with ``split_share``, :mod:`executor.parallel.split_share`), plus its first all-reduce;
  ``lazy``: the same group under a default group *not* bound to a device (a fresh communicator
  created at the first all-reduce), measured in the ``lazy-world`` variant only (there ``init``
  creates no communicator: the first pair's ``connect`` creates the world's).

The variants (NCCL 2.28 names): ``NCCL_RUNTIME_CONNECT=0`` connects every peer at init instead of
at first use; ``NCCL_NCHANNELS_PER_PEER`` / ``NCCL_MAX_P2P_NCHANNELS`` bound the channels a pair
connects (each channel is a connection to set up); ``NCCL_BUFFSIZE`` shrinks each connection's
buffers; ``NCCL_CUMEM_ENABLE=0`` uses legacy IPC instead of cuMem handles (their export/import is
per connection); ``NCCL_P2P_LEVEL=NVL`` keeps pairs on NVLink; ``NCCL_COMM_SPLIT_SHARE_RESOURCES=1``
shares every split's resources with its parent.

    # on the GPU machine (4 GPUs, ~1 minute; --mps starts and stops the MPS daemon):
    NCCL_NVLS_ENABLE=0 python -m benchmarks.executor.p2p_connect --mps --out benchmarks/results
    # CPU smoke (gloo, 4 processes, the default variant; tests/executor/test_bench_p2p_connect.py):
    python -m benchmarks.executor.p2p_connect --smoke --out /tmp/p2p-smoke
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from hexiscale.launch.mps import mps_daemon

ROOT = Path(__file__).resolve().parents[2]
WORLD = 4
MPS_SHARES = (100, 100, 50, 50)  # the elastic benchmark's cluster: fast:0, fast:1, slow:0, slow:1
VARIANTS: dict[str, dict[str, str]] = {
    "default": {},
    "runtime-connect-0": {"NCCL_RUNTIME_CONNECT": "0"},
    "channels-per-peer-1": {"NCCL_NCHANNELS_PER_PEER": "1"},
    "max-p2p-channels-4": {"NCCL_MAX_P2P_NCHANNELS": "4"},
    "buffsize-1mib": {"NCCL_BUFFSIZE": str(2**20)},
    "cumem-0": {"NCCL_CUMEM_ENABLE": "0"},
    "p2p-level-nvl": {"NCCL_P2P_LEVEL": "NVL"},
    "split-share-1": {"NCCL_COMM_SPLIT_SHARE_RESOURCES": "1"},
    "lazy-world": {},  # the default group not bound to a device (see the module docstring)
}
COLUMNS = ("init_s", "connect_max_s", "connect_sum_s", "warm_max_s", "gbps_min", "batch_s", "split_s",
           "share_s", "lazy_s")


@dataclass(frozen=True)
class RankArgs:
    rank: int
    port: int
    backend: str
    mib: int
    bind: bool  # bind the default group to the device (eager NCCL set-up, new_group splits)


def rank_times(a: RankArgs) -> dict[str, Any]:
    """One rank's times (module docstring); every part starts after a meeting of all ranks."""
    import torch
    import torch.distributed as dist

    from executor.parallel.split_share import split_share_options
    from executor.parallel.store_meet import meet

    store = dist.TCPStore("127.0.0.1", a.port, WORLD, False, timeout=timedelta(seconds=120))
    cuda = a.backend == "nccl"
    device = torch.device("cuda", a.rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.ones(1, device=device)  # the CUDA context, outside the timed parts
    out: dict[str, Any] = {}

    def timed(name: str, fn: Any) -> None:
        meet(store, f"meet/{name}", WORLD, timeout_s=120.0, who=f"rank {a.rank}")
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize(device)
        out[name] = time.perf_counter() - t0

    def pairs_batch(peers: list[int], tensors: tuple[Any, Any], group: Any = None) -> None:
        ops = []
        for p in peers:
            ops += [dist.P2POp(dist.isend, tensors[0], p, group=group),
                    dist.P2POp(dist.irecv, tensors[1], p, group=group)]
        for req in dist.batch_isend_irecv(ops) if ops else ():
            req.wait()

    timed("init_s", lambda: dist.init_process_group(a.backend, store=dist.PrefixStore("world", store), rank=a.rank,
                                                     world_size=WORLD, device_id=device if cuda and a.bind else None))
    one = (torch.ones(1, device=device), torch.empty(1, device=device))
    big = (torch.ones(a.mib * 2**18, device=device), torch.empty(a.mib * 2**18, device=device))
    pairs = [(i, j) for i in range(WORLD) for j in range(i + 1, WORLD)]
    for kind, tensors in (("connect", one), ("warm", one), ("transfer", big)):
        for i, j in pairs:
            peers = [j if a.rank == i else i] if a.rank in (i, j) else []
            timed(f"{kind}/{i}-{j}", lambda peers=peers, t=tensors: pairs_batch(peers, t))
    out["transfer_bytes"] = big[0].numel() * 4
    fresh = dist.new_group(list(range(WORLD)))
    timed("batch_s", lambda: pairs_batch([r for r in range(WORLD) if r != a.rank], one, group=fresh))
    for name, opts in (("split_s", None), ("share_s", split_share_options())):
        if name == "share_s" and opts is None:
            continue  # gloo, or a default group not bound to a device: nothing to share

        def group_and_first_op(opts: Any = opts) -> None:
            g = dist.new_group([0, 1], pg_options=opts)
            if a.rank in (0, 1):
                dist.all_reduce(torch.ones(1, device=device), group=g)

        timed("lazy_s" if cuda and not a.bind and name == "split_s" else name, group_and_first_op)
    dist.destroy_process_group()
    return out


def summarise(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """The slowest rank's figure of each part; per pair the slower end's."""
    keys = {k for r in ranks for k in r if k != "transfer_bytes"}
    worst = {k: max(r[k] for r in ranks if k in r) for k in sorted(keys)}
    pairs = sorted(k.partition("/")[2] for k in worst if k.startswith("connect/"))
    nbytes = ranks[0]["transfer_bytes"]
    return {"init_s": worst.get("init_s"), "connect_max_s": max(worst[f"connect/{p}"] for p in pairs),
            "connect_sum_s": sum(worst[f"connect/{p}"] for p in pairs),
            "warm_max_s": max(worst[f"warm/{p}"] for p in pairs),
            "gbps_min": min(nbytes / worst[f"transfer/{p}"] / 1e9 for p in pairs),
            "batch_s": worst.get("batch_s"), "split_s": worst.get("split_s"), "share_s": worst.get("share_s"),
            "lazy_s": worst.get("lazy_s"), "pairs": {p: {"connect_s": worst[f"connect/{p}"],
                                                        "warm_s": worst[f"warm/{p}"]} for p in pairs}}


def run_variant(name: str, backend: str, mib: int, mps: bool, work: Path, timeout_s: float) -> dict[str, Any]:
    """4 fresh processes under the variant's environment; their summary, or the failure."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, WORLD + 1, True, timeout=timedelta(seconds=timeout_s),
                          wait_for_workers=False)
    procs = []
    for rank in range(WORLD):
        env = {k: v for k, v in os.environ.items() if not k.startswith("HEXISCALE_")}
        env.update(VARIANTS[name], OMP_NUM_THREADS="1")
        if mps:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(MPS_SHARES[rank])
        cmd = [sys.executable, "-m", "benchmarks.executor.p2p_connect", "--rank", str(rank), "--port",
               str(store.port), "--backend", backend, "--mib", str(mib), "--out", str(work / f"{name}-{rank}.json")]
        if name == "lazy-world":
            cmd.append("--lazy")
        log = open(work / f"{name}-{rank}.log", "w")  # noqa: SIM115 - closed once the process ends
        procs.append((subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    codes = []
    for proc, log in procs:
        try:
            codes.append(proc.wait(timeout=timeout_s))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append(proc.wait())
        log.close()
    if any(codes):
        return {"variant": name, "env": VARIANTS[name], "error": f"exit codes {codes} (logs under {work})"}
    ranks = [json.loads((work / f"{name}-{r}.json").read_text()) for r in range(WORLD)]
    return {"variant": name, "env": VARIANTS[name], **summarise(ranks)}


def _f(x: Any, scale: float = 1e3, fmt: str = ".1f") -> str:
    return "-" if x is None else format(x * scale, fmt)


def print_table(rows: list[dict[str, Any]]) -> None:
    print("\n| variant | init ms | connect ms (slowest pair) | connect ms (all pairs) | warm ms | GB/s (slowest pair) "
          "| batch to every peer ms | split ms | split+share ms | lazy group ms |")
    print("|---|" + "---:|" * len(COLUMNS))
    for r in rows:
        if "error" in r:
            print(f"| {r['variant']} | {r['error']} |" + " |" * (len(COLUMNS) - 1))
            continue
        print(f"| {r['variant']} | {_f(r['init_s'])} | {_f(r['connect_max_s'])} | {_f(r['connect_sum_s'])} | "
              f"{_f(r['warm_max_s'], 1e3, '.2f')} | {_f(r['gbps_min'], 1.0)} | {_f(r['batch_s'])} | "
              f"{_f(r['split_s'])} | {_f(r['share_s'])} | {_f(r['lazy_s'])} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="CPU/gloo, the default variant, 1 MiB transfers")
    ap.add_argument("--mps", action="store_true", help="MPS clients at 100/100/50/50 %% (starts the MPS daemon)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--mib", type=int, default=256, help="MiB each way per pair for the bandwidth column")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per variant")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)  # a child process (run_variant)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--backend", default="nccl", help=argparse.SUPPRESS)
    ap.add_argument("--lazy", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rank is not None:
        res = rank_times(RankArgs(args.rank, args.port, args.backend, args.mib, bind=not args.lazy))
        Path(args.out).write_text(json.dumps(res))
        return 0
    names = ["default"] if args.smoke else [v for v in args.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        print(f"error: --variants: unknown {', '.join(unknown)}; choose from {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    from benchmarks.executor.run_meta import run_versions

    out = Path(args.out).resolve()
    work = out / "p2p_connect_work"
    work.mkdir(parents=True, exist_ok=True)
    backend, mib = ("gloo", 1) if args.smoke else ("nccl", args.mib)
    kind = "cpu_smoke" if args.smoke else "gpu"
    path = out / f"p2p_connect_{kind}_{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    meta = dict(run_versions(gpu=not args.smoke), backend=backend, mps=args.mps, mib=mib, world=WORLD)
    rows: list[dict[str, Any]] = []
    with mps_daemon() if args.mps else nullcontext():
        for name in names:
            rows.append(run_variant(name, backend, mib, args.mps, work, args.timeout))
            print(f"{name}: {'failed: ' + rows[-1]['error'] if 'error' in rows[-1] else 'done'}", flush=True)
            # rewritten after every variant: a run cut short by its caller keeps what it measured
            path.write_text(json.dumps(dict(meta, variants=rows), indent=1) + "\n")
    print_table(rows)
    print(f"\nslowest rank per part, each after a meeting of all ranks; JSON {path}")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
