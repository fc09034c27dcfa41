"""What a context-parallel (CP) stage's attention keeps per layer beyond a plain layer at ``S/cp``.

The executor (``executor.parallel.context_parallel``) all-gathers K and V of the whole sequence,
expands them to the query heads (GQA, ``_expand``; a no-op with as many K/V heads as query heads)
and runs SDPA per local chunk over slices of that one buffer. Counted on CPU/gloo
(tests/executor/test_cp_memory.py: saved tensors and the live-storage peak of the attention)::

    kv_e = 2 · b · S · kv' / t · e          the gathered buffer, kv' = h if GQA else kv
    saved      kv_e, not the local K,V       every slice SDPA saves is a view of the one buffer,
                                            and nothing else keeps the rank's own K,V
               + b·(S/cp)·h/t·e             the chunks' outputs are SDPA's, their concatenation
                                            is copied again for ``wo`` (without CP, ``wo``'s input
                                            is a view of SDPA's output)
    backward   + 3 · kv_e at its peak       the gradient of the buffer: each chunk's dK/dV, the
                                            slice/select backward's full-size zeros, their sum

A plain layer at ``S/cp`` (:func:`planner.cost.memory.layer_activation_bytes`) counts the rank's
own K,V (``2·b·(S/cp)·kv_saved·e/t``), so the CP extra saved is ``kv_e`` less that. Per recompute
mode (``saved``: per layer and micro-batch in flight; ``transient``: once, the layer whose
backward runs)::

    none       saved kv_e - own + out      transient 3·kv_e
    selective  saved 0 (the core keeps own q,k,v and recomputes the gather)   transient 4·kv_e
    full       saved 0                     transient 4·kv_e - own + out (the recomputed layer's
                                           ``none`` activations, counted apart, hold own K,V)
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.ops import DTYPE_BYTES, Numerics
from planner.cost.params import DEFAULT_PARAMS, CostParams
from planner.model import ModelSpec

BACKWARD_BUFFERS = 3  # kv_e-sized gradient buffers live at the attention backward's peak (module docstring)


@dataclass(frozen=True)
class CPAttentionMemory:
    """Bytes one CP rank's attention adds to a plain layer at ``S/cp``, per micro-batch."""

    saved: float  # per layer and micro-batch in flight
    transient: float  # once: the layer whose backward (and recompute) runs


def gathered_kv_bytes(model: ModelSpec, micro_batch: int, tp: int, dtype: str, seq_len: int | None = None) -> float:
    """``kv_e``: the gathered K,V of the whole sequence on one TP rank, expanded to the query heads."""
    heads = model.hidden_size if model.kv_dim != model.hidden_size else model.kv_dim
    return 2.0 * micro_batch * (seq_len or model.seq_len) * heads / tp * DTYPE_BYTES[dtype]


def cp_attention_memory(model: ModelSpec, *, micro_batch: int, tp: int, cp: int, dtype: str, recompute: str,
                        params: CostParams = DEFAULT_PARAMS, seq_len: int | None = None) -> CPAttentionMemory:
    """The CP extra of one layer (module docstring); zero without CP."""
    if cp <= 1:
        return CPAttentionMemory(0.0, 0.0)
    num = Numerics.from_params(dtype, params)
    kv_e = gathered_kv_bytes(model, micro_batch, tp, dtype, seq_len)
    own_kv = model.hidden_size if (num.expand_kv and model.kv_dim != model.hidden_size) else model.kv_dim
    tokens = micro_batch * ((seq_len or model.seq_len) // cp)
    own = 2.0 * tokens * own_kv / tp * num.e
    out = tokens * model.hidden_size / tp * num.e
    if recompute == "none":
        return CPAttentionMemory(kv_e - own + out, BACKWARD_BUFFERS * kv_e)
    if recompute == "selective":
        return CPAttentionMemory(0.0, (1 + BACKWARD_BUFFERS) * kv_e)
    return CPAttentionMemory(0.0, (1 + BACKWARD_BUFFERS) * kv_e - own + out)
