"""Hypothesis strategies: random valid plans on named devices, and pairs of them (a running plan and
the plan it switches to), for the reshard planner and the switch oracle."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

from planner.model import PRESETS, ModelSpec
from planner.plan import Pipeline, Plan, PlanOptions, Stage

TINY = PRESETS["tiny"]
TINY8 = PRESETS["tiny-8l"]
# two nodes of four devices: same-node senders are preferred, so both kinds of peers occur
UNIVERSE = tuple(f"{n}:{i}" for n in ("a", "b") for i in range(4))


def named_plan(model: ModelSpec, pipes: Sequence[tuple[int, Sequence[tuple[Any, ...]]]], *, zero: int = 0,
               micro: int = 1) -> Plan:
    """A plan from ``[(batch, [(devices, n_layers[, cp]), ...]), ...]`` (cp 1 unless given, TP = the
    stage's device count / cp, ``min(micro, batch)`` micro-batches per pipeline)."""
    out = []
    for bs, stages in pipes:
        at, sts = 0, []
        for devs, n, *cps in stages:
            cp = cps[0] if cps else 1
            sts.append(Stage(tuple(devs), len(devs) // cp, (at, at + n), cp))
            at += n
        out.append(Pipeline(bs, min(micro, bs), tuple(sts)))
    return Plan(model, sum(bs for bs, _ in pipes), tuple(out), PlanOptions(zero=zero, dtype="fp32"))


@st.composite
def plans_on(draw: st.DrawFn, model: ModelSpec, devices: list[str], batch: int) -> Plan:
    """A random valid plan of ``model`` on exactly ``devices`` (in this order) with global batch
    ``batch``: 1-3 pipelines, 1-3 stages each of 1, 2 or 4 devices (TP where the heads allow, a
    ``cp x tp`` mesh for some: context parallelism), random layer splits, batch sizes, micro-batch
    counts, schedules and ZeRO setting."""
    tps = [t for t in (1, 2, 4) if model.num_kv_heads % t == 0]
    n = len(devices)
    n_pipes = draw(st.integers(1, min(3, n, batch)))
    sizes = _split(draw, n, n_pipes)
    batches = _split(draw, batch, n_pipes)
    pipes, at = [], 0
    max_stages = min(3, model.num_layers)
    for size, bs in zip(sizes, batches):
        stage_tps: list[int] = []
        while sum(stage_tps) < size:
            rest, left = size - sum(stage_tps), max_stages - len(stage_tps) - 1
            fits = [t for t in tps if t <= rest and _min_parts(rest - t, tps) <= left]
            stage_tps.append(draw(st.sampled_from(fits)))
        cuts = sorted(draw(st.lists(st.integers(1, model.num_layers - 1), min_size=len(stage_tps) - 1,
                                    max_size=len(stage_tps) - 1, unique=True)))
        bounds = [0, *cuts, model.num_layers]
        stages = []
        for t, a, b in zip(stage_tps, bounds, bounds[1:]):
            cp = draw(st.sampled_from([c for c in (1, 2, 4) if t % c == 0 and model.seq_len % (2 * c) == 0]))
            stages.append(Stage(tuple(devices[at:at + t]), t // cp, (a, b), cp))
            at += t
        mb = draw(st.integers(1, bs))
        pipes.append(Pipeline(bs, mb, tuple(stages), draw(st.sampled_from(["1f1b", "gpipe"]))))
    return Plan(model, batch, tuple(pipes), PlanOptions(dtype="fp32", zero=draw(st.sampled_from([0, 1]))))


def _min_parts(x: int, tps: list[int]) -> int:
    """Fewest stages whose TP degrees (powers of two from ``tps``) add up to ``x``."""
    parts = 0
    for t in sorted(tps, reverse=True):
        parts += x // t
        x %= t
    return parts


def _split(draw: st.DrawFn, total: int, parts: int) -> list[int]:
    """``total`` as ``parts`` positive integers."""
    cuts = sorted(draw(st.lists(st.integers(1, total - 1), min_size=parts - 1, max_size=parts - 1, unique=True))) \
        if parts > 1 else []
    bounds = [0, *cuts, total]
    return [b - a for a, b in zip(bounds, bounds[1:])]


@st.composite
def plan_pairs(draw: st.DrawFn, universe: tuple[str, ...] = UNIVERSE, max_devices: int = 8,
               models: tuple[ModelSpec, ...] = (TINY, TINY8)) -> tuple[Plan, Plan]:
    """(old, new): the same model and global batch on two random device subsets of ``universe``
    (overlapping or not, in random orders), each with a random layout."""
    model = draw(st.sampled_from(models))
    batch = draw(st.integers(3, 8))
    pool = list(universe[:max_devices])
    out = []
    for _ in range(2):
        n = draw(st.integers(1, min(len(pool), 6)))
        devices = draw(st.permutations(pool))[:n]
        out.append(draw(plans_on(model, list(devices), batch)))
    return out[0], out[1]
