"""Which context-parallel (CP) degrees the search tries, and when.

CP pays where activations, not weights, fill memory: long sequences. The search tries it
(:meth:`planner.search.planner.Search.run`, phase A') only when the sequence is longer than
``CP_MIN_SEQ`` tokens, or when nothing fits without it (memory forces it): at 4K-8K context TP and
pipelining already fit and CP only adds K/V traffic, so short sequences cost no extra work.

The degree is chosen per TP template (every node cut into ``cp x tp`` meshes of consecutive GPUs;
a node too small for one keeps plain TP groups), not per stage: per-stage degrees would multiply
the templates by the CP choices of every node kind, and the search's work with them
(tests/planner/test_search_work.py bounds it). CP groups stay inside a node, on its fast link.
"""

from __future__ import annotations

from planner.model import ModelSpec

CP_MIN_SEQ = 8192  # sequences up to this long are searched without CP unless nothing fits


def cp_choices(model: ModelSpec, tp: int, max_gpus: int) -> list[int]:
    """CP degrees ``cp >= 2`` (powers of two) with ``2·cp`` dividing the sequence (two balanced
    chunks per rank) and ``tp·cp`` devices fitting the largest node."""
    out, c = [], 2
    while tp * c <= max_gpus:
        if model.seq_len % (2 * c) == 0:
            out.append(c)
        c *= 2
    return out


def cp_wanted(model: ModelSpec, enabled: bool, found: bool) -> bool:
    """Whether the search tries CP: allowed, and a long sequence or nothing found without it."""
    return enabled and (model.seq_len > CP_MIN_SEQ or not found)
