"""The interleaved-1F1B twin of a 1F1B finalist: each pipeline that can run it cut into layer chunks.

Like ZB-H1 (:mod:`.schedule_variant`), interleaved 1F1B only shrinks the bubble, which the
surrogate's ``(m - 1) x bottleneck + sum`` does not model, so it is no setting of the sweep: each
refined 1F1B finalist gets one twin, and the full estimate (whose simulator prices the smaller
bubble and the ``v``-fold p2p sends) decides; at most one more estimate per finalist. Above
``FULL_ESTIMATE_DEVICES`` devices the finish estimates only the first plan that fits and nothing
ranks the twins there, so this twin comes last: it is estimated only when neither the finalist nor
ZB-H1's twin fits (large clusters keep one layer range per stage in practice).

The twin keeps the finalist's layouts (stage units, layers per stage, batch and micro-batches) and
cuts each pipeline's stages into ``v`` = :data:`planner.schedules.interleaved.CHUNKS` chunks as
:func:`planner.interleave.interleaved` lays them out (round-robin over the stages). A pipeline is
interleaved where the executor and the validator take it: at least 2 stages, micro-batches a
multiple of the stages (:func:`~planner.schedules.interleaved.interleaved_requires`), at least ``v``
layers on every stage (a chunk holds one layer or more; CP stages too, their boundaries exchanged
piece-wise inside the rounds, :mod:`planner.schedules.slot_comm`), and every stage's layers fitting
under interleaved's own in-flight rule (stage ``i`` holds ``ceil((2(S-1-i) + (v-1)S + 1) / v)``
micro-batches at its peak against 1F1B's ``S - i``); the other pipelines keep 1F1B. So the schedule
is chosen per pipeline as far as validity and memory go; *which is faster* is decided per plan.
Choosing that per pipeline too would need each mix priced (the step is the slowest pipeline plus the
gradient sync, which the pipelines' stage boundaries shape together): up to ``2^k`` estimates for
``k`` pipeline types, or a per-pipeline simulator pass the estimate then repeats; the one twin keeps
the finish's cost flat.
"""

from __future__ import annotations

import dataclasses

from planner.schedules.interleaved import CHUNKS, interleaved_requires
from planner.search.candidate import Candidate, Layout, stage_costs
from planner.search.oracle import Oracle, Setting

INTERLEAVED = "interleaved-1f1b"


def interleaves(oracle: Oracle, lay: Layout, s: Setting, pipelines: int) -> bool:
    """Whether ``lay`` can run interleaved 1F1B with ``CHUNKS`` chunks per stage under setting ``s``
    (the schedule's shape rules, and its layers fitting interleaved's in-flight memory)."""
    S = len(lay.units)
    if interleaved_requires(S, lay.micro_batches) is not None or min(lay.counts) < CHUNKS:
        return False
    costs = stage_costs(oracle, lay.units, lay.micro_batches, s, pipelines)
    return all(n <= c.max_layers() for n, c in zip(lay.counts, costs))


def interleaved_twin(oracle: Oracle, cand: Candidate, schedules: tuple[str, ...]) -> Candidate | None:
    """``cand`` with every pipeline that :func:`interleaves` interleaved, the rest 1F1B; None when
    interleaved 1F1B is not searched, ``cand`` is not a refined 1F1B candidate, or no pipeline can."""
    if INTERLEAVED not in schedules or cand.setting.schedule != "1f1b" or not cand.feasible or not cand.layouts:
        return None
    s = dataclasses.replace(cand.setting, schedule=INTERLEAVED)
    seen: dict[tuple[object, ...], bool] = {}  # identical pipelines decide once
    picks = []
    for lay in cand.layouts:
        key = (tuple(u.signature for u in lay.units), lay.counts, lay.micro_batches)
        if key not in seen:
            seen[key] = interleaves(oracle, lay, s, len(cand.layouts))
        picks.append(INTERLEAVED if seen[key] else "1f1b")
    if INTERLEAVED not in picks:
        return None
    return dataclasses.replace(cand, schedules=tuple(picks))


def schedules_label(cand: Candidate) -> str:
    """The setting's label, naming the interleaved pipelines where a twin mixes schedules."""
    if not cand.schedules:
        return cand.setting.label()
    n = cand.schedules.count(INTERLEAVED)
    mixed = f"{INTERLEAVED} v={CHUNKS} ({n} of {len(cand.schedules)} pipelines)"
    return dataclasses.replace(cand.setting, schedule=mixed).label()
