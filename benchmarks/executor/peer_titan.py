"""torchtitan as a peer: its Llama model, its parallelisms and its compile, in our timing loop.

torchtitan 0.3.0 (from its wheel; the benchmark does not need its data or tokenizer stack). What is
torchtitan's here: the model code (``torchtitan.models.llama3``: fused QKV, FlexAttention with the
causal document mask its data loaders always produce, complex RoPE), ``parallelize_llama`` (TP with
sequence parallel, per-block ``torch.compile``, FSDP2 with bf16 parameters and fp32 reduction — its
default mixed precision), activation checkpointing when asked, and its distributed gradient clipping.
What is ours: the step loop (what ``Trainer.train_step`` does: micro-batches, forward, summed
cross-entropy over the step's tokens, backward, clip at 1.0, fused AdamW), written here because its
``Trainer`` needs the Hugging Face ``datasets`` stack. The model is built from our preset's shapes.
"""

from __future__ import annotations

import sys
import tempfile
from types import ModuleType, SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F

from planner.model import ModelSpec


def _placeholders() -> None:
    """torchtitan's config code imports its ``Trainer``, whose module imports Hugging Face
    ``datasets`` (and pyarrow) for its data loaders and TensorBoard for its metrics; this benchmark
    feeds tokens and logs itself, so placeholder modules stand in for whichever of them is not
    installed (any use of one raises)."""

    def unavailable(*_: Any, **__: Any) -> Any:
        raise RuntimeError("not installed here (and not needed by this benchmark)")

    def stub(name: str, **attrs: Any) -> ModuleType:
        mod = ModuleType(name)
        mod.__path__ = []  # a package, so its submodules import
        for k, v in attrs.items():
            setattr(mod, k, v)
        sys.modules[name] = mod
        return mod

    try:
        import datasets  # noqa: F401
    except ImportError:
        stub("datasets", Dataset=type("Dataset", (), {}), IterableDataset=type("IterableDataset", (), {}),
             load_dataset=unavailable, interleave_datasets=unavailable)
        stub("datasets.distributed", split_dataset_by_node=unavailable)
    try:
        from torch.utils import tensorboard  # noqa: F401
    except ImportError:
        stub("torch.utils.tensorboard", SummaryWriter=unavailable)


def titan_model_config(m: ModelSpec, attention: str) -> Any:
    """torchtitan's Llama 3 model config with ``m``'s shapes (no weight tying, no RoPE scaling)."""
    from torchtitan.models import llama3 as t
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm

    h, v = m.hidden_size, m.vocab_size
    norm = {"weight": torch.nn.init.ones_}
    layers = t._build_llama3_layers(  # noqa: SLF001 - the builder of its presets; pinned to 0.3.0
        n_layers=m.num_layers, dim=h, n_heads=m.num_heads, n_kv_heads=m.num_kv_heads,
        hidden_dim=m.ffn_hidden_size, fuse_qkv=True, attn_backend=attention,
        rope=ComplexRoPE.Config(dim=m.head_dim, max_seq_len=m.seq_len, theta=m.rope_theta, scaling="none"))
    for layer in layers:
        layer.attention_norm.eps = layer.ffn_norm.eps = m.norm_eps
    return t.Llama3Model.Config(
        dim=h, vocab_size=v,
        tok_embeddings=Embedding.Config(num_embeddings=v, embedding_dim=h, param_init=t._EMBEDDING_INIT),  # noqa: SLF001
        norm=RMSNorm.Config(normalized_shape=h, eps=m.norm_eps, param_init=norm),
        lm_head=Linear.Config(in_features=h, out_features=v, param_init=t._output_linear_init(h)),  # noqa: SLF001
        layers=layers)


def _ac(mode: str) -> Any:
    if mode == "none":
        return None
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

    return (FullAC if mode == "full" else SelectiveAC).Config()


def titan_worker(m: ModelSpec, *, rank: int, world: int, tp: int, rows: torch.Tensor, micro_batch: int,
                 compile: bool, ac: str, device: torch.device, loop: Any) -> dict[str, Any]:
    """Train ``rows`` (this rank's share of the step, ``[b, s + 1]``) with torchtitan's model and
    parallelisms; ``loop(step)`` times it. FSDP over ``world // tp`` ranks, TP over ``tp``."""
    _placeholders()
    import torchtitan
    from torchtitan.config.configs import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.models.llama3 import parallelize_llama

    attention = "flex"
    if device.type == "cpu":  # the CPU smoke run: torchtitan assumes CUDA when nothing else is there
        import torchtitan.distributed.parallel_dims as pd

        pd.device_type = "cpu"
    parallelism = ParallelismConfig(tensor_parallel_degree=tp, data_parallel_shard_degree=-1,
                                    spmd_backend="partial_dtensor")
    dims = ParallelDims.from_config(parallelism, world)
    dims.build_mesh()
    cfg = titan_model_config(m, attention)
    cfg.update_from_config(config=SimpleNamespace(parallelism=parallelism))
    with torch.device("meta"):
        model = cfg.build()
    training = TrainingConfig(local_batch_size=micro_batch, seq_len=m.seq_len, dtype="float32",
                              mixed_precision_param="bfloat16" if device.type == "cuda" else "float32",
                              mixed_precision_reduce="float32")
    comp = CompileConfig(enable=compile, components=["model", "loss"])
    with tempfile.TemporaryDirectory() as dump:
        model = parallelize_llama(model, parallel_dims=dims, training=training, parallelism=parallelism,
                                  compile_config=comp, ac_config=_ac(ac), dump_folder=dump)
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=True if device.type == "cuda" else None)
    dp_groups = world // tp
    global_tokens = rows.shape[0] * dp_groups * m.seq_len

    def loss_fn(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(), reduction="sum") / global_tokens

    if compile:
        loss_fn = torch.compile(loss_fn)
    dev_rows = rows.to(device)
    positions = torch.arange(m.seq_len, device=device).expand(micro_batch, m.seq_len)
    masks = model.get_attention_masks(positions=positions)

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        total = torch.zeros((), device=device)
        for r in range(0, dev_rows.shape[0], micro_batch):
            chunk = dev_rows[r:r + micro_batch]
            pred = model(chunk[:, :-1], positions=positions, attention_masks=masks)
            loss = loss_fn(pred, chunk[:, 1:])
            del pred
            loss.backward()
            total += loss.detach()
        dist_utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        return float(total.item()) * dp_groups  # this rank's share of the step's mean loss, scaled up

    out = loop(step)
    out.update({"torchtitan": getattr(torchtitan, "__version__", "0.3.0"), "attention": f"torchtitan {attention}",
                "config": {"fsdp": world // tp, "tp": tp, "micro_batch": micro_batch, "ac": ac, "compile": compile}})
    return out
