"""Elastic training on one 4-GPU host made heterogeneous with MPS: a trace of device sets
(4 GPUs at 100/100/50/50 % -> slow:1 leaves -> slow:1 joins again -> both slow GPUs leave: 100 % x 2;
8/64/8/8 steps: phase 1 is long enough for the joiner of phase 2 to start while the job trains: it took
~14.5 s on 4x H100 on 2026-11-27, 40 steps; each joiner prints where its start-up went)
run as one elastic job (in-process switches), and the same events as checkpoint-restart (save, exit,
re-plan, relaunch, load) in the same run. Prints a table and writes JSON (device, versions, date).

    # on the GPU machine, from the repository root (4 GPUs; 8-11 minutes; starts and stops the MPS daemon):
    NCCL_NVLS_ENABLE=0 python -m benchmarks.executor.elastic --out benchmarks/results
    # the same run in two commands on one machine (where one command may not last ~10 minutes): the
    # elastic half (~1.5 min), then the checkpoint-restart half (~6-9 min), which reads the first from --out
    NCCL_NVLS_ENABLE=0 python -m benchmarks.executor.elastic --elastic-only --out benchmarks/results
    NCCL_NVLS_ENABLE=0 python -m benchmarks.executor.elastic --restart-only --out benchmarks/results
    # CPU smoke (tiny model, gloo, a 4 -> 3 -> 4 trace of 2-step phases; tests/train/test_elastic_bench.py):
    python -m benchmarks.executor.elastic --smoke --out /tmp/elastic-smoke

Per switch: bytes moved, the most bytes one rank sends or receives, the lower bound (that / the
fastest measured pair bandwidth: one ``batch_isend_irecv`` each way between two GPUs), the switch
time without communicator set-up (slowest rank) and the set-up apart (its parts: default groups
created, the exchanging pairs connected — NCCL connects two ranks in their first point-to-point
call —, the new plan's groups created), the new plan's engine built (without its groups, reported
apart: between two steps before the switch where every rank could, else inside the switch as
``engine_late``; :mod:`executor.switch.elastic_switch`; a staying rank's build ahead is added to the
downtime below, which it delayed between two steps), the old plan's groups and the default groups the switch
left (``leave``: only their detaching) destroyed after the new plan's first step (``retire``: not
in the switch, but the second step waits for it; :mod:`executor.parallel.group_retire`), and the downtime
the event cost: ``time(step k+2 ends) - time(step k ends) - 2 x the new phase's steady step time``
for the elastic job (two steps, so that the retire point after step k+1 counts;
``gap(k, k+1) - steady + retire`` where the phase has one step; the retire point also connects
every pair of the new world for the next switch: ``connect_ahead``); for checkpoint-restart
``time(step k+1) - time(step k) - steady`` across the two launches plus the re-plan time (the
elastic supervisor re-plans while the job trains; a restart must re-plan while stopped).
Steady state: each phase's median step time (its first two steps left out) in the elastic job vs
the non-elastic launch of the same plan. The plans: phase 0 by the planner, the others re-planned
warm-started (planner.replan); both paths run the same plans. The smoke mode uses fixed plans and
the cluster file's link bandwidth (no measurement).
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.executor.hetero_e2e import CLI, ROOT
from benchmarks.executor.hetero_e2e import _run as run_logged
from benchmarks.executor.run_meta import run_versions
from executor.switch.elastic_switch import COMM_PARTS, PARTS

FOUR = ["fast:0", "fast:1", "slow:0", "slow:1"]  # the cluster file's devices


@dataclass(frozen=True)
class Phase:
    devices: list[str]
    steps: int


def _records(path: Path) -> dict[int, dict[str, Any]]:
    return {r["step"]: r for r in map(json.loads, path.read_text().splitlines())} if path.exists() else {}


def _steady(recs: dict[int, dict[str, Any]], start: int, end: int) -> float | None:
    """Median step time of steps ``start+1..end`` leaving out the phase's first two."""
    times = [recs[k]["step_time_s"] for k in range(start + 1, end + 1) if k in recs]
    times = times[2:] if len(times) > 3 else times[1:] or times
    return statistics.median(times) if times else None


