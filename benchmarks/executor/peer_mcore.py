"""Megatron-Core as a peer: its GPT model, TP/PP/DP, distributed optimizer and pipeline schedules.

megatron-core 0.19.2 (from its wheel). Transformer Engine is not installable on the GPU image (its
wheels are far over what a run can carry, and its torch extension builds from source), and neither
is apex, so the layer spec is Megatron-Core's own (``get_gpt_layer_local_spec``, RMSNorm, SwiGLU,
no biases) with one substitution: its local attention materialises the ``s x s`` score matrix,
which would make the comparison meaningless at seq 4096, so core attention is PyTorch's fused SDPA
(causal; the same kernels our executor uses) in Megatron's ``[s, b, heads, dim]`` layout. All the
rest is Megatron's: column/row-parallel linears (without sequence parallelism: Megatron-Core's
torch-norm fallback refuses it without apex/TE), bf16 parameters with fp32
main gradients (``DistributedDataParallel``, overlapped reduce), the distributed optimizer (ZeRO-1,
fp32 master weights, torch AdamW as Megatron falls back to without apex/TE), clipping at 1.0, and
``get_forward_backward_func`` (1F1B with deallocated pipeline outputs when PP > 1).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

from planner.model import ModelSpec


def _sdpa_attention_class() -> type:
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class SdpaAttention(DotProductAttention):
        """Megatron's core attention interface over fused causal SDPA."""

        def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,  # noqa: ANN001
                    packed_seq_params=None):  # noqa: ANN001
            q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, dim]
            if k.shape[1] != q.shape[1]:  # grouped-query attention
                k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
                v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale)
            return out.permute(2, 0, 1, 3).reshape(out.shape[2], out.shape[0], -1)  # [s, b, heads * dim]

    return SdpaAttention


def _layer_spec() -> Any:
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    spec.submodules.self_attention.submodules.core_attention = _sdpa_attention_class()
    return spec


def mcore_worker(m: ModelSpec, *, tp: int, pp: int, rows: torch.Tensor, micro_batch: int,
                 device: torch.device, loop: Any) -> dict[str, Any]:
    """Train ``rows`` (this DP rank's share, ``[b, s + 1]``; equal across its TP/PP ranks) with
    Megatron-Core at TP ``tp`` x PP ``pp`` x DP (the rest); ``loop(step)`` times it."""
    import megatron.core as mc
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.models.gpt import GPTModel
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer.transformer_config import TransformerConfig

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    tensor_parallel.model_parallel_cuda_manual_seed(0)
    cfg = TransformerConfig(
        num_layers=m.num_layers, hidden_size=m.hidden_size, num_attention_heads=m.num_heads,
        num_query_groups=m.num_kv_heads, ffn_hidden_size=m.ffn_hidden_size, kv_channels=m.head_dim,
        normalization="RMSNorm", layernorm_epsilon=m.norm_eps, gated_linear_unit=True, activation_func=F.silu,
        add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0, bias_activation_fusion=False,
        masked_softmax_fusion=False, persist_layer_norm=False, bias_dropout_fusion=False, apply_rope_fusion=False,
        gradient_accumulation_fusion=False, bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, sequence_parallel=False,
        deallocate_pipeline_outputs=True, init_method_std=0.02)
    model = GPTModel(config=cfg, transformer_layer_spec=_layer_spec(), vocab_size=m.vocab_size,
                     max_sequence_length=m.seq_len, pre_process=parallel_state.is_pipeline_first_stage(),
                     post_process=parallel_state.is_pipeline_last_stage(), parallel_output=True,
                     share_embeddings_and_output_weights=False, position_embedding_type="rope",
                     rotary_base=int(m.rope_theta)).to(device)
    ddp_cfg = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=True,
                                            use_distributed_optimizer=True)
    model = DistributedDataParallel(config=cfg, ddp_config=ddp_cfg, module=model)
    # what Megatron's training loop wires up: no reduction inside gradient accumulation, the
    # overlapped bucket reduction started by the schedule, and the final reduction (DP reduce-scatter,
    # TP/SP norm gradients, PP embedding gradients) before the optimizer
    cfg.no_sync_func = model.no_sync
    cfg.grad_sync_func = model.start_grad_sync
    cfg.finalize_model_grads_func = finalize_model_grads
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=3e-4, weight_decay=0.1, adam_beta1=0.9,
                                                 adam_beta2=0.95, bf16=True, use_distributed_optimizer=True,
                                                 clip_grad=1.0), [model])
    dev_rows = rows.to(device)
    n_micro = dev_rows.shape[0] // micro_batch
    positions = torch.arange(m.seq_len, device=device).expand(micro_batch, m.seq_len)
    fwd_bwd = get_forward_backward_func()

    def loss_func(output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        loss = output.float().sum()
        tokens = torch.tensor(output.numel(), dtype=torch.int, device=output.device)
        return loss, tokens, {"lm loss": torch.stack([loss.detach(), tokens.float()])}

    def forward_step(it: Any, model_: Any) -> tuple[torch.Tensor, Any]:
        chunk = next(it)
        return model_(chunk[:, :-1], positions, None, labels=chunk[:, 1:]), partial(loss_func)

    def step() -> float:
        model.zero_grad_buffer()
        opt.zero_grad()
        it = iter([dev_rows[i * micro_batch:(i + 1) * micro_batch] for i in range(n_micro)])
        out = fwd_bwd(forward_step_func=forward_step, data_iterator=it, model=[model], num_microbatches=n_micro,
                      seq_length=m.seq_len, micro_batch_size=micro_batch, forward_only=False)
        opt.step()
        if not out:  # not the last stage: no loss here
            return 0.0
        total = torch.stack([o["lm loss"] for o in out]).sum(0)
        return float((total[0] / total[1]).item())

    try:
        res = loop(step)
    finally:
        parallel_state.destroy_model_parallel()
    res.update({"megatron_core": mc.__version__, "attention": "torch SDPA (causal) in Megatron's core attention",
                "config": {"tp": tp, "pp": pp, "dp": parallel_state_dp(tp, pp), "micro_batch": micro_batch,
                           "distributed_optimizer": True, "sequence_parallel": False}})
    return res


def parallel_state_dp(tp: int, pp: int) -> int:
    return torch.distributed.get_world_size() // (tp * pp)
