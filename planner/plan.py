"""The plan: the contract between planner and executor (``hexiscale.plan/1`` and ``/2`` JSON).

A plan lists pipelines (data-parallel replicas); each pipeline lists stages in order; each stage
names its devices and the half-open layer range it holds. A stage of an interleaved pipeline
(``interleaved-1f1b``, ``v`` layer chunks per stage) holds ``v`` ranges, ``"layers": [[0, 3],
[12, 15]]``: chunk ``k`` of stage ``s`` of ``S`` is virtual stage ``k·S + s``, and the virtual
stages cover the layers contiguously in that order (activations flow from the last stage back to
the first between chunks). In Python ``Stage.layers`` is chunk 0's range, ``Stage.chunks`` all of
them (``(layers,)`` for a stage of one chunk). A stage's devices form a ``cp x tp``
mesh (``tp * cp == len(devices)``): ``cp`` context-parallel slots, each a TP group of ``tp``
consecutive devices (device ``i`` is ``cp_rank = i // tp``, ``tp_rank = i % tp``; TP innermost,
since it needs the fastest links). Format ``/2`` adds the ``cp`` field (default 1) and stages of
several layer ranges; a plan is written as ``/1`` when it uses neither, so older readers still
load it.
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
PLAN_FORMAT_CP = "hexiscale.plan/2"  # adds Stage.cp and layer chunks; written only when a plan uses them
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
    layers: tuple[int, int]  # half-open [start, end); an interleaved stage: its chunk 0
    cp: int = 1  # context-parallel degree: cp TP groups of tp devices split each sequence
    chunks: tuple[tuple[int, int], ...] = ()  # every layer range, chunk order; () means (layers,)

    def __post_init__(self) -> None:
        if len(self.chunks) <= 1:  # one chunk is ``layers`` (so ``replace(stage, layers=...)`` keeps them one)
            object.__setattr__(self, "chunks", (self.layers,))

    @property
    def num_layers(self) -> int:
        """Layers of the stage, over all its chunks."""
        return sum(end - start for start, end in self.chunks)


@dataclass(frozen=True)
class Pipeline:
    batch_size: int
    micro_batches: int
    stages: tuple[Stage, ...]
    schedule: str = "1f1b"

    @property
    def chunks(self) -> int:
        """Layer chunks per stage (1 unless interleaved; validated equal on every stage)."""
        return len(self.stages[0].chunks) if self.stages else 1

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
            for di, dev in enumerate(st.devices):
                if dev in seen:
                    raise SpecError(f"{sp}.devices[{di}]", f"device {dev!r} is already used by {seen[dev]}",
                                    "use every device at most once")
                seen[dev] = sp
        # an interleaved schedule runs the plan's chunk count (at least 2, the same on every stage)
        v = max(sched.chunks, *(len(s.chunks) for s in pipe.stages)) if sched.chunks > 1 else 1
        _check_layer_cover(pipe, pp, v, m.num_layers)
    if total != plan.global_batch_size:
        raise SpecError("pipelines", f"batch sizes sum to {total}, global_batch_size is {plan.global_batch_size}",
                        "make the pipelines' batch_size values add up to the global batch")


def _check_layer_cover(pipe: Pipeline, pp: str, v: int, num_layers: int) -> None:
    """Every stage holds the schedule's ``v`` layer chunks; chunk ``k`` of stage ``s`` (virtual
    stage ``k·S + s``) starts where virtual stage ``k·S + s - 1`` ends; the last ends the model."""
    n = len(pipe.stages)
    shape = "one [start, end] range" if v == 1 else f"{v} ranges [[start, end], ...], chunk k of stage s " \
        f"being virtual stage k x {n} + s"
    for si, st in enumerate(pipe.stages):
        if len(st.chunks) != v:
            raise SpecError(f"{pp}.stages[{si}].layers", f"holds {len(st.chunks)} layer range(s), schedule "
                            f"{pipe.schedule} runs {v} layer chunk(s) per stage", f"give every stage {shape}")
        if st.chunks[0] != st.layers:
            raise SpecError(f"{pp}.stages[{si}].layers", f"chunk 0 is {list(st.chunks[0])}, layers says "
                            f"{list(st.layers)}", "make layers chunk 0's range")
    expect = 0
    for k in range(v * n):
        si, c = k % n, k // n
        field = f"{pp}.stages[{si}].layers" + (f"[{c}]" if v > 1 else "")
        start, end = pipe.stages[si].chunks[c]
        if start != expect:
            raise SpecError(field, f"starts at {start}, expected {expect}",
                            "stages must cover the layers contiguously, in order" if v == 1 else
                            f"virtual stages (chunk k of stage s is k x {n} + s) must cover the layers "
                            "contiguously, in that order")
        if end <= start:
            raise SpecError(field, f"[{start}, {end}) is empty", "every layer chunk needs at least one layer")
        expect = end
    if expect != num_layers:
        raise SpecError(f"{pp}.stages", f"layers end at {expect}, the model has {num_layers}",
                        f"the last {'stage' if v == 1 else 'virtual stage'} must end at {num_layers}")


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
    if layers and all(isinstance(x, list) for x in layers):  # an interleaved stage: one range per chunk
        chunks = tuple(_layer_range(x, join(join(path, "layers"), i)) for i, x in enumerate(layers))
    else:
        chunks = (_layer_range(layers, join(path, "layers")),)
    cp = get_int(data, "cp", path, minimum=1, maximum=len(devs), default=1)
    tp = get_int(data, "tp", path, minimum=1, default=len(devs) // cp)
    return Stage(tuple(devs), tp, chunks[0], cp, chunks)


def _layer_range(layers: list[Any], path: str) -> tuple[int, int]:
    if len(layers) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_LAYER
                                   for x in layers):
        raise SpecError(path, f"expected [start, end] of integers in [0, {MAX_LAYER}], got {layers!r}"[:200],
                        "write a half-open layer range such as [0, 16] (an interleaved stage: [[0, 4], [8, 12]])")
    return layers[0], layers[1]


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
        _refuse_v2_in_v1(pipes)
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


def _refuse_v2_in_v1(pipes: list[Any]) -> None:
    for pi, pipe in enumerate(pipes):
        stages = pipe.get("stages") if isinstance(pipe, dict) else None
        for si, st in enumerate(stages if isinstance(stages, list) else []):  # other shapes: the parser's error
            if isinstance(st, dict) and "cp" in st:
                raise SpecError(f"pipelines[{pi}].stages[{si}].cp", f"{PLAN_FORMAT!r} has no cp field",
                                f"write format {PLAN_FORMAT_CP!r} for context parallelism")
            layers = st.get("layers") if isinstance(st, dict) else None
            if isinstance(layers, list) and layers and isinstance(layers[0], list):
                raise SpecError(f"pipelines[{pi}].stages[{si}].layers", f"{PLAN_FORMAT!r} has one layer range "
                                "per stage", f"write format {PLAN_FORMAT_CP!r} for interleaved layer chunks")


def _stage_dict(s: Stage) -> dict[str, Any]:
    layers = list(s.layers) if len(s.chunks) == 1 else [list(c) for c in s.chunks]
    out: dict[str, Any] = {"devices": list(s.devices), "tp": s.tp, "layers": layers}
    if s.cp > 1:
        out["cp"] = s.cp
    return out


def uses_cp(plan: Plan) -> bool:
    return any(s.cp > 1 for p in plan.pipelines for s in p.stages)


def uses_chunks(plan: Plan) -> bool:
    """Some stage holds several layer chunks (an interleaved pipeline)."""
    return any(len(s.chunks) > 1 for p in plan.pipelines for s in p.stages)


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    out: dict[str, Any] = {
        "format": PLAN_FORMAT_CP if uses_cp(plan) or uses_chunks(plan) else PLAN_FORMAT,
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