# ---------------------------------------------------------------------- plans
def smoke_plans(out: Path) -> tuple[Path, list[Phase], list[Path], list[float]]:
    """demo-cpu-6, the tiny model: 4 -> 3 -> 4 ranks (TP 2 -> 1, 1F1B -> GPipe, ZeRO 0 -> 1 -> 0)."""
    plan4 = ROOT / "examples" / "plans" / "demo-cpu-4-tiny.json"
    data = json.loads(plan4.read_text())
    data["pipelines"] = [
        {"batch_size": 3, "micro_batches": 3, "stages": [{"devices": ["a100:0"], "layers": [0, 4]}]},
        {"batch_size": 5, "micro_batches": 2, "schedule": "gpipe",
         "stages": [{"devices": ["r4090:0"], "layers": [0, 1]}, {"devices": ["r4090:1"], "layers": [1, 4]}]}]
    data["options"]["zero"] = 1
    three = out / "plan-1.json"
    three.write_text(json.dumps(data))
    four = ["a100:0", "r4090:0", "r4090:1", "r4090:2"]
    phases = [Phase(four, 2), Phase(four[:3], 2), Phase(four, 2)]
    return ROOT / "examples" / "clusters" / "demo-cpu-6.yaml", phases, [plan4, three, plan4], [0.0, 0.0, 0.0]


def gpu_plans(out: Path, cluster_path: Path, model: str, seq_len: int, batch: int, steps: list[int]
              ) -> tuple[list[Phase], list[Path], list[float]]:
    """Phase 0 by the planner, each later phase re-planned warm-started from the previous plan."""
    from planner.cluster import load_cluster
    from planner.hf_config import resolve_model
    from planner.plan import save_plan
    from planner.replan import replan
    from planner.search.config import PlannerConfig, elastic_config
    from planner.search.planner import search

    cluster = load_cluster(cluster_path)
    phases = [Phase(FOUR, steps[0]), Phase(FOUR[:3], steps[1]), Phase(FOUR, steps[2]), Phase(FOUR[:2], steps[3])]
    t0 = time.perf_counter()
    cfg = elastic_config(PlannerConfig(time_limit_s=15.0))  # as `hexiscale plan --elastic`: what the job trains
    plan = search(cluster, resolve_model(model, seq_len), batch, config=cfg).plan
    paths, seconds = [], [time.perf_counter() - t0]
    for i, ph in enumerate(phases):
        if i:
            r = replan(cluster, ph.devices, plan)
            plan = r.plan
            seconds.append(r.seconds)
        paths.append(out / f"plan-{i}.json")
        save_plan(plan, paths[-1])
    return phases, paths, seconds


def write_trace(out: Path, phases: list[Phase], plans: list[Path], shares: dict[str, float]) -> Path:
    lines = ["format: hexiscale.trace/1", "phases:"]
    for i, (ph, plan) in enumerate(zip(phases, plans)):
        lines.append(f"  - steps: {ph.steps}")
        if i:
            lines += [f"    devices: [{', '.join(ph.devices)}]", f"    plan: {plan.resolve()}"]
        mine = {n: s for n, s in shares.items() if any(d.partition(':')[0] == n for d in ph.devices)}
        if mine:
            lines.append("    sm_percent: {" + ", ".join(f"{n}: {s:g}" for n, s in mine.items()) + "}")
    path = out / "trace.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


