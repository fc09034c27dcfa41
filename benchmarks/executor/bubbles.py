"""Pipeline bubbles, measured: 1F1B against ZB-H1 on a 4-stage pipeline over a heterogeneous
4-GPU host (MPS: 100/100/50/50 % of the SMs), at the same micro-batch count, beside what the cost
model's simulator predicts for the same plans. Prints a table and writes JSON (device, versions, date).

    # on the GPU machine, from the repository root (4 GPUs; two launches; starts and stops the MPS daemon):
    NCCL_NVLS_ENABLE=0 python -m benchmarks.executor.bubbles --out benchmarks/results
    # CPU smoke (tiny model, 2 stages, gloo, no MPS; measures nothing; tests/executor/test_bench_bubbles.py):
    python -m benchmarks.executor.bubbles --smoke --out /tmp/bubbles-smoke
    # the MPS shares measured on this host first, so the split is balanced on their measured speeds:
    python -m hexiscale calibrate --sm-percent 50,100
    NCCL_NVLS_ENABLE=0 python -m benchmarks.executor.bubbles --out benchmarks/results
    # or the split pinned, to compare runs across calibrations:
    NCCL_NVLS_ENABLE=0 python -m benchmarks.executor.bubbles --layers 8,8,5,3 --out benchmarks/results

The plan: llama-1.3b (seq 2048) on ``fast:0, fast:1, slow:0, slow:1`` of the bundled
``{h100,h200}x4-mps-100-100-50-50`` cluster, one stage per GPU, the layers split as the planner
would (an equal split polished by the full estimate, :func:`planner.search.local_search.polish_layers`,
under 1F1B); every schedule runs that split. The speeds are those of the profiles the cluster's GPU
types are planned with: with ``hexiscale calibrate --sm-percent 50`` run on this host,
``h100-sxm-mps50-measured`` in ``$HEXISCALE_HOME`` prices the 50 % ranks (not the shipped
``h100-sxm-mps50`` of another host, which left them idle 40-50 % of the step on 2026-11-27); the
program prints which entry each GPU type's speeds came from and records it (``profiles``).
``--layers 8,8,5,3`` pins the split instead (one positive count per stage, summing to the model's
layers). Each schedule is one ``hexiscale launch`` with ``--trace``: each op's compute is timed with
CUDA events inside the schedule interpreter (the trace's spans; tracing off costs one shared null
context per op), and each rank's peak memory is recorded. Per traced step and rank:

* busy = the sum of the rank's ``F``/``B``/``W`` op durations (its spans, paired with the registry's
  op order, :mod:`planner.timeline_ops` — a rank that ran another order fails the run);
* schedule time = the last op's end - the first op's start over all ranks (the gradient sync and
  the optimizer step after it are not part of the schedule); bubble = schedule time - busy;

each reported as the median of the traced steps. The prediction applies the same definitions to the
simulated step (:func:`planner.cost.estimate` with ``timeline=True``: p2p sends are bubble in both),
priced as ``hexiscale estimate`` prices it (:func:`priced`: this host's calibrations in
``HEXISCALE_HOME``, else the packaged ones).
"Step" is the whole training step (``--log-jsonl``'s median, first step left out) against the
estimate's step time. ZB-H1's first stage fuses each ``W`` into its ``B`` (the ``W`` is the very
next op, :func:`planner.schedules.inline_w.inline_w`): the executor computes those weight gradients
inside the ``B``'s span and leaves the ``W``'s empty, so there ``B`` counts ``B + W`` in the per-op
seconds, measured and predicted alike (busy time is unchanged). Its later stages hold back ``W`` ops,
each keeping a micro-batch's queued weight-gradient operands, so the peak memory of every rank is
printed for both schedules (measured: ``torch.cuda.max_memory_allocated``; predicted: the model's
tensors, comparable with it, and its total with the CUDA context, workspaces, NCCL buffers and
fragmentation), and the pipeline's peak (its fullest rank's) decides ``same_memory_as_baseline``:
at most ``SAME_MEMORY`` = 5 % above the first setting's peak. ``--runs`` adds settings,
e.g. ``zb-h1:16`` (ZB-H1 at 16 micro-batches of half the size) or ``interleaved-1f1b`` (each
stage's layers cut into two chunks, :mod:`planner.interleave`; same layers per stage).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.executor.hetero_e2e import CLI, ROOT
from benchmarks.executor.hetero_e2e import _run as run_logged
from benchmarks.executor.run_meta import run_versions
from hexiscale.launch.mps import mps_available, mps_daemon
from planner.cluster import ClusterSpec, load_cluster
from planner.cost import estimate
from planner.cost.memory import GIB
from planner.errors import SpecError
from planner.interleave import interleaved
from planner.model import ModelSpec
from planner.plan import Pipeline, Plan, PlanOptions, Stage, plan_to_dict, save_plan
from planner.schedules import schedule_named
from planner.schedules.inline_w import inline_w
from planner.timeline import Lane, read_trace
from planner.timeline_ops import op_times, seconds_by_kind
from planner.validate import validate

GPU_DEVICES = ["fast:0", "fast:1", "slow:0", "slow:1"]  # the MPS cluster file's devices, one stage each
# demo-cpu-6, mixed in the cost model only; two stages, not four: the smoke checks the program, and
# each rank is a process start (the test's cost on a 2-core CI machine)
SMOKE_DEVICES = ["a100:0", "r4090:0"]
SAME_MEMORY = 0.05  # "the same memory": the pipeline's peak at most 5 % above the baseline's
LAUNCH_TIMEOUT_S = 240


@dataclass(frozen=True)
class Setting:
    schedule: str
    micro_batches: int

    @property
    def label(self) -> str:
        return f"{self.schedule} m={self.micro_batches}"


def parse_layers(text: str, stages: int, num_layers: int) -> list[int]:
    """``--layers 8,8,5,3`` -> layers per stage: one positive integer per stage, summing to the model's."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != stages or not all(p.isdigit() and int(p) > 0 for p in parts) or \
            sum(int(p) for p in parts) != num_layers:
        raise SpecError("--layers", f"{text!r} is not {stages} positive layer counts summing to the model's "
                        f"{num_layers} layers", f"write one count per stage, e.g. --layers "
                        f"{','.join(map(str, _even(num_layers, stages)))}")
    return [int(p) for p in parts]


