"""The planner's view of the cost model: linear per-stage costs for the refinement.

Everything here is computed by the cost model's own pure functions (:mod:`planner.cost`): device
profiles for the layer, embedding and head times, :mod:`planner.cost.links` for TP all-reduces,
p2p sends and the gradient sync, :mod:`planner.cost.memory` for memory, and the closed-form
schedule times of :mod:`planner.cost.schedule`. The planner only reshapes them:

* a stage's time per micro-batch (forward + backward, p2p sends included) is linear in its layer
  count, ``a·n + e``, and so is its memory, ``w·n + f`` (``stage_memory`` is linear in ``layers``);
  :meth:`Oracle.stage_cost` returns those four numbers for a unit in a given position;
* the step time of a candidate is ``max_p T_p + sync + optimizer`` with ``T_p`` the 1F1B/GPipe
  closed form, the gradient sync an all-reduce over the pipelines of the largest gradient any
  device holds, across the slowest link between pipelines, of which ``1 - dp_overlap`` is exposed,
  and the optimizer step of the device holding the most parameters. This *surrogate* ranks the
  candidates; the plan the planner returns carries the full :func:`planner.cost.estimate`, which
  also decides between the best few candidates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planner.cluster import ClusterSpec, Link
from planner.cost.communicators import stage_communicators
from planner.cost.context import local_seq
from planner.cost.cp_memory import cp_attention_memory
from planner.cost.links import allreduce_time
from planner.cost.memory import GIB, stage_memory, stage_params, state_bytes
from planner.cost.params import CostParams
from planner.cost.profile_set import ProfileSet
from planner.cost.stage import activation_bytes, slots_boundary_time, stage_time
from planner.layout import stage_tensors
from planner.model import ModelSpec
from planner.schedules.held import Held
from planner.search.graph import Unit, slowest_link_among
from planner.search.layer_split import StageCost
from planner.search.stats import SearchStats


@dataclass(frozen=True)
class Setting:
    """The options the search enumerates for a candidate."""

    micro_batch: int = 1
    recompute: str = "none"
    zero: int = 0
    schedule: str = "1f1b"
    dtype: str = "bf16"
    compile: bool = False  # compiled blocks: the compiled path's activation bytes (planner.cost.memory)

    def label(self) -> str:
        return (f"mbs={self.micro_batch} recompute={self.recompute} zero={self.zero} {self.schedule}"
                + (" compiled" if self.compile else ""))


class Oracle:
    """Cached cost-model numbers for one (cluster, model, global batch)."""

    def __init__(self, cluster: ClusterSpec, model: ModelSpec, profiles: ProfileSet | None = None):
        self.cluster = cluster
        self.model = model
        self.profiles = profiles or ProfileSet(cluster.catalog)
        self.params: CostParams = self.profiles.params
        self._time_cache: dict[tuple[object, ...], tuple[float, float]] = {}
        self._mem_cache: dict[tuple[object, ...], StageCost] = {}
        self._links: dict[tuple[str, str], Link] = {}
        self._sync_cache: dict[tuple[object, ...], tuple[float, float]] = {}
        self._slowest: dict[frozenset[str], Link | None] = {}
        self._chains: dict[tuple[str, ...], tuple[Link, ...]] = {}
        self.type_cache: dict[tuple[object, ...], Any] = {}  # per pipeline type, see candidate._refine_type
        self.stats = SearchStats()  # the search's work counters (planner.search.stats)

    def node_link(self, a: str, b: str) -> Link:
        """``cluster.node_link``, cached."""
        hit = self._links.get((a, b))
        if hit is None:
            hit = self._links[a, b] = self._links[b, a] = self.cluster.node_link(a, b)
        return hit

    def chain_links(self, nodes: tuple[str, ...]) -> tuple[Link, ...]:
        """The links between consecutive stages on ``nodes`` (cached: identical pipelines recur on
        the same nodes across structures and settings)."""
        hit = self._chains.get(nodes)
        if hit is None:
            hit = self._chains[nodes] = tuple(self.node_link(a, b) for a, b in zip(nodes, nodes[1:]))
        return hit

    def slowest_link(self, nodes: frozenset[str]) -> Link | None:
        """:func:`planner.search.graph.slowest_link_among`, cached."""
        if nodes not in self._slowest:
            self._slowest[nodes] = slowest_link_among(self.cluster, nodes)
        return self._slowest[nodes]

    # ------------------------------------------------------------------ per stage
    def stage_seconds(self, unit: Unit, layers: int, first: bool, last: bool, s: Setting) -> float:
        """Forward + backward of one micro-batch on ``unit`` holding ``layers`` layers (TP included)."""
        devs = [self.cluster.device(d) for d in unit.devices]
        st = stage_time(self.model, layers=layers, first=first, last=last, micro_batch=s.micro_batch, tp=unit.tp,
                        devices=[(self.profiles.get(d.gpu), d.slowdown) for d in devs],
                        tp_link=unit.link if unit.tp > 1 else None, dtype=s.dtype, recompute=s.recompute,
                        params=self.params, cp=unit.cp, cp_link=unit.link if unit.cp > 1 else None)
        return st.forward_s + st.backward_s

    def send_seconds(self, a: Unit, b: Unit, s: Setting) -> float:
        """One micro-batch's activation (or gradient) sent from stage ``a`` to stage ``b``."""
        nbytes = activation_bytes(self.model, s.micro_batch, s.dtype)
        return slots_boundary_time(nbytes, a.devices, a.tp, b.devices, b.tp, self.cluster, self.params)

    def stage_cost(self, unit: Unit, first: bool, last: bool, in_flight: int, prev: Unit | None,
                   nxt: Unit | None, s: Setting, zero_shards: int, held: tuple[Held, ...] | None = None) -> StageCost:
        """Linear time and memory of ``unit`` as a stage between ``prev`` and ``nxt``.

        Time (cached per unit signature, position, neighbours' links and TP, and the setting's
        micro-batch size, recompute and dtype): ``a`` = one more layer's forward + backward, ``e`` =
        the embedding/head and the stage's own blocking sends, as :mod:`planner.cost.step` charges
        them (the activation to ``nxt`` in the forward, the gradient to ``prev`` in the backward).
        Memory (cached per GPU type, TP degree, position, in-flight count and setting): from
        :func:`planner.cost.memory.stage_memory`, which is linear in the layer count, with the
        device's measured activation bytes where its tables have them (as the estimate), so the
        micro-batch sizes the search keeps are those that fit by measurement. ``held``: a split-backward
        schedule's moments, in place of ``in_flight`` (:func:`planner.cost.schedule.split_backward_held`)."""
        self.stats.oracle_calls += 1
        link_prev = self.node_link(prev.node, unit.node) if prev is not None else None
        link_next = self.node_link(unit.node, nxt.node) if nxt is not None else None
        tkey = (unit.signature, first, last, link_prev, (prev.tp, prev.cp) if prev else 0, link_next,
                (nxt.tp, nxt.cp) if nxt else 0, s.micro_batch, s.recompute, s.dtype)
        times = self._time_cache.get(tkey)
        if times is None:
            self.stats.oracle_misses += 1
            t0 = self.stage_seconds(unit, 0, first, last, s)
            t1 = self.stage_seconds(unit, 1, first, last, s)
            fixed = t0 + (self.send_seconds(unit, nxt, s) if nxt is not None else 0.0)
            fixed += self.send_seconds(unit, prev, s) if prev is not None else 0.0
            times = self._time_cache[tkey] = (t1 - t0, fixed)
        # CP slots own gradients beside the pipelines; the engine shards where every parameter has
        # two owners or more (planner.state_layout.zero_sharded: the search gives a plan's stages
        # one CP degree, so a lone pipeline shards when its stages use CP)
        shards = zero_shards * unit.cp if s.zero and zero_shards * unit.cp > 1 else 1
        device_params = self.profiles.params_for(unit.gpu)  # overhead terms per GPU type
        mkey = (unit.gpu, unit.tp, unit.cp, unit.memory_gib, first, last, in_flight, s.micro_batch, s.recompute,
                s.dtype,
                shards, s.compile, device_params, held)
        mem = self._mem_cache.get(mkey)
        if mem is None:
            self.stats.oracle_misses += 1
            # measured activation bytes where the device's tables have them, as the estimate takes them
            seq = local_seq(self.model, unit.cp)
            layer_act, head_act = self.profiles.get(unit.gpu).stage_activations(
                self.model, s.micro_batch, unit.tp, s.dtype, s.recompute, last=last, compile=s.compile,
                seq_len=seq if unit.cp > 1 else None)
            kw = dict(tp=unit.tp, first=first, last=last, micro_batch=s.micro_batch, in_flight=in_flight,
                      dtype=s.dtype, recompute=s.recompute, zero_shards=shards, params=device_params,
                      compile=s.compile, layer_activation=layer_act, head_activation=head_act, seq_len=seq, held=held,
                      cp_attention=cp_attention_memory(self.model, micro_batch=s.micro_batch, tp=unit.tp, cp=unit.cp,
                                                       dtype=s.dtype, recompute=s.recompute, params=device_params))
            comm = stage_communicators(unit.tp, first, last, unit.cp) * device_params.comm_gib * GIB
            mem0 = stage_memory(self.model, layers=0, **kw).required + comm  # type: ignore[arg-type]
            mem1 = stage_memory(self.model, layers=1, **kw).required + comm  # type: ignore[arg-type]
            mem = self._mem_cache[mkey] = StageCost(times[0], times[1], mem1 - mem0, mem0, unit.memory_gib * GIB)
        if mem.per_layer_s != times[0] or mem.fixed_s != times[1]:
            mem = StageCost(times[0], times[1], mem.per_layer_bytes, mem.fixed_bytes, mem.capacity_bytes)
        return mem

    def copy_bytes(self, elements: float, s: Setting, pipelines: int, gpu: str) -> float:
        """Bytes a device holds for ``elements`` of its shards cut into several sync slices
        (:func:`planner.cost.partial_params.partial_params`): their own gradients, and under ZeRO-1 their own
        weights, beside their slots in the flat buffers (fragmentation included)."""
        if pipelines <= 1 or elements <= 0:
            return 0.0
        cut = state_bytes(0.0, pipelines=pipelines, zero_shards=pipelines if s.zero else 1, partial=elements)
        return (cut.weights + cut.gradients) * (1 + self.profiles.params_for(gpu).fragmentation)

    # ------------------------------------------------------------------ per step
    def allreduce_s(self, nbytes: float, ranks: int, link: Link | None) -> float:
        """Flat all-reduce of ``nbytes`` over ``ranks`` ranks whose slowest link is ``link`` (cached)."""
        if ranks <= 1 or link is None or nbytes <= 0:
            return 0.0
        key = (nbytes, ranks, link)
        hit = self._sync_cache.get(key)
        if hit is None:
            hit = self._sync_cache[key] = (allreduce_time(nbytes, ranks, link, self.params), 0.0)
        return hit[0]

    def optimizer_seconds(self, unit: Unit, layers: int, first: bool, last: bool, zero_shards: int,
                          s: Setting) -> float:
        """AdamW step of one device of ``unit`` (as :func:`planner.cost.estimate` counts it). A CP unit
        adds the all-reduce of its gradients over its slots (the surrogate's sync across pipelines
        does not see the slots; the full estimate syncs both in one group)."""
        prof = self.profiles.get(unit.gpu)
        params = self.stage_params(layers, unit.tp, first, last)
        shard = params / (zero_shards * unit.cp if s.zero else 1)
        tensors = stage_tensors(self.model, layers, first, last)
        slots = self.allreduce_s(params * 4.0, unit.cp, unit.link) * (0.5 if s.zero else 1.0)
        return prof.optimizer_time(shard, tensors, s.dtype) * unit.slowdown + slots

    def stage_params(self, layers: int, tp: int, first: bool, last: bool) -> float:
        return stage_params(self.model, layers, tp, first, last)
