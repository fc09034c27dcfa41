"""Llama decoder built from a ModelSpec, tensor-parallel, cut into pipeline stages.

Block (pre-norm)::

    x = x + Wo · Attn(RoPE(Wq · n1(x)), RoPE(Wk · n1(x)), Wv · n1(x))     n = RMSNorm
    x = x + W_down · (silu(W_gate · n2(x)) * (W_up · n2(x)))

* RMSNorm: ``x / sqrt(mean(x²) + eps) * w`` (statistics in fp32).
* Residual stream: fp32 (``x`` stays fp32 under autocast), or with ``residual="bf16"``/``"fp16"``
  the autocast dtype inside the stage (Megatron's default; half the traffic of the norms and
  residual adds, and of the saved layer inputs). A stage's input and output stay fp32 either way,
  so what crosses a pipeline boundary does not change (the round trip through fp32 is exact).
* RoPE, rotate-half convention: for each head, pairs ``(x_i, x_{i+d/2})`` rotate by angle
  ``pos · θ^(-2i/d)`` (rescaled per ``rope_scaling``, :mod:`planner.rope`); applied as
  ``x·cos + rotate_half(x)·sin`` with precomputed tables (no loops).
* Grouped-query attention: each KV head serves ``num_heads / num_kv_heads`` consecutive query
  heads; SDPA with a causal mask. With TP degree ``t`` a rank holds ``num_heads/t`` query heads and
  the matching ``num_kv_heads/t`` KV heads (whole groups, so no KV head is split).

Parameter names are the logical (dense) names of :mod:`planner.layout`, e.g.
``layers.3.attn.wq.weight``, so a stage's ``named_parameters()`` maps 1:1 to logical tensors (this
rank's shard of them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from executor.data.packed_docs import DocSpans, packed_attention
from executor.model import fast_path
from executor.model.cast_once import WeightCopies, drop_grad_acc, hand_over_grads
from executor.model.chunked_loss import chunked_vocab_cross_entropy
from executor.model.recompute_core import recomputed_core
from executor.parallel.context_parallel import CPContext, cp_attention, cp_packed_attention, local_positions
from executor.parallel.tp_layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    copy_to_tp,
    vocab_parallel_cross_entropy,
)
from planner.errors import SpecError
from planner.model import ModelSpec
from planner.plan import Plan
from planner.rope import RopeScaling, inv_frequencies


def check_supported(plan: Plan) -> None:
    """Plan features this model does not run (beyond the plan's own structural checks)."""
    if plan.model.tie_embeddings:
        raise SpecError("model.tie_embeddings", "tied embeddings are not supported by the executor",
                        "train with an untied LM head (tie_embeddings: false)")


# ------------------------------------------------------------------------------ functional pieces


def rope_tables(seq_len: int, head_dim: int, theta: float, device: torch.device | None = None,
                scaling: RopeScaling | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables ``[seq_len, head_dim]`` (fp32) for the rotate-half RoPE convention, with
    the frequencies of :func:`planner.rope.inv_frequencies` (``scaling``: linear or llama3)."""
    inv = torch.tensor(inv_frequencies(head_dim, theta, scaling), dtype=torch.float64, device=device)
    ang = torch.arange(seq_len, dtype=torch.float64, device=device)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().float(), ang.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [b, heads, s, d]`` by position (tables cut to ``s``)."""
    s = x.shape[-2]
    c, sn = cos[:s].to(x.dtype), sin[:s].to(x.dtype)
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * c + rot * sn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, device: torch.device | None = None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # one fused kernel in x's dtype: the fp32 residual stream, or a bf16 one (its fp32
        # statistics, the scale rounded to bf16 as Megatron's bf16 weights are)
        return fast_path.rms_norm(x, self.weight, self.eps)


# ------------------------------------------------------------------------------ blocks


class Attention(nn.Module):
    def __init__(self, m: ModelSpec, *, tp: int, group: Any, recompute: str, device: torch.device | None,
                 cp: CPContext | None = None):
        super().__init__()
        self.group = group
        self.cp = cp  # set: this rank holds 2 of 2·cp sequence chunks (executor.parallel.context_parallel)
        self.heads = m.num_heads // tp
        self.kv_heads = m.num_kv_heads // tp
        self.head_dim = m.head_dim
        self.recompute_core = recompute == "selective"
        # SDPA backend preference of this device (cuDNN first on Hopper; empty on CPU), see fast_path
        self.attn_backends = fast_path.attention_backends(torch.device(device or "cpu"), m.head_dim)
        h = m.hidden_size
        self.wq = ColumnParallelLinear(h, h, tp=tp, group=group, device=device)
        self.wk = ColumnParallelLinear(h, m.kv_dim, tp=tp, group=group, device=device)
        self.wv = ColumnParallelLinear(h, m.kv_dim, tp=tp, group=group, device=device)
        self.wo = RowParallelLinear(h, h, tp=tp, group=group, device=device)

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: DocSpans | None = None) -> torch.Tensor:
        if docs is not None:
            if self.cp is not None:
                return cp_packed_attention(q, k, v, docs, self.cp, self.attn_backends)
            return packed_attention(q, k, v, docs, self.attn_backends)
        if self.cp is not None:
            return cp_attention(q, k, v, self.cp, self.attn_backends)
        return fast_path.causal_attention(q, k, v, self.attn_backends)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                docs: DocSpans | None = None) -> torch.Tensor:
        b, s, _ = x.shape
        x = copy_to_tp(x, self.group)
        q = self.wq(x, input_is_copied=True).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(x, input_is_copied=True).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x, input_is_copied=True).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.recompute_core and torch.is_grad_enabled():
            o = recomputed_core(self._core, q, k, v, docs)
        else:
            o = self._core(q, k, v, docs)
        return self.wo(o.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, m: ModelSpec, *, tp: int, group: Any, device: torch.device | None):
        super().__init__()
        self.group = group
        h, f = m.hidden_size, m.ffn_hidden_size
        self.w_gate = ColumnParallelLinear(h, f, tp=tp, group=group, device=device)
        self.w_up = ColumnParallelLinear(h, f, tp=tp, group=group, device=device)
        self.w_down = RowParallelLinear(f, h, tp=tp, group=group, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = copy_to_tp(x, self.group)
        return self.w_down(F.silu(self.w_gate(x, input_is_copied=True)) * self.w_up(x, input_is_copied=True))


class Block(nn.Module):
    def __init__(self, m: ModelSpec, *, tp: int, group: Any, recompute: str, device: torch.device | None,
                 cp: CPContext | None = None):
        super().__init__()
        self.full_recompute = recompute == "full"
        self.attn_norm = RMSNorm(m.hidden_size, m.norm_eps, device)
        self.attn = Attention(m, tp=tp, group=group, recompute=recompute, device=device, cp=cp)
        self.mlp_norm = RMSNorm(m.hidden_size, m.norm_eps, device)
        self.mlp = MLP(m, tp=tp, group=group, device=device)

    def _forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 docs: DocSpans | None = None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin, docs)
        return x + self.mlp(self.mlp_norm(x))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                docs: DocSpans | None = None) -> torch.Tensor:
        if self.full_recompute and torch.is_grad_enabled():
            return checkpoint(self._forward, x, cos, sin, docs, use_reentrant=False)
        return self._forward(x, cos, sin, docs)


