"""End to end on one 4-GPU host made heterogeneous with MPS (two GPUs at 100 %, two at 50 % of their SMs):
``hexiscale plan`` -> ``hexiscale launch --local --sm-percent slow=50`` for N steps, next to a uniform
plan (TP 2 x PP 2, even layers) of the same model, options and data. Prints a table and writes JSON
(device, versions, date). Also measures the device memory one NCCL communicator takes.

    python -m benchmarks.executor.hetero_e2e --out results/    # on the GPU machine (needs 4 GPUs)

The planner's plan must have a stage boundary between different TP degrees (the point of the
exercise: issue 12); its losses must track the uniform plan's within bf16 tolerance.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hexiscale.launch.mps import mps_daemon

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "hexiscale"]
BF16_RTOL = 2e-2


def _gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name(0)


def _run(cmd: list[str], log: Path, env: dict[str, str] | None = None, timeout: float = 400) -> tuple[int, str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("HEXISCALE_")}
    full.update(env or {})
    t0 = time.perf_counter()
    body = log.with_suffix(log.suffix + ".part")  # written as the command runs: a run cut short keeps it
    with body.open("w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=full, stdout=f, stderr=subprocess.STDOUT, text=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
    out = body.read_text()
    log.write_text(f"$ {' '.join(cmd)}\n# {time.perf_counter() - t0:.1f} s, exit {code}\n{out}")
    body.unlink()
    return code, out


def _tp_change(plan: dict[str, Any]) -> bool:
    return any(len({s["tp"] for s in p["stages"]}) > 1 for p in plan["pipelines"])


def _uniform(plan: dict[str, Any]) -> dict[str, Any]:
    """One pipeline: TP 2 on the fast pair, then TP 2 on the slow pair, layers split evenly."""
    n = plan["model"]["num_layers"]
    out = dict(plan)
    out.pop("estimate", None)
    out["pipelines"] = [{"batch_size": plan["global_batch_size"], "micro_batches": plan["global_batch_size"],
                         "schedule": "1f1b",
                         "stages": [{"devices": ["fast:0", "fast:1"], "tp": 2, "layers": [0, n // 2]},
                                    {"devices": ["slow:0", "slow:1"], "tp": 2, "layers": [n // 2, n]}]}]
    out["options"] = dict(plan["options"], zero=0)
    return out


def _summary(out: str) -> dict[str, Any]:
    line = next((ln for ln in out.splitlines() if ln.startswith("summary:")), "")
    rec: dict[str, Any] = {"summary": line}
    for key, pattern in (("step_s", r"([\d.]+) s/step"), ("tokens_per_s", r"([\d,]+) tok/s"), ("mfu", r"MFU (\S+?),")):
        m = re.search(pattern, line)
        if m:
            rec[key] = m.group(1) if key == "mfu" else float(m.group(1).replace(",", ""))
    comm = next((ln for ln in out.splitlines() if "communicators in" in ln), "")
    rec["communicators"] = comm.partition("rank 0 ")[2]
    return rec


def comm_memory_job() -> dict[str, float]:
    """On each of 4 NCCL ranks: device memory and set-up time of one plan's communicators."""
    import torch.distributed as dist

    from executor.parallel.groups import ProcessGroups
    from planner.layout import build_topology
    from planner.model import PRESETS
    from planner.plan import Pipeline, Plan, Stage

    d = [f"d:{i}" for i in range(4)]
    plan = Plan(PRESETS["tiny-8l"], 8, (Pipeline(5, 5, (Stage((d[0], d[1]), 2, (0, 3)), Stage((d[2],), 1, (3, 8)))),
                                        Pipeline(3, 1, (Stage((d[3],), 1, (0, 8)),), "gpipe")))
    groups = ProcessGroups.create(build_topology(plan))
    res = {"rank": dist.get_rank(), "communicators": groups.members(), "mib": groups.device_mib,
           "setup_s": groups.setup_s}
    groups.close()
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama2-13b")
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import torch

    from tests.support.dist_testing import DistPool

    name = _gpu_name()
    kind = "h200" if "H200" in name else "h100"
    cluster = ROOT / "examples" / "clusters" / f"{kind}x4-mps-100-100-50-50.yaml"
    with DistPool(4, backend="nccl", timeout=120, preload=("executor.train.engine",)) as pool:
        comm = pool.run(comm_memory_job)
    print("communicator memory per rank:", comm, flush=True)

    plan_path = out / "e2e_plan.json"
    t0 = time.perf_counter()
    code, text = _run(CLI + ["plan", str(cluster), "--model", args.model, "--global-batch-size", str(args.global_batch),
                             "--seq-len", str(args.seq_len), "-o", str(plan_path)], out / "e2e_plan.log")
    plan_s = time.perf_counter() - t0
    if code != 0:
        print(text)
        return 1
    plan = json.loads(plan_path.read_text())
    uniform_path = out / "e2e_uniform.json"
    uniform_path.write_text(json.dumps(_uniform(plan), indent=1))
    rows: dict[str, Any] = {}
    with mps_daemon():
        for label, path in (("planner", plan_path), ("uniform", uniform_path)):
            jsonl = out / f"e2e_{label}.jsonl"
            jsonl.unlink(missing_ok=True)
            code, text = _run(CLI + ["launch", str(path), "--local", "--device", "cuda", "--cluster", str(cluster),
                                     "--sm-percent", "slow=50", "--", "--steps", str(args.steps), "--seed", "0",
                                     "--lr", "1e-4", "--warmup", "2", "--log-jsonl", str(jsonl), "--log-every", "5"],
                              out / f"e2e_{label}.log", timeout=500)
            losses = [json.loads(ln)["loss"] for ln in jsonl.read_text().splitlines()] if jsonl.exists() else []
            rows[label] = {"exit": code, "losses": losses, **_summary(text)}
            print(f"{label}: exit {code}; {rows[label].get('summary')}; {rows[label]['communicators']}", flush=True)
    a, b = rows["planner"]["losses"], rows["uniform"]["losses"]
    worst = max((abs(x - y) / abs(y) for x, y in zip(a, b)), default=float("nan"))
    stages = [[(s["devices"], s["tp"], s["layers"]) for s in p["stages"]] for p in plan["pipelines"]]
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "gpu": name,
              "device_count": torch.cuda.device_count(), "torch": torch.__version__,
              "nccl": ".".join(map(str, torch.cuda.nccl.version())), "cluster": cluster.name, "model": args.model,
              "global_batch": args.global_batch, "seq_len": args.seq_len, "steps": args.steps, "plan_s": plan_s,
              "plan_stages": stages, "plan_options": plan["options"], "tp_change_in_a_pipeline": _tp_change(plan),
              "estimate": plan.get("estimate"), "runs": rows, "max_rel_loss_diff": worst,
              "losses_track": len(a) == len(b) == args.steps and worst <= BF16_RTOL, "comm_memory": comm}
    path = out / f"hetero_e2e_{kind}x4_{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n| plan | stages | exit | s/step | tok/s | MFU | loss 1 -> {args.steps} |\n|---|---|---|---|---|---|---|")
    for label in rows:
        r = rows[label]
        ls = r["losses"]
        desc = stages if label == "planner" else "TP2 -> TP2"
        print(f"| {label} | {desc} | {r['exit']} | {r.get('step_s')} | {r.get('tokens_per_s')} | {r.get('mfu')} | "
              f"{ls[0] if ls else '-'} -> {ls[-1] if ls else '-'} |")
    print(f"max relative loss difference {worst:.2e} (bf16 tolerance {BF16_RTOL}); TP change inside a pipeline: "
          f"{result['tp_change_in_a_pipeline']}; plan took {plan_s:.1f} s; JSON {path}")
    return 0 if result["losses_track"] and result["tp_change_in_a_pipeline"] else 1


if __name__ == "__main__":
    sys.exit(main())
