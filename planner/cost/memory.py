"""Memory per device: weights, gradients, optimizer states, activations in flight, overhead.

Parameters on one device of a stage with ``n`` layers and TP degree ``t``::

    P = n · (layer_params - 2h) / t  +  n · 2h             TP-sharded weights + replicated norms
      + [first stage] V·h / t                              vocab-parallel embedding
      + [last stage]  h + V·h / t                          final norm + LM head (not when tied
                                                           and the same stage holds the embedding)

Bytes per parameter (the executor: parameters are the fp32 master weights, the compute dtype
comes from autocast; executor/engine.py)::

    weights    4                  fp32 parameters
    gradients  4                  fp32 accumulation / reduction buffer
    optimizer  8 (Adam m and v), divided by Z = zero_shards: the owners of each parameter slice
               (the number of pipelines) under ZeRO-1, 1 without it

Activations saved for backward, per layer per micro-batch of ``T = b·s`` tokens (``e`` compute
bytes, ``r`` residual bytes, ``a`` heads; flash/SDPA keeps no s² scores; no dropout)::

    none       T·[2·(r·h + 4·h + 4)                 two RMSNorms: input, fp32 normalised, rstd
                  + 5·e·h  (r != e) or 2·e·h        autocast casts of the norm outputs (q,k,v,gate,up)
                  + e·(h + 2·kv')/t + e·h/t + 4·a/t q, k, v into SDPA (kv' = h if K/V are expanded
                                                    for GQA, else kv), attention output, log-sum-exp
                  + 4·e·f/t]                        gate, up, silu(gate), their product (w_down input)
               + [e != 4] 4·s·d·e                   RoPE cos/sin tables cast to the compute dtype
                                                    for q and for k (d = head_dim)
    selective  the attention core is checkpointed: it keeps q, k, v (unexpanded) and its output,
               drops the expanded K/V copies and the log-sum-exp
    full       T·r·h (the layer input only) + ONE layer's ``none`` activations while it is
               recomputed in the backward

Per micro-batch in flight a stage also holds: with autocast (bf16/fp16) and recompute other
than full, the compute-dtype copies of its matmul weights (``e`` per matmul parameter: saved by
the matmuls for their backward); on every stage but the last, its output ``T·r·h`` (kept for the
backward); on the first stage the token ids (8 B/token); on the last stage the final norm and the
logits with their fp32 loss buffer, ``T·(r·h + 4·h + 4 + e·h + V/t·(e + 4))``.
A stage holds ``in_flight`` micro-batches (1F1B: ``min(S - i, m)``; GPipe: ``m``) at most, but the
gradients (dropped at each step's start) only exist from the stage's first backward on, when it
holds ``held_with_grads`` (1F1B: ``min(S - i, m)`` if a forward follows the first backward,
i.e. ``m > S - i``, else one less; GPipe: ``m - 1``); the peak is the larger of the two moments.

Measured bytes replace the formulas when given (``layer_activation``, ``head_activation``: per
micro-batch, the input included, the weight casts not; ``MeasuredProfile.activation_bytes``
converts the profiler's figures to that). On an H100 and an H200 (llama-1.3b), the formulas equal
the measured bytes to within 1 KiB per layer and per head at TP 1, a few MiB at TP 2.

ZeRO-1 step buffers (``zero_shards = k > 1``; executor/zero.py). After the schedule, per part of
``c = P/k`` elements (``P`` the device's parameters), the executor allocates three whole-part fp32
vectors: the reduce-scattered gradient (``mine``, from ``reduce_grads`` while the full gradients and
the Adam state are still allocated), the master copy of the part (``master.data``) and the squared
gradient of the norm (``grad_sq_norm``'s ``pow(2)``); and per round of at most ``ZERO_BUCKET_NUMEL``
elements per owner, ``k`` padded input pieces, the padding temporary and the output of the
reduce-scatter (the all-gather's ``k + 1`` round buffers are fewer)::

    step_buffers = 3 · 4·P/k  +  (k + 2) · 4 · min(c, ZERO_BUCKET_NUMEL)

Each whole-part vector is ONE allocation larger than any block the schedule frees (per-tensor
activations, per-parameter gradients), so the caching allocator cannot serve it from what the
schedule left cached and reserves new device memory: the figure that a GPU shows and that runs out
is the schedule's peak PLUS these buffers (4 x H200, 2026-11-26, llama2-7b PP2 x DP2 ZeRO-1: the
estimate without them was 24 % under the measured device memory; 3 · 6.3 GiB is that gap). That is
``total``; a device without that much room still runs the step when the tensors live during it fit
(the allocator frees its cached blocks and retries first): ``required`` = the larger of the
schedule's peak and ``weights + optimizer + 2 parts + max(gradients + one round, one part)``, which
is what out-of-memory checks compare with the capacity.

Overhead per device: ``framework_gib + workspace_gib`` plus ``fragmentation`` times the tensor
bytes (``CostParams``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from planner.cost.ops import GRAD_BYTES, Numerics
from planner.cost.params import DEFAULT_PARAMS, CostParams
from planner.layout import layer_numel
from planner.model import ModelSpec

GIB = float(1 << 30)
# Elements per owner in one reduce-scatter / all-gather round of ZeRO-1 (executor.grad_sync's
# DEFAULT_BUCKET_NUMEL; tests/planner/test_cost_memory.py checks that they agree).
ZERO_BUCKET_NUMEL = 1 << 25


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per term on one device."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    overhead: float
    step_buffers: float = 0.0  # ZeRO-1's flat buffers after the schedule (module docstring)
    step_live: float = 0.0  # ZeRO-1: bytes live at once during its step, overhead included (0 without)

    @property
    def total(self) -> float:
        """The device memory the run reserves when the device has room for it (what it shows)."""
        return self.weights + self.gradients + self.optimizer + self.activations + self.overhead + self.step_buffers

    @property
    def required(self) -> float:
        """The device memory the run cannot do without: the schedule's peak, or ZeRO-1's step where
        larger. Short of room, the caching allocator frees the blocks the schedule left cached and
        retries before it fails, so the step buffers need room of their own only where the tensors
        live during the step exceed the schedule's peak."""
        return max(self.total - self.step_buffers, self.step_live)

    @property
    def required_gib(self) -> float:
        return self.required / GIB

    @property
    def total_gib(self) -> float:
        return self.total / GIB

    def to_gib_dict(self) -> dict[str, float]:
        out = {k: v / GIB for k, v in asdict(self).items() if k != "step_live"}
        out["total"] = self.total_gib
        return out


