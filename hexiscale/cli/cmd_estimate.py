"""``hexiscale estimate PLAN [--cluster CLUSTER] [--json] [--params FILE] [-o OUT] [--plot DIR]``.

Prints the cost model's estimate of one training step: the step time and its breakdown, tokens/s,
MFU and HFU, each pipeline's time and idle wait at the gradient sync, each stage's per-micro-batch
times and memory, the bottleneck with a hint on what to change, and any device out of memory.
Without ``--cluster`` the plan's ``cluster`` name (a plain name, never a path) is looked up as
``NAME.yaml`` in the plan's directory, ``../clusters/`` next to it, and ``examples/clusters/``.
``--plot DIR`` writes the plan map and the simulated step's timeline as PNGs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table

from hexiscale.cli.flag_names import add_output, typed
from hexiscale.cli.output import _ranges, console, layers_label, print_warning, styled
from hexiscale.cli.pictures import PLAN_MAP, SIMULATED, write_pictures
from hexiscale.cli.writing import writing
from planner.cluster import ClusterSpec, load_cluster
from planner.cost import BREAKDOWN_TERMS, CostParams, Estimate, ProfileSet, estimate
from planner.documents import load_json_file
from planner.errors import SpecError
from planner.names import is_safe_name
from planner.plan import Plan, load_plan, save_plan, uses_cp
from planner.validate import other_cluster, validate

if TYPE_CHECKING:
    from planner.calibration.local import ResolvedProfiles


def add_common_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("plan", help="plan file (JSON)")
    p.add_argument("--cluster", help="cluster file (YAML); default: the plan's 'cluster' name, looked up")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--params", help="JSON file of cost-model parameters (CostParams fields) to override")
    p.add_argument("--spec-only", action="store_true", help="ignore measured profiles; use the spec roofline")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("estimate", help="estimate a plan's step time, memory, MFU and bottleneck")
    add_common_arguments(p)
    add_output(p, "write the plan with its estimate to this JSON file", "--save")
    p.add_argument("--plot", metavar="DIR", help=f"write {PLAN_MAP} and {SIMULATED} (the simulated step) to DIR")
    p.set_defaults(func=run)


def find_cluster(plan: Plan, plan_path: str, cluster_arg: str | None) -> ClusterSpec:
    """``--cluster`` (a warning when the plan was made for another cluster), else the plan's
    ``cluster`` looked up by name (module docstring). The name is a plain name, never a path: a plan
    cannot make a command read a file outside the places looked in (``"../../../base"``)."""
    if cluster_arg:
        cluster = load_cluster(cluster_arg)
        validate(plan, cluster)
        print_warning(other_cluster(plan, cluster))
        return cluster
    if not plan.cluster:
        raise SpecError("--cluster", "missing, and the plan names no cluster", "pass --cluster CLUSTER.yaml")
    if not is_safe_name(plan.cluster):
        raise SpecError("cluster", f"{plan.cluster!r} is not a plain cluster name, so no file is looked up for it",
                        "a plan names its cluster, it does not point at a file: pass --cluster CLUSTER.yaml",
                        plan_path)
    here = Path(plan_path).resolve().parent
    for cand in (here / f"{plan.cluster}.yaml", here.parent / "clusters" / f"{plan.cluster}.yaml",
                 Path("examples/clusters") / f"{plan.cluster}.yaml"):
        if cand.exists():
            return load_cluster(cand)
    raise SpecError("cluster", f"no file {plan.cluster}.yaml found for the plan's cluster {plan.cluster!r}",
                    "pass --cluster CLUSTER.yaml")


def load_params(path: str | None) -> CostParams:
    if not path:
        return CostParams()
    data = load_json_file(path, "--params")
    if not isinstance(data, dict):
        raise SpecError("--params", "expected a JSON object", "write {\"gemm_efficiency\": 0.7, ...}", path)
    known = set(CostParams.__dataclass_fields__)
    for key in data:
        if key not in known:
            raise SpecError(f"--params.{key}", "unknown cost parameter", f"known: {', '.join(sorted(known))}", path)
    try:
        return CostParams(**data)
    except SpecError as exc:
        raise exc.with_file(path) from None


def profiles_for(args: argparse.Namespace, cluster: ClusterSpec, *, say: bool = True) -> ProfileSet:
    """This host's profiles and calibration when present (planner.calibration.local), ``--params``
    overriding the terms; says which, and what priced each node (on stderr under ``--json``)."""
    return resolved_for(args, cluster, say=say).profiles


def resolved_for(args: argparse.Namespace, cluster: ClusterSpec, *, say: bool = True) -> ResolvedProfiles:
    from planner.calibration.local import resolve_profiles

    resolved = resolve_profiles(cluster, params=load_params(args.params) if args.params else None,
                                spec_only=args.spec_only)
    if say:
        resolved.say(sys.stderr if getattr(args, "json", False) else sys.stdout)
    return resolved


def _s(x: float) -> str:
    if x >= 1:
        return f"{x:.3f} s"
    if x >= 1e-3:
        return f"{x * 1e3:.2f} ms"
    return f"{x * 1e6:.1f} us"


def advice(plan: Plan, cluster: ClusterSpec, est: Estimate) -> str:
    """One sentence on what to change, from the bottleneck term."""
    b = est.bottleneck
    pipe = plan.pipelines[b["pipeline"]]
    stage = pipe.stages[b["stage"]]
    term = b["term"]
    where = f"pipeline {b['pipeline']} stage {b['stage']} ({_ranges(stage.devices)})"
    if term == "compute":
        return (f"{where} computes longest ({stage.num_layers} layers on {cluster.device(b['device']).gpu}): move "
                "layers to faster stages, give this pipeline a smaller batch, or faster GPUs")
    if term == "tp_comm":
        lk = cluster.slowest_link(stage.devices)
        kind = f"{lk.kind} {lk.bandwidth_GBps:g} GB/s" if lk else "?"
        if stage.cp > 1:
            return (f"{where} spends most on TP all-reduces and CP K/V collectives over {kind}: lower its TP or CP "
                    "degree or keep them on faster links")
        return f"{where} spends most on TP all-reduces over {kind}: lower its TP degree or keep TP on faster links"
    if term == "pp_comm":
        return f"{where} waits on p2p between stages: put neighbouring stages on faster links or use fewer stages"
    if term == "bubble":
        return (f"pipeline {b['pipeline']} idles in the pipeline bubble: more micro-batches (now "
                f"{pipe.micro_batches}) or fewer/more balanced stages")
    if term == "dp_sync":
        idle = max(est.pipelines, key=lambda p: p.idle_s)
        return (f"gradient sync across pipelines is exposed (device {b['device']}); the most idle pipeline waits "
                f"{_s(idle.idle_s)}: balance batch sizes across pipelines or use faster inter-pipeline links")
    return "the optimizer step dominates: use ZeRO-1 (options.zero = 1) to shard it across pipelines"


def render(plan: Plan, cluster: ClusterSpec, est: Estimate, title: str = "estimate") -> None:
    m = plan.model
    console.print(styled((title, "bold"), f": {m.name}, global batch {plan.global_batch_size} x seq {m.seq_len}, "
                         f"{plan.world_size} devices on cluster {cluster.name!r}"
                         + (", compiled blocks (options.compile)" if plan.options.compile else "")
                         + (f", {plan.options.residual_dtype} residual (options.residual_dtype)"
                            if plan.options.residual_dtype != "fp32" else "")))
    console.print(styled("step time ", (_s(est.step_time_s), "bold"), f", {est.tokens_per_s:,.0f} tokens/s, "
                         f"MFU {est.mfu * 100:.1f} %, HFU {est.hfu * 100:.1f} %"))
    bt = Table(title="step time: terms of the slowest pipeline's bottleneck stage", title_justify="left", min_width=64)
    bt.add_column("term")
    bt.add_column("time", justify="right")
    bt.add_column("share", justify="right")
    for k in BREAKDOWN_TERMS:
        v = est.breakdown[k]
        bt.add_row(k, _s(v), f"{100 * v / est.step_time_s:.1f} %")
    console.print(bt)

    st = Table(title="stages (per micro-batch of the largest size; totals per step)", title_justify="left")
    cp = uses_cp(plan)  # context parallelism: the CP degree and its K,V collectives per stage
    for col in ("pipe", "stage", "devices", "gpu", "tp", *(("cp",) if cp else ()), "layers", "fwd/mb", "bwd/mb",
                "compute", "tp comm", *(("cp comm",) if cp else ()), "pp comm", "memory GiB"):
        st.add_column(col, justify="left" if col in ("devices", "gpu", "layers") else "right")
    for pi, (pipe, pe) in enumerate(zip(plan.pipelines, est.pipelines, strict=True)):
        for si, (stage, se) in enumerate(zip(pipe.stages, pe.stages, strict=True)):
            gpus = ",".join(sorted({cluster.device(d).gpu for d in stage.devices}))
            mem = max(est.memory_gib[d] for d in stage.devices)
            cap = min(est.capacity_gib[d] for d in stage.devices)
            mem_s = f"{mem:.1f}/{cap:g}" + (" OOM" if mem > cap else "")
            mark = "*" if si == pe.bottleneck_stage else ""
            st.add_row(str(pi) if si == 0 else "", f"{si}{mark}", _ranges(stage.devices), gpus, str(stage.tp),
                       *((str(stage.cp),) if cp else ()),
                       layers_label(stage), _s(se.forward_s), _s(se.backward_s),
                       _s(se.compute_s), _s(se.tp_comm_s), *((_s(se.cp_comm_s),) if cp else ()), _s(se.pp_comm_s),
                       styled((mem_s, "red")) if mem > cap else mem_s)
        if pi != len(plan.pipelines) - 1:
            st.add_section()
    console.print(st)
    full = max(est.memory, key=lambda d: est.memory_gib[d] / est.capacity_gib[d])
    terms = ", ".join(f"{k} {v:.2f}" for k, v in est.memory[full].to_gib_dict().items() if k != "total")
    console.print(f"fullest device {full}: {est.memory_gib[full]:.2f} of {est.capacity_gib[full]:g} GiB "
                  f"({terms} GiB)", highlight=False)

    pt = Table(title="pipelines (* = bottleneck stage above)", title_justify="left")
    for col in ("pipe", "batch", "micro-batches", "schedule", "time", "idle at sync", "bubble"):
        pt.add_column(col, justify="right")
    for pi, (pipe, pe) in enumerate(zip(plan.pipelines, est.pipelines, strict=True)):
        pt.add_row(str(pi), str(pipe.batch_size), str(pipe.micro_batches), pipe.schedule, _s(pe.time_s),
                   _s(pe.idle_s), f"{pe.bubble_fraction * 100:.1f} %")
    console.print(pt)
    b = est.bottleneck
    console.print(styled(f"bottleneck: pipeline {b['pipeline']}, stage {b['stage']}, device {b['device']}, term ",
                         (b["term"], "bold")))
    console.print(f"hint: {advice(plan, cluster, est)}", highlight=False)
    by_stage: dict[str, list[dict[str, Any]]] = {}
    for o in est.oom:
        by_stage.setdefault(o["path"].rpartition(".devices")[0], []).append(o)
    for where, items in by_stage.items():
        worst = max(items, key=lambda o: o["over_gib"])
        devs = _ranges([o["device"] for o in items])
        console.print(styled(("out of memory", "red"), f": {where} ({devs}) needs {worst['need_gib']:.2f} GiB, has "
                             f"{worst['capacity_gib']:g} GiB ({worst['over_gib']:.2f} GiB over)"))
    if est.oom:
        console.print(f"hint: {len(est.oom)} devices run out of memory: use recompute (options.recompute), ZeRO-1, "
                      "fewer layers or a larger TP degree on those stages", highlight=False)
    if any(s == "spec" for s in est.sources.values()):
        spec = sorted(g for g, s in est.sources.items() if s == "spec")
        console.print(styled((f"profiles: spec-derived (datasheet roofline, not measured) for {', '.join(spec)}",
                              "dim")))
    for note in est.notes:
        console.print(f"note: {note}", highlight=False)


def run(args: argparse.Namespace) -> int:
    plan = load_plan(args.plan)
    cluster = find_cluster(plan, args.plan, args.cluster)
    from planner.calibration.priced_by import used_by

    resolved = resolved_for(args, cluster)
    est = estimate(plan, cluster, resolved.profiles, timeline=bool(args.plot))
    data: dict[str, Any] = {**est.to_dict(), "priced_by": used_by(resolved.priced_by, cluster, plan.devices)}
    if args.output:
        with writing(typed(args, "output", "-o"), args.output):
            save_plan(plan.with_estimate(data), args.output)
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        render(plan, cluster, est)
        if args.output:
            console.print(f"wrote {args.output}", highlight=False)
    if args.plot:
        write_pictures(args.plot, plan, cluster, est.timeline, SIMULATED, f"cluster {cluster.name}")
    return 0
