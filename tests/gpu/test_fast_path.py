"""executor.model.fast_path on CPU: the fast functions compute the plain formulas (fp32, any machine)."""

from __future__ import annotations

import math

import pytest
import torch

from executor.model import fast_path
from executor.model.llama import StageModule
from planner.model import PRESETS


def _reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    s = q.shape[-2]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    mask = torch.ones(s, s, dtype=torch.bool).triu(1)
    return scores.masked_fill(mask, float("-inf")).softmax(-1) @ v


@pytest.mark.parametrize(("hq", "hkv"), [(4, 4), (4, 2), (6, 1)])
def test_causal_attention_matches_formula(hq: int, hkv: int) -> None:
    gen = torch.Generator().manual_seed(hq * 10 + hkv)
    q = torch.randn(2, hq, 9, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(2, hkv, 9, 8, generator=gen, dtype=torch.float64)
    v = torch.randn(2, hkv, 9, 8, generator=gen, dtype=torch.float64)
    out = fast_path.causal_attention(q, k, v, fast_path.attention_backends(torch.device("cpu")))
    torch.testing.assert_close(out, _reference_attention(q, k, v), rtol=1e-10, atol=1e-10)


def test_causal_attention_rejects_partial_groups() -> None:
    q, k = torch.zeros(1, 3, 4, 8), torch.zeros(1, 2, 4, 8)
    with pytest.raises(ValueError, match="not a multiple"):
        fast_path.causal_attention(q, k, k)


def test_rms_norm_matches_formula() -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(3, 5, 16, generator=gen, dtype=torch.float64)
    w = torch.randn(16, generator=gen, dtype=torch.float64)
    ref = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w
    torch.testing.assert_close(fast_path.rms_norm(x, w, 1e-5), ref)
    half = fast_path.rms_norm(x.to(torch.bfloat16), w.float(), 1e-5)
    assert half.dtype == torch.bfloat16  # output keeps the input's dtype


def test_cpu_has_no_backend_restriction_and_no_compile() -> None:
    assert fast_path.attention_backends(torch.device("cpu")) == ()
    assert fast_path.attention_kernel_name(torch.device("cpu")) == "sdpa:default"
    stage = StageModule(PRESETS["tiny"], layers=(0, 2), first=True, last=False, tp=1, tp_rank=0, group=None)
    assert fast_path.compile_blocks(stage) == 0  # off on CPU unless forced
    with pytest.raises(TypeError):
        fast_path.compile_blocks(torch.nn.Linear(2, 2))
