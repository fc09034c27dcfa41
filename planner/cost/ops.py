"""The kernels of one Llama layer (and of the embedding, LM head and optimizer) as a list of ops
with their FLOPs and bytes moved, for one tensor-parallel shard. Pure counting, no device.

Notation: ``T = micro_batch * seq_len`` tokens, ``h`` hidden, ``f`` ffn hidden, ``kv`` the K/V
width (``num_kv_heads * head_dim``), ``t`` the TP degree, ``e`` bytes per element of the compute
dtype, ``r`` bytes per element of the residual stream (:class:`Numerics`: 4 in the executor,
which keeps the residual and RMSNorm in fp32 and autocasts matmuls; inside the layers ``Numerics.rl``,
the compute dtype's ``e`` under a plan's ``options.residual_dtype``). Megatron tensor parallelism
without sequence parallelism: norms and residual adds run on the full (replicated) activation on
every TP rank; q/k/v, gate/up are column-parallel (N/t), wo and w_down row-parallel (K/t).

Forward ops of one layer, as the executor runs them in eager PyTorch (GEMM shapes are
``[M, K] x [K, N]``; bytes are each kernel's reads + writes)::

    weight_cast  mem   [autocast, no cast-once] fp32 weights -> compute dtype: (4 + e) per matmul parameter
    attn_norm    mem   unfused fp32 RMSNorm (pow, mean, +eps, rsqrt, mul, mul): 28·T·h
    input_cast   mem   [r != e] the 3 (q/k/v) + 2 (gate/up) casts of the norm outputs: 5·T·h·(r+e)
    wq, wk, wv   gemm  [T, h] x [h, h/t], [h, kv/t], [h, kv/t]
    rope         mem   rotate-half RoPE on q and k (neg, cat, mul, mul, add): 10·e·T·(h + kv)/t
    kv_expand    mem   [GQA, expand] copy K/V to the query heads: e·T·2·(kv + h)/t
    attention    attn  causal flash attention: 2·b·s²·h/t FLOPs (half of the 4·b·s²·h/t dense count)
    wo           gemm  [T, h/t] x [h/t, h]
    residual     mem   read r·T·h + e·T·h, write r·T·h   (after attention and after the MLP)
    mlp_norm     mem   as attn_norm
    w_gate,w_up  gemm  [T, h] x [h, f/t]
    swiglu       mem   silu then mul: 5·e·T·f/t
    w_down       gemm  [T, f/t] x [f/t, h]

Backward: each GEMM becomes a data-gradient GEMM and a weight-gradient GEMM of the same FLOPs;
the weight gradients are cast to fp32 and accumulated into ``.grad`` (12 B per parameter);
attention's backward runs ``attention_backward_flops_ratio`` times its forward FLOPs and moves twice
its bytes; RMSNorm's autograd backward ~84·T·h; RoPE's ~10·e·T·(h + kv)/t; SwiGLU's 9·e·T·f/t;
the gradients of the norm outputs' 3 + 2 consumers are summed (9·r·T·h); casts cast back.

Cast-once (``Numerics.cast_once``, the engine's default since 2026-11-27 01:25 UTC,
executor/model/cast_once.py): no pass casts a weight; each projection is a ``CastOnceLinear`` call,
host work in place of the cast's launch (``cast_once_linear``, a ``HOST`` op). Each layer (and the LM head) makes its
compute-dtype copy once per step, just before its first forward after the optimizer step (under
ZeRO-1 after its parameter gate): :func:`weight_copy_op`, (4 + e) bytes per matmul parameter in one
``_foreach_copy_``; the weight gradient leaves its GEMM in fp32 (no cast back).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planner.layout import layer_numel, stage_tensors
from planner.model import ModelSpec

GEMM, ATTN, MEM, HOST = "gemm", "attn", "mem", "host"  # HOST: host work that launches no kernel
# Forward ops full recompute does not repeat: the non-reentrant checkpoint stops once the last
# tensor the backward needs (w_down's input) is rebuilt.
NOT_RECOMPUTED = frozenset({"w_down", "residual_mlp"})
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
GRAD_BYTES = 4  # gradients are accumulated and reduced in fp32


@dataclass(frozen=True)
class Op:
    """One kernel (or a few fused ones): FLOPs, bytes moved, and its shape for efficiency curves.

    ``dim`` is the smallest GEMM dimension (GEMM) or the sequence length (attention); 0 for
    memory-bound ops. ``kernels`` is how many launches it takes (a ``HOST`` op: how many calls of
    issue cost on the host, and no GPU time)."""

    name: str
    kind: str
    flops: float
    bytes: float
    dim: float = 0.0
    kernels: int = 1


@dataclass(frozen=True)
class Numerics:
    """Element sizes and implementation facts the op counts depend on (from ``CostParams``)."""

    e: int  # compute dtype bytes
    r: int  # residual-stream bytes at a stage's ends (embedding output, stage-boundary activations)
    weight_casts: bool  # the matmuls run on compute-dtype copies of the fp32 weights
    expand_kv: bool  # GQA K/V expanded to the query heads
    rl: int  # residual-stream bytes inside the layers (RMSNorm inputs, residual adds)
    cast_once: bool = False  # those copies are made once per step (weight_copy_op), not in every pass

    @property
    def casts_per_pass(self) -> bool:
        """Autocast's path: every forward casts the weights and every backward casts their gradients back."""
        return self.weight_casts and not self.cast_once

    @staticmethod
    def of(dtype: str, fp32_residual: bool = False, autocast_weight_copies: bool = False,
           expand_kv_heads: bool = False, residual_in_compute_dtype: bool = False, cast_once: bool = False) -> Numerics:
        e = DTYPE_BYTES[dtype]
        mixed = e != 4
        r = 4 if fp32_residual else e
        return Numerics(e, r, autocast_weight_copies and mixed, expand_kv_heads, e if residual_in_compute_dtype else r,
                        cast_once)

    @staticmethod
    def from_params(dtype: str, params: Any) -> Numerics:
        """The numerics ``params`` (a ``CostParams``) describe for compute dtype ``dtype``."""
        return Numerics.of(dtype, params.fp32_residual, params.autocast_weight_copies, params.expand_kv_heads,
                           params.residual_in_compute_dtype, params.cast_once)


