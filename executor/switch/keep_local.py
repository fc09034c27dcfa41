"""The state a process keeps across an elastic switch: adopted by the new plan's engine where it can
be, copied into it only where it changes place (:mod:`executor.switch.state_move`, step 4's local part).

A kept piece (:meth:`planner.state_move_plan.ReshardPlan.local`) that is the whole holding on both
sides — the same rectangle of the same tensor in the old and in the new plan — needs no copy: the
new engine takes the old engine's tensor as its own (the old tensor's storage, its values as they
are) and lets go of the one it built ahead. What is adopted, by the new engine's kind:

* without ZeRO-1: a weight becomes the parameter's data (``param.data``), an AdamW moment the
  optimizer's state tensor, one holding at a time — where the tensors adopted from one allocation
  use all of it (an old ZeRO-1 bucket's weight views only together, a view keeps its allocation);
* under ZeRO-1 the weights live in flat bucket buffers (:mod:`executor.parallel.zero`): a bucket's
  whole buffer is adopted (:meth:`ZeroOptimizer.adopt_weights`) where the old engine, also under
  ZeRO-1, has a bucket of the same views at the same offsets, every one of them whole and kept
  whole. The padding may differ (``k`` owners pad to ``k·ceil(N/k)``); the allocations carry slack
  for it (:data:`executor.parallel.zero.ADOPT_SLACK`). ZeRO-1's moments live per master (a
  bucket's owned range): where this process owns the same range of a bucket laid out alike as
  before (the owner count and its position unchanged), the master takes the old master's moments.
  Where the range changes they are copied, the rest arriving from the peers — also where it
  shrinks (a join): a view of the old, larger moment would keep more memory than the new plan was
  priced with (+1/3 of the rank's moments in a 3 -> 4 join), for 4 ms of copying on the 4x H100 join.

Memory: an adopted tensor replaces the one the new engine built ahead, which is freed — but for
ZeRO-1's moments, whose flat part (built ahead) stays allocated while any master of it still uses it.

On 4x H100 (2026-11-27 15:00, llama-1.3b under ZeRO-1) the slowest rank spent 12-14 ms copying the
state it kept, 8.19 GB: 5.46 GB of it its weights, which stay where they are now in every event;
the rest, its moments, changes range in each (2.73 GB still copied).

Why adopting is safe: every new holding adopted is covered by that one piece, so no other piece
(local or received) writes into it, and the old engine never writes again — after the switch it is
dropped (its groups alone live on, retired, :mod:`executor.parallel.group_retire`, which frees and
zeroes no tensor); it may still be read meanwhile (the same values sent to a peer). A kept piece
that is part of a holding, or of another dtype or shape, or a bucket not laid out alike, is copied
as before (``copied_bytes``). A ZeRO-1 master's moments are adopted only where every holding in its
range is covered by kept pieces alone, so nothing received lands in the old engine's tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from executor.state.state_pieces import OPTIM, NewState, key_name, narrow
from executor.train.engine import Engine
from planner.state_layout import MOMENTS, Holding
from planner.state_move_plan import Piece

UNUSED_MAX = 4096  # bytes of an allocation its adopted tensors may leave unused (_fills_storage)


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
    if new.engine.zero is not None:
        adopted = _adopt_buckets(whole, old, new) | _adopt_moments(local, old, new)
    else:
        adopted = _adopt_tensors(whole, held, new)
    rest = [p for p in local if p.dst_slot not in adopted]
    if rest:
        torch._foreach_copy_([narrow(new.tensors[p.dst_slot], dst[p.dst_slot].chunk, p.chunk) for p in rest],
                             [narrow(held[p.src_slot], src[p.src_slot].chunk, p.chunk) for p in rest])
    return Kept(adopted_bytes=sum(p.nbytes for p in local if p.dst_slot in adopted),
                copied_bytes=sum(p.nbytes for p in rest))


def _adoptable(t: torch.Tensor, h: Holding) -> bool:
    return t.dtype == torch.float32 and tuple(t.shape) == tuple(h.chunk.sizes)


def _adopt_tensors(whole: dict[int, int], held: list[torch.Tensor], new: NewState) -> set[int]:
    """A new engine without ZeRO-1: each whole weight or moment becomes the old tensor, where the
    tensors adopted from one allocation use all of it (:func:`_fills_storage`)."""
    engine, dst = new.engine, new.state.holdings
    params = engine.params
    # (an engine's device may carry no index: the tensors' own devices are compared)
    wanted = {d: held[s] for d, s in whole.items() if (dst[d].part is None or not dst[d].tensor.startswith(OPTIM))
              and _adoptable(held[s], dst[d]) and held[s].device == new.tensors[d].device}
    out = _fills_storage(wanted)
    for d in out:
        h, t = dst[d], wanted[d]
        if not h.tensor.startswith(OPTIM):
            p = params[h.chunk.name]
            p.data = t
            new.tensors[d] = p.detach()
        else:
            key, name = key_name(h.tensor)
            engine.optimizer.state[params[name]][key] = t
            new.tensors[d] = t
    return out


def _fills_storage(tensors: dict[int, torch.Tensor]) -> set[int]:
    """The keys of ``tensors`` whose allocation they (with the others of it here) use all of but
    :data:`UNUSED_MAX` bytes or 1 % (a ZeRO-1 bucket's padding and slack): adopting a view keeps its
    whole allocation alive, and an old ZeRO-1 bucket of which only a norm scale is kept must not
    outlive the old engine."""
    used: dict[int, int] = {}
    for t in tensors.values():
        ptr = t.untyped_storage().data_ptr()
        used[ptr] = used.get(ptr, 0) + t.numel() * t.element_size()
    return {d for d, t in tensors.items() if t.untyped_storage().nbytes() - used[t.untyped_storage().data_ptr()]
            <= max(UNUSED_MAX, t.untyped_storage().nbytes() // 100)}


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


def _adopt_moments(local: list[Piece], old: Engine, new: NewState) -> set[int]:
    """A new engine under ZeRO-1: a master (one bucket's owned range) whose range is this process's
    owned range of the old engine's bucket of the same layout, every one of its holdings kept
    (covered by kept pieces alone), takes the old master's moments as its own."""
    zero, old_zero = new.engine.zero, old.zero
    if zero is None or old_zero is None:
        return set()
    dst = new.state.holdings
    covered: dict[int, int] = {}
    for p in local:
        covered[p.dst_slot] = covered.get(p.dst_slot, 0) + p.numel
    old_at = {(b.spec.views, b.spec.offsets): q for q, b in enumerate(old_zero.sync.order)}
    out: set[int] = set()
    for b in zero.sync.order:
        q_old = old_at.get((b.spec.views, b.spec.offsets))
        if q_old is None:
            continue
        ob = old_zero.sync.order[q_old]
        lo, hi = b.spec.owned(zero.sync.parts[b.part].index)
        old_lo, old_hi = ob.spec.owned(old_zero.sync.parts[ob.part].index)
        start = sum(m.numel() for m in zero.parts[b.part].masters[:b.index])  # the master's first element in its part
        slots = [d for d, h in enumerate(dst) if h.part == b.part and start <= h.at < start + hi - lo]
        if not slots or (lo, hi) != (old_lo, old_hi) or any(covered.get(d) != dst[d].numel for d in slots):
            continue
        state = zero.optimizer.state[zero.parts[b.part].masters[b.index]]
        old_start = sum(m.numel() for m in old_zero.parts[ob.part].masters[:ob.index])
        kept = {key: old_zero.moment_view(ob.part, old_start, hi - lo, key) for key in MOMENTS}
        if any(t.device != state[key].device for key, t in kept.items()):
            continue
        state.update(kept)
        for d in slots:
            key, _ = key_name(dst[d].tensor)
            new.tensors[d] = zero.moment_view(b.part, dst[d].at, dst[d].numel, key).view(dst[d].chunk.sizes)
        out.update(slots)
    return out