def stage_params(model: ModelSpec, layers: int, tp: int, first: bool, last: bool) -> float:
    """Parameters held by ONE device of a stage (see the module docstring)."""
    h = model.hidden_size
    sharded, replicated = layer_numel(model)
    p = layers * (sharded / tp + replicated)
    if first:
        p += model.embedding_params() / tp
    if last:
        p += h
        if not (model.tie_embeddings and first):
            p += model.vocab_size * h / tp
    return p


def _num(dtype: str, params: CostParams) -> Numerics:
    return Numerics.of(dtype, params.fp32_residual, params.autocast_weight_copies, params.expand_kv_heads)


def layer_activation_bytes(model: ModelSpec, micro_batch: int, tp: int, dtype: str, recompute: str,
                           seq_len: int | None = None, params: CostParams = DEFAULT_PARAMS) -> float:
    """Bytes one layer keeps for its backward, per micro-batch (``full``: the layer input only)."""
    num = _num(dtype, params)
    e, r = num.e, num.r
    h, f, kv, a = model.hidden_size, model.ffn_hidden_size, model.kv_dim, model.num_heads
    tokens = micro_batch * (seq_len or model.seq_len)
    if recompute == "full":
        return tokens * h * r
    per_token = 2 * (r * h + 4 * h + 4) + (5 if r != e else 2) * e * h + 4 * e * f / tp
    if recompute == "none":
        kv_saved = h if (num.expand_kv and kv != h) else kv
        per_token += e * (h + 2 * kv_saved) / tp + e * h / tp + 4 * a / tp
    else:  # selective
        per_token += e * (h + 2 * kv) / tp + e * h / tp
    rope_casts = 4 * (seq_len or model.seq_len) * model.head_dim * e if e != 4 else 0.0
    return tokens * per_token + rope_casts


def head_activation_bytes(model: ModelSpec, micro_batch: int, tp: int, dtype: str, seq_len: int | None = None,
                          params: CostParams = DEFAULT_PARAMS) -> float:
    num = _num(dtype, params)
    e, r, h = num.e, num.r, model.hidden_size
    tokens = micro_batch * (seq_len or model.seq_len)
    return tokens * (r * h + 4 * h + 4 + e * h + 4 * model.vocab_size / tp + 9)


