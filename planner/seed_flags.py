"""Conversion between plans and the seed systems' command-line flags.

The seed trainers describe a layout with:

* ``--hetero_configs``  per pipeline, the TP degree of each stage: ``"[[1, 2, 1], [2, 2]]"``
* ``--layer_partitions`` per pipeline, the number of layers of each stage: ``"[[10, 12, 10], [16, 16]]"``
* ``--global_bsz_size`` / ``--global_batch_size``: batch size per pipeline
* ``--chunks`` / ``--micro_batch_num``: micro-batches per pipeline
* ``--devices_id``      per pipeline, per stage, the *node index* of each GPU:
  ``"[[[0], [0, 0], [0]], [[1, 1], [1, 1]]]"``; local GPU indices are handed out per node in order
  of appearance (the first GPU named on node 1 is its local 0, the next its local 1, ...).

Lists are Python literals (trailing commas allowed, e.g. ``"[[1, 2, 1],]"``); batch and chunk lists
may also be space-separated numbers. A batch or chunk list shorter than the number of pipelines is
padded with its last value; a longer one is truncated (the seed's rule).
"""

from __future__ import annotations

import ast
import warnings
from dataclasses import dataclass
from typing import Any

from planner.cluster import ClusterSpec
from planner.cp_layout import refuse_cp
from planner.errors import SpecError
from planner.model import ModelSpec
from planner.plan import Pipeline, Plan, PlanOptions, Stage

LOCAL_NODE = "local"  # the node of plans whose devices are all on this machine


@dataclass(frozen=True)
class SeedFlags:
    hetero_configs: list[list[int]]
    layer_partitions: list[list[int]]
    global_bsz_size: list[int]
    chunks: list[int]
    devices_id: list[list[list[int]]] | None = None

    def as_args(self) -> list[str]:
        """The flags as an argv fragment (values quoted as the seed scripts write them)."""
        args = ["--hetero_configs", str(self.hetero_configs), "--layer_partitions", str(self.layer_partitions),
                "--global_bsz_size", *map(str, self.global_bsz_size), "--chunks", *map(str, self.chunks)]
        if self.devices_id is not None:
            args += ["--devices_id", str(self.devices_id)]
        return args

    def as_command_line(self) -> str:
        parts = [f'--hetero_configs "{self.hetero_configs}"', f'--layer_partitions "{self.layer_partitions}"',
                 "--global_bsz_size " + " ".join(map(str, self.global_bsz_size)),
                 "--chunks " + " ".join(map(str, self.chunks))]
        if self.devices_id is not None:
            parts.append(f'--devices_id "{self.devices_id}"')
        return " ".join(parts)


def parse_literal(text: Any, flag: str) -> Any:
    """A Python literal from a flag value; anything else is a ``SpecError`` naming the flag. Python's
    own parser warnings (3.12: ``1and 2`` is an "invalid decimal literal") stay quiet: one line only."""
    if not isinstance(text, str):
        return text
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            warnings.simplefilter("ignore", DeprecationWarning)  # 3.10/3.11: invalid escape sequence
            return ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        raise SpecError(flag, f"cannot parse {text!r}", "write a Python list such as \"[[1, 2], [2]]\"") from None


def _int_list(value: Any, flag: str) -> list[int]:
    """Batch/chunk values: a literal list, a single number, or space-separated numbers."""
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        value = " ".join(value)
    if isinstance(value, str):
        text = value.strip()
        if text and not text.startswith("[") and not text.startswith("("):
            tokens = text.replace(",", " ").split()
            if not all(t.lstrip("-").isdecimal() for t in tokens):  # isdigit() passes "²"
                raise SpecError(flag, f"cannot parse {value!r}", "write numbers such as '32 32' or '[32, 32]'")
            value = [int(t) for t in tokens]
        else:
            value = parse_literal(text, flag)
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list | tuple) or not value:
        raise SpecError(flag, f"expected a non-empty list of integers, got {value!r}", "write e.g. '[32, 32]'")
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise SpecError(f"{flag}[{i}]", f"expected a positive integer, got {v!r}", "use whole numbers >= 1")
    return list(value)