# ---------------------------------------------------------------------- link bandwidth
def pair_bandwidth_job(mib: int) -> dict[str, float]:
    """On every rank of a DistPool: for each pair in turn, one batch_isend_irecv of ``mib`` MiB each
    way (after one warm-up); GB/s one way for the pairs this rank is in, as 'i-j'."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device())
    out, back = torch.ones(mib * 2**18, device=device), torch.empty(mib * 2**18, device=device)
    res = {}
    for i in range(world):
        for j in range(i + 1, world):
            for rep in range(2):
                dist.barrier(device_ids=[device.index])
                torch.cuda.synchronize(device)
                t0 = time.perf_counter()
                if rank in (i, j):
                    peer = j if rank == i else i
                    for req in dist.batch_isend_irecv([dist.P2POp(dist.isend, out, peer),
                                                       dist.P2POp(dist.irecv, back, peer)]):
                        req.wait()
                torch.cuda.synchronize(device)
                if rep and rank in (i, j):
                    res[f"{i}-{j}"] = out.numel() * 4 / (time.perf_counter() - t0) / 1e9
    return res


def measure_bandwidth(nccl_debug: bool = False) -> dict[str, float]:
    """Per pair, the slower end's GB/s; ``nccl_debug``: NCCL prints the transport each channel uses."""
    import os

    from tests.support.dist_testing import DistPool

    saved = os.environ.get("NCCL_DEBUG")
    if nccl_debug:
        os.environ["NCCL_DEBUG"] = "INFO"
    try:
        with DistPool(4, backend="nccl", timeout=120) as pool:
            per_rank = pool.run(pair_bandwidth_job, 512)
    finally:
        if saved is None:
            os.environ.pop("NCCL_DEBUG", None)
        else:
            os.environ["NCCL_DEBUG"] = saved
    pairs = {k for r in per_rank for k in r}
    return {k: min(r[k] for r in per_rank if k in r) for k in sorted(pairs)}  # the slower end's view


# ---------------------------------------------------------------------- the two paths
def run_elastic(out: Path, plan0: Path, cluster: Path, trace: Path, device: str, train: list[str]
                ) -> tuple[int, dict[int, dict[str, Any]], list[dict[str, Any]]]:
    jsonl, report = out / "elastic_steps.jsonl", out / "elastic_switches.jsonl"
    for p in (jsonl, report):
        p.unlink(missing_ok=True)
    code, _ = run_logged(CLI + ["launch", str(plan0), "--local", "--device", device, "--cluster", str(cluster),
                          "--elastic-trace", str(trace), "--elastic-log", str(report), "--run-id", "bench-elastic",
                          "--", "--log-jsonl", str(jsonl), *train], out / "elastic.log")
    switches = [json.loads(x) for x in report.read_text().splitlines()] if report.exists() else []
    return code, _records(jsonl), [s for s in switches if s.get("event") == "switch"]


def run_restarts(out: Path, plans: list[Path], phases: list[Phase], cluster: Path, device: str, train: list[str],
                 shares: dict[str, float], *, checkpoints: bool = True
                 ) -> tuple[list[int], list[dict[int, dict[str, Any]]]]:
    """One plain launch per phase: each trains its phase's steps, saves at its end, exits; the next
    resumes from that checkpoint under its own plan (the learning-rate schedule spans the whole trace:
    ``--stop-at``). Without ``checkpoints`` each launch trains its phase's steps from a fresh start
    (no save, no load): its step times give the steady state, its records are numbered as the
    phase's steps of the trace, and there is no downtime to read."""
    ck = Path(tempfile.mkdtemp(prefix="hexiscale-elastic-ck-"))  # GBs on GPU: removed at the end
    codes, recs, end, total = [], [], 0, sum(p.steps for p in phases)
    for i, (plan, ph) in enumerate(zip(plans, phases)):
        start, end = end, end + ph.steps
        jsonl = out / f"restart_{i}.jsonl"
        jsonl.unlink(missing_ok=True)
        mps = [f"--sm-percent={n}={s:g}" for n, s in shares.items() if any(d.startswith(n + ":") for d in ph.devices)]
        steps = ["--steps", str(total), "--stop-at", str(end), "--checkpoint-dir", str(ck),
                 *(["--resume", str(ck)] if i else [])] if checkpoints else ["--steps", str(ph.steps)]
        code, _ = run_logged(CLI + ["launch", str(plan), "--local", "--device", device, "--cluster", str(cluster), *mps,
                              "--run-id", f"bench-restart-{i}", "--", *steps, "--log-jsonl", str(jsonl), *train],
                       out / f"restart_{i}.log")
        codes.append(code)
        got = _records(jsonl)
        recs.append(got if checkpoints else {k + start: r for k, r in got.items()})
        if code != 0:
            break
    shutil.rmtree(ck, ignore_errors=True)
    return codes, recs


