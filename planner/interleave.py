"""An interleaved pipeline from a plain one: each stage keeps its devices and its number of layers,
cut into ``v`` chunks placed in virtual-stage order (chunk ``k`` of stage ``s`` of ``S`` is virtual
stage ``k·S + s``; :mod:`planner.plan`). Worked example, two stages of 4 and 2 layers, ``v = 2``:
stage 0 holds ``[0, 2)`` and ``[3, 5)``, stage 1 ``[2, 3)`` and ``[5, 6)``."""

from __future__ import annotations

from dataclasses import replace

from planner.errors import SpecError
from planner.plan import Pipeline


def interleaved(pipe: Pipeline, chunks: int = 2, schedule: str = "interleaved-1f1b",
                field: str = "pipelines[0]") -> Pipeline:
    """``pipe`` under ``schedule`` with ``chunks`` layer chunks per stage (sizes as even as they go)."""
    sizes = []
    for si, st in enumerate(pipe.stages):
        if st.num_layers < chunks:
            raise SpecError(f"{field}.stages[{si}].layers", f"{st.num_layers} layer(s) cannot make {chunks} chunks",
                            "give the stage more layers or use fewer chunks")
        q, r = divmod(st.num_layers, chunks)
        sizes.append([q + 1] * r + [q] * (chunks - r))
    ranges: list[list[tuple[int, int]]] = [[] for _ in pipe.stages]
    at = 0
    for k in range(chunks * len(pipe.stages)):
        si, c = k % len(pipe.stages), k // len(pipe.stages)
        ranges[si].append((at, at + sizes[si][c]))
        at += sizes[si][c]
    stages = tuple(replace(st, layers=r[0], chunks=tuple(r)) for st, r in zip(pipe.stages, ranges))
    return replace(pipe, stages=stages, schedule=schedule)
