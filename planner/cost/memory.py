"""Memory per device: weights, gradients, optimizer states, activations in flight, overhead.

Parameters on one device of a stage with ``n`` layers and TP degree ``t``::

    P = n · (layer_params - 2h) / t  +  n · 2h             TP-sharded weights + replicated norms
      + [first stage] V·h / t                              vocab-parallel embedding
      + [last stage]  h + V·h / t                          final norm + LM head (not when tied
                                                           and the same stage holds the embedding)

Per-device state (what the executor allocates; ``P`` the device's parameters, ``k`` the pipelines
holding them, ``X`` the elements of ``P`` whose local shard is cut into several sync slices because
another pipeline holds that tensor at a TP degree that does not divide this stage's,
:func:`planner.cost.partial_params.partial_params`)::

                                one pipeline     k > 1, ZeRO-0     k > 1, ZeRO-1
    weights                     4·P              4·P               4·P + 4·X
    gradients                   4·P              4·P + 4·X         4·P + 4·X
      of which from the start   0                4·P               4·P
    optimizer                   8·P              8·P               8·P / k
    reduced gradient chunks     0                0                 4·P / k

* weights: the fp32 parameters are the master weights (the compute dtype comes from autocast;
  executor/train/engine.py). Under ZeRO-1 they live in one all-gather buffer per flat bucket
  (executor/parallel/zero.py: ``k·c`` fp32 elements for a bucket of ``N``, ``c = ceil(N/k)``; the padding,
  under ``k`` elements a bucket, is not counted); a shard cut into several slices keeps its own
  tensor beside its slots.
* gradients: with several pipelines every sync slice has its slot in a flat fp32 bucket buffer
  (executor/parallel/grad_sync.py), allocated zeroed at the step's start, before the first forward
  (``GradSync.arm``), and bound as ``.grad`` so micro-batches accumulate in place; a shard cut into
  slices gets autograd's own gradient at its first backward, copied into its slots at launch. With
  one pipeline there are no buckets: autograd allocates the gradients at the first backward.
  ZeRO-1 drops the buckets once reduced; ZeRO-0 keeps the bound ones until the next step starts.
* optimizer: AdamW's two fp32 moments of every element this device updates; under ZeRO-1 the
  owned ``c`` elements of every bucket (TP ranks other than the stage leader hold no norm-scale
  state there: at most ``2h`` elements a layer, not counted).
* reduced gradient chunks (ZeRO-1): each bucket's reduce-scatter output, ``c`` fp32 elements,
  allocated as the bucket's gradients are final during the last micro-batch's backward; they are
  the masters' gradients through clipping and AdamW and are freed after it.
* nothing else of that size: fused AdamW (CUDA), clipping in place, ``_foreach_norm``, the
  norm's ``pow(2)`` one bucket chunk at a time, the all-gather in place into the weight buffers,
  the reduce-scatter from a bucket into its chunk.

tests/executor/test_exec_memory.py counts every tensor storage reachable from an ``Engine`` on
gloo ranks at the end of a step's backward and after its update and checks these terms
(:func:`state_bytes`) against the counts.

Activations saved for backward, per layer per micro-batch of ``T = b·s`` tokens (``e`` compute
bytes, ``r`` residual bytes, ``a`` heads; flash/SDPA keeps no s² scores; no dropout)::

    none       T·[2·(r·h + n·h + 4)                 two RMSNorms: input, [n = 4 unfused] the fp32
                                                    normalised tensor, rstd (n = 0 with
                                                    ``CostParams.fused_rms_norm``: CUDA's fused
                                                    kernel saves input and rstd only, 4x H200)
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

Compiled blocks (``options.compile``: executor/fast_path.compile_blocks, Inductor) keep less,
``none`` recompute only (the saved-tensor count of benchmarks/executor/activation_memory.py,
benchmarks/NOTES.md "Activation memory": the fp32 and bf16-autocast counts on CPU equal
this term by term at llama2-7b shapes; scaled to seq 4096 it gives ~18 GiB per sample with the head
where 4x H200 measured 17.9)::

    none, compiled  T·[r·h + 8                      the layer input; the two RMSNorms' rstd
                       + 3·e·h                      the attention norm's output, wo's output, the
                                                    MLP norm's output (replicated, as the norm casts)
                       + e·(h + 2·kv')/t + e·h/t    q, k, v (kv' as above) and the attention output
                       + 4·a/t                      the log-sum-exp
                       + 3·e·f/t]                   gate, up, and silu(gate) or the product
                    + [e != 4] 2·s·d·e              two RoPE table casts (one cos, one sin)

and the same weight copies as eager (one per stage, below). The split of the ``7·e·h``
the count found into replicated and TP-sharded terms follows the eager formula (the count ran at
TP 1 with MHA). Under ``selective`` and ``full`` the compiled path has not been counted: the eager
formulas stand for them.

Weight copies: with autocast (bf16/fp16) a stage holds ONE compute-dtype copy of its matmul
weights, ``e`` bytes per matmul parameter of its layers and of the LM head
(:func:`weight_copy_bytes`), whatever the recompute mode and the micro-batches in flight: the
engine turns cast-once on (executor/model/cast_once.py), the copies are buffers made at a step's
first forward and refreshed in place, and each matmul saves that buffer, not a cast of its own.
(A bare module under autocast casts per forward and each micro-batch in flight saves its casts:
the executor before 2026-11-27 01:25 UTC, priced with ``CostParams.cast_once`` off,
:func:`per_micro_batch_casts`. Until issue 32 the model charged that for every run, ~2.6 GiB over
on the 9-layer llama-1.3b rank of benchmarks/results/bubbles_h100_20261127T064953Z.json.)
tests/executor/test_weight_copy_count.py counts them on CPU with 2-4 micro-batches in flight.

Per micro-batch in flight a stage also holds: on every stage but the last, its output ``T·r·h``
(kept for the backward); on the first stage the token ids (8 B/token); on the last stage the final norm and the
logits with their fp32 loss buffer, ``T·(r·h + 4·h + 4 + e·h + V/t·(e + 4))``.
A stage holds ``in_flight`` micro-batches (1F1B: ``min(S - i, m)``; GPipe: ``m``) at most, but the
gradients autograd allocates (all of them with one pipeline, the ``4·X`` of cut shards with
several; dropped at each step's start) only exist from the stage's first backward on, when it
holds ``held_with_grads`` (1F1B: ``min(S - i, m)`` if a forward follows the first backward,
i.e. ``m > S - i``, else one less; GPipe: ``m - 1``); the peak is the larger of the two moments.

Beside what is held, one micro-batch's transient: on the last stage the loss's ``T·V/t·(e + 8)``
(its fp32 softmax, in the forward and the head's backward); in a layer's backward the CP
attention's (``cp_attention``) and full recompute's (:func:`full_recompute_transient`). The loss's
comes at another moment than a layer's backward, so the larger of the two counts (their sum with
``CostParams.cast_once`` off: there autocast's cast cache, full recompute's larger moment, ended the
forward beside the loss). Summed, the 64K dense full-recompute plans on 4x H100 were 10-14 % over
(tests/planner/test_fidelity_long_context_memory.py).

Measured bytes replace the formulas when given (``layer_activation``, ``head_activation``: per
micro-batch, the input included, the weight copies not; ``MeasuredProfile.activation_bytes``
converts the profiler's figures to that). On an H100 and an H200 (llama-1.3b), the formulas equal
the measured bytes to within 1 KiB per layer and per head at TP 1, a few MiB at TP 2.

Peak: the larger of two moments. The schedule's: weights and their copies, optimizer, the gradients allocated by
then and the activations in flight (above). The end of the last backward: weights, optimizer,
every gradient and the reduced chunks, the activations freed (the last micro-batch's backward frees
each layer's activations as its buckets complete and their chunks are allocated). The breakdown
shows the schedule's moment; ``step_buffers`` is what the end of the backward holds beyond it
(ZeRO-1 where the chunks outgrow the activations they replace; usually 0). Every buffer above is
allocated in the same sizes every step (buckets of at most ``ZERO_BUCKET_NUMEL`` elements, chunks
of ``1/k`` of that), so the caching allocator serves them from blocks the step before freed and
reserves nothing beyond this peak: ``required`` (what out-of-memory checks compare with the
capacity) equals ``total``. (Until 8de8520 ZeRO-1 allocated three whole-part vectors after the
schedule, which the allocator could not serve from cached blocks; that term is gone with them.)

Overhead per device: ``framework_gib + workspace_gib`` plus ``fragmentation`` times the tensor
bytes (``CostParams``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from planner.cost.cp_memory import CPAttentionMemory
from planner.cost.ops import GRAD_BYTES, Numerics
from planner.cost.params import DEFAULT_PARAMS, CostParams
from planner.cost.wgrad_memory import deferred_wgrad_bytes, held_peak
from planner.layout import layer_numel
from planner.model import ModelSpec
from planner.schedules.held import Held

GIB = float(1 << 30)
# Elements per owner in one reduce-scatter / all-gather round of ZeRO-1 (executor.parallel.grad_sync's
# DEFAULT_BUCKET_NUMEL; tests/planner/test_cost_memory.py checks that they agree).
ZERO_BUCKET_NUMEL = 1 << 25


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per term on one device, at the schedule's peak (module docstring)."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    overhead: float
    step_buffers: float = 0.0  # what the end of the last backward holds beyond the schedule's peak (ZeRO-1)
    weight_copies: float = 0.0  # the stage's cast-once compute-dtype weights (one copy, not per micro-batch)

    @property
    def total(self) -> float:
        """The device's peak: the larger of the schedule's and the end of the last backward."""
        return (self.weights + self.weight_copies + self.gradients + self.optimizer + self.activations
                + self.overhead + self.step_buffers)

    @property
    def required(self) -> float:
        """What out-of-memory checks compare with the capacity: ``total`` (every buffer is served
        from blocks the step before freed; nothing is reserved only where there is room)."""
        return self.total

    @property
    def required_gib(self) -> float:
        return self.required / GIB

    @property
    def total_gib(self) -> float:
        return self.total / GIB

    def to_gib_dict(self) -> dict[str, float]:
        out = {k: v / GIB for k, v in asdict(self).items()}
        out["total"] = self.total_gib
        return out


@dataclass(frozen=True)
class StateBytes:
    """Bytes of one device's parameters, gradients and optimizer state (module docstring's table)."""

    weights: float
    gradients: float  # every gradient buffer at the end of the backward
    early_gradients: float  # of which allocated at the step's start (flat buckets, several pipelines)
    optimizer: float
    reduced: float  # ZeRO-1's reduce-scattered chunks, from the last backward through AdamW
    after_step: float  # what stays after the update (ZeRO-1: no gradients; ZeRO-0: every ``.grad``)

    @property
    def end_of_backward(self) -> float:
        """Everything here that is live at the end of the last backward."""
        return self.weights + self.gradients + self.optimizer + self.reduced


def state_bytes(params: float, *, pipelines: int = 1, zero_shards: int = 1, partial: float = 0.0) -> StateBytes:
    """The state of a device holding ``params`` elements of which ``partial`` are cut into several
    sync slices, its stage held by ``pipelines`` pipelines, ``zero_shards`` of them sharing the
    optimizer state (ZeRO-1; 1 without it)."""
    k = max(int(pipelines), int(zero_shards))
    grads = GRAD_BYTES * params
    if k <= 1:
        return StateBytes(4.0 * params, grads, 0.0, 8.0 * params, 0.0, 16.0 * params)
    copies = GRAD_BYTES * partial  # autograd's own gradient beside the slots (and under ZeRO-1 the weight)
    if zero_shards <= 1:  # after the all-reduce the buckets of cut shards go, each .grad stays
        return StateBytes(4.0 * params, grads + copies, grads, 8.0 * params, 0.0, (4.0 + 8.0) * params + grads)
    weights, optimizer = 4.0 * (params + partial), 8.0 * params / k
    return StateBytes(weights, grads + copies, grads, optimizer, GRAD_BYTES * params / k, weights + optimizer)


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
    return Numerics.from_params(dtype, params)


def _norm_saved(params: CostParams) -> int:
    """Bytes per element an RMSNorm saves beside its input and rstd: 0 fused (CUDA), 4 unfused."""
    return 0 if params.fused_rms_norm else 4


def layer_activation_bytes(model: ModelSpec, micro_batch: int, tp: int, dtype: str, recompute: str,
                           seq_len: int | None = None, params: CostParams = DEFAULT_PARAMS, *,
                           compile: bool = False) -> float:
    """Bytes one layer keeps for its backward, per micro-batch (``full``: the layer input only).
    ``compile``: the blocks are compiled; without recompute that is
    :func:`compiled_layer_activation_bytes`, with it the eager formula (module docstring)."""
    if compile and recompute == "none":
        return compiled_layer_activation_bytes(model, micro_batch, tp, dtype, seq_len, params)
    num = _num(dtype, params)
    e, r = num.e, num.rl
    h, f, kv, a = model.hidden_size, model.ffn_hidden_size, model.kv_dim, model.num_heads
    tokens = micro_batch * (seq_len or model.seq_len)
    if recompute == "full":
        return tokens * h * r
    per_token = 2 * (r * h + _norm_saved(params) * h + 4) + (5 if r != e else 2) * e * h + 4 * e * f / tp
    if recompute == "none":
        kv_saved = h if (num.expand_kv and kv != h) else kv
        per_token += e * (h + 2 * kv_saved) / tp + e * h / tp + 4 * a / tp
    else:  # selective
        per_token += e * (h + 2 * kv) / tp + e * h / tp
    rope_casts = 4 * (seq_len or model.seq_len) * model.head_dim * e if e != 4 else 0.0
    return tokens * per_token + rope_casts


def compiled_layer_activation_bytes(model: ModelSpec, micro_batch: int, tp: int, dtype: str,
                                    seq_len: int | None = None, params: CostParams = DEFAULT_PARAMS) -> float:
    """Bytes one COMPILED layer keeps for its backward per micro-batch without recompute (module
    docstring, "none, compiled"; the saved-tensor count of benchmarks/executor/activation_memory.py)."""
    num = _num(dtype, params)
    e, r = num.e, num.rl
    h, f, kv, a = model.hidden_size, model.ffn_hidden_size, model.kv_dim, model.num_heads
    seq = seq_len or model.seq_len
    kv_saved = h if (num.expand_kv and kv != h) else kv
    per_token = r * h + 8 + 3 * e * h + e * (h + 2 * kv_saved) / tp + e * h / tp + 4 * a / tp + 3 * e * f / tp
    rope_casts = 2 * seq * model.head_dim * e if e != 4 else 0.0
    return micro_batch * seq * per_token + rope_casts


def weight_copy_bytes(model: ModelSpec, *, layers: int, tp: int, last: bool, dtype: str,
                      params: CostParams = DEFAULT_PARAMS) -> float:
    """The stage's compute-dtype copies of its matmul weights: ``e`` bytes per matmul parameter of
    ``layers`` layers, and of the LM head on the last stage, held ONCE per stage (module docstring,
    "Weight copies"). 0 without them (fp32, ``CostParams.autocast_weight_copies`` off)."""
    num = _num(dtype, params)
    if not num.weight_casts:
        return 0.0
    matmul = layers * layer_numel(model)[0] / tp
    if last:
        matmul += model.vocab_size * model.hidden_size / tp
    return matmul * num.e


def per_micro_batch_casts(model: ModelSpec, *, layers: int, tp: int, last: bool, dtype: str, recompute: str,
                          params: CostParams = DEFAULT_PARAMS) -> float:
    """Without cast-once (``CostParams.cast_once`` off: the executor before 2026-11-27 01:25 UTC),
    the casts one micro-batch in flight saves: :func:`weight_copy_bytes`, less the checkpointed
    layers' under full recompute (:func:`full_recompute_transient` has them; the head is never
    recomputed). 0 with cast-once, where the stage holds one copy instead."""
    if params.cast_once:
        return 0.0
    head = weight_copy_bytes(model, layers=0, tp=tp, last=last, dtype=dtype, params=params)
    body = weight_copy_bytes(model, layers=layers, tp=tp, last=False, dtype=dtype, params=params)
    return head + (0.0 if recompute == "full" else body)


def full_recompute_transient(model: ModelSpec, *, micro_batch: int, tp: int, dtype: str, layers: int,
                             seq_len: int | None = None, params: CostParams = DEFAULT_PARAMS,
                             compile: bool = False) -> float:
    """What one micro-batch adds at its peak under full recompute: a recomputed layer's whole
    activations in the backward. With cast-once its weight copies are the stage's
    (:func:`weight_copy_bytes`, held anyway) and a checkpointed forward leaves no autocast cast
    cache: the linears multiply with those copies, autocast casts no weight.

    Without (``CostParams.cast_once`` off), the larger of two moments: the recomputed layer with its
    own casts, or the end of an eager forward, where autocast's cast cache keeps every matmul
    weight's copy of the stage until the forward leaves its autocast region (one region per
    micro-batch forward, ``executor.parallel.schedules``; compiled blocks cast inside their graphs,
    not cached: the first moment only). Measured on 2x H200 (fidelity ``--gpus 2``, ``7b-pp2-full``,
    2026-11-26): 5.8 and 6.0 GiB allocated above the model without that moment, against 6.0 GiB of
    copies of a 16-layer llama2-7b stage."""
    layer = layer_activation_bytes(model, micro_batch, tp, dtype, "none", seq_len, params)
    one = weight_copy_bytes(model, layers=1, tp=tp, last=False, dtype=dtype, params=params)
    if params.cast_once or not one:
        return layer
    return layer + one if compile else max(layer + one, layers * one)


def head_activation_bytes(model: ModelSpec, micro_batch: int, tp: int, dtype: str, seq_len: int | None = None,
                          params: CostParams = DEFAULT_PARAMS) -> float:
    num = _num(dtype, params)
    e, r, h = num.e, num.r, model.hidden_size
    tokens = micro_batch * (seq_len or model.seq_len)
    return tokens * (r * h + _norm_saved(params) * h + 4 + e * h + 4 * model.vocab_size / tp + 9)


def stage_memory(model: ModelSpec, *, layers: int, tp: int, first: bool, last: bool, micro_batch: int,
                 in_flight: int, dtype: str = "bf16", recompute: str = "none", zero_shards: int = 1,
                 params: CostParams = DEFAULT_PARAMS, seq_len: int | None = None,
                 layer_activation: float | None = None, head_activation: float | None = None,
                 held_with_grads: int | None = None, pipelines: int = 1, partial: float = 0.0,
                 compile: bool = False, cp_attention: CPAttentionMemory | None = None,
                 held: Sequence[Held] | None = None) -> MemoryBreakdown:
    """Peak memory of ONE device of a stage (fast: plain arithmetic).

    ``micro_batch`` is the largest micro-batch of the pipeline, ``in_flight`` the number of
    micro-batches held (:func:`planner.cost.schedule.in_flight`), ``zero_shards`` the number of
    owners sharing the optimizer state under ZeRO-1 (1 = replicated), ``pipelines`` the number of
    pipelines holding the stage's parameters (at least ``zero_shards``), ``partial`` the elements
    of a device's shards cut into several sync slices (:func:`planner.cost.partial_params.partial_params`).
    ``layer_activation`` / ``head_activation``: measured bytes per micro-batch replacing the formulas.
    ``compile``: the blocks are compiled (the plan's ``options.compile``): the compiled path's
    layer activations (:func:`layer_activation_bytes`); the head stays eager.
    ``cp_attention``: a CP stage's attention extra (:func:`planner.cost.cp_memory.cp_attention_memory`;
    ``seq_len`` is then the rank's ``S/cp``): ``saved`` per layer and micro-batch held, ``transient``
    once, while a layer's backward runs.

    ``held_with_grads``: micro-batches held once autograd's gradients exist
    (:func:`planner.cost.schedule.held_with_grads`); the executor drops the gradients at each step's
    start, so the peak is ``max(in_flight · A + G0, held_with_grads · A + G)`` (``A`` one
    micro-batch's activations, ``G`` the gradients, ``G0`` those of the flat buckets allocated at the
    start) and the breakdown shows what is allocated at that moment. ``None`` counts all the
    gradients from the start (``in_flight · A + G``, an upper bound that is linear in ``layers``).

    ``held``: a split-backward schedule's moments (:meth:`planner.schedules.Schedule.held`), which
    replace ``in_flight`` and ``held_with_grads``: a micro-batch between its deferring ``B`` and its
    ``W`` holds only the queued weight-gradient operands (:mod:`planner.cost.wgrad_memory`)."""
    num = _num(dtype, params)
    p = stage_params(model, layers, tp, first, last)
    state = state_bytes(p, pipelines=pipelines, zero_shards=zero_shards, partial=partial)
    tokens = micro_batch * (seq_len or model.seq_len)
    layer_input = tokens * model.hidden_size * num.r
    per_layer = layer_activation if layer_activation is not None else layer_activation_bytes(
        model, micro_batch, tp, dtype, recompute, seq_len, params, compile=compile)
    per_mb = layers * per_layer  # everything one micro-batch in flight keeps
    cp = cp_attention or CPAttentionMemory(0.0, 0.0)
    per_mb += layers * cp.saved
    per_mb += per_micro_batch_casts(model, layers=layers, tp=tp, last=last, dtype=dtype, recompute=recompute,
                                    params=params)
    if not last:
        per_mb += layer_input
    if first:
        per_mb += tokens * 8
    transient = cp.transient  # while one micro-batch runs
    if recompute == "full":
        transient += full_recompute_transient(model, micro_batch=micro_batch, tp=tp, dtype=dtype, layers=layers,
                                              seq_len=seq_len, params=params, compile=compile)
    if last:
        per_mb += head_activation if head_activation is not None else head_activation_bytes(
            model, micro_batch, tp, dtype, seq_len, params)
        loss = tokens * model.vocab_size / tp * (num.e + 8)  # the loss's transient (module docstring)
        transient = max(transient, loss) if params.cast_once else transient + loss  # not at a layer's backward
    acts, grads_at_peak = in_flight * per_mb + transient, state.gradients
    if held is not None:
        deferred = deferred_wgrad_bytes(model, micro_batch=micro_batch, tp=tp, dtype=dtype, layers=layers,
                                        last=last, seq_len=seq_len, params=params)
        acts, grads_at_peak = held_peak(held, per_mb=per_mb, deferred=deferred,
                                        early_gradients=state.early_gradients, gradients=state.gradients)
        acts += transient
    elif held_with_grads is not None:
        if in_flight * per_mb + state.early_gradients > held_with_grads * per_mb + state.gradients:
            grads_at_peak = state.early_gradients  # the peak comes before the first backward
        else:
            acts = held_with_grads * per_mb + transient
    copies = weight_copy_bytes(model, layers=layers, tp=tp, last=last, dtype=dtype, params=params) \
        if params.cast_once else 0.0
    schedule = state.weights + copies + grads_at_peak + state.optimizer + acts
    buffers = max(0.0, state.end_of_backward + copies - schedule)  # the end of the last backward, where higher
    fixed = (params.framework_gib + params.workspace_gib) * GIB
    overhead = fixed + params.fragmentation * (schedule + buffers)
    return MemoryBreakdown(state.weights, grads_at_peak, state.optimizer, acts, overhead, buffers, copies)