def _even(num_layers: int, stages: int) -> list[int]:
    return [num_layers // stages + (1 if i < num_layers % stages else 0) for i in range(stages)]


def parse_runs(text: str, micro_batches: int) -> list[Setting]:
    """``1f1b,zb-h1:16`` -> settings; a schedule without ``:M`` runs ``micro_batches``."""
    out = []
    for item in text.split(","):
        name, _, m = item.strip().partition(":")
        schedule_named(name, "--runs").check_trained("--runs")
        if m and not (m.isdigit() and int(m) > 0):
            raise SpecError("--runs", f"{item.strip()!r}: micro-batches {m!r} is not a positive integer",
                            "write schedule or schedule:M, e.g. 1f1b,zb-h1:16")
        out.append(Setting(name, int(m) if m else micro_batches))
    return out


# ---------------------------------------------------------------------- plans
def make_plan(model: ModelSpec, devices: list[str], counts: list[int], batch: int, setting: Setting,
              cluster: str) -> Plan:
    stages, lo = [], 0
    for d, n in zip(devices, counts):
        stages.append(Stage((d,), 1, (lo, lo + n)))
        lo += n
    pipe = Pipeline(batch, setting.micro_batches, tuple(stages), setting.schedule)
    chunks = schedule_named(setting.schedule).chunks
    if chunks > 1:  # each stage's layers cut into chunks in virtual-stage order (planner.interleave)
        pipe = interleaved(pipe, chunks, setting.schedule)
    return Plan(model, batch, (pipe,), PlanOptions(dtype="bf16"), cluster=cluster)


def balanced_counts(cluster: ClusterSpec, model: ModelSpec, devices: list[str], batch: int, m: int) -> list[int]:
    """Layers per stage as the planner would split them: equal, then polished by the estimate (1F1B)."""
    from planner.search.local_search import polish_layers

    counts = _even(model.num_layers, len(devices))
    plan = make_plan(model, devices, counts, batch, Setting("1f1b", m), cluster.name)
    profiles = priced(cluster)
    polished, _ = polish_layers(plan, estimate(plan, cluster, profiles), cluster=cluster, profiles=profiles, log=[])
    return [s.num_layers for s in polished.pipelines[0].stages]


# ---------------------------------------------------------------------- one step, measured or simulated
def step_stats(lanes: list[Lane], plan: Plan) -> dict[str, Any]:
    """Schedule time, and per stage busy / bubble / seconds per op kind, of one step's lanes (one per
    stage of the plan's one pipeline, in stage order)."""
    pipe = plan.pipelines[0]
    sched = schedule_named(pipe.schedule)
    ops = [sched.ops(len(pipe.stages), i, pipe.micro_batches, pipe.chunks) for i in range(len(lanes))]
    per = [op_times(lane, o) for lane, o in zip(lanes, ops)]
    start = min(t[0].start for t in per)
    span = max(t[-1].end for t in per) - start
    kinds = [seconds_by_kind(t, inline_w(o, i == 0)) for i, (t, o) in enumerate(zip(per, ops))]
    busy = [sum(k.values()) for k in kinds]
    return {"schedule_s": span, "busy_s": busy, "bubble_s": [span - b for b in busy], "op_s": kinds}


def _median_stats(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Each quantity's median over the traced steps."""
    def med(get: Any) -> Any:
        return statistics.median(get(s) for s in steps)
    n = len(steps[0]["busy_s"])
    return {"schedule_s": med(lambda s: s["schedule_s"]),
            "busy_s": [med(lambda s, i=i: s["busy_s"][i]) for i in range(n)],
            "bubble_s": [med(lambda s, i=i: s["bubble_s"][i]) for i in range(n)],
            "op_s": [{k: med(lambda s, i=i, k=k: s["op_s"][i][k]) for k in ("F", "B", "W")} for i in range(n)]}


def priced(cluster: ClusterSpec) -> Any:
    """The profiles and cost terms ``hexiscale estimate`` prices ``cluster`` with: this host's
    measured entries and calibrations where ``HEXISCALE_HOME`` has them, else the packaged ones."""
    from planner.calibration.local import resolve_profiles

    return resolve_profiles(cluster).profiles


def priced_from(cluster: ClusterSpec) -> dict[str, str]:
    """GPU type -> the catalog entry its speeds come from (a ``calibrate --sm-percent`` entry of this
    host, ``<type>-measured``, where ``HEXISCALE_HOME`` has one)."""
    profiles = priced(cluster)
    return {gpu: profiles.get(gpu).device.key for gpu in sorted({d.gpu for d in cluster.devices})}


def predicted(plan: Plan, cluster: ClusterSpec) -> dict[str, Any]:
    est = estimate(plan, cluster, priced(cluster), timeline=True)
    assert est.timeline is not None
    lanes = sorted((ln for ln in est.timeline.lanes if ln.pipeline == 0), key=lambda ln: ln.stage)
    mems = [est.memory[s.devices[0]] for s in plan.pipelines[0].stages]
    # memory_gib: the model's total per rank (what must fit the device); tensor_gib: without the CUDA
    # context, workspaces, NCCL buffers and fragmentation, i.e. what max_memory_allocated measures
    return dict(step_stats(lanes, plan), step_s=est.step_time_s, memory_gib=[m.total_gib for m in mems],
                tensor_gib=[(m.total - m.overhead) / GIB for m in mems])


def measured(trace: Path, jsonl: Path) -> dict[str, Any]:
    plan, steps = read_trace(trace)
    per_step = [step_stats(sorted(t.lanes, key=lambda ln: ln.stage), plan) for t in steps]
    times = [json.loads(x)["step_time_s"] for x in jsonl.read_text().splitlines()]
    last = sorted(steps[-1].lanes, key=lambda ln: ln.stage)
    return dict(_median_stats(per_step), step_s=statistics.median(times[1:] or times),
                memory_gib=[ln.peak_memory_gib for ln in last], traced_steps=len(steps))


# ---------------------------------------------------------------------- runs
def run_one(work: Path, plan_path: Path, cluster: Path, device: str, sm: list[str], steps: int, trace_steps: int,
            label: str) -> tuple[int, Path, Path]:
    tag = label.replace(" ", "_").replace("=", "")
    trace, jsonl = work / f"trace_{tag}.json", work / f"steps_{tag}.jsonl"
    for p in (trace, jsonl):
        p.unlink(missing_ok=True)
    code, _ = run_logged(CLI + ["launch", str(plan_path), "--local", "--device", device, "--cluster", str(cluster), *sm,
                                "--run-id", f"bench-bubbles-{tag}", "--", "--steps", str(steps), "--trace", str(trace),
                                "--trace-steps", str(trace_steps), "--log-jsonl", str(jsonl), "--lr", "1e-4",
                                "--warmup", "1", "--seed", "0"], work / f"{tag}.log", timeout=LAUNCH_TIMEOUT_S)
    return code, trace, jsonl


def _err(pred: float, meas: float) -> float | None:
    return (pred - meas) / meas if meas else None


def analyse(settings: list[Setting], meas: list[dict[str, Any]], pred: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per setting; reductions against the first setting (the 1F1B baseline)."""
    rows = []
    base = meas[0]
    for st, m, p in zip(settings, meas, pred):
        mean_bubble, pred_bubble = statistics.mean(m["bubble_s"]), statistics.mean(p["bubble_s"])
        base_bubble = statistics.mean(base["bubble_s"])
        rows.append({
            "setting": st.label, "schedule": st.schedule, "micro_batches": st.micro_batches,
            "measured": m, "predicted": p,
            "bubble_mean_s": mean_bubble, "predicted_bubble_mean_s": pred_bubble,
            "bubble_reduction": 1 - mean_bubble / base_bubble if base_bubble > 0 else None,
            "bubble_reduction_per_rank": [1 - b / a if a > 0 else None
                                          for a, b in zip(base["bubble_s"], m["bubble_s"])],
            "schedule_error": _err(p["schedule_s"], m["schedule_s"]),
            "bubble_error": _err(pred_bubble, mean_bubble),
            "step_error": _err(p["step_s"], m["step_s"]),
            "peak_memory_gib": max(x for x in m["memory_gib"] if x is not None),
            "predicted_peak_memory_gib": max(p["memory_gib"]),
            "predicted_peak_tensor_gib": max(p["tensor_gib"]),
        })
    for r in rows:  # the pipeline's peak (its fullest rank), not rank by rank
        r["same_memory_as_baseline"] = r["peak_memory_gib"] <= rows[0]["peak_memory_gib"] * (1 + SAME_MEMORY)
    return rows


def _f(x: Any, scale: float = 1.0, fmt: str = ".1f") -> str:
    return "-" if x is None else format(x * scale, fmt)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f} %"


def print_tables(rows: list[dict[str, Any]]) -> None:
    n = len(rows[0]["measured"]["bubble_s"])
    print("\n| setting | step ms (pred., err) | schedule ms (pred., err) | "
          + " | ".join(f"bubble r{i} ms (pred.)" for i in range(n))
          + " | mean bubble ms (pred., err) | bubble cut vs 1st | peak GiB, max over ranks (pred. tensors) "
          "| same memory |")
    print("|---|---:|---:|" + "---:|" * n + "---:|---:|---|---|")
    for r in rows:
        m, p = r["measured"], r["predicted"]
        bub = " | ".join(f"{_f(a, 1e3)} ({_f(b, 1e3)})" for a, b in zip(m["bubble_s"], p["bubble_s"]))
        mem = f"{_f(r['peak_memory_gib'], 1, '.2f')} ({_f(r['predicted_peak_tensor_gib'], 1, '.2f')})"
        print(f"| {r['setting']} | {_f(m['step_s'], 1e3)} ({_f(p['step_s'], 1e3)}, {_pct(r['step_error'])}) | "
              f"{_f(m['schedule_s'], 1e3)} ({_f(p['schedule_s'], 1e3)}, {_pct(r['schedule_error'])}) | {bub} | "
              f"{_f(r['bubble_mean_s'], 1e3)} ({_f(r['predicted_bubble_mean_s'], 1e3)}, {_pct(r['bubble_error'])}) | "
              f"{_pct(r['bubble_reduction'])} | {mem} | {'yes' if r['same_memory_as_baseline'] else 'NO'} |")
    print("\nPer op, ms per micro-batch, measured (predicted):\n")
    print("| setting | rank | F | B | W |\n|---|---:|---:|---:|---:|")
    for r in rows:
        m, p, mb = r["measured"], r["predicted"], r["micro_batches"]
        for i in range(n):
            cells = " | ".join(f"{_f(m['op_s'][i][k] / mb, 1e3, '.2f')} ({_f(p['op_s'][i][k] / mb, 1e3, '.2f')})"
                               for k in ("F", "B", "W"))
            print(f"| {r['setting']} | {i} | {cells} |")
    print("\nPeak memory per rank, GiB: measured (max_memory_allocated) / predicted tensors / predicted total "
          "(with the CUDA context, workspaces, NCCL buffers, fragmentation):\n")
    print("| setting | " + " | ".join(f"r{i}" for i in range(n)) + " |\n|---|" + "---:|" * n)
    for r in rows:
        m, p = r["measured"], r["predicted"]
        cells = " | ".join(f"{_f(a, 1, '.2f')} / {_f(b, 1, '.2f')} / {_f(c, 1, '.2f')}"
                           for a, b, c in zip(m["memory_gib"], p["tensor_gib"], p["memory_gib"]))
        print(f"| {r['setting']} | {cells} |")


def print_verdict(rows: list[dict[str, Any]]) -> None:
    """Each setting against the first: the bubble cut (target >= 30 %), memory, the prediction errors (<= 10 %)."""
    base = rows[0]
    for r in rows[1:]:
        mem = r["peak_memory_gib"] / base["peak_memory_gib"] - 1
        same = "the same memory" if r["same_memory_as_baseline"] else "NOT the same memory"
        print(f"\n{r['setting']} vs {base['setting']}: mean bubble cut {_pct(r['bubble_reduction'])} (target >= 30 %); "
              f"fullest rank {_f(r['peak_memory_gib'], 1, '.2f')} vs {_f(base['peak_memory_gib'], 1, '.2f')} GiB "
              f"({_pct(mem)}: {same}, at most +{100 * SAME_MEMORY:.0f} %)")
    for r in rows:
        print(f"{r['setting']}: predicted step {_pct(r['step_error'])}, schedule {_pct(r['schedule_error'])}, "
              f"mean bubble {_pct(r['bubble_error'])} (target: within 10 %)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--smoke", action="store_true",
                    help="CPU/gloo, tiny model, no MPS: checks the program, measures nothing")
    ap.add_argument("--model", default="llama-1.3b")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--global-batch-size", "--global-batch", dest="global_batch", type=int, default=16,
                    help="samples per step (the total, as in every hexiscale command)")
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--runs", default="1f1b,zb-h1",
                    help="settings, the first the baseline: schedule or schedule:micro_batches, comma-separated")
    ap.add_argument("--layers", help="layers per stage, e.g. 8,8,5,3 (default: balanced on the profiles the "
                    "cluster's GPU types are planned with; pin it to compare runs across calibrations)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--trace-steps", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)
    if args.smoke:
        args.global_batch, args.micro_batches, args.steps, args.trace_steps = 4, 4, 3, 2
    try:
        settings = parse_runs(args.runs, args.micro_batches)
    except SpecError as exc:
        ap.error(str(exc))
    from planner.hf_config import resolve_model

    out = Path(args.out).resolve()
    work = out / "bubbles_work"
    work.mkdir(parents=True, exist_ok=True)
    meta = run_versions(gpu=not args.smoke)
    if args.smoke:
        kind, device, devices, sm = "cpu_smoke", "cpu", SMOKE_DEVICES, []
        cluster_path = ROOT / "examples" / "clusters" / "demo-cpu-6.yaml"
        model = resolve_model("tiny-8l")
    else:
        kind = "h200" if "H200" in meta["gpu"] else "h100"
        device, devices, sm = "cuda", GPU_DEVICES, ["--sm-percent=slow=50"]
        cluster_path = ROOT / "examples" / "clusters" / f"{kind}x4-mps-100-100-50-50.yaml"
        model = resolve_model(args.model, args.seq_len)
    cluster = load_cluster(cluster_path)
    try:  # every setting's plan, checked before anything launches (e.g. micro-batches above the batch)
        counts = (parse_layers(args.layers, len(devices), model.num_layers) if args.layers else
                  balanced_counts(cluster, model, devices, args.global_batch, args.micro_batches))
        plans = [make_plan(model, devices, counts, args.global_batch, st, cluster.name) for st in settings]
        for plan in plans:
            validate(plan, cluster)
            schedule_named(plan.pipelines[0].schedule).check(len(devices), plan.pipelines[0].micro_batches)
    except SpecError as exc:
        ap.error(str(exc))
    profiles = priced_from(cluster)
    how = "pinned by --layers" if args.layers else "balanced"
    print(f"layers per stage {counts} on {devices} ({cluster.name}; {how}; speeds from "
          f"{', '.join(f'{t} -> {k}' for t, k in profiles.items())})", flush=True)
    codes, meas, pred, order_errors = [], [], [], []
    if not args.smoke and not mps_available():
        print("needs CUDA MPS (nvidia-cuda-mps-control) to make the GPUs heterogeneous; run --smoke without it")
        return 2
    with nullcontext() if args.smoke else mps_daemon():
        for st, plan in zip(settings, plans):
            path = work / f"plan_{st.schedule}_m{st.micro_batches}.json"
            save_plan(plan, path)
            t0 = time.perf_counter()
            code, trace, jsonl = run_one(work, path, cluster_path, device, sm, args.steps, args.trace_steps, st.label)
            print(f"{st.label}: exit {code}, {time.perf_counter() - t0:.0f} s", flush=True)
            codes.append(code)
            if code != 0:
                break
            try:
                meas.append(measured(trace, jsonl))
            except ValueError as exc:  # a rank ran another op order than the registry's (planner.timeline_ops)
                print(f"{st.label}: {exc}", flush=True)
                order_errors.append(f"{st.label}: {exc}")
                break
            pred.append(predicted(plan, cluster))
    ok = len(meas) == len(settings)
    rows = analyse(settings, meas, pred) if ok else []
    result = dict(meta, cluster=cluster.name, model=model.name, seq_len=model.seq_len, global_batch=args.global_batch,
                  devices=devices, layers_per_stage=counts, layers_pinned=bool(args.layers), profiles=profiles,
                  exits=codes,
                  op_order_errors=order_errors, plans=[plan_to_dict(p) for p in plans],
                  rows=rows)
    path = out / f"bubbles_{kind}_{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    if not ok:
        print(f"FAILED (logs under {work}); JSON {path}")
        return 1
    print_tables(rows)
    print("\nop order: every rank ran the registry's ops in order on every traced step")
    print_verdict(rows)
    print(f"\nJSON {path}; logs under {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