# ---------------------------------------------------------------------- report
def analyse(phases: list[Phase], replan_s: list[float], el: dict[int, dict[str, Any]], switches: list[dict[str, Any]],
            rs: list[dict[int, dict[str, Any]]], bandwidth_gbps: float | None, mps_gbps: float | None = None,
            restart_downtime: bool = True) -> dict[str, Any]:
    starts = [sum(p.steps for p in phases[:i]) for i in range(len(phases) + 1)]
    steady = []
    for i in range(len(phases)):
        e = _steady(el, starts[i], starts[i + 1])
        b = _steady(rs[i], starts[i], starts[i + 1]) if i < len(rs) else None
        steady.append({"phase": i, "ranks_devices": len(phases[i].devices), "elastic_step_s": e, "plain_step_s": b,
                       "ratio": e / b if e and b else None})
    events = []
    for i, sw in enumerate(switches, start=1):
        k = starts[i]
        bound = sw["max_rank_bytes"] / (bandwidth_gbps * 1e9) if bandwidth_gbps else sw["lower_bound_s"]
        new_step = steady[i]["elastic_step_s"] or 0.0
        gap = el[k + 1]["time"] - el[k]["time"] if k in el and k + 1 in el else None
        retire = (sw.get("retire_s") or 0.0) + (sw.get("connect_ahead_s") or 0.0)  # the retire point's work
        if gap is not None and k + 2 in el and phases[i].steps >= 2:  # the retire point after step k+1 counts
            gap = el[k + 2]["time"] - el[k]["time"] - (steady[i]["elastic_step_s"] or 0.0)
        elif gap is not None:
            gap += retire
        b_gap = rs[i][k + 1]["time"] - rs[i - 1][k]["time"] if restart_downtime and i < len(rs) and k + 1 in rs[i] \
            and k in rs[i - 1] else None
        # a staying rank's engine built ahead ran between two of the old plan's steps: the job waited for it there
        down = gap - new_step + (sw.get("engine_between_steps_s") or 0.0) if gap is not None else None
        b_down = b_gap - (steady[i]["plain_step_s"] or 0.0) + replan_s[i] if b_gap is not None else None
        events.append({"event": i, "after_step": sw["step"], "ranks": f"{sw['old_ranks']} -> {sw['new_ranks']}",
                       "leave": sw["leave"], "join": sw["join"], "moved_bytes": sw["moved_bytes"],
                       "local_bytes": sw["local_bytes"], "adopted_bytes": sw.get("adopted_bytes"),
                       "max_rank_bytes": sw["max_rank_bytes"],
                       "lower_bound_s": bound, "cluster_file_bound_s": sw.get("lower_bound_s"),
                       "transfer_s": sw["transfer_s"], "switch_excl_comm_s": sw["switch_excl_comm_s"],
                       "comm_setup_s": sw["comm_s"], "switch_s": sw["switch_s"], "wait_for_joiners_s": sw["wait_s"],
                       "move_plan_s": sw["plan_s"], "move_planned_ahead": sw.get("planned_ahead"),
                       "engine_build_s": sw["engine_s"], "engine_built_ahead": sw.get("engine_ahead"),
                       "install_s": sw.get("install_s"),
                       "retire_s": sw.get("retire_s"), "retire_after_step": sw.get("retire_after_step"),
                       "connect_ahead_s": sw.get("connect_ahead_s"),
                       "parts_s": {k: sw.get(k) for k in PARTS},
                       "critical_parts_s": sw.get("critical"),
                       "comm_parts_s": {k: sw.get(k) for k in COMM_PARTS},
                       "exchange_gbps": sw["max_rank_bytes"] / sw["exchange_s"] / 1e9 if sw.get("exchange_s") else None,
                       "mps_lower_bound_s": sw["max_rank_bytes"] / (mps_gbps * 1e9) if mps_gbps else None,
                       "target_s": 1.25 * bound + 0.05, "target_met": sw["switch_excl_comm_s"] <= 1.25 * bound + 0.05,
                       "replan_s": replan_s[i], "elastic_downtime_s": down, "restart_downtime_s": b_down,
                       "speedup": b_down / down if down and b_down else None})
    return {"events": events, "steady": steady}


def _f(x: Any, scale: float = 1.0, fmt: str = ".1f") -> str:
    return "-" if x is None else format(x * scale, fmt)