def _gemm(name: str, m: float, k: float, n: float, e: int) -> Op:
    return Op(name, GEMM, 2.0 * m * k * n, e * (m * k + k * n + m * n), min(m, k, n))


def _gemm_backward(name: str, m: float, k: float, n: float, e: int) -> list[Op]:
    dgrad = Op(name + ".dgrad", GEMM, 2.0 * m * k * n, e * (m * n + k * n + m * k), min(m, k, n))
    wgrad = Op(name + ".wgrad", GEMM, 2.0 * m * k * n, e * (m * k + m * n + k * n), min(m, k, n))
    return [dgrad, wgrad]


def layer_gemms(model: ModelSpec, tokens: float, tp: int) -> list[tuple[str, float, float, float]]:
    h, f, kv = model.hidden_size, model.ffn_hidden_size, model.kv_dim
    return [("wq", tokens, h, h / tp), ("wk", tokens, h, kv / tp), ("wv", tokens, h, kv / tp),
            ("wo", tokens, h / tp, h), ("w_gate", tokens, h, f / tp), ("w_up", tokens, h, f / tp),
            ("w_down", tokens, f / tp, h)]


def attention_core_forward(model: ModelSpec, micro_batch: int, seq_len: int, tp: int, e: int) -> Op:
    h, kv = model.hidden_size, model.kv_dim
    tokens = micro_batch * seq_len
    flops = 2.0 * micro_batch * seq_len * seq_len * h / tp  # causal half of 4·b·s²·h/t
    return Op("attention", ATTN, flops, e * tokens * (2 * h + 2 * kv) / tp, seq_len)


def _matmul_params(model: ModelSpec, tp: int) -> float:
    return layer_numel(model)[0] / tp


def _weight_casts(name: str, nbytes: float, linears: int, num: Numerics) -> Op:
    """The weights' side of ``linears`` projections in one pass: autocast casts them (and casts
    their gradients back), one kernel each; cast-once multiplies with the step's copies through
    ``CastOnceLinear``, a Python autograd function per projection and pass: host calls, no GPU work
    (the profiler found the layer's host time short by those calls when timed without them,
    executor/profiler/compute.py ``engine_copies``)."""
    if num.casts_per_pass:
        return Op(name, MEM, 0.0, nbytes, kernels=linears)
    return Op(name.replace("weight_cast", "cast_once_linear"), HOST, 0.0, 0.0, kernels=linears)