def stage_memory(model: ModelSpec, *, layers: int, tp: int, first: bool, last: bool, micro_batch: int,
                 in_flight: int, dtype: str = "bf16", recompute: str = "none", zero_shards: int = 1,
                 params: CostParams = DEFAULT_PARAMS, seq_len: int | None = None,
                 layer_activation: float | None = None, head_activation: float | None = None,
                 held_with_grads: int | None = None) -> MemoryBreakdown:
    """Peak memory of ONE device of a stage (fast: plain arithmetic).

    ``micro_batch`` is the largest micro-batch of the pipeline, ``in_flight`` the number of
    micro-batches held (:func:`planner.cost.schedule.in_flight`), ``zero_shards`` the number of
    owners sharing the optimizer state under ZeRO-1 (1 = replicated). ``layer_activation`` /
    ``head_activation``: measured bytes per micro-batch replacing the formulas.

    ``held_with_grads``: micro-batches held once the gradients exist
    (:func:`planner.cost.schedule.held_with_grads`); the executor drops the gradients at each step's
    start, so the peak is ``max(in_flight · A, held_with_grads · A + G)`` (``A`` one micro-batch's
    activations, ``G`` the gradients) and the breakdown shows what is allocated at that moment.
    ``None`` counts both together (``in_flight · A + G``, an upper bound that is linear in ``layers``)."""
    num = _num(dtype, params)
    p = stage_params(model, layers, tp, first, last)
    weights = p * 4
    grads = p * GRAD_BYTES
    optimizer = p * 8 / max(1, zero_shards)
    tokens = micro_batch * (seq_len or model.seq_len)
    layer_input = tokens * model.hidden_size * num.r
    per_layer = layer_activation if layer_activation is not None else layer_activation_bytes(
        model, micro_batch, tp, dtype, recompute, seq_len, params)
    per_mb = layers * per_layer  # everything one micro-batch in flight keeps
    if num.weight_casts and recompute != "full":
        matmul = layers * layer_numel(model)[0] / tp
        if last:
            matmul += model.vocab_size * model.hidden_size / tp
        per_mb += matmul * num.e
    if not last:
        per_mb += layer_input
    if first:
        per_mb += tokens * 8
    transient = 0.0  # while one micro-batch runs
    if recompute == "full":
        transient += layer_activation_bytes(model, micro_batch, tp, dtype, "none", seq_len, params)
    if last:
        per_mb += head_activation if head_activation is not None else head_activation_bytes(
            model, micro_batch, tp, dtype, seq_len, params)
        transient += tokens * model.vocab_size / tp * (num.e + 8)  # the loss's transient peak (module docstring)
    acts, grads_at_peak = in_flight * per_mb + transient, grads
    if held_with_grads is not None and in_flight * per_mb > held_with_grads * per_mb + grads:
        grads_at_peak = 0.0  # the peak comes before the first backward allocates the gradients
    elif held_with_grads is not None:
        acts = held_with_grads * per_mb + transient
    buffers = zero_step_buffers(p, zero_shards)
    tensors = weights + grads_at_peak + optimizer + acts + buffers
    fixed = (params.framework_gib + params.workspace_gib) * GIB
    overhead = fixed + params.fragmentation * tensors
    live = 0.0
    if buffers:  # ZeRO-1's step: the reduce-scatter (gradients, part, master, one round) or the norm (3 parts)
        part, rounds = 4.0 * p / zero_shards, buffers - 3 * 4.0 * p / zero_shards
        step = weights + optimizer + 2 * part + max(grads + rounds, part)
        live = fixed + (1 + params.fragmentation) * step
    return MemoryBreakdown(weights, grads_at_peak, optimizer, acts, overhead, buffers, live)


def zero_step_buffers(stage_params: float, zero_shards: int) -> float:
    """Bytes ZeRO-1 reserves after the schedule on a device holding ``stage_params`` parameters
    shared by ``zero_shards`` owners (module docstring); 0 without ZeRO-1."""
    k = int(zero_shards)
    if k <= 1 or stage_params <= 0:
        return 0.0
    part = stage_params / k
    return 3 * 4.0 * part + (k + 2) * 4.0 * min(part, ZERO_BUCKET_NUMEL)