def print_tables(res: dict[str, Any]) -> None:
    print("\n| event | ranks | moved MB | max rank MB | bound ms | transfer ms | switch ms (excl. comm) | target ms | "
          "comm set-up ms | joiner wait s | re-plan s | elastic downtime s | ckpt-restart downtime s | speed-up |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for e in res["events"]:
        change = " ".join([*(f"-{d}" for d in e["leave"]), *(f"+{d}" for d in e["join"])])
        print(f"| {e['event']} after step {e['after_step']} ({change}) | {e['ranks']} | {_f(e['moved_bytes'], 1e-6)} "
              f"| {_f(e['max_rank_bytes'], 1e-6)} | {_f(e['lower_bound_s'], 1e3, '.2f')} | {_f(e['transfer_s'], 1e3)} "
              f"| {_f(e['switch_excl_comm_s'], 1e3)} {'ok' if e['target_met'] else 'MISSED'} | "
              f"{_f(e['target_s'], 1e3)} | {_f(e['comm_setup_s'], 1e3)} | {_f(e['wait_for_joiners_s'])} | "
              f"{_f(e['replan_s'], 1, '.2f')} | {_f(e['elastic_downtime_s'], 1, '.2f')} | "
              f"{_f(e['restart_downtime_s'], 1, '.1f')} | {_f(e['speedup'], 1, '.1f')}{'x' if e['speedup'] else ''} |")
    print("\nWhere the switch time goes (slowest rank per part, ms; each part ends with a device sync):\n")
    print("| event | " + " | ".join(k[:-2] for k in PARTS) + " | engine build (no groups; ahead?) | move plan | "
          "exchange GB/s (max rank bytes / exchange) | bound under MPS ms | "
          + " | ".join(f"comm: {k[:-2]}" for k in COMM_PARTS)
          + " | retire (after the 1st step, not in the switch) | next switch's pairs connected (there too) |")
    print("|---|" + "---:|" * (len(PARTS) + 6 + len(COMM_PARTS)))
    for e in res["events"]:
        parts = " | ".join(_f(e["parts_s"].get(k), 1e3) for k in PARTS)
        comm = " | ".join(_f(e["comm_parts_s"].get(k), 1e3) for k in COMM_PARTS)
        where = "ahead" if e["engine_built_ahead"] else "in the switch: engine_late"
        print(f"| {e['event']} | {parts} | {_f(e['engine_build_s'], 1e3)} ({where}) | "
              f"{_f(e['move_plan_s'], 1e3)} | {_f(e['exchange_gbps'])} | {_f(e['mps_lower_bound_s'], 1e3, '.2f')} "
              f"| {comm} | {_f(e['retire_s'], 1e3)} | {_f(e['connect_ahead_s'], 1e3)} |")
    print("\nThe slowest rank's switch (excl. comm), part by part (ms; they add up to its total, 'other' "
          "included; waits are parts of their own):\n")
    print("| event | rank | " + " | ".join(k[:-2] for k in PARTS) + " | total |")
    print("|---|---|" + "---:|" * (len(PARTS) + 1))
    for e in res["events"]:
        crit = e.get("critical_parts_s") or {}
        total = sum(crit.get(k) or 0.0 for k in PARTS)
        print(f"| {e['event']} | {crit.get('device', '-')} | " + " | ".join(_f(crit.get(k), 1e3) for k in PARTS)
              + f" | {_f(total, 1e3)} |")
    print("\n| phase | devices | elastic s/step | plain s/step | ratio (target <= 1.05) |\n|---|---:|---:|---:|---:|")
    for s in res["steady"]:
        print(f"| {s['phase']} | {s['ranks_devices']} | {_f(s['elastic_step_s'], 1, '.3f')} | "
              f"{_f(s['plain_step_s'], 1, '.3f')} | {_f(s['ratio'], 1, '.3f')} |")


HALF = "elastic_half.json"  # the elastic half of a run, for ``--restart-only`` (in the work folder)
SAME = ("smoke", "model", "seq_len", "global_batch", "steps")  # what both halves of a run must share


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="CPU/gloo, tiny model, a 4 -> 3 -> 4 trace of 2-step phases")
    ap.add_argument("--model", default="llama-1.3b")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--steps", default="8,64,8,8", help="steps per phase (GPU trace: 4 phases)")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--elastic-only", action="store_true",
                    help="skip the checkpoint-restart half (its columns read '-'): a quick re-measure of the switch; "
                         "the half is kept in OUT/elastic_work for --restart-only")
    ap.add_argument("--restart-only", action="store_true",
                    help="the checkpoint-restart half of the run whose --elastic-only half is in OUT/elastic_work "
                         "(same machine, same arguments): the whole run in two commands where one may not last "
                         "~10 minutes")
    ap.add_argument("--plain-steady", action="store_true",
                    help="the plain launches without checkpoints: the steady-state ratio in the same run without "
                         "the restart path's saves and loads (its downtime columns read '-')")
    return ap