# ------------------------------------------------------------------------------ stage


class StageModule(nn.Module):
    """Layers ``[start, end)`` of the model on one TP rank, plus the vocab-parallel embedding on the
    first stage and the final norm + vocab-parallel LM head on the last stage.

    ``forward(x)`` maps token ids ``[b, s]`` (first stage) or hidden states ``[b, s, h]`` to hidden
    states; ``loss(hidden, labels)`` (last stage) returns per-token fp32 cross-entropy ``[b, s]``.
    Parameters are created empty; :meth:`load_logical` fills them from logical tensors.
    ``param_gate(key)``, when set, is called before the parameters of ``embed``, ``layers.<i>`` and
    ``head`` are first used in a forward (ZeRO-1 waits there for their all-gather, :mod:`executor.parallel.zero`).
    """

    def __init__(self, m: ModelSpec, *, layers: tuple[int, int], first: bool, last: bool, tp: int, tp_rank: int,
                 group: Any, device: torch.device | None = None, recompute: str = "none",
                 residual: str = "fp32", cp: CPContext | None = None,
                 chunks: Sequence[tuple[int, int]] = ()):
        super().__init__()
        self.spec = m
        self.cp = cp  # context parallelism: inputs, labels and outputs are this rank's sequence chunks
        self.low_residual = residual != "fp32"  # the residual stream in the autocast dtype (if any)
        self.first, self.last = first, last
        self.tp, self.tp_rank, self.group = tp, tp_rank, group
        self.param_gate: Callable[[str], None] | None = None
        # cross-entropy in row chunks (executor.model.chunked_loss) instead of the unchunked function, which
        # keeps an fp32 softmax of the micro-batch's logits. Off by default: the planner's memory
        # model (planner.cost.memory.head_activation_bytes) counts the unchunked function's 4·V/t B a
        # token; chunked, the loss saves e·V/t + 13 (the logits in the compute dtype, int64 target
        # index, bool mask, fp32 lse). benchmarks/executor/peers.py turns it on.
        self.chunked_loss = False
        self.embed = (VocabParallelEmbedding(m.vocab_size, m.hidden_size, tp=tp, tp_rank=tp_rank, group=group,
                                             device=device) if first else None)
        # an interleaved stage's layer chunks (``forward(x, chunk=c)`` runs one): the embedding
        # belongs to chunk 0 of the first stage, the head to the last chunk of the last stage
        self.chunk_keys = [[str(i) for i in range(a, b)] for a, b in (chunks or (layers,))]
        self.layers = nn.ModuleDict({
            k: Block(m, tp=tp, group=group, recompute=recompute, device=device, cp=cp)
            for ks in self.chunk_keys for k in ks})
        if last:
            self.final_norm: RMSNorm | None = RMSNorm(m.hidden_size, m.norm_eps, device)
            self.lm_head: ColumnParallelLinear | None = ColumnParallelLinear(
                m.hidden_size, m.vocab_size, tp=tp, group=group, device=device)
        else:
            self.final_norm, self.lm_head = None, None
        # cast-once weights (executor.model.cast_once): per gate key, the linears whose copies it refreshes
        self.weight_copies = WeightCopies()
        self._linears = {key: [x for x in mod.modules() if isinstance(x, (ColumnParallelLinear, RowParallelLinear))]
                         for key, mod in [*(("layers." + k, b) for k, b in self.layers.items()),
                                          *([("head", self.lm_head)] if self.lm_head is not None else [])]}
        self._cast_once = False  # the owner turns it on with a way to know when weights change (Engine)
        # set by the schedule's runner for one forward whose backward runs next: the linears take the
        # accumulated weight gradients into their GEMMs (executor.model.cast_once.hand_over_grads)
        self.accumulate_in_gemm = False
        cos, sin = rope_tables(m.seq_len, m.head_dim, m.rope_theta, device, m.rope_scaling)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def attach(self, group: Any, cp_group: Any = None) -> None:
        """The stage's TP group (and this rank's CP group) for a module built with ``group=None``
        before its groups existed (the elastic switch builds its next engine early,
        :mod:`executor.switch.elastic_switch`): every layer that holds the group gets it."""
        cp = replace(self.cp, group=cp_group) if self.cp is not None else None
        for mod in self.modules():
            if "group" in vars(mod):  # the TP layers (executor.parallel.tp_layers), Attention, MLP, this
                mod.group = group
            if "cp" in vars(mod):  # Attention and this
                mod.cp = cp  # type: ignore[assignment]

    @property
    def cast_once(self) -> bool:
        """Whether linears multiply with one low-precision weight copy per step while autocast runs
        (:mod:`executor.model.cast_once`), instead of autocast's cast per micro-batch. Off unless the owner
        of the module calls :meth:`weights_changed` whenever the weights change without their
        version counters showing it (the :class:`~executor.train.engine.Engine` does, and turns it on)."""
        return self._cast_once

    @cast_once.setter
    def cast_once(self, on: bool) -> None:
        self._cast_once = on
        if not on:
            self.weight_copies.drop([x for xs in self._linears.values() for x in xs])

    def weights_changed(self, *_: object) -> None:
        """The weights changed in a way their version counters may not show (an optimizer step,
        a collective): the cast-once copies are made again before their next use."""
        self.weight_copies.invalidate()

    def _fresh_copies(self, key: str, dev: str) -> None:
        """Make ``key``'s cast-once copies current; under :attr:`accumulate_in_gemm` hand its linears'
        accumulated gradients to their GEMMs (not in a fully recomputed block, whose recomputed
        forward would not see them)."""
        if self._cast_once and torch.is_autocast_enabled(dev):
            self.weight_copies.refresh(key, self._linears[key], torch.get_autocast_dtype(dev))
            block = self.layers[key.removeprefix("layers.")] if key != "head" else None
            if self.accumulate_in_gemm and not getattr(block, "full_recompute", False):
                hand_over_grads(self._linears[key])

    def forward(self, x: torch.Tensor, docs: DocSpans | None = None, chunk: int | None = None) -> torch.Tensor:
        """``docs``: the documents packed into the one row of ``x`` (positions restart in each, and
        attention stays inside each; see :mod:`executor.data.packed_docs`). ``chunk``: run only
        that layer chunk of an interleaved stage (None: every layer)."""
        gate = self.param_gate
        keys = self.layers.keys() if chunk is None else self.chunk_keys[chunk]
        embeds = chunk is None or chunk == 0
        heads = self.last and (chunk is None or chunk == len(self.chunk_keys) - 1)
        if self.embed is not None and embeds:
            if gate is not None:
                gate("embed")
            x = self.embed(x)
        dev = x.device.type
        low = self.low_residual and torch.is_autocast_enabled(dev)
        if low:
            x = x.to(torch.get_autocast_dtype(dev))
        cos: torch.Tensor = self.rope_cos  # type: ignore[assignment]
        sin: torch.Tensor = self.rope_sin  # type: ignore[assignment]
        if self.cp is not None:  # this rank's chunks sit at global positions (in the row, if packed)
            pos = local_positions(x.shape[1] * self.cp.cp, self.cp.cp, self.cp.cp_rank, cos.device)
            if docs is not None:
                pos = docs.positions(cos.device)[pos]
            cos, sin = cos[pos], sin[pos]
        elif docs is not None:  # per-token tables: [T, d], which apply_rope takes like a cut table
            pos = docs.positions(cos.device)
            cos, sin = cos[pos], sin[pos]
        for key in keys:
            if gate is not None:
                gate("layers." + key)
            self._fresh_copies("layers." + key, dev)
            x = self.layers[key](x, cos, sin, docs)
            drop_grad_acc(self._linears["layers." + key])
        if gate is not None and heads:  # loss() follows on the last stage
            gate("head")
        return x.float() if low else x

    def loss(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        self._fresh_copies("head", hidden.device.type)
        try:
            return self.head_loss(hidden, labels)
        finally:
            drop_grad_acc(self._linears["head"])

    def head_loss(self, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Final norm, LM head and cross-entropy (what :func:`executor.model.fast_path.compile_blocks`
        compiles; :meth:`loss` first makes the head's cast-once copy current, outside it)."""
        assert self.final_norm is not None and self.lm_head is not None, "loss() is for the last stage"
        logits = self.lm_head(self.final_norm(hidden))
        start = self.tp_rank * (self.spec.vocab_size // self.tp)
        if self.chunked_loss:
            return chunked_vocab_cross_entropy(logits, labels, vocab_start=start, group=self.group)
        return vocab_parallel_cross_entropy(logits, labels, vocab_start=start, group=self.group)

    @torch.no_grad()
    def load_logical(self, tensors: dict[str, torch.Tensor], shard_dims: dict[str, int | None]) -> None:
        """Copy this rank's shard of every logical tensor into the parameters."""
        self.weights_changed()
        for name, p in self.named_parameters():
            p.copy_(shard_of(tensors[name], shard_dims[name], self.tp, self.tp_rank))


def shard_of(full: torch.Tensor, dim: int | None, tp: int, tp_rank: int) -> torch.Tensor:
    """This TP rank's contiguous part of ``full`` along ``dim`` (all of it if ``dim`` is None)."""
    if dim is None or tp == 1:
        return full
    n = full.shape[dim] // tp
    return full.narrow(dim, tp_rank * n, n)
