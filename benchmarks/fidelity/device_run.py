"""Everything the GPU machine does for the profiler issue, in two phases (one command each).

    python -m benchmarks.fidelity.device_run profile --out $OUT     # ~4 min on 2 H100s
    python -m benchmarks.fidelity.device_run runs --out $OUT        # ~5 min on 2 H100s
    python -m benchmarks.fidelity.device_run {profile,runs} --cpu --out /tmp/x   # CPU rehearsal

``profile``: starts the MPS control daemon, profiles the model's layer etc. with ``hexiscale profile`` at
100 % of the SMs and under MPS at 60, 35, 50 and 75 % (two GPUs at a time, one process per GPU), then
the p2p/all-reduce sweep between the two GPUs; writes the measured catalog entries to ``WORK/profiles``
and a tarball of them to ``--out``.

``runs``: the fidelity plans (``benchmarks/fidelity/plans.py``) and the heterogeneous-efficiency
candidates chosen by the cost model from the measured profiles (``benchmarks/fidelity/hetero_efficiency.py``),
each launch with its MPS shares; writes ``runs.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORK = Path(os.environ.get("HX_WORK", "/tmp/hx"))
PROFILE_ROUNDS = ((100,), (60, 35), (50, 75))  # GPU k of a round runs the k-th share; 100 % without MPS


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def mps(start: bool) -> bool:
    """Start (or quit) the MPS control daemon; returns whether the command worked."""
    try:
        if start:
            r = subprocess.run(["nvidia-cuda-mps-control", "-d"], capture_output=True, text=True, timeout=30)
        else:
            r = subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", capture_output=True, text=True, timeout=30)
        log(f"mps {'start' if start else 'quit'}: rc={r.returncode} {r.stdout.strip()} {r.stderr.strip()}")
        return r.returncode == 0
    except (OSError, subprocess.SubprocessError) as exc:
        log(f"mps {'start' if start else 'quit'} failed: {exc}")
        return False


def device_meta() -> dict[str, str]:
    """GPU names, driver, torch version and date (nvidia-smi, so no CUDA context is created here)."""
    import datetime as _dt

    import torch

    meta = {"torch": torch.__version__, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
        meta["gpus"] = r.stdout.strip().replace("\n", "; ")
    except (OSError, subprocess.SubprocessError):
        meta["gpus"] = "unknown"
    return meta


def _profile_cmd(key: str, sm: int, cpu: bool, comm: int) -> list[str]:
    cmd = [sys.executable, "-m", "hexiscale", "profile", "--out", str(WORK / "profiles" / f"{key}.json"),
           "--key", key, "--comm-ranks", str(comm), "--quiet"]
    if cpu:
        cmd += ["--model", "tiny-8l", "--cpu"]
    else:
        cmd += ["--model", "llama-1.3b", "--layers", "8", "--seq-len", "2048", "--base", "h100-sxm",
                "--micro-batches", "1,2,4", "--seq-lens", "1024,2048", "--tp", "1,2", "--repeats", "8"]
    if sm < 100:
        cmd += ["--sm-percent", str(sm)]
    return cmd


def phase_profile(out: Path, cpu: bool, single_gpu: bool = False) -> None:
    from benchmarks.fidelity.model import device_key

    (WORK / "profiles").mkdir(parents=True, exist_ok=True)
    env0 = {**os.environ, "PYTHONPATH": str(ROOT), "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
    rounds = ((100,),) if cpu else (((100,), (60,), (35,), (50,), (75,)) if single_gpu else PROFILE_ROUNDS)
    status: dict[str, object] = {}
    key100 = "cpu-measured" if cpu else device_key(100)
    use_mps = False
    for shares in rounds:
        if not cpu and any(sm < 100 for sm in shares) and not use_mps:
            use_mps = mps(True)
            status["mps"] = use_mps
        procs = []
        for gpu, sm in enumerate(shares):
            if sm < 100 and not use_mps:
                log(f"skip {sm} %: MPS is not running")
                continue
            key = "cpu-measured" if cpu else device_key(sm)
            env = dict(env0)
            if not cpu:
                env["CUDA_VISIBLE_DEVICES"] = str(gpu)
            if sm < 100:
                env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(sm)
            log(f"profile {key} on gpu{gpu}")
            procs.append((key, subprocess.Popen(_profile_cmd(key, sm, cpu, 0), env=env, cwd=ROOT)))
        for key, p in procs:
            try:
                status[key] = p.wait(timeout=300)
            except subprocess.TimeoutExpired:
                p.kill()
                status[key] = "timeout"
            log(f"{key}: rc={status[key]}")
        if shares == (100,) and not single_gpu:  # the link sweep, before MPS starts (NCCL under MPS is not supported)
            log("p2p / all-reduce sweep over 2 ranks")
            try:
                status["comm"] = subprocess.run(_profile_cmd(key100, 100, cpu, 2), env=env0, cwd=ROOT,
                                                timeout=180).returncode
            except subprocess.TimeoutExpired:
                status["comm"] = "timeout"
    if use_mps:
        mps(False)
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out / "profiles.tar.gz", "w:gz") as tar:
        tar.add(WORK / "profiles", arcname="profiles")
    (out / "profile_status.json").write_text(json.dumps(status))
    for f in sorted((WORK / "profiles").glob("*.json")):
        m = json.loads(f.read_text())["measured"]
        c = m.get("ceilings", {})
        lay = [r for r in m.get("layer", []) if r["micro_batch"] == 2 and r["tp"] == 1 and r["recompute"] == "none"]
        log(f"{f.stem}: gemm {c.get('gemm_tflops', 0):.0f} TFLOP/s, copy {c.get('copy_GBps', 0):.0f} GB/s, "
            f"layer mb2 " + ", ".join(f"s{r['seq_len']} {r['forward_s'] * 1e3:.2f}/{r['backward_s'] * 1e3:.2f} ms"
                                      for r in lay) + (f", comm {m['comm']['fit']}" if "comm" in m else ""))


def run_launch_subprocess(name: str, sm: list[int], plans: list[dict], cpu: bool, timeout: float,
                          extra_env: dict[str, str] | None = None) -> dict:
    """One launch in a child process with a wall-clock limit (a hung collective must not eat the lease)."""
    spec = WORK / f"launch-{name}.json"
    result = WORK / f"result-{name}.json"
    result.unlink(missing_ok=True)
    spec.write_text(json.dumps({"sm": sm, "plans": plans, "cpu": cpu}))
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(extra_env or {})}
    cmd = [sys.executable, "-m", "benchmarks.fidelity.device_run", "launch", "--spec", str(spec), "--out", str(result)]
    try:
        rc = subprocess.run(cmd, env=env, cwd=ROOT, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        return {"sm": sm, "error": f"timeout after {timeout:.0f} s", "plans": []}
    if rc != 0 or not result.exists():
        return {"sm": sm, "error": f"exit code {rc}", "plans": []}
    return json.loads(result.read_text())  # type: ignore[no-any-return]


def phase_runs(out: Path, cpu: bool, only: list[str] | None = None, tag: str = "runs", micro: int = 4) -> None:
    from benchmarks.fidelity.hetero_efficiency import HETERO_PAIRS, choose_candidates
    from benchmarks.fidelity.plans import bench_model, fidelity_launches, plan_to_json

    os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
    model = bench_model(cpu)
    prof_dir = WORK / "profiles" if (WORK / "profiles").exists() else ROOT / "planner" / "profiles" / "devices"
    WORK.mkdir(parents=True, exist_ok=True)
    launches = [(la.name, list(la.sm), [{"name": n, "plan": plan_to_json(p)} for n, p in la.plans])
                for la in fidelity_launches(model)]
    if only:
        launches = [x for x in launches if x[0] in only]
    chosen = {}
    for pair in HETERO_PAIRS if not only or any(o.startswith("hetero") for o in only) else ():
        picks = choose_candidates(model, pair, prof_dir, cpu=cpu, top=2, micro=micro)
        chosen[f"{pair[0]}-{pair[1]}"] = [n for n, _, _ in picks]
        launches.append((f"hetero-{pair[0]}-{pair[1]}", list(pair),
                         [{"name": n, "plan": plan_to_json(p)} for n, p, _ in picks]))
    results: dict = {"model": model.to_dict(), "hetero_chosen": chosen, "launches": [], "device_meta": device_meta()}
    use_mps = False
    for name, sm, plans in launches:
        if cpu:
            sm = [100] * len(sm)
        elif any(s < 100 for s in sm) and not use_mps:
            use_mps = mps(True)
            results["mps"] = use_mps
        if any(s < 100 for s in sm) and not use_mps:
            log(f"skip {name}: MPS is not running")
            continue
        log(f"launch {name} sm={sm}: {len(plans)} plans")
        t0 = time.time()
        limit = 60 + 30 * len(plans) * (2 if any(s < 50 for s in sm) else 1)
        res = run_launch_subprocess(name, sm, plans, cpu, limit)
        if "error" in res and use_mps and not cpu:
            log(f"launch {name} failed ({res['error']}); again with NCCL_P2P_DISABLE=1")
            res = run_launch_subprocess(name, sm, plans, cpu, limit, {"NCCL_P2P_DISABLE": "1"})
            res["nccl_p2p_disabled"] = True
        failed = [p["name"] for p in res.get("plans", []) if "error" in p and "NCCL" in p["error"]]
        if failed and not cpu:  # once seen under MPS: "Duplicate GPU detected" for the first launch after start
            log(f"launch {name}: NCCL failed for {failed}; those plans once more")
            again = run_launch_subprocess(name + "-retry", sm, [x for x in plans if x["name"] in failed], cpu, limit)
            redo = {p["name"]: p for p in again.get("plans", [])}
            res["plans"] = [redo.get(p["name"], p) if p["name"] in failed else p for p in res["plans"]]
            res["retried"] = failed
        res["name"] = name
        res["seconds"] = time.time() - t0
        results["launches"].append(res)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{tag}.json").write_text(json.dumps(results, indent=1))
    if use_mps:
        mps(False)
    for launch in results["launches"]:
        for p in launch["plans"]:
            mem = " ".join(f"g{r['gpu']}:{r.get('in_use_gib', 0):.1f}G" for r in p["ranks"])
            log(f"{launch['name']:<12} {p['name']:<24} "
                + (f"{p['step_time_s'] * 1e3:8.1f} ms  {mem}" if "step_time_s" in p else
                   "ERROR " + p.get("error", "").strip().splitlines()[-1][:100]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("phase", choices=("profile", "runs", "launch"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--cpu", action="store_true")
    ap.add_argument("--spec", help="(launch) the launch's JSON spec")
    ap.add_argument("--only", help="(runs) comma list of launch names to run")
    ap.add_argument("--single-gpu", action="store_true", help="(profile) one GPU: shares one after another, no sweep")
    ap.add_argument("--tag", default="runs", help="(runs) output file name without .json")
    ap.add_argument("--hetero-micro", type=int, default=4, help="(runs) samples per micro-batch of the hetero plans")
    args = ap.parse_args()
    out = Path(args.out)
    if args.phase == "launch":
        from benchmarks.fidelity.worker import run_launch

        spec = json.loads(Path(args.spec).read_text())
        res = run_launch(spec["plans"], spec["sm"], cpu=spec["cpu"], warmup=1 if spec["cpu"] else 2,
                         steps=2 if spec["cpu"] else 5)
        out.write_text(json.dumps(res))
    elif args.phase == "profile":
        phase_profile(out, args.cpu, args.single_gpu)
    else:
        phase_runs(out, args.cpu, args.only.split(",") if args.only else None, args.tag, args.hetero_micro)


if __name__ == "__main__":
    main()
