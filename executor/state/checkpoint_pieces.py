"""What each rank writes to, and reads from, a checkpoint: rectangles (:class:`planner.chunks.Chunk`)
of the logical tensors, each with the local tensor that holds its values.

Logical tensors (the layout-independent contract): ``model/<param>`` (fp32 weights) and
``optim/exp_avg/<param>``, ``optim/exp_avg_sq/<param>`` (AdamW moments), full logical shapes.

Writing, every logical element exactly once over the whole plan:

* weights: the ranks of pipeline 0 (which holds every layer) write their TP shards; a replicated
  tensor (a norm scale) is written by the stage leader only;
* moments without ZeRO-1: the same ranks, their local-shard moments;
* moments under ZeRO-1: every owner its own parts (:mod:`executor.parallel.zero`): each element's moments
  live on one rank of the plan, so each rank writes what it holds and nothing is gathered.

Reading, any plan: every rank asks for the rectangles it holds (its shards; its ZeRO parts) and the
checkpoint reader copies the overlapping pieces of the stored rectangles into them (resharding).
Destinations are filled with NaN first, so a region that no stored rectangle covers is caught.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from executor.parallel.zero import MOMENTS
from executor.train.engine import Engine
from planner.chunks import Chunk, shard_chunk, view_chunk
from planner.layout import ParamInfo, stage_params
from planner.state_layout import part_rects


@dataclass(frozen=True)
class Piece:
    """Values of ``chunk`` (``tensor``'s shape is ``chunk.sizes``) of a logical tensor of ``shape``."""

    chunk: Chunk
    shape: tuple[int, ...]
    tensor: torch.Tensor


def _infos(engine: Engine) -> dict[str, ParamInfo]:
    st = engine.stage
    return {i.name: i for i in stage_params(engine.plan.model, st.layers, st.is_first, st.is_last, st.chunks)}


def _shard_pieces(engine: Engine, prefix: str, tensors: dict[str, torch.Tensor], writer: bool) -> list[Piece]:
    """One piece per local shard; as a writer, replicated tensors only on the TP leader."""
    out = []
    for name, info in _infos(engine).items():
        if writer and info.shard_dim is None and engine.tp_rank != 0:
            continue
        chunk = shard_chunk(info, engine.stage.tp, engine.tp_rank)
        out.append(Piece(replace(chunk, name=prefix + name), info.shape, tensors[name]))
    return out


def _part_pieces(engine: Engine, key: str, flats: list[torch.Tensor]) -> list[Piece]:
    """Rectangles of this rank's ZeRO-1 parts of moment ``key`` (``flats[i]``: part ``i``'s values)."""
    assert engine.zero is not None
    infos = _infos(engine)
    st, tp_rank = engine.stage, engine.tp_rank
    out = []
    for part, flat in zip(engine.zero.parts, flats, strict=True):
        for at, chunk in part_rects(part.spec, lambda v: view_chunk(infos[v.name], st.tp, tp_rank, v.dim, v.start,
                                                                    v.length)):
            out.append(Piece(replace(chunk, name=f"optim/{key}/{chunk.name}"), infos[chunk.name].shape,
                             flat[at:at + chunk.numel].view(chunk.sizes)))
    return out


def save_pieces(engine: Engine) -> list[Piece]:
    """What this rank writes (module docstring)."""
    out: list[Piece] = []
    writes_shards = engine.stage.pipeline == 0 and engine.stage.cp_rank == 0  # CP slots hold equal shards
    if writes_shards:
        out += _shard_pieces(engine, "model/", {n: p.detach() for n, p in engine.params.items()}, writer=True)
    if engine.zero is not None:
        parts = engine.zero.part_moments()
        for key in MOMENTS:
            out += _part_pieces(engine, key, [p[key] for p in parts])
    elif writes_shards:
        moments = engine.optimizer_moments()
        for key in MOMENTS:
            out += _shard_pieces(engine, f"optim/{key}/", moments[key], writer=True)
    return out


def load_targets(engine: Engine) -> tuple[list[Piece], Callable[[int], None]]:
    """What this rank reads (module docstring), every destination filled with NaN, and the function
    that hands the loaded moments and the step count to the optimizer afterwards."""
    nan = float("nan")
    with torch.no_grad():
        for p in engine.params.values():
            p.fill_(nan)
    out = _shard_pieces(engine, "model/", {n: p.data for n, p in engine.params.items()}, writer=False)
    zero = engine.zero
    if zero is not None:
        flats = [{key: torch.full((part.numel,), nan, device=part.device) for key in MOMENTS}
                 for part in zero.parts]
        for key in MOMENTS:
            out += _part_pieces(engine, key, [f[key] for f in flats])

        def install(step: int) -> None:
            zero.set_part_moments(flats, step)
            engine.step = step
        return out, install
    moments = {key: {n: torch.full_like(p, nan, dtype=torch.float32) for n, p in engine.params.items()}
               for key in MOMENTS}
    for key in MOMENTS:
        out += _shard_pieces(engine, f"optim/{key}/", moments[key], writer=False)
    return out, lambda step: engine.set_optimizer_state(moments, step)
