"""The ZB-H1 variant of a finalist: the same pipelines, the backward split into ``B`` and ``W``.

The surrogate's pipeline time, ``(m - 1) x bottleneck + sum``, has no bubble model per schedule,
so ZB-H1 would tie 1F1B there while holding more activations (stage ``i`` holds 1F1B's ``S - i``
micro-batches plus the queued weight-gradient operands of ``i`` more, :mod:`planner.schedules.held`);
sweeping it with every setting would only add candidates that cannot win. The full estimate's
simulator prices its smaller bubble, so each 1F1B finalist with a multi-stage pipeline gets one
ZB-H1 twin, refined under ZB-H1's own memory (a split near the memory cap does not fit and keeps
1F1B), and the finish picks whichever the estimate finds faster. Single-stage pipelines have no
bubble: a plan of only those gets no twin. Above ``FULL_ESTIMATE_DEVICES`` devices the finish
estimates one plan (the simulator is the slow part there): the twin first when its surrogate time
is no worse, the 1F1B finalist if the twin OOMs. Interleaved 1F1B's twin, which keeps the finalist's
split and cuts it into chunks, is :mod:`.interleaved_variant`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from planner.search.candidate import Candidate, evaluate
from planner.search.oracle import Oracle

ZB_H1 = "zb-h1"


def zb_h1_twin(oracle: Oracle, cand: Candidate, schedules: tuple[str, ...], global_batch: int) -> Candidate | None:
    """``cand`` refined under ZB-H1 (ILP batch split), or None: not searched, no bubble, no fit."""
    if ZB_H1 not in schedules or cand.setting.schedule != "1f1b" or all(len(p) < 2 for p in cand.pipelines):
        return None
    twin = evaluate(oracle, cand.pipelines, dataclasses.replace(cand.setting, schedule=ZB_H1), global_batch,
                    use_ilp=True)
    return twin if twin.feasible else None


def with_zb_h1_twin(oracle: Oracle, cand: Candidate, schedules: tuple[str, ...], global_batch: int, *,
                    both: bool) -> Sequence[Candidate]:
    """The finalists to estimate, in order: ``cand`` and its twin (``both``), else the twin first
    when the surrogate ranks it no worse (its smaller bubble is the estimate's to price)."""
    twin = zb_h1_twin(oracle, cand, schedules, global_batch)
    if twin is None:
        return (cand,)
    if both:
        return (cand, twin)
    return (twin, cand) if twin.step_s <= cand.step_s else (cand,)
