"""Dense single-process Llama with the logical parameter names: the oracle's reference.

Written independently of the TP layers (plain ``nn.Linear``/``nn.Embedding``, attention with an
explicit causal softmax, ``F.cross_entropy``), sharing only RoPE's table formula. Training uses
the same :class:`~executor.train.optim.OptimConfig`, parameter groups, clipping rule and LR schedule as
the engine, so any plan must reproduce :func:`reference_train` exactly (up to fp32 rounding).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from executor.model.init import logical_init
from executor.model.llama import rope_tables
from executor.train.optim import OptimConfig, build_optimizer, clip_coefficient, lr_at, set_lr
from planner.model import ModelSpec


class _Norm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * (x.pow(2).mean(-1, keepdim=True) + self.eps).rsqrt() * self.weight


class _Attn(nn.Module):
    def __init__(self, m: ModelSpec):
        super().__init__()
        self.m = m
        self.wq = nn.Linear(m.hidden_size, m.hidden_size, bias=False)
        self.wk = nn.Linear(m.hidden_size, m.kv_dim, bias=False)
        self.wv = nn.Linear(m.hidden_size, m.kv_dim, bias=False)
        self.wo = nn.Linear(m.hidden_size, m.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        m = self.m
        b, s, _ = x.shape
        d = m.head_dim
        q = self.wq(x).view(b, s, m.num_heads, d).transpose(1, 2)
        k = self.wk(x).view(b, s, m.num_kv_heads, d).transpose(1, 2)
        v = self.wv(x).view(b, s, m.num_kv_heads, d).transpose(1, 2)

        def rope(t: torch.Tensor) -> torch.Tensor:
            t1, t2 = t[..., : d // 2], t[..., d // 2:]
            return t * cos[:s] + torch.cat([-t2, t1], dim=-1) * sin[:s]

        q, k = rope(q), rope(k)
        rep = m.num_heads // m.num_kv_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        scores = q @ k.transpose(-1, -2) / d ** 0.5
        mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        att = scores.masked_fill(mask, float("-inf")).softmax(-1)
        return self.wo((att @ v).transpose(1, 2).reshape(b, s, m.hidden_size))


class _MLP(nn.Module):
    def __init__(self, m: ModelSpec):
        super().__init__()
        self.w_gate = nn.Linear(m.hidden_size, m.ffn_hidden_size, bias=False)
        self.w_up = nn.Linear(m.hidden_size, m.ffn_hidden_size, bias=False)
        self.w_down = nn.Linear(m.ffn_hidden_size, m.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class _Layer(nn.Module):
    def __init__(self, m: ModelSpec):
        super().__init__()
        self.attn_norm = _Norm(m.hidden_size, m.norm_eps)
        self.attn = _Attn(m)
        self.mlp_norm = _Norm(m.hidden_size, m.norm_eps)
        self.mlp = _MLP(m)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class DenseLlama(nn.Module):
    """The whole model in one process; ``forward(ids)`` returns logits ``[b, s, V]``."""

    def __init__(self, m: ModelSpec):
        super().__init__()
        self.spec = m
        self.embed = nn.Embedding(m.vocab_size, m.hidden_size)
        self.layers = nn.ModuleList([_Layer(m) for _ in range(m.num_layers)])
        self.final_norm = _Norm(m.hidden_size, m.norm_eps)
        self.lm_head = nn.Linear(m.hidden_size, m.vocab_size, bias=False)
        cos, sin = rope_tables(m.seq_len, m.head_dim, m.rope_theta, scaling=m.rope_scaling)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        return self.lm_head(self.final_norm(x))

    def loss(self, tokens: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
        """Mean token cross-entropy of ``tokens [b, s+1]`` (inputs ``[:, :-1]``, labels ``[:, 1:]``),
        or of a list of 1-D documents, each run through the model on its own (no packing, no mask:
        the per-document training that packed training must equal)."""
        if isinstance(tokens, list):
            total = sum(self.loss(d[None]) * (len(d) - 1) for d in tokens)
            return total / sum(len(d) - 1 for d in tokens)
        logits = self(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


@dataclass
class ReferenceRun:
    losses: list[float]
    grad_norms: list[float]
    lrs: list[float]
    state: dict[str, torch.Tensor]
    model: DenseLlama
    optimizer: torch.optim.Optimizer


def reference_model(m: ModelSpec, seed: int) -> DenseLlama:
    model = DenseLlama(m)
    model.load_state_dict(logical_init(m, seed))
    return model


def reference_train(m: ModelSpec, batches: list[torch.Tensor] | list[list[torch.Tensor]], *, optim: OptimConfig,
                    seed: int = 0,
                    model: DenseLlama | None = None, optimizer: torch.optim.Optimizer | None = None,
                    start_step: int = 0) -> ReferenceRun:
    """Train the dense model on ``batches`` (one global batch per step: ``[B, s+1]`` tokens or a list
    of documents) from the logical init."""
    model = model or reference_model(m, seed)
    opt = optimizer or build_optimizer(list(model.named_parameters()), optim)
    losses, norms, lrs = [], [], []
    for k, tokens in enumerate(batches):
        opt.zero_grad(set_to_none=True)
        loss = model.loss(tokens)
        loss.backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        coef = clip_coefficient(norm, optim.grad_clip)
        for g in grads:
            g.mul_(coef)
        lr = lr_at(start_step + k, optim)
        set_lr(opt, lr)
        opt.step()
        losses.append(float(loss.detach()))
        norms.append(float(norm))
        lrs.append(lr)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return ReferenceRun(losses, norms, lrs, state, model, opt)
