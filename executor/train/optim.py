"""Optimizer settings, AdamW on fp32 master weights, global-norm clipping, LR warm-up + cosine.

AdamW (decoupled weight decay) per element, step ``k`` counted from 1::

    m = β1·m + (1-β1)·g        v = β2·v + (1-β2)·g²
    p ← p - lr·( m/(1-β1^k) / (sqrt(v/(1-β2^k)) + ε) + wd·p )

Weight decay applies to matrices (embedding, projections, LM head), not to RMSNorm scales. AdamW is
element-wise, so running it on TP shards gives bit-for-bit the result of the dense update.

Clipping: ``coef = min(1, max_norm / (‖g‖ + 1e-6))`` with ``‖g‖`` the L2 norm of the whole logical
gradient (every logical element counted once; see :mod:`executor.train.engine`).

Learning rate at step ``k`` (0-based): linear warm-up ``lr·(k+1)/warmup`` for ``k < warmup``; then
cosine from ``lr`` to ``min_lr`` over ``[warmup, total_steps)``; ``min_lr`` after that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from planner.layout import decays


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 3e-4
    min_lr: float = 3e-5
    warmup_steps: int = 100
    total_steps: int = 10_000
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0  # max global L2 norm; <= 0 disables clipping
    fused: bool | None = None  # torch AdamW ``fused`` (CUDA); None = torch's default

    def __post_init__(self) -> None:
        if self.lr <= 0 or self.min_lr < 0 or self.min_lr > self.lr:
            raise ValueError(f"need 0 <= min_lr <= lr and lr > 0, got lr={self.lr} min_lr={self.min_lr}")
        if self.warmup_steps < 0 or self.total_steps < 1:
            raise ValueError("warmup_steps must be >= 0 and total_steps >= 1")


def lr_at(step: int, cfg: OptimConfig) -> float:
    """Learning rate of 0-based optimizer step ``step``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.total_steps - cfg.warmup_steps)
    t = min(1.0, (step - cfg.warmup_steps) / span)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1.0 + math.cos(math.pi * t))


def build_optimizer(named_params: list[tuple[str, torch.nn.Parameter]], cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW over ``named_params`` in two groups (decayed matrices, undecayed norm scales)."""
    decay = [p for n, p in named_params if decays(n)]
    plain = [p for n, p in named_params if not decays(n)]
    groups = [g for g in ({"params": decay, "weight_decay": cfg.weight_decay},
                          {"params": plain, "weight_decay": 0.0}) if g["params"]]
    kwargs = {} if cfg.fused is None else {"fused": cfg.fused}
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, **kwargs)


def for_device(cfg: OptimConfig, device: torch.device) -> OptimConfig:
    """``cfg`` as an engine on ``device`` runs it: fused AdamW on CUDA (a few kernels for the whole
    step) unless ``cfg.fused`` says otherwise."""
    if cfg.fused is None and device.type == "cuda":
        return replace(cfg, fused=True)
    return cfg


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for g in opt.param_groups:
        g["lr"] = lr


def clip_coefficient(total_norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """``min(1, max_norm / (total_norm + 1e-6))`` as a tensor (no host sync); 1 when disabled."""
    if max_norm <= 0:
        return torch.ones_like(total_norm)
    return torch.clamp(max_norm / (total_norm + 1e-6), max=1.0)
