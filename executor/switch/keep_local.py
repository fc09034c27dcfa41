"""The state a process keeps across an elastic switch: adopted by the new plan's engine where it can
be, copied into it only where it changes place (:mod:`executor.switch.state_move`, step 4's local part).

A kept piece (:meth:`planner.state_move_plan.ReshardPlan.local`) that is the whole holding on both
sides — the same rectangle of the same tensor in the old and in the new plan — needs no copy: the
new engine takes the old engine's tensor as its own (the old tensor's storage, its values as they
are) and lets go of the one it built ahead. What is adopted, by the new engine's kind:

* without ZeRO-1: a weight becomes the parameter's data (``param.data``), an AdamW moment the
  optimizer's state tensor, one holding at a time;
* under ZeRO-1 the weights live in flat bucket buffers (:mod:`executor.parallel.zero`): a bucket's
  whole buffer is adopted (:meth:`ZeroOptimizer.adopt_weights`) where the old engine, also under
  ZeRO-1, has a bucket of the same views at the same offsets, every one of them whole and kept
  whole. The padding may differ (``k`` owners pad to ``k·ceil(N/k)``); the allocations carry slack
  for it (:data:`executor.parallel.zero.ADOPT_SLACK`). ZeRO-1's moments are flat parts whose ranges
  change with the owner count: they are copied (a part's pieces are not its whole holdings).

On 4x H100 (2026-11-27 15:00, a 4 -> 3 leave of llama-1.3b under ZeRO-1) the slowest rank spent 12-14
ms copying the state it kept, 5.4 GB of it its own weights, which stay where they are now.

Why adopting is safe: every new holding adopted is covered by that one piece, so no other piece
(local or received) writes into it, and the old engine never writes again — after the switch it is
dropped (its groups alone live on, retired, :mod:`executor.parallel.group_retire`, which frees and
zeroes no tensor); it may still be read meanwhile (the same values sent to a peer). A kept piece
that is part of a holding, or of another dtype or shape, or a bucket not laid out alike, is copied
as before (``copied_bytes``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from executor.state.state_pieces import OPTIM, NewState, key_name, narrow
from executor.train.engine import Engine
from planner.state_layout import Holding
from planner.state_move_plan import Piece


@dataclass(frozen=True)
class Kept:
    """What :func:`keep` did with a process's kept pieces: bytes adopted (no copy) and copied."""

    adopted_bytes: int = 0
    copied_bytes: int = 0


def whole_pieces(local: list[Piece], src: tuple[Holding, ...], dst: tuple[Holding, ...]) -> dict[int, int]:
    """New holding slot -> old holding slot, for each kept piece that is the whole holding on both
    sides (module docstring)."""
    return {p.dst_slot: p.src_slot for p in local
            if src[p.src_slot].tensor == dst[p.dst_slot].tensor and p.chunk == src[p.src_slot].chunk
            and p.chunk == dst[p.dst_slot].chunk}


def keep(local: list[Piece], *, old: Engine, held: list[torch.Tensor], src: tuple[Holding, ...],
         new: NewState) -> Kept:
    """Put this process's kept pieces ``local`` into the new engine: adopted where they are whole
    (module docstring), the rest copied from ``held`` (the old engine's tensors, one per holding of
    ``src``) in one torch call (one copy kernel per strided piece)."""
    dst = new.state.holdings
    whole = whole_pieces(local, src, dst)
    adopted = _adopt_buckets(whole, old, new) if new.engine.zero is not None else _adopt_tensors(whole, held, new)
    rest = [p for p in local if p.dst_slot not in adopted]
    if rest:
        torch._foreach_copy_([narrow(new.tensors[p.dst_slot], dst[p.dst_slot].chunk, p.chunk) for p in rest],
                             [narrow(held[p.src_slot], src[p.src_slot].chunk, p.chunk) for p in rest])
    return Kept(adopted_bytes=sum(p.nbytes for p in local if p.dst_slot in adopted),
                copied_bytes=sum(p.nbytes for p in rest))


def _adoptable(t: torch.Tensor, h: Holding) -> bool:
    return t.dtype == torch.float32 and tuple(t.shape) == tuple(h.chunk.sizes)


def _adopt_tensors(whole: dict[int, int], held: list[torch.Tensor], new: NewState) -> set[int]:
    """A new engine without ZeRO-1: each whole weight or moment becomes the old tensor."""
    engine, dst, out = new.engine, new.state.holdings, set()
    params = engine.params
    for d, s in whole.items():
        h, t = dst[d], held[s]
        if not _adoptable(t, h) or t.device != new.tensors[d].device:  # (an engine's device may have no index)
            continue
        if not h.tensor.startswith(OPTIM):
            p = params[h.chunk.name]
            p.data = t
            new.tensors[d] = p.detach()
        elif h.part is None:
            key, name = key_name(h.tensor)
            engine.optimizer.state[params[name]][key] = t
            new.tensors[d] = t
        else:
            continue
        out.add(d)
    return out


def _adopt_buckets(whole: dict[int, int], old: Engine, new: NewState) -> set[int]:
    """A new engine under ZeRO-1: each weight bucket laid out as one of the old engine's (also
    ZeRO-1), every view whole and kept whole and its parameter that buffer's slot there, adopts
    that bucket's buffer."""
    zero, old_zero = new.engine.zero, old.zero
    if zero is None or old_zero is None:
        return set()
    dst = new.state.holdings
    slot_of = {h.chunk.name: d for d, h in enumerate(dst) if not h.tensor.startswith(OPTIM) and d in whole}
    old_at = {(b.spec.views, b.spec.offsets): q for q, b in enumerate(old_zero.sync.order)}
    old_params, params = old.params, new.engine.params
    out: set[int] = set()
    for q, b in enumerate(zero.sync.order):
        slots = [slot_of.get(v.name) for v in b.spec.views]
        q_old = old_at.get((b.spec.views, b.spec.offsets))
        if q_old is None or any(d is None or not v.whole for d, v in zip(slots, b.spec.views)):
            continue
        storage = old_zero.storage[q_old]
        if storage.numel() < b.spec.padded or storage.device != zero.storage[q].device or any(
                old_params[v.name].data_ptr() != old_zero.weights[q_old][off:].data_ptr()
                for v, off in zip(b.spec.views, b.spec.offsets)):
            continue
        zero.adopt_weights(q, storage)
        for d, v in zip(slots, b.spec.views):
            assert d is not None
            new.tensors[d] = params[v.name].detach()
            out.add(d)
    return out