def _nested_ints(value: Any, flag: str, depth: int) -> list[Any]:
    """A list nested ``depth`` deep whose leaves are positive ints (a flat list counts as one pipeline)."""
    value = parse_literal(value, flag)
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value) \
            and depth == 2:
        value = [value]

    def check(v: Any, path: str, d: int, minimum: int) -> Any:
        if d == 0:
            if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
                raise SpecError(path, f"expected an integer >= {minimum}, got {v!r}", "fix the number")
            return v
        if not isinstance(v, list | tuple) or not v:
            raise SpecError(path, f"expected a non-empty list, got {v!r}", "check the nesting of the brackets")
        return [check(x, f"{path}[{i}]", d - 1, minimum) for i, x in enumerate(v)]

    return check(value, flag, depth, 0 if flag == "--devices_id" else 1)  # type: ignore[no-any-return]


def pad_to(values: list[int], n: int) -> list[int]:
    """The seed's rule: pad a short list with its last value, truncate a long one."""
    return values[:n] if len(values) >= n else values + [values[-1]] * (n - len(values))


def plan_from_flags(
    *,
    model: ModelSpec,
    cluster: ClusterSpec | None,
    hetero_configs: Any,
    layer_partitions: Any,
    global_bsz_size: Any,
    chunks: Any,
    devices_id: Any = None,
    options: PlanOptions | None = None,
    accum_iter: int = 1,
) -> Plan:
    """A plan from seed-style flags (strings as typed on a command line, or already-parsed lists).

    ``cluster`` None: every device is on this machine (``--devices_id`` names node 0 only), named
    ``local:0``, ``local:1``, ... in order of appearance. ``accum_iter`` (the seed's
    ``--accum-iter``: iterations of the batch per optimizer step) multiplies each pipeline's batch
    and micro-batch count, so one step sees what the seed's ``accum_iter`` iterations saw, in
    micro-batches of the same size."""
    tps: list[list[int]] = _nested_ints(hetero_configs, "--hetero_configs", 2)
    parts: list[list[int]] = _nested_ints(layer_partitions, "--layer_partitions", 2)
    if len(parts) != len(tps):
        raise SpecError("--layer_partitions", f"has {len(parts)} pipelines, --hetero_configs has {len(tps)}",
                        "give one list per pipeline in both flags")
    for i, (t, p) in enumerate(zip(tps, parts)):
        if len(t) != len(p):
            raise SpecError(f"--layer_partitions[{i}]", f"has {len(p)} stages, --hetero_configs[{i}] has {len(t)}",
                            "give one entry per stage in both flags")
        if sum(p) != model.num_layers:
            raise SpecError(f"--layer_partitions[{i}]", f"sums to {sum(p)}, the model has {model.num_layers} layers",
                            "the stages of a pipeline must hold every layer")
    n = len(tps)
    bsz = [b * accum_iter for b in pad_to(_int_list(global_bsz_size, "--global_bsz_size"), n)]
    mbs = [m * accum_iter for m in pad_to(_int_list(chunks, "--chunks"), n)]
    devices = _devices_from_flag(devices_id, tps, cluster)
    pipelines = []
    k = 0
    for i in range(n):
        stages = []
        start = 0
        for tp, nl in zip(tps[i], parts[i]):
            stages.append(Stage(tuple(devices[k:k + tp]), tp, (start, start + nl)))
            k += tp
            start += nl
        pipelines.append(Pipeline(batch_size=bsz[i], micro_batches=mbs[i], stages=tuple(stages)))
    return Plan(model=model, global_batch_size=sum(bsz), pipelines=tuple(pipelines),
                options=options or PlanOptions(), cluster=cluster.name if cluster else None)


def _local_devices(devices_id: Any, world: int) -> list[str]:
    """``local:i`` for every GPU of a layout whose ``--devices_id`` (if given) names node 0 only."""
    if devices_id is not None:
        ids: list[list[list[int]]] = _nested_ints(devices_id, "--devices_id", 3)
        for i, pipe in enumerate(ids):
            for j, stage in enumerate(pipe):
                for g, node in enumerate(stage):
                    if node != 0:
                        raise SpecError(f"--devices_id[{i}][{j}][{g}]", f"names node {node}: not every device is "
                                        "on this machine", "pass --cluster CLUSTER.yaml for a multi-node layout")
    return [f"{LOCAL_NODE}:{i}" for i in range(world)]