def elastic_half(args: argparse.Namespace, work: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """Plans, link bandwidth and the elastic job; what the restart half and the report need, also
    written to ``work/HALF``."""
    if args.smoke:
        shares: dict[str, float] = {}
        cluster, phases, plans, replan_s = smoke_plans(work)
        bandwidths: dict[str, float] = {}  # the bound from the cluster file's links (the switch report's)
        mps_bandwidths: dict[str, float] = {}
    else:
        kind = "h200" if "H200" in meta["gpu"] else "h100"
        cluster = ROOT / "examples" / "clusters" / f"{kind}x4-mps-100-100-50-50.yaml"
        shares = {"slow": 50.0}
        steps = [int(x) for x in args.steps.split(",")]
        phases, plans, replan_s = gpu_plans(work, cluster, args.model, args.seq_len, args.global_batch, steps)
        bandwidths = measure_bandwidth()
        print(f"pair bandwidth GB/s (one way, both ways at once): {bandwidths}", flush=True)
        subprocess.run(["nvidia-cuda-mps-control", "-d"], check=False)
        mps_bandwidths = measure_bandwidth(nccl_debug=True)  # the processes are MPS clients now
        print(f"pair bandwidth GB/s under MPS: {mps_bandwidths}", flush=True)
    trace = write_trace(work, phases, plans, shares)
    t0 = time.perf_counter()
    code, _, switches = run_elastic(work, plans[0], cluster, trace, _device(args), _train(args))
    half = {"meta": meta, "host": machine(), "args": {k: getattr(args, k) for k in SAME},
            "cluster": str(cluster),
            "phases": [p.__dict__ for p in phases], "plans": [str(p) for p in plans], "replan_s": replan_s,
            "shares": shares, "pair_bandwidth_gbps": bandwidths, "pair_bandwidth_mps_gbps": mps_bandwidths,
            "elastic_exit": code, "elastic_wall_s": time.perf_counter() - t0}
    print(f"elastic job: exit {code}, {len(switches)} switches, {half['elastic_wall_s']:.0f} s", flush=True)
    (work / HALF).write_text(json.dumps(half, indent=1) + "\n")
    return half


def machine() -> str:
    """This machine, booted once: host name and boot id. Lent GPU machines may all be named alike
    (``vm``), and one gone cold between the halves comes back as another boot."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8]
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}" if boot else socket.gethostname()


def read_half(args: argparse.Namespace, work: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """The elastic half kept by ``--elastic-only`` for ``--restart-only``; a half that does not fit this
    run (missing, other arguments, another GPU) is a ``SystemExit`` naming it and the fix."""
    path = work / HALF
    if not path.exists():
        raise SystemExit(f"--restart-only: no elastic half at {path}; run this program with --elastic-only and the "
                         "same --out first")
    half = json.loads(path.read_text())
    mine = {k: getattr(args, k) for k in SAME}
    if half["args"] != mine:
        raise SystemExit(f"--restart-only: the elastic half at {path} ran with {half['args']}, not {mine}; "
                         "pass the same arguments (or run both halves again)")
    if half["meta"].get("gpu") != meta.get("gpu"):
        raise SystemExit(f"--restart-only: the elastic half at {path} ran on {half['meta'].get('gpu')}, this machine "
                         f"is {meta.get('gpu')}; both halves must run on the same machine")
    if half.get("host") != machine():
        raise SystemExit(f"--restart-only: the elastic half at {path} ran on host {half.get('host')}, this is "
                         f"{machine()}; both halves must run on the same machine (or run both again)")
    return half


def _device(args: argparse.Namespace) -> str:
    return "cpu" if args.smoke else "cuda"


def _train(args: argparse.Namespace) -> list[str]:
    return ["--lr", "3e-3", "--warmup", "1", "--seed", "0"] if args.smoke else \
        ["--lr", "1e-4", "--warmup", "2", "--seed", "0"]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.elastic_only and (args.restart_only or args.plain_steady):
        raise SystemExit("--elastic-only runs no restart half: drop --restart-only/--plain-steady, or --elastic-only")
    out = Path(args.out).resolve()
    work = out / "elastic_work"
    work.mkdir(parents=True, exist_ok=True)
    meta = run_versions(gpu=not args.smoke)
    kind = "cpu_smoke" if args.smoke else "h200" if "H200" in meta["gpu"] else "h100"
    try:
        if args.restart_only:
            half = read_half(args, work, meta)
            if not args.smoke:
                subprocess.run(["nvidia-cuda-mps-control", "-d"], check=False)
        else:
            half = elastic_half(args, work, meta)
        phases = [Phase(**p) for p in half["phases"]]
        plans = [Path(p) for p in half["plans"]]
        cluster = Path(half["cluster"])
        t0 = time.perf_counter()
        codes, rs = ([], []) if args.elastic_only else run_restarts(
            work, plans, phases, cluster, _device(args), _train(args), half["shares"],
            checkpoints=not args.plain_steady)
        restart_wall = time.perf_counter() - t0
        if not args.elastic_only:
            what = "plain launches (steady state)" if args.plain_steady else "checkpoint-restart"
            print(f"{what}: exits {codes}, {restart_wall:.0f} s", flush=True)
    finally:
        if not args.smoke:
            subprocess.run(["bash", "-c", "echo quit | nvidia-cuda-mps-control"], check=False)
    code, el = half["elastic_exit"], _records(work / "elastic_steps.jsonl")
    switches = [s for s in map(json.loads, (work / "elastic_switches.jsonl").read_text().splitlines())
                if s.get("event") == "switch"] if (work / "elastic_switches.jsonl").exists() else []
    replan_s, bandwidths = half["replan_s"], half["pair_bandwidth_gbps"]
    mps_bandwidths = half["pair_bandwidth_mps_gbps"]
    ok = code == 0 and all(c == 0 for c in codes) and len(switches) == len(phases) - 1
    bw = max(bandwidths.values()) if bandwidths else None
    mps_bw = max(mps_bandwidths.values()) if mps_bandwidths else None
    res = analyse(phases, replan_s, el, switches, rs, bw, mps_bw, restart_downtime=not args.plain_steady) if ok \
        else {"events": [], "steady": []}
    halves = {"elastic": half["meta"]["date"], "restart": meta["date"], "machine": machine()} if args.restart_only \
        else None
    result = dict(meta, cluster=cluster.name, model="tiny" if args.smoke else args.model, seq_len=args.seq_len,
                  global_batch=args.global_batch, phases=[p.__dict__ for p in phases], replan_s=replan_s,
                  plans=[json.loads(p.read_text()) for p in plans], pair_bandwidth_gbps=bandwidths,
                  pair_bandwidth_mps_gbps=mps_bandwidths, halves=halves,
                  bound_bandwidth_gbps=bw, plain_steady=args.plain_steady, elastic_exit=code, restart_exits=codes,
                  elastic_wall_s=half["elastic_wall_s"],
                  restart_wall_s=restart_wall, elastic_losses={k: r["loss"] for k, r in sorted(el.items())},
                  restart_losses=[{k: r["loss"] for k, r in sorted(x.items())} for x in rs], **res)
    path = out / f"elastic_{kind}_{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    if not ok:
        print(f"FAILED (logs under {work}); JSON {path}")
        return 1
    print_tables(res)
    link = f"{bw:.1f} GB/s (measured)" if bw else "the cluster file's link bandwidth"
    print(f"\nbound = max over ranks of bytes in or out / {link}; JSON {path}; logs under {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
