"""What a context-parallel (CP) stage's attention keeps per layer beyond a plain layer at ``S/cp``.

The executor (``executor.parallel.cp_blockwise``) all-gathers K and V of the whole sequence,
expands them to the query heads (GQA) and runs flash kernels piece by piece, merged by
log-sum-exp. Its one autograd node keeps q, the rank's **own** K,V, the merged output and the
log-sum-exp; the backward gathers K,V again. Counted on CPU/gloo (tests/executor/test_cp_memory.py:
saved tensors and the live-storage peak of the attention's backward)::

    kv_e = 2 · b · S · kv' / t · e          the gathered buffer, kv' = h if GQA else kv
    out  = b · (S/cp) · h/t · e             the merged output, laid out so that ``wo``'s input
                                            is a view of it, as of SDPA's without CP
    saved      + 0                          a plain layer at ``S/cp`` counts q, own K,V, the
                                            output and log-sum-exp already
    backward   kv_e                         the gathered, expanded K,V again
               + kv_e · 4/e                 their gradient, summed in fp32 over the pieces
               + kv_e · (2cp-1)/(2cp)       the largest piece's dK, dV (its keys before the chunk)
               + kv_e / (2cp) each          the rank's dQ, and one piece's dQ
               = kv_e · (2 + 4/e) + 2 · kv_e/(2cp)   at the peak (fp32: 3·kv_e + ...)

Per recompute mode (``saved``: per layer and micro-batch in flight; ``transient``: once, the
layer whose backward runs)::

    none       saved 0                     transient B (the backward's peak above)
    selective  saved 0 (the core keeps q,k,v and runs again, output and all)   transient B + out
    full       saved 0                     transient B + out (the recomputed layer's ``none``
                                           activations, counted apart, hold the rest)
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.ops import DTYPE_BYTES, Numerics
from planner.cost.params import DEFAULT_PARAMS, CostParams
from planner.model import ModelSpec

BACKWARD_GATHERED = 2  # kv_e-sized buffers besides the fp32 sum at the backward's peak (module docstring)


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
    tokens = micro_batch * ((seq_len or model.seq_len) // cp)
    expanded = num.expand_kv and model.kv_dim != model.hidden_size
    # a plain layer counts its own K,V expanded to the query heads where the dense path expands them;
    # the CP node keeps them as they are
    own_gap = 2.0 * tokens * (model.hidden_size - model.kv_dim) / tp * num.e if expanded else 0.0
    out = tokens * model.hidden_size / tp * num.e
    backward = kv_e * (BACKWARD_GATHERED + 4.0 / num.e) + 2.0 * kv_e / (2 * cp)
    if recompute == "none":
        return CPAttentionMemory(-own_gap, backward)
    return CPAttentionMemory(0.0, backward + out)