def _devices_from_flag(devices_id: Any, tps: list[list[int]], cluster: ClusterSpec | None) -> list[str]:
    world = sum(sum(t) for t in tps)
    if cluster is None:
        return _local_devices(devices_id, world)
    if devices_id is None:
        all_devs = [d.id for d in cluster.devices]
        if world > len(all_devs):
            raise SpecError("--hetero_configs", f"needs {world} devices, cluster {cluster.name!r} has {len(all_devs)}",
                            "use fewer or smaller stages, or a larger cluster")
        return all_devs[:world]
    ids: list[list[list[int]]] = _nested_ints(devices_id, "--devices_id", 3)
    if len(ids) != len(tps):
        raise SpecError("--devices_id", f"has {len(ids)} pipelines, --hetero_configs has {len(tps)}",
                        "give one list per pipeline")
    next_local: dict[int, int] = {}
    out = []
    for i, (pipe_ids, pipe_tps) in enumerate(zip(ids, tps)):
        if len(pipe_ids) != len(pipe_tps):
            raise SpecError(f"--devices_id[{i}]", f"has {len(pipe_ids)} stages, --hetero_configs[{i}] has "
                            f"{len(pipe_tps)}", "give one list per stage")
        for j, (stage_ids, tp) in enumerate(zip(pipe_ids, pipe_tps)):
            if len(stage_ids) != tp:
                raise SpecError(f"--devices_id[{i}][{j}]", f"names {len(stage_ids)} GPUs, the stage's TP is {tp}",
                                "name one node index per GPU of the stage")
            for g, node_idx in enumerate(stage_ids):
                path = f"--devices_id[{i}][{j}][{g}]"
                if node_idx >= len(cluster.nodes):
                    raise SpecError(path, f"node index {node_idx} but the cluster has {len(cluster.nodes)} nodes",
                                    "node indices count from 0 in the cluster file's order")
                node = cluster.nodes[node_idx]
                local = next_local.get(node_idx, 0)
                if local >= node.gpus:
                    raise SpecError(path, f"node {node.name!r} has only {node.gpus} GPUs", "use another node")
                next_local[node_idx] = local + 1
                out.append(f"{node.name}:{local}")
    return out


def plan_to_flags(plan: Plan, cluster: ClusterSpec | None = None) -> SeedFlags:
    """Seed-style flags for ``plan``; with a cluster, ``--devices_id`` too.

    The seed numbers a node's GPUs in order of appearance, so a plan whose devices on some node do
    not appear as local 0, 1, 2, ... in rank order has no exact ``--devices_id``; that is an error.
    The seeds have no context parallelism: a plan with ``cp > 1`` has no flags (one error line), nor
    layer chunks (an interleaved stage).
    """
    refuse_cp(plan, "the seed systems' flags (--hetero_configs: one TP degree per stage)",
              "keep the plan file (format hexiscale.plan/2) for this layout")
    for pi, pipe in enumerate(plan.pipelines):
        for si, st in enumerate(pipe.stages):
            if len(st.chunks) > 1:
                raise SpecError(f"pipelines[{pi}].stages[{si}].layers", f"{len(st.chunks)} layer chunks: the seed "
                                "flags have one layer range per stage", "pass the plan file (--plan) instead")
    devices_id = None
    if cluster is not None:
        index = {n.name: i for i, n in enumerate(cluster.nodes)}
        next_local: dict[str, int] = {}
        devices_id = []
        for pi, pipe in enumerate(plan.pipelines):
            p_ids = []
            for si, st in enumerate(pipe.stages):
                s_ids = []
                for di, dev in enumerate(st.devices):
                    d = cluster.device(dev, f"pipelines[{pi}].stages[{si}].devices[{di}]")
                    want = next_local.get(d.node, 0)
                    if d.local_index != want:
                        raise SpecError(f"pipelines[{pi}].stages[{si}].devices[{di}]",
                                        f"{dev} would be {d.node}:{want} in the seed's numbering",
                                        "use each node's GPUs in ascending order in rank order")
                    next_local[d.node] = want + 1
                    s_ids.append(index[d.node])
                p_ids.append(s_ids)
            devices_id.append(p_ids)
    return SeedFlags(
        hetero_configs=[[s.tp for s in p.stages] for p in plan.pipelines],
        layer_partitions=[[s.num_layers for s in p.stages] for p in plan.pipelines],
        global_bsz_size=[p.batch_size for p in plan.pipelines],
        chunks=[p.micro_batches for p in plan.pipelines],
        devices_id=devices_id,
    )
