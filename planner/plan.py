"""The plan: the contract between planner and executor (``hexiscale.plan/1`` and ``/2`` JSON).

A plan lists pipelines (data-parallel replicas); each pipeline lists stages in order; each stage
names its devices and the half-open layer range it holds. A stage's devices form a ``cp x tp``
mesh (``tp * cp == len(devices)``): ``cp`` context-parallel slots, each a TP group of ``tp``
consecutive devices (device ``i`` is ``cp_rank = i // tp``, ``tp_rank = i % tp``; TP innermost,
since it needs the fastest links). Format ``/2`` adds the ``cp`` field (default 1); a plan is
written as ``/1`` when no stage uses context parallelism, so older readers still load it.
The embedding sits on every first stage, the final norm + LM head on every last stage.

Rank order (**contract**): pipelines in order, stages in order, devices in order. Worked example,
pipelines ``[[A0,A1] | [A2]]`` and ``[[B0,B1,B2,B3] | [C0,C1] | [C2,C3]]`` give ranks
A0=0 A1=1 A2=2 B0=3 B1=4 B2=5 B3=6 C0=7 C1=8 C2=9 C3=10.

Structural invariants are checked on construction (``Plan.__post_init__``); the checks that need
the cluster live in :mod:`planner.validate`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from planner.documents import load_json_file
from planner.errors import SpecError
from planner.fields import (
    check_keys,
    expect_list,
    expect_mapping,
    get_bool,
    get_int,
    get_str,
    join,
)
from planner.model import MODEL_LIMITS, RECOMPUTE_MODES, ModelSpec, model_from_dict
from planner.schedules import SCHEDULE_NAMES, schedule_named

PLAN_FORMAT = "hexiscale.plan/1"
PLAN_FORMAT_CP = "hexiscale.plan/2"  # adds Stage.cp; written only when some stage has cp > 1
PLAN_FORMATS = (PLAN_FORMAT, PLAN_FORMAT_CP)
SCHEDULES = SCHEDULE_NAMES  # the registry's names (planner.schedules)
DTYPES = ("fp32", "bf16", "fp16")
MAX_MICRO_BATCHES = 100_000
MAX_GLOBAL_BATCH = 1 << 24  # samples per step; far beyond any real run
MAX_LAYER = MODEL_LIMITS["num_layers"]


@dataclass(frozen=True)
class Stage:
    devices: tuple[str, ...]
    tp: int
    layers: tuple[int, int]  # half-open [start, end)
    cp: int = 1  # context-parallel degree: cp TP groups of tp devices split each sequence

    @property
    def num_layers(self) -> int:
        return self.layers[1] - self.layers[0]


@dataclass(frozen=True)
class Pipeline:
    batch_size: int
    micro_batches: int
    stages: tuple[Stage, ...]
    schedule: str = "1f1b"

    def micro_batch_sizes(self) -> list[int]:
        """Samples per micro-batch: an even split, larger ones first (10 over 4 -> 3,3,2,2)."""
        q, r = divmod(self.batch_size, self.micro_batches)
        return [q + 1] * r + [q] * (self.micro_batches - r)

    @property
    def devices(self) -> list[str]:
        return [d for s in self.stages for d in s.devices]


@dataclass(frozen=True)
class PlanOptions:
    recompute: str = "none"  # none | selective | full
    zero: int = 0  # 0 = replicated optimizer state, 1 = ZeRO-1 (sharded across a layer's owners)
    dtype: str = "bf16"  # compute dtype; master weights and gradient reduction stay fp32
    compile: bool = False  # blocks run torch.compile'd (the executor compiles them on CUDA; the
    # memory model counts the compiled path's activations, planner.cost.memory)
    residual_dtype: str = "fp32"  # the residual stream between blocks: fp32, or the compute dtype
    # (Megatron's default: half the norm and residual traffic; stage boundaries still carry fp32)


@dataclass(frozen=True)
class RankInfo:
    rank: int
    device: str
    pipeline: int
    stage: int
    tp_rank: int
    cp_rank: int = 0


@dataclass(frozen=True)
class Plan:
    model: ModelSpec
    global_batch_size: int
    pipelines: tuple[Pipeline, ...]
    options: PlanOptions = PlanOptions()
    cluster: str | None = None
    estimate: dict[str, Any] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        check_structure(self)

    @property
    def world_size(self) -> int:
        return sum(len(s.devices) for p in self.pipelines for s in p.stages)

    @property
    def devices(self) -> list[str]:
        return [d for p in self.pipelines for d in p.devices]

    def ranks(self) -> list[RankInfo]:
        """Rank of every device, in the contract order (see module docstring)."""
        out: list[RankInfo] = []
        for pi, pipe in enumerate(self.pipelines):
            for si, stage in enumerate(pipe.stages):
                for i, dev in enumerate(stage.devices):
                    out.append(RankInfo(len(out), dev, pi, si, i % stage.tp, i // stage.tp))
        return out

    def with_estimate(self, estimate: dict[str, Any] | None) -> Plan:
        return replace(self, estimate=estimate)


def check_structure(plan: Plan) -> None:
    """Invariants that need only the plan (not the cluster)."""
    m = plan.model
    if not 1 <= plan.global_batch_size <= MAX_GLOBAL_BATCH:
        raise SpecError("global_batch_size", f"must be in [1, {MAX_GLOBAL_BATCH:,}], got {plan.global_batch_size}",
                        "use a realistic batch of samples")
    if not plan.pipelines:
        raise SpecError("pipelines", "a plan needs at least one pipeline", "add a pipeline")
    o = plan.options
    if o.recompute not in RECOMPUTE_MODES:
        raise SpecError("options.recompute", f"{o.recompute!r} is not one of {list(RECOMPUTE_MODES)}",
                        "use none, selective or full")
    if o.zero not in (0, 1):
        raise SpecError("options.zero", f"{o.zero!r} is not 0 or 1", "ZeRO stage 0 or 1")
    if o.dtype not in DTYPES:
        raise SpecError("options.dtype", f"{o.dtype!r} is not one of {list(DTYPES)}", "use bf16 or fp32")
    if not isinstance(o.compile, bool):
        raise SpecError("options.compile", f"expected true or false, got {o.compile!r}", "write true or false")
    if o.residual_dtype not in ("fp32", o.dtype):
        raise SpecError("options.residual_dtype", f"{o.residual_dtype!r} is neither fp32 nor the compute dtype "
                        f"{o.dtype!r}", f"use fp32 or {o.dtype}")
    total = 0
    seen: dict[str, str] = {}
    for pi, pipe in enumerate(plan.pipelines):
        pp = f"pipelines[{pi}]"
        if pipe.batch_size < 1:
            raise SpecError(f"{pp}.batch_size", f"must be >= 1, got {pipe.batch_size}",
                            "drop the pipeline or give it samples")
        if not 1 <= pipe.micro_batches <= min(pipe.batch_size, MAX_MICRO_BATCHES):
            raise SpecError(f"{pp}.micro_batches", f"{pipe.micro_batches} is not in [1, batch_size="
                            f"{pipe.batch_size}] (at most {MAX_MICRO_BATCHES})",
                            "every micro-batch needs at least one sample")
        sched = schedule_named(pipe.schedule, f"{pp}.schedule")
        total += pipe.batch_size
        if not pipe.stages:
            raise SpecError(f"{pp}.stages", "a pipeline needs at least one stage", "add a stage")
        sched.check(len(pipe.stages), pipe.micro_batches, f"{pp}.micro_batches")
        expect_start = 0
        for si, st in enumerate(pipe.stages):
            sp = f"{pp}.stages[{si}]"
            if st.cp < 1:
                raise SpecError(f"{sp}.cp", f"must be >= 1, got {st.cp}", "use 1 for no context parallelism")
            if st.tp < 1 or st.tp * st.cp != len(st.devices):
                raise SpecError(f"{sp}.tp", f"tp={st.tp} x cp={st.cp} but the stage lists {len(st.devices)} devices",
                                "tp x cp must equal the number of devices of the stage")
            if st.cp > 1 and m.seq_len % (2 * st.cp):  # without CP any sequence length goes
                raise SpecError(f"{sp}.cp", f"2 x cp = {2 * st.cp} does not divide seq_len={m.seq_len} "
                                "(each CP rank holds two equal causal-balanced chunks)",
                                "choose a cp that divides seq_len / 2")
            for name, value in (("num_heads", m.num_heads), ("num_kv_heads", m.num_kv_heads),
                                ("ffn_hidden_size", m.ffn_hidden_size)):
                if value % st.tp:
                    raise SpecError(f"{sp}.tp", f"{st.tp} does not divide {name}={value}",
                                    "choose a tp that divides the head counts and ffn size")
            first, last = si == 0, si == len(pipe.stages) - 1
            if (first or last) and m.vocab_size % st.tp:
                raise SpecError(f"{sp}.tp", f"{st.tp} does not divide vocab_size={m.vocab_size} "
                                "(this stage holds the vocab-parallel embedding or LM head)",
                                "pad the vocabulary or choose another tp")
            start, end = st.layers
            if start != expect_start:
                raise SpecError(f"{sp}.layers", f"starts at {start}, expected {expect_start}",
                                "stages must cover the layers contiguously, in order")
            if end <= start:
                raise SpecError(f"{sp}.layers", f"[{start}, {end}) is empty", "every stage needs at least one layer")
            if end - start < sched.chunks:
                raise SpecError(f"{sp}.layers", f"{end - start} layer(s) cannot make the {sched.chunks} layer "
                                f"chunks per stage of {pipe.schedule}", "give the stage more layers")
            expect_start = end
            for di, dev in enumerate(st.devices):
                if dev in seen:
                    raise SpecError(f"{sp}.devices[{di}]", f"device {dev!r} is already used by {seen[dev]}",
                                    "use every device at most once")
                seen[dev] = sp
        if expect_start != m.num_layers:
            raise SpecError(f"{pp}.stages", f"layers end at {expect_start}, the model has {m.num_layers}",
                            f"the last stage must end at {m.num_layers}")
    if total != plan.global_batch_size:
        raise SpecError("pipelines", f"batch sizes sum to {total}, global_batch_size is {plan.global_batch_size}",
                        "make the pipelines' batch_size values add up to the global batch")


# ------------------------------------------------------------------------------------ JSON io


def _parse_stage(data: Any, path: str) -> Stage:
    data = expect_mapping(data, path)
    check_keys(data, path, ("devices", "layers"), ("tp", "cp"))
    devs = expect_list(data["devices"], join(path, "devices"))
    if not devs:
        raise SpecError(join(path, "devices"), "a stage needs at least one device", "list its devices")
    for i, d in enumerate(devs):
        if not isinstance(d, str) or not d:
            raise SpecError(join(join(path, "devices"), i), f"expected a device id string, got {d!r}",
                            "write 'node-name:local-index'")
    layers = expect_list(data["layers"], join(path, "layers"))
    if len(layers) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_LAYER
                                   for x in layers):
        raise SpecError(join(path, "layers"), f"expected [start, end] of integers in [0, {MAX_LAYER}], got "
                        f"{layers!r}"[:200], "write a half-open layer range such as [0, 16]")
    cp = get_int(data, "cp", path, minimum=1, maximum=len(devs), default=1)
    tp = get_int(data, "tp", path, minimum=1, default=len(devs) // cp)
    return Stage(tuple(devs), tp, (layers[0], layers[1]), cp)


def _parse_pipeline(data: Any, path: str) -> Pipeline:
    data = expect_mapping(data, path)
    check_keys(data, path, ("batch_size", "micro_batches", "stages"), ("schedule",))
    stages = expect_list(data["stages"], join(path, "stages"))
    return Pipeline(
        batch_size=get_int(data, "batch_size", path, minimum=1, maximum=MAX_GLOBAL_BATCH),
        micro_batches=get_int(data, "micro_batches", path, minimum=1, maximum=MAX_MICRO_BATCHES),
        stages=tuple(_parse_stage(s, join(join(path, "stages"), i)) for i, s in enumerate(stages)),
        schedule=get_str(data, "schedule", path, default="1f1b", choices=SCHEDULES),
    )


def _parse_options(data: Any) -> PlanOptions:
    data = expect_mapping(data, "options")
    check_keys(data, "options", (), ("recompute", "zero", "dtype", "compile", "residual_dtype"))
    return PlanOptions(
        recompute=get_str(data, "recompute", "options", default="none", choices=RECOMPUTE_MODES),
        zero=get_int(data, "zero", "options", minimum=0, default=0),
        dtype=get_str(data, "dtype", "options", default="bf16", choices=DTYPES),
        compile=get_bool(data, "compile", "options", default=False),
        residual_dtype=get_str(data, "residual_dtype", "options", default="fp32", choices=DTYPES),
    )


def plan_from_dict(data: Any) -> Plan:
    data = expect_mapping(data, "")
    check_keys(data, "", ("format", "model", "global_batch_size", "pipelines"), ("options", "cluster", "estimate"))
    fmt = data["format"]
    if fmt not in PLAN_FORMATS:
        raise SpecError("format", f"unsupported plan format {fmt!r}",
                        f"this HexiScale reads {' and '.join(map(repr, PLAN_FORMATS))}")
    pipes = expect_list(data["pipelines"], "pipelines")
    if fmt == PLAN_FORMAT:
        _refuse_cp_in_v1(pipes)
    estimate = data.get("estimate")
    if estimate is not None:
        estimate = dict(expect_mapping(estimate, "estimate"))
    cluster = data.get("cluster")
    if cluster is not None and not isinstance(cluster, str):
        raise SpecError("cluster", f"expected the cluster's name, got {cluster!r}", "write a string")
    return Plan(
        model=model_from_dict(data["model"], "model"),
        global_batch_size=get_int(data, "global_batch_size", "", minimum=1),
        pipelines=tuple(_parse_pipeline(p, join("pipelines", i)) for i, p in enumerate(pipes)),
        options=_parse_options(data.get("options", {})),
        cluster=cluster,
        estimate=estimate,
    )


def _refuse_cp_in_v1(pipes: list[Any]) -> None:
    for pi, pipe in enumerate(pipes):
        for si, st in enumerate(pipe.get("stages", []) if isinstance(pipe, dict) else []):
            if isinstance(st, dict) and "cp" in st:
                raise SpecError(f"pipelines[{pi}].stages[{si}].cp", f"{PLAN_FORMAT!r} has no cp field",
                                f"write format {PLAN_FORMAT_CP!r} for context parallelism")


def _stage_dict(s: Stage) -> dict[str, Any]:
    out: dict[str, Any] = {"devices": list(s.devices), "tp": s.tp, "layers": list(s.layers)}
    if s.cp > 1:
        out["cp"] = s.cp
    return out


def uses_cp(plan: Plan) -> bool:
    return any(s.cp > 1 for p in plan.pipelines for s in p.stages)


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    out: dict[str, Any] = {
        "format": PLAN_FORMAT_CP if uses_cp(plan) else PLAN_FORMAT,
        "model": plan.model.to_dict(),
        "global_batch_size": plan.global_batch_size,
        "pipelines": [
            {"batch_size": p.batch_size, "micro_batches": p.micro_batches, "schedule": p.schedule,
             "stages": [_stage_dict(s) for s in p.stages]}
            for p in plan.pipelines
        ],
        "options": {"recompute": plan.options.recompute, "zero": plan.options.zero, "dtype": plan.options.dtype},
    }
    if plan.options.compile:  # written only when set: plans without it read as before
        out["options"]["compile"] = True
    if plan.options.residual_dtype != "fp32":  # likewise
        out["options"]["residual_dtype"] = plan.options.residual_dtype
    if plan.cluster is not None:
        out["cluster"] = plan.cluster
    if plan.estimate is not None:
        out["estimate"] = plan.estimate
    return out


def load_plan(path: str | Path) -> Plan:
    data = load_json_file(path, "plan")
    try:
        return plan_from_dict(data)
    except SpecError as exc:
        raise exc.with_file(str(path)) from None


def save_plan(plan: Plan, path: str | Path) -> None:
    Path(path).write_text(json.dumps(plan_to_dict(plan), indent=2) + "\n")
