"""Memory per device: weights, gradients, optimizer states, activations in flight, overhead.

Parameters on one device of a stage with ``n`` layers and TP degree ``t``::

    P = n · (layer_params - 2h) / t  +  n · 2h             TP-sharded weights + replicated norms
      + [first stage] V·h / t                              vocab-parallel embedding
      + [last stage]  h + V·h / t                          final norm + LM head (not when tied
                                                           and the same stage holds the embedding)

Bytes per parameter (mixed precision, Megatron-style)::

    weights    e                  compute-dtype copy (e = 2 for bf16/fp16, 4 for fp32)
    gradients  4                  fp32 accumulation / reduction buffer
    optimizer  4 (master, only when e != 4) + 8 (Adam m and v), divided by Z
               Z = zero_shards: the owners of each parameter slice (the number of pipelines)
               under ZeRO-1, 1 without it

Activations saved for backward, per layer per micro-batch of ``T = b·s`` tokens (flash
attention keeps no s² scores; no dropout in Llama)::

    none       T·[e·(4h + (h + 2kv)/t + h/t + 3f/t) + 8 + 4·a/t]
               = norm inputs and outputs (4·T·h, replicated across TP), q/k/v after RoPE,
                 attention output (wo input), gate/up/SwiGLU outputs, fp32 RMSNorm rstd (2·4 B)
                 and the flash-attention log-sum-exp (4 B per head)
    selective  the same minus the attention output and log-sum-exp (recomputed from q/k/v)
    full       T·h·e (the layer input only) + ONE layer's ``none`` activations while it is
               recomputed in the backward

A stage holds ``in_flight`` micro-batches (1F1B: ``min(S - i, m)``; GPipe: ``m``). The first
stage adds the token ids (8 B/token), the last stage the final norm input/output and the
logits with their fp32 loss buffer, ``T·(2h·e + V/t·(e + 4))``, per micro-batch in flight.

Overhead per device: ``framework_gib + workspace_gib`` plus ``fragmentation`` times the tensor
bytes (``CostParams``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from planner.cost.ops import DTYPE_BYTES, GRAD_BYTES
from planner.cost.params import DEFAULT_PARAMS, CostParams
from planner.model import ModelSpec

GIB = float(1 << 30)


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per term on one device."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    overhead: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.overhead

    @property
    def total_gib(self) -> float:
        return self.total / GIB

    def to_gib_dict(self) -> dict[str, float]:
        out = {k: v / GIB for k, v in asdict(self).items()}
        out["total"] = self.total_gib
        return out


def stage_params(model: ModelSpec, layers: int, tp: int, first: bool, last: bool) -> float:
    """Parameters held by ONE device of a stage (see the module docstring)."""
    h = model.hidden_size
    p = layers * ((model.layer_params() - 2 * h) / tp + 2 * h)
    if first:
        p += model.embedding_params() / tp
    if last:
        p += h
        if not (model.tie_embeddings and first):
            p += model.vocab_size * h / tp
    return p


def layer_activation_bytes(model: ModelSpec, micro_batch: int, tp: int, dtype: str, recompute: str,
                           seq_len: int | None = None) -> float:
    """Bytes one layer keeps for its backward, per micro-batch (``full``: the layer input only)."""
    e = DTYPE_BYTES[dtype]
    h, f, kv, a = model.hidden_size, model.ffn_hidden_size, model.kv_dim, model.num_heads
    tokens = micro_batch * (seq_len or model.seq_len)
    if recompute == "full":
        return tokens * h * e
    per_token = e * (4 * h + (h + 2 * kv) / tp + 3 * f / tp) + 8
    if recompute == "none":
        per_token += e * h / tp + 4 * a / tp
    return tokens * per_token


def head_activation_bytes(model: ModelSpec, micro_batch: int, tp: int, dtype: str, seq_len: int | None = None) -> float:
    e = DTYPE_BYTES[dtype]
    tokens = micro_batch * (seq_len or model.seq_len)
    return tokens * (2 * model.hidden_size * e + model.vocab_size / tp * (e + 4))


def stage_memory(model: ModelSpec, *, layers: int, tp: int, first: bool, last: bool, micro_batch: int,
                 in_flight: int, dtype: str = "bf16", recompute: str = "none", zero_shards: int = 1,
                 params: CostParams = DEFAULT_PARAMS, seq_len: int | None = None) -> MemoryBreakdown:
    """Peak memory of ONE device of a stage (fast: plain arithmetic).

    ``micro_batch`` is the largest micro-batch of the pipeline, ``in_flight`` the number of
    micro-batches held (:func:`planner.cost.schedule.in_flight`), ``zero_shards`` the number of
    owners sharing the optimizer state under ZeRO-1 (1 = replicated)."""
    e = DTYPE_BYTES[dtype]
    p = stage_params(model, layers, tp, first, last)
    weights = p * e
    grads = p * GRAD_BYTES
    optimizer = p * ((4 if e != 4 else 0) + 8) / max(1, zero_shards)
    per_layer = layer_activation_bytes(model, micro_batch, tp, dtype, recompute, seq_len)
    acts = in_flight * layers * per_layer
    if recompute == "full":
        acts += layer_activation_bytes(model, micro_batch, tp, dtype, "none", seq_len)
    tokens = micro_batch * (seq_len or model.seq_len)
    if first:
        acts += in_flight * tokens * 8
    if last:
        acts += in_flight * head_activation_bytes(model, micro_batch, tp, dtype, seq_len)
    tensors = weights + grads + optimizer + acts
    overhead = (params.framework_gib + params.workspace_gib) * GIB + params.fragmentation * tensors
    return MemoryBreakdown(weights, grads, optimizer, acts, overhead)