def _norm(name: str, tokens: float, h: int, r: int) -> tuple[Op, Op]:
    """The executor's RMSNorm, unfused in fp32 (pow, mean, +eps, rsqrt, mul, mul: 28 B per element
    forward); its autograd backward reads and writes about 84 B per element in ~12 kernels. A
    residual stream in another dtype adds a cast in and out."""
    cast = 0 if r == 4 else 2 * (r + 4)
    return (Op(name, MEM, 0.0, (28 + cast) * tokens * h, kernels=6 + (2 if cast else 0)),
            Op(name + ".backward", MEM, 0.0, (84 + cast) * tokens * h, kernels=12 + (2 if cast else 0)))


def layer_forward_ops(model: ModelSpec, micro_batch: int, seq_len: int, tp: int, num: Numerics) -> list[Op]:
    e, r = num.e, num.rl
    h, f, kv = model.hidden_size, model.ffn_hidden_size, model.kv_dim
    t = micro_batch * seq_len
    gemms = {name: _gemm(name, m, k, n, e) for name, m, k, n in layer_gemms(model, t, tp)}
    ops: list[Op] = []
    if num.weight_casts:
        ops.append(_weight_casts("weight_cast", (4 + e) * _matmul_params(model, tp), 7, num))
    ops.append(_norm("attn_norm", t, h, r)[0])
    if r != e:
        ops.append(Op("input_cast", MEM, 0.0, 5 * t * h * (r + e), kernels=5))
    ops += [gemms["wq"], gemms["wk"], gemms["wv"], Op("rope", MEM, 0.0, 10 * e * t * (h + kv) / tp, kernels=14)]
    if num.expand_kv and kv != h:
        ops.append(Op("kv_expand", MEM, 0.0, e * t * 2 * (kv + h) / tp, kernels=2))
    ops += [
        attention_core_forward(model, micro_batch, seq_len, tp, e),
        gemms["wo"],
        Op("residual_attn", MEM, 0.0, t * h * (2 * r + e)),
        _norm("mlp_norm", t, h, r)[0],
        gemms["w_gate"], gemms["w_up"],
        Op("swiglu", MEM, 0.0, e * 5 * t * f / tp, kernels=2),
        gemms["w_down"],
        Op("residual_mlp", MEM, 0.0, t * h * (2 * r + e)),
    ]
    return ops


def layer_backward_ops(model: ModelSpec, micro_batch: int, seq_len: int, tp: int, num: Numerics,
                       attention_backward_flops_ratio: float) -> list[Op]:
    """Backward ops without recompute (recompute adds forward ops; see profile.py)."""
    e, r = num.e, num.rl
    h, f, kv = model.hidden_size, model.ffn_hidden_size, model.kv_dim
    t = micro_batch * seq_len
    ops: list[Op] = []
    for name, m, k, n in layer_gemms(model, t, tp):
        ops.extend(_gemm_backward(name, m, k, n, e))
    attn = attention_core_forward(model, micro_batch, seq_len, tp, e)
    ops.append(Op("attention.backward", ATTN, attn.flops * attention_backward_flops_ratio, 2 * attn.bytes,
                  seq_len, kernels=2))
    if num.weight_casts:
        ops.append(_weight_casts("weight_cast.backward", (4 + e) * _matmul_params(model, tp), 7, num))
    ops.append(Op("grad_accumulate", MEM, 0.0, 3 * GRAD_BYTES * (_matmul_params(model, tp) + layer_numel(model)[1]),
                  kernels=stage_tensors(model, 1, False, False)))
    if r != e:
        ops.append(Op("input_cast.backward", MEM, 0.0, 5 * t * h * (r + e), kernels=5))
    if num.expand_kv and kv != h:
        ops.append(Op("kv_expand.backward", MEM, 0.0, e * t * 2 * (kv + h) / tp, kernels=2))
    ops += [
        Op("branch_grad_sum", MEM, 0.0, 9 * r * t * h, kernels=3),  # q/k/v and gate/up input gradients
        _norm("attn_norm", t, h, r)[1],
        Op("rope.backward", MEM, 0.0, 10 * e * t * (h + kv) / tp, kernels=16),
        Op("residual_attn.backward", MEM, 0.0, r * 3 * t * h),  # accumulating the branch gradients
        _norm("mlp_norm", t, h, r)[1],
        Op("swiglu.backward", MEM, 0.0, e * 9 * t * f / tp, kernels=3),
        Op("residual_mlp.backward", MEM, 0.0, r * 3 * t * h),
    ]
    return ops


