"""torchtitan as a peer: its Llama model, its parallelisms and its compile, in our timing loop.

torchtitan 0.2.2 (from its wheel; 0.3.0 needs a newer torch than the GPU image's 2.11). What is
torchtitan's here: the model (``torchtitan.models.llama3``, SDPA attention, as its Llama 3 presets
use), ``parallelize_llama`` (TP with sequence parallel and loss parallel, per-block
``torch.compile``, FSDP2 with bf16 parameters and fp32 reduction — its default mixed precision; AMP
autocast on one GPU, as its trainer does when FSDP is off), activation checkpointing when asked, its
compiled summed cross-entropy and its distributed gradient clipping. What is ours: the step loop
(what ``Trainer.train_step`` does: micro-batches, forward, loss sum over the step's tokens, backward,
clip at 1.0, fused AdamW), written here because its ``Trainer`` needs the Hugging Face ``datasets``
stack. The model is built from our preset's shapes (torchtitan's SwiGLU width rule gives the same
``ffn_hidden_size`` for both presets used).
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from types import ModuleType
from typing import Any

import torch

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


def titan_model_args(m: ModelSpec) -> Any:
    """torchtitan's Llama 3 model arguments with ``m``'s shapes."""
    from torchtitan.models.llama3 import TransformerModelArgs

    args = TransformerModelArgs(dim=m.hidden_size, n_layers=m.num_layers, n_heads=m.num_heads,
                                n_kv_heads=m.num_kv_heads, vocab_size=m.vocab_size, multiple_of=256,
                                norm_eps=m.norm_eps, rope_theta=m.rope_theta, max_seq_len=m.seq_len,
                                attn_type="sdpa", attn_mask_type="causal")
    hidden = 256 * ((int(2 * 4 * m.hidden_size / 3) + 255) // 256)
    if hidden != m.ffn_hidden_size:
        raise ValueError(f"torchtitan's SwiGLU width for {m.name} is {hidden}, not {m.ffn_hidden_size}")
    return args


def titan_worker(m: ModelSpec, *, rank: int, world: int, tp: int, rows: torch.Tensor, micro_batch: int,
                 compile: bool, ac: str, device: torch.device, loop: Any) -> dict[str, Any]:
    """Train ``rows`` (this rank's share of the step, ``[b, s + 1]``) with torchtitan's model and
    parallelisms; ``loop(step)`` times it. FSDP over ``world // tp`` ranks, TP over ``tp``."""
    _placeholders()
    import torchtitan
    from torchtitan.components.loss import build_cross_entropy_loss
    from torchtitan.config import JobConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.models.llama3 import Transformer, parallelize_llama

    if device.type == "cpu":  # the CPU check of this file: torchtitan assumes CUDA when nothing else is there
        import torchtitan.distributed.parallel_dims as pd

        pd.device_type = "cpu"
    jc = JobConfig()
    jc.training.seq_len = m.seq_len
    jc.training.local_batch_size = micro_batch
    jc.training.mixed_precision_param = "bfloat16"
    jc.training.mixed_precision_reduce = "float32"
    jc.compile.enable = compile
    jc.activation_checkpoint.mode = ac
    jc.parallelism.tensor_parallel_degree = tp
    jc.parallelism.data_parallel_shard_degree = -1
    dims = ParallelDims(dp_replicate=1, dp_shard=-1, cp=1, tp=tp, pp=1, ep=1, etp=1, world_size=world)
    dims.build_mesh()
    args = titan_model_args(m)
    args.update_from_config(jc)
    with torch.device("meta"):
        model = Transformer(args)
    with tempfile.TemporaryDirectory() as dump:
        jc.job.dump_folder = dump
        model = parallelize_llama(model, dims, jc)
    model.to_empty(device=device)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=True if device.type == "cuda" else None)
    loss_fn = build_cross_entropy_loss(jc)
    train_context = dist_utils.get_train_context(dims.tp_enabled and not jc.parallelism.disable_loss_parallel)
    amp = (dist_utils.maybe_enable_amp(dims, "bfloat16", device.type) if device.type == "cuda"
           else contextlib.nullcontext())
    global_tokens = rows.shape[0] * (world // tp) * m.seq_len
    dev_rows = rows.to(device)

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        total = torch.zeros((), device=device)
        for r in range(0, dev_rows.shape[0], micro_batch):
            chunk = dev_rows[r:r + micro_batch]
            with train_context():
                with amp:
                    pred = model(chunk[:, :-1])
                    loss = loss_fn(pred, chunk[:, 1:]) / global_tokens
                del pred
                loss.backward()
            done = loss.detach()
            total += done.full_tensor() if hasattr(done, "full_tensor") else done  # a DTensor under loss parallel
        dist_utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        return float(total.item()) * (world // tp)  # this rank's share of the mean loss, scaled up

    out = loop(step)
    out.update({"torchtitan": getattr(torchtitan, "__version__", "0.2.2"), "attention": "torchtitan sdpa",
                "config": {"fsdp": world // tp, "tp": tp, "micro_batch": micro_batch, "ac": ac, "compile": compile,
                           "amp": isinstance(amp, torch.autocast)}})
    return out
