"""ZeRO-1: AdamW state sharded across the owners of every finest-common slice.

What is sharded (the cost model's ``zero_shards``, :mod:`planner.cost.memory`): every element of a
logical parameter has one owner per pipeline (:mod:`executor.topology`: the finest-common slices
of TP-sharded weights; the stage leaders for replicated norm scales). Those ``k`` owners form a
:class:`~executor.topology.SyncGroup`. Under ZeRO-1 they split the group's state ``k`` ways, so
every logical element has its Adam moments on exactly ONE rank of the whole plan; a rank holds
~1/k of the optimizer state it holds without ZeRO (norm scales: only the TP leaders hold their
share, the other TP ranks none).

Layout of one group on one rank: the rank's local views of the group's slices (same order as
:class:`executor.grad_sync.GradSync`), split into decayed matrices and undecayed norm scales (AdamW
weight decay differs), each concatenated into a flat vector of ``N`` elements. With
``c = ceil(N / k)``, the owner at position ``i`` of the group (pipeline order) owns the contiguous
part ``[i·c, min((i+1)·c, N))`` — the "flat part".

One step (replacing :class:`executor.grad_sync.GradSync` in the engine; see :meth:`executor.engine.Engine.train_step`):

1. :meth:`ZeroOptimizer.reduce_grads`: per part (in the topology's global group order, shared by
   every rank) a SUM reduce-scatter of the local gradients among the owners, so each owner's
   ``master.grad`` is the synchronised gradient of its flat part — half the traffic of the
   all-reduce, as :mod:`planner.cost.step` assumes for ``zero == 1``. The master part (a copy of
   the current parameters' flat part) exists only from here to the end of the step, and the full
   local gradients are dropped once reduced, so between steps a rank holds 1/k of the Adam state
   and nothing else of ZeRO's;
2. global-norm clipping, unchanged in meaning: every logical element's gradient lies in exactly one
   rank's parts, so the squared norms of the parts summed over all ranks are ``‖g‖²``; the engine
   scales the parts by the clip coefficient;
3. one AdamW step runs over the master parts (element-wise: the dense update of those elements;
   the same ``build_optimizer`` settings);
4. per part, the updated parts are all-gathered in rounds of at most ``bucket_numel`` elements per
   owner and written back into every owner's parameter views — the owners end up identical;
5. stage leaders broadcast the updated norm scales inside their TP group (the TP ranks other than
   the leader hold no norm state).

Sums run in another order than the all-reduce's, so results differ from ``zero == 0`` by fp32
rounding only (the oracle's tolerances). With one pipeline there is nothing to shard (``k = 1``)
and the engine runs without ZeRO.

Checkpoints: every owner writes and reads its own parts (:meth:`ZeroOptimizer.part_moments`,
:meth:`ZeroOptimizer.set_part_moments`) as rectangles of the logical moments
(:mod:`executor.checkpoint_pieces`), so a checkpoint is the same under ZeRO-0 and ZeRO-1.
:meth:`ZeroOptimizer.full_moments` (collective) all-gathers the parts into local-shard tensors;
:meth:`ZeroOptimizer.load_moments` cuts a rank's parts out of local-shard moments.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from executor.grad_sync import DEFAULT_BUCKET_NUMEL
from executor.groups import ProcessGroups
from executor.optim import OptimConfig, build_optimizer, decays

MOMENTS = ("exp_avg", "exp_avg_sq")
View = tuple[str, int | None, int, int]  # (name, dim, start, length) in the local shard


@dataclass
class _Part:
    """One flat vector (a group's decayed or undecayed slices) and this rank's part of it."""

    group: Any  # process group of the owners
    k: int  # owners
    index: int  # this rank's position among the owners
    views: list[View]
    numel: int  # N
    master: torch.nn.Parameter  # this rank's part [lo, hi); empty outside a step
    device: torch.device

    @property
    def chunk(self) -> int:
        return -(-self.numel // self.k)

    @property
    def lo(self) -> int:
        return min(self.index * self.chunk, self.numel)

    @property
    def hi(self) -> int:
        return min(self.lo + self.chunk, self.numel)


def _tensors(tensors: Mapping[str, torch.Tensor], views: list[View]) -> list[torch.Tensor]:
    return [tensors[n] if dim is None else tensors[n].narrow(dim, s, ln) for n, dim, s, ln in views]


def read_flat(tensors: list[torch.Tensor], lo: int, hi: int) -> torch.Tensor:
    """Elements ``[lo, hi)`` of the concatenation of the flattened ``tensors`` (a new fp32 tensor)."""
    out, off = [], 0
    for t in tensors:
        n = t.numel()
        s, e = max(lo, off), min(hi, off + n)
        if s < e:
            out.append(t.reshape(-1)[s - off:e - off].float())
        off += n
    if not out:
        return torch.zeros(0, dtype=torch.float32, device=tensors[0].device if tensors else None)
    return torch.cat(out)


def write_flat(tensors: list[torch.Tensor], lo: int, values: torch.Tensor) -> None:
    """Write ``values`` over elements ``[lo, lo + len)`` of the concatenated flattened ``tensors``."""
    hi, off = lo + values.numel(), 0
    for t in tensors:
        n = t.numel()
        s, e = max(lo, off), min(hi, off + n)
        if s < e:
            src = values[s - lo:e - lo]
            if t.is_contiguous():
                t.view(-1)[s - off:e - off].copy_(src)
            else:  # a narrowed view along dim 1: go through a flat copy of this view only
                flat = t.reshape(-1).clone()
                flat[s - off:e - off] = src
                t.copy_(flat.view(t.shape))
        off += n


class ZeroOptimizer:
    """AdamW over this rank's flat parts of every sync group it belongs to (see the module
    docstring). ``optimizer`` is the torch AdamW over the master parts (set its LR as usual)."""

    def __init__(self, groups: ProcessGroups, params: dict[str, torch.nn.Parameter], cfg: OptimConfig, *,
                 bucket_numel: int = DEFAULT_BUCKET_NUMEL):
        topo = groups.topology
        rank = groups.rank
        self.params = params
        self.bucket_numel = bucket_numel
        self.parts: list[_Part] = []
        for g in topo.sync_groups:
            if rank not in g.ranks:
                continue
            handle = groups.group(g.ranks)
            views: list[View] = []
            for ref in g.slices:
                dim, lo, hi = topo.local_slice(rank, ref)
                views.append((ref.name, dim, lo, hi - lo))
            for decayed in (True, False):
                mine = [v for v in views if decays(v[0]) == decayed]
                if not mine:
                    continue
                numel = sum(t.numel() for t in _tensors(params, mine))
                dev = params[mine[0][0]].device
                master = torch.nn.Parameter(torch.empty(0, dtype=torch.float32, device=dev))
                self.parts.append(_Part(handle, len(g.ranks), g.ranks.index(rank), mine, numel, master, dev))
        # replicated (norm) parameters the stage leader broadcasts after the update
        self.bcasts: list[tuple[Any, int, list[str]]] = [
            (groups.group(b.ranks), b.ranks[0], list(b.names)) for b in topo.tp_broadcasts if rank in b.ranks]
        if not self.parts:
            raise RuntimeError(f"ZeRO-1: rank {rank} owns no slice of any sync group (single pipeline?)")
        named = [(f"zero{i}:{p.views[0][0]}", p.master) for i, p in enumerate(self.parts)]
        self.optimizer = build_optimizer(named, cfg)

    # ------------------------------------------------------------------------------ training
    def reduce_grads(self) -> None:
        """Collective: SUM-reduce-scatter the local gradients of every part among its owners, so
        each owner's ``master.grad`` is the synchronised gradient of its part (rounds of at most
        ``bucket_numel`` elements per owner; groups in the topology's global order)."""
        with torch.no_grad():
            for part in self.parts:
                grads = _tensors({n: self.params[n].grad for n, *_ in part.views}, part.views)  # type: ignore[misc]
                mine = torch.zeros(part.hi - part.lo, dtype=torch.float32, device=part.device)
                c = part.chunk
                step = max(1, min(c, self.bucket_numel))
                for r0 in range(0, c, step):
                    n = min(step, c - r0)
                    ins = []
                    for j in range(part.k):
                        start = j * c + r0
                        piece = read_flat(grads, start, min(start + n, part.numel))
                        ins.append(torch.nn.functional.pad(piece, (0, n - piece.numel())))
                    out = torch.empty(n, dtype=torch.float32, device=mine.device)
                    dist.reduce_scatter(out, ins, group=part.group)
                    have = max(0, min(n, mine.numel() - r0))
                    mine[r0:r0 + have] = out[:have]
                part.master.data = read_flat(_tensors(self.params, part.views), part.lo, part.hi)
                part.master.grad = mine
            for p in self.params.values():  # reduced into the parts: the full gradients are done
                p.grad = None

    def grads(self) -> list[torch.Tensor]:
        """The synchronised gradient parts (after :meth:`reduce_grads`): every logical element's
        gradient is in exactly one rank's parts, so their squared norms summed over the plan's
        ranks give the global gradient norm, and clipping scales these."""
        out = [p.master.grad for p in self.parts]
        if any(g is None for g in out):
            raise RuntimeError("ZeRO-1: reduce_grads() must run before the gradient parts are used")
        return out  # type: ignore[return-value]

    def grad_sq_norm(self) -> torch.Tensor:
        """Sum of the squares of this rank's gradient parts (fp32 scalar)."""
        return torch.stack([g.float().pow(2).sum() for g in self.grads()]).sum()

    def step(self) -> None:
        """AdamW on this rank's parts (gradients from :meth:`reduce_grads`, clipped by the caller),
        then all-gather the updated parameters (collective)."""
        self.grads()
        with torch.no_grad():
            self.optimizer.step()
            for part in self.parts:
                part.master.grad = None
                self._gather(part, part.master.detach(), _tensors(self.params, part.views))
                part.master.data = torch.empty(0, dtype=torch.float32, device=part.device)
            for group, src, names in self.bcasts:
                flat = torch.cat([self.params[n].detach().reshape(-1) for n in names])
                dist.broadcast(flat, src=src, group=group)
                write_flat([self.params[n].detach() for n in names], 0, flat)

    def _gather(self, part: _Part, mine: torch.Tensor, targets: list[torch.Tensor]) -> None:
        """All-gather every owner's part (``mine`` on this rank) into ``targets`` (the flat vector's
        views), in rounds of at most ``bucket_numel`` elements per owner."""
        c = part.chunk
        step = max(1, min(c, self.bucket_numel))
        for r0 in range(0, c, step):
            n = min(step, c - r0)
            buf = torch.zeros(n, dtype=torch.float32, device=mine.device)
            have = max(0, min(n, mine.numel() - r0))
            if have:
                buf[:have] = mine[r0:r0 + have]
            outs = [torch.empty_like(buf) for _ in range(part.k)]
            dist.all_gather(outs, buf, group=part.group)
            for j, out in enumerate(outs):
                start = j * c + r0
                valid = max(0, min(n, part.numel - start))
                if valid:
                    write_flat(targets, start, out[:valid])

    # ------------------------------------------------------------------------------ state
    def state_numel(self) -> int:
        """Elements of Adam moments this rank holds (0 before the first step or load)."""
        return sum(t.numel() for st in self.optimizer.state.values() for key, t in st.items() if key in MOMENTS)

    def full_moments(self) -> dict[str, dict[str, torch.Tensor]]:
        """Collective over the plan: this rank's moments per local parameter shard, all-gathered
        from the owners' parts (zeros before the first step; norm scales on TP ranks other than the
        leader stay zeros — the checkpoint reads replicated tensors from the leader)."""
        out: dict[str, dict[str, torch.Tensor]] = {}
        for key in MOMENTS:
            full = {n: torch.zeros_like(p, dtype=torch.float32).detach() for n, p in self.params.items()}
            for part in self.parts:
                st = self.optimizer.state.get(part.master, {})
                mine = st[key] if key in st else torch.zeros(part.hi - part.lo, device=part.device)
                self._gather(part, mine, _tensors(full, part.views))
            out[key] = full
        return out

    def part_moments(self) -> list[dict[str, torch.Tensor]]:
        """This rank's Adam moments, one flat fp32 tensor per part and moment (zeros before the first
        step); part ``i`` covers elements ``[lo, hi)`` of ``parts[i]``'s flat vector."""
        out = []
        for part in self.parts:
            st = self.optimizer.state.get(part.master, {})
            out.append({key: st[key] if key in st else torch.zeros(part.hi - part.lo, device=part.device)
                        for key in MOMENTS})
        return out

    def set_part_moments(self, values: list[dict[str, torch.Tensor]], step: int) -> None:
        """Install per-part moments (as :meth:`part_moments` returns them) and the step count."""
        for group in self.optimizer.param_groups:
            on_device = bool(group.get("fused") or group.get("capturable"))
            for part, moments in zip(self.parts, values, strict=True):
                if not any(part.master is p for p in group["params"]):
                    continue
                st: dict[str, torch.Tensor] = {
                    "step": torch.tensor(float(step), dtype=torch.float32,
                                         device=part.device if on_device else torch.device("cpu"))}
                for key in MOMENTS:
                    st[key] = moments[key].to(part.device, torch.float32).reshape(-1).clone()
                self.optimizer.state[part.master] = st

    def load_moments(self, moments: dict[str, dict[str, torch.Tensor]], step: int) -> None:
        """Install this rank's parts of ``moments`` (per local shard name) and the step count."""
        values = []
        for part in self.parts:
            src = {key: {n: moments[key][n].to(part.device, torch.float32) for n, *_ in part.views}
                   for key in MOMENTS}
            values.append({key: read_flat(_tensors(src[key], part.views), part.lo, part.hi) for key in MOMENTS})
        self.set_part_moments(values, step)
