"""ZeRO-1: AdamW state sharded across the owners of every finest-common slice.

What is sharded (the cost model's ``zero_shards``, :mod:`planner.cost.memory`): every element of a
logical parameter has one owner per pipeline (:mod:`planner.layout`: the finest-common slices
of TP-sharded weights; the stage leaders for replicated norm scales). Those ``k`` owners form a
:class:`~planner.layout.SyncGroup`. Under ZeRO-1 they split the group's state ``k`` ways, so
every logical element has its Adam moments on exactly ONE rank of the whole plan; a rank holds
~1/k of the optimizer state it holds without ZeRO (norm scales: only the TP leaders hold their
share, the other TP ranks none).

Layout (:func:`planner.flat_buckets.flat_parts`, the same buckets :class:`executor.parallel.grad_sync.GradSync`
reduces): a group's local views on one rank, split into decayed matrices and undecayed norm scales
(AdamW weight decay differs), form two *parts*; each part is cut into flat buckets of at most
``bucket_numel`` elements. In a bucket of ``N`` elements, with ``c = ceil(N / k)``, the owner at
position ``i`` of the group (pipeline order) owns ``[i·c, min((i+1)·c, N))``; its *part* is the
concatenation of its owned ranges, bucket by bucket (:func:`planner.state_layout.part_rects`).
Owning per bucket, not per part, is what lets a bucket be reduced as soon as its gradients are
final. Every bucket has a weight buffer of ``k·c`` fp32 elements; a parameter whose local shard
is one whole view *is* its slot of that buffer (``param.data`` is a view), and the master of an
owned range is a view of the same buffer — no copy of the weights is ever made.

One step (see :meth:`executor.train.engine.Engine.train_step`):

1. :meth:`ZeroOptimizer.reduce_grads`: the gradient buckets (bound to ``.grad`` before backward,
   so micro-batches accumulate in place) are SUM-reduce-scattered among the owners — launched from
   the backward hooks as soon as a bucket is final (:mod:`executor.parallel.grad_sync`), the rest and the
   waits here — so each master's ``.grad`` is the synchronised gradient of its owned range: half
   the traffic of the all-reduce, as :mod:`planner.cost.step` assumes for ``zero == 1``. The full
   local gradients are dropped once reduced;
2. global-norm clipping, unchanged in meaning: every logical element's gradient lies in exactly one
   rank's parts, so the squared norms of the parts summed over all ranks are ``‖g‖²``; the engine
   scales the parts by the clip coefficient;
3. one AdamW step runs over the masters (element-wise: the dense update of those elements; the
   same ``build_optimizer`` settings), in place in the weight buffers;
4. every bucket's weight buffer is all-gathered in place, launched asynchronously in forward
   order; the next forward waits for a bucket just before the first layer that uses it
   (:meth:`ZeroOptimizer.ready`, called by :class:`executor.model.llama.StageModule`), so the gathers
   overlap the next step's forward. Whoever reads the weights otherwise waits for all first
   (:meth:`ZeroOptimizer.wait_all`; :attr:`executor.train.engine.Engine.params` does);
5. stage leaders broadcast the updated norm scales inside their TP group (the TP ranks other than
   the leader hold no norm state), after the gathers of the buckets that hold them only (the norm
   scales' own part: in forward order it comes early, the matrices' gathers stay in flight).

Why the weight all-gathers cannot deadlock: they go on the sync communicators only, launched by
every rank in the same order (the reverse of the reduction order, a global order, see
:mod:`executor.parallel.grad_sync`) at the end of :meth:`step`, before the rank issues anything of the
next step; a launch waits on nothing but the rank's own AdamW. So each gather completes once
every owner has finished its step, whatever the norm-scale broadcasts and the next forward's TP
and p2p traffic (other communicators) do meanwhile, and the forward's waits only wait for those. The next step's
reduce-scatters on the same communicators come after the gathers on every rank.

Sums run in another order than the all-reduce's, so results differ from ``zero == 0`` by fp32
rounding only (the oracle's tolerances). With one pipeline there is nothing to shard (``k = 1``)
and the engine runs without ZeRO.

Checkpoints: every owner writes and reads its own parts (:meth:`ZeroOptimizer.part_moments`,
:meth:`ZeroOptimizer.set_part_moments`) as rectangles of the logical moments
(:mod:`executor.state.checkpoint_pieces`), so a checkpoint is the same under ZeRO-0 and ZeRO-1.
:meth:`ZeroOptimizer.full_moments` (collective) all-gathers the parts into local-shard tensors;
:meth:`ZeroOptimizer.load_moments` cuts a rank's parts out of local-shard moments.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from executor.parallel.grad_sync import (
    DEFAULT_BUCKET_NUMEL,
    Bucket,
    GradSync,
    all_gather_flat,
    narrow,
    slot,
    tp_broadcasts,
)
from executor.parallel.groups import ProcessGroups
from executor.train.optim import OptimConfig, build_optimizer
from planner.flat_buckets import FlatPart
from planner.layout import Topology

MOMENTS = ("exp_avg", "exp_avg_sq")
# elements allocated beyond each weight buffer's padded size: another plan's engine whose ``k'``
# owners pad the same bucket to ``k'·ceil(N/k') <= N + k' - 1`` elements can adopt the allocation
# (ZeroOptimizer.adopt_weights) for any k' up to ADOPT_SLACK + 1 (beyond that the elastic switch
# copies); 512 bytes a bucket, under 0.5 % of the tiny test models' weights (tests/executor/test_exec_memory.py)
ADOPT_SLACK = 128


@dataclass
class _Part:
    """One flat part (a sync group's decayed or undecayed views) and this rank's masters in it."""

    spec: FlatPart
    device: torch.device
    masters: list[torch.nn.Parameter]  # per bucket: the owned range of its weight buffer (may be empty)

    @property
    def numel(self) -> int:
        """Elements of this rank's part (the sum of its owned ranges)."""
        return self.spec.numel

    @property
    def views(self) -> list[tuple[str, int | None, int, int]]:
        return [(v.name, v.dim, v.start, v.length) for v in self.spec.views]


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


def _gate_key(name: str) -> str:
    """The forward gate (:attr:`executor.model.llama.StageModule.param_gate`) that uses parameter ``name``."""
    if name.startswith("layers."):
        return "layers." + name.split(".")[1]
    return "embed" if name.startswith("embed.") else "head"


class ZeroOptimizer:
    """AdamW over this rank's owned ranges of every flat bucket (see the module docstring).
    ``optimizer`` is the torch AdamW over the masters (set its LR as usual)."""

    def __init__(self, topology: Topology, rank: int, params: dict[str, torch.nn.Parameter], cfg: OptimConfig, *,
                 bucket_numel: int = DEFAULT_BUCKET_NUMEL):
        self.params = params
        self.sync = GradSync(topology, rank, params, bucket_numel=bucket_numel, scatter=True)
        if not self.sync.parts:
            raise RuntimeError(f"ZeRO-1: rank {rank} owns no slice of any sync group (single pipeline?)")
        # one weight buffer per bucket (in the issue order); whole local shards live in it. Each is
        # the head of an allocation ADOPT_SLACK elements longer (``storage``), so that another plan's
        # engine can take it over as its own buffer of that bucket (adopt_weights)
        self.weights: list[torch.Tensor] = []
        self.storage: list[torch.Tensor] = []
        with torch.no_grad():
            for b in self.sync.order:
                dev = params[b.spec.views[0].name].device
                self.storage.append(torch.zeros(b.spec.padded + ADOPT_SLACK, dtype=torch.float32, device=dev))
                self.weights.append(self.storage[-1][:b.spec.padded])
            self._bind()
        # (part, bucket of the part) -> position in the issue order
        self._where = {(b.part, b.index): q for q, b in enumerate(self.sync.order)}
        self.parts: list[_Part] = []
        for i, spec in enumerate(self.sync.parts):
            masters = []
            for j, bucket in enumerate(spec.buckets):
                q = self._where[(i, j)]
                lo, hi = bucket.owned(spec.index)
                masters.append(torch.nn.Parameter(self.weights[q].narrow(0, lo, hi - lo)))
            self.parts.append(_Part(spec, params[spec.buckets[0].views[0].name].device, masters))
        # replicated (norm) parameters the stage leader broadcasts after the update (groups: attach)
        self.bcast_specs = tp_broadcasts(topology, rank)
        self.bcasts: list[tuple[Any, int, list[str]]] = []
        named = [(f"zero{i}.{j}:{p.spec.buckets[j].views[0].name}", m)
                 for i, p in enumerate(self.parts) for j, m in enumerate(p.masters)]
        self.optimizer = build_optimizer(named, cfg)
        self._gates: dict[str, list[int]] = {}
        for q, b in enumerate(self.sync.order):
            for key in sorted({_gate_key(n) for n in b.names}):
                self._gates.setdefault(key, []).append(q)
        self._gathering: dict[int, Any] = {}  # bucket (issue order) -> its weight all-gather in flight
        # the buckets holding the norm scales this rank broadcasts: waited for before the broadcast
        broadcast = {n for _, _, names in self.bcast_specs for n in names}
        self._before_bcast = [q for q, b in enumerate(self.sync.order) if b.names & broadcast]

    def attach(self, groups: ProcessGroups) -> None:
        """The process groups of the plan (:meth:`GradSync.attach`), before the first step."""
        self.sync.attach(groups)
        self.bcasts = [(groups.group(ranks), src, names) for ranks, src, names in self.bcast_specs]

    @property
    def bucket_numel(self) -> int:
        """Elements per owner of one collective call: the bucket's chunk unless set lower (then the
        collectives run in rounds; the ownership layout is unchanged)."""
        return self.sync.round_numel or self.sync.bucket_numel

    @bucket_numel.setter
    def bucket_numel(self, n: int) -> None:
        self.sync.round_numel = n

    def _bind(self) -> None:
        """Put every parameter's current values into its slots of the weight buffers; a parameter
        whose local shard is one whole view becomes that slot (so the all-gather writes it in place).
        Cheap when nothing changed; it re-binds a parameter whose ``.data`` someone replaced."""
        for b, buf in zip(self.sync.order, self.weights):
            for v, off in zip(b.spec.views, b.spec.offsets):
                p = self.params[v.name]
                dst = slot(buf, v, off, p.shape)
                if dst.data_ptr() == p.data_ptr() and v.whole:
                    continue
                dst.copy_(narrow(p.detach(), v))
                if v.whole:
                    p.data = dst

    def adopt_weights(self, q: int, storage: torch.Tensor) -> None:
        """Make ``storage`` (another engine's :attr:`storage` of a bucket laid out as bucket ``q``:
        the same views at the same offsets) bucket ``q``'s weight buffer, its values as they are:
        the whole views' parameters and this rank's master become views of it, nothing is copied
        (the elastic switch, :mod:`executor.switch.keep_local`). Only the padding, whose values
        nobody reads, may differ in length: ``storage`` must hold this bucket's padded size."""
        b = self.sync.order[q]
        if storage.numel() < b.spec.padded or storage.dtype != torch.float32 or storage.dim() != 1:
            raise ValueError(f"bucket {q}: a buffer of {storage.numel()} elements cannot hold its {b.spec.padded}")
        buf = storage[:b.spec.padded]
        self.storage[q], self.weights[q] = storage, buf
        with torch.no_grad():
            for v, off in zip(b.spec.views, b.spec.offsets):
                if not v.whole:
                    raise ValueError(f"bucket {q}: {v.name} is not a whole view; its parameter is not the buffer's")
                p = self.params[v.name]
                p.data = slot(buf, v, off, p.shape)
            lo, hi = b.spec.owned(self.sync.parts[b.part].index)
            self.parts[b.part].masters[b.index].data = buf.narrow(0, lo, hi - lo)

    # ------------------------------------------------------------------------------ training
    def reduce_grads(self) -> None:
        """Collective: SUM-reduce-scatter the local gradients of every bucket among its owners
        (what :meth:`GradSync.arm` did not launch during backward), so each master's ``.grad`` is
        the synchronised gradient of its owned range; the full local gradients are dropped."""
        self.wait_all()
        with torch.no_grad():
            self._bind()
            self.sync.sync()
            for i, part in enumerate(self.parts):
                for j, m in enumerate(part.masters):
                    b = self.sync.order[self._where[(i, j)]]
                    assert b.out is not None
                    m.grad = b.out[:m.numel()]
            self.sync.release()
            for p in self.params.values():  # reduced into the masters: the full gradients are done
                p.grad = None

    def grads(self) -> list[torch.Tensor]:
        """The synchronised gradient parts (after :meth:`reduce_grads`): every logical element's
        gradient is in exactly one rank's parts, so their squared norms summed over the plan's
        ranks give the global gradient norm, and clipping scales these."""
        out = [m.grad for p in self.parts for m in p.masters]
        if any(g is None for g in out):
            raise RuntimeError("ZeRO-1: reduce_grads() must run before the gradient parts are used")
        return out  # type: ignore[return-value]

    def grad_sq_norm(self) -> torch.Tensor:
        """Sum of the squares of this rank's gradient parts (fp32 scalar)."""
        return torch.stack([g.float().pow(2).sum() for g in self.grads()]).sum()

    def step(self) -> None:
        """AdamW on this rank's owned ranges (gradients from :meth:`reduce_grads`, clipped by the
        caller), then launch the all-gather of every bucket's weights, in forward order; the next
        forward waits for each before its first use (:meth:`ready`)."""
        self.grads()
        with torch.no_grad():
            self.optimizer.step()
            for part in self.parts:
                for m in part.masters:
                    m.grad = None
            for q in reversed(range(len(self.sync.order))):
                self._gathering[q] = self._gather(self.sync.order[q], self.weights[q])
            for q in self._before_bcast:  # the leader's norm scales are gathered before it broadcasts
                self._finish(q)            # them; the other buckets stay in flight for the forward
            for group, src, names in self.bcasts:
                ps = [self.params[n].detach() for n in names]
                flat = torch.cat([t.reshape(-1) for t in ps])
                dist.broadcast(flat, src=src, group=group)
                torch._foreach_copy_(ps, [t.view_as(p) for t, p in zip(flat.split([p.numel() for p in ps]), ps)])

    def _gather(self, b: Bucket, buf: torch.Tensor) -> Any:
        """Launch the all-gather of ``buf`` (a bucket's [padded] buffer whose owned chunk this rank
        holds) in place; rounds of at most ``bucket_numel`` elements per owner if set lower."""
        c, k, i = b.spec.chunk, b.spec.k, self.sync.parts[b.part].index
        step = c if self.sync.round_numel is None else max(1, min(c, self.sync.round_numel))
        if step == c:
            return all_gather_flat(buf, buf.narrow(0, i * c, c), group=b.group, async_op=True)
        return [dist.all_gather([buf[j * c + r0:j * c + r0 + min(step, c - r0)] for j in range(k)],
                                buf[i * c + r0:i * c + r0 + min(step, c - r0)], group=b.group, async_op=True)
                for r0 in range(0, c, step)]

    def _finish(self, q: int) -> None:
        work = self._gathering.pop(q, None)
        if work is None:
            return
        for w in work if isinstance(work, list) else [work]:
            w.wait()
        b, buf = self.sync.order[q], self.weights[q]
        with torch.no_grad():
            for v, off in zip(b.spec.views, b.spec.offsets):  # views that are not their slot
                p = self.params[v.name]
                src = slot(buf, v, off, p.shape)
                if src.data_ptr() != p.data_ptr():
                    narrow(p.detach(), v).copy_(src)

    def ready(self, key: str) -> None:
        """Wait for the weight all-gathers of the buckets that gate ``key`` (``embed``,
        ``layers.<i>``, ``head``) uses: called by the stage's forward before it touches them."""
        for q in self._gates.get(key, ()):
            if q in self._gathering:
                self._finish(q)

    def wait_all(self) -> None:
        """Wait for every weight all-gather in flight (before anyone reads the weights otherwise)."""
        for q in sorted(self._gathering):
            self._finish(q)

    # ------------------------------------------------------------------------------ state
    def state_numel(self) -> int:
        """Elements of Adam moments this rank holds (0 before the first step or load)."""
        return sum(t.numel() for st in self.optimizer.state.values() for key, t in st.items() if key in MOMENTS)

    def _moment(self, m: torch.nn.Parameter, key: str) -> torch.Tensor:
        st = self.optimizer.state.get(m, {})
        return st[key] if key in st else torch.zeros(m.numel(), dtype=torch.float32, device=m.device)

    def full_moments(self) -> dict[str, dict[str, torch.Tensor]]:
        """Collective over the plan: this rank's moments per local parameter shard, all-gathered
        from the owners' parts (zeros before the first step; norm scales on TP ranks other than the
        leader stay zeros — the checkpoint reads replicated tensors from the leader)."""
        self.wait_all()
        masters = {q: self.parts[i].masters[j] for (i, j), q in self._where.items()}
        out: dict[str, dict[str, torch.Tensor]] = {}
        for key in MOMENTS:
            full = {n: torch.zeros_like(p, dtype=torch.float32).detach() for n, p in self.params.items()}
            for q, b in enumerate(self.sync.order):
                m = masters[q]
                c, i = b.spec.chunk, self.sync.parts[b.part].index
                buf = torch.zeros(b.spec.padded, dtype=torch.float32, device=m.device)
                buf[i * c:i * c + m.numel()] = self._moment(m, key)
                all_gather_flat(buf, buf.narrow(0, i * c, c).clone(), group=b.group)
                for v, off in zip(b.spec.views, b.spec.offsets):
                    narrow(full[v.name], v).copy_(slot(buf, v, off, full[v.name].shape))
            out[key] = full
        return out

    def moment_view(self, part: int, at: int, numel: int, key: str) -> torch.Tensor:
        """Elements ``[at, at + numel)`` of moment ``key`` of part ``part`` (as :meth:`part_moments`
        concatenates it), a view of the live state, no copy: the range must lie in one bucket's
        owned range, as every rectangle of :func:`planner.state_layout.part_rects` does."""
        off = 0
        for m in self.parts[part].masters:
            if off <= at and at + numel <= off + m.numel():
                return self._moment(m, key).view(-1)[at - off:at - off + numel]
            off += m.numel()
        raise RuntimeError(f"ZeRO-1 part {part}: elements [{at}, {at + numel}) span two buckets' owned ranges "
                           "(planner.state_layout and executor.parallel.zero disagree)")

    def part_moments(self) -> list[dict[str, torch.Tensor]]:
        """This rank's Adam moments, one flat fp32 tensor per part and moment (zeros before the first
        step); part ``i`` is the concatenation of its owned ranges, bucket by bucket
        (:func:`planner.state_layout.part_rects`)."""
        return [{key: torch.cat([self._moment(m, key) for m in part.masters]) for key in MOMENTS}
                for part in self.parts]

    def set_part_moments(self, values: list[dict[str, torch.Tensor]], step: int, *, copy: bool = True) -> None:
        """Install per-part moments (as :meth:`part_moments` returns them) and the step count; with
        ``copy=False`` the state *is* views of ``values`` (flat fp32 tensors on the device), which
        the elastic switch then fills (:class:`executor.state.state_pieces.NewState`)."""
        for group in self.optimizer.param_groups:
            on_device = bool(group.get("fused") or group.get("capturable"))
            for part, moments in zip(self.parts, values, strict=True):
                sizes = [m.numel() for m in part.masters]
                split = {key: moments[key].to(part.device, torch.float32).reshape(-1).split(sizes) for key in MOMENTS}
                for j, m in enumerate(part.masters):
                    if not any(m is p for p in group["params"]):
                        continue
                    st: dict[str, torch.Tensor] = {
                        "step": torch.tensor(float(step), dtype=torch.float32,
                                             device=part.device if on_device else torch.device("cpu"))}
                    for key in MOMENTS:
                        st[key] = split[key][j].clone() if copy else split[key][j]
                    self.optimizer.state[m] = st

    def load_moments(self, moments: dict[str, dict[str, torch.Tensor]], step: int) -> None:
        """Install this rank's parts of ``moments`` (per local shard name) and the step count."""
        values = []
        for part in self.parts:
            out: dict[str, torch.Tensor] = {}
            for key in MOMENTS:
                pieces = []
                for bucket in part.spec.buckets:
                    lo, hi = bucket.owned(part.spec.index)
                    src = [narrow(moments[key][v.name].to(part.device, torch.float32), v) for v in bucket.views]
                    pieces.append(read_flat(src, lo, hi))
                out[key] = torch.cat(pieces)
            values.append(out)
        self.set_part_moments(values, step)