def embedding_ops(model: ModelSpec, micro_batch: int, seq_len: int, tp: int, num: Numerics
                  ) -> tuple[list[Op], list[Op]]:
    """Vocab-parallel embedding (fp32 table): a gather forward; backward a zeroed fp32 gradient of
    the table shard, a scatter-add of the token gradients, and its accumulation into ``.grad``."""
    t, h, vt = micro_batch * seq_len, model.hidden_size, model.vocab_size / tp
    fwd = [Op("embedding", MEM, 0.0, num.r * 2 * t * h, kernels=1 if tp == 1 else 5)]
    bwd = [Op("embedding.backward", MEM, 0.0, (num.r + 4) * t * h + 4 * GRAD_BYTES * vt * h, kernels=4)]
    return fwd, bwd


def head_ops(model: ModelSpec, micro_batch: int, seq_len: int, tp: int, num: Numerics) -> tuple[list[Op], list[Op]]:
    """Final RMSNorm, vocab-parallel LM head and cross-entropy, as executor/parallel/tp_layers.py runs it over
    the ``N = T·V/t`` logits: forward casts them to fp32 and takes max, shift, exp, sum and the
    in-place division (``(e + 36)·N`` bytes); backward clones the softmax, scales it and casts it
    back (``(20 + e)·N``)."""
    e, r = num.e, num.r
    t, h, vt = micro_batch * seq_len, model.hidden_size, model.vocab_size / tp
    norm_f, norm_b = _norm("final_norm", t, h, r)
    fwd = [norm_f, _gemm("lm_head", t, h, vt, e), Op("cross_entropy", MEM, 0.0, (e + 36) * t * vt, kernels=10)]
    bwd = [Op("cross_entropy.backward", MEM, 0.0, (20 + e) * t * vt, kernels=5),
           *_gemm_backward("lm_head", t, h, vt, e),
           Op("grad_accumulate", MEM, 0.0, 3 * GRAD_BYTES * (vt * h + h), kernels=2), norm_b]
    if num.weight_casts:
        fwd.insert(0, _weight_casts("weight_cast", (4 + e) * h * vt, 1, num))
        bwd.append(_weight_casts("weight_cast.backward", (4 + e) * h * vt, 1, num))
    if r != e:
        fwd.insert(2, Op("input_cast", MEM, 0.0, t * h * (r + e)))
        bwd.append(Op("input_cast.backward", MEM, 0.0, t * h * (r + e)))
    return fwd, bwd


def weight_copy_op(kind: str, model: ModelSpec, tp: int, num: Numerics) -> Op | None:
    """The cast-once copy of one ``kind`` ('layer', 'head'; the embedding has none) per step: fp32
    weights read, compute-dtype copy written, one ``_foreach_copy_`` (executor/model/cast_once.py).
    None where no copy is made once per step (fp32, or autocast's cast per pass)."""
    if not (num.weight_casts and num.cast_once) or kind == "embedding":
        return None
    params = _matmul_params(model, tp) if kind == "layer" else model.hidden_size * model.vocab_size / tp
    return Op(f"{kind}.weight_copy", MEM, 0.0, (4 + num.e) * params)


ADAM_BYTES_PER_PARAM = 7 * 4  # AdamW: read parameter, gradient, m, v; write parameter, m, v (fp32)
CLIP_BYTES_PER_PARAM = 3 * GRAD_BYTES  # read the gradients for the global norm, scale them in place


def optimizer_bytes_per_param() -> float:
    """The executor's step tail, per fp32 parameter (the parameters are the master weights): AdamW
    (28 B) and gradient clipping (12 B)."""
    return ADAM_BYTES_PER_PARAM + CLIP_BYTES_PER_PARAM
