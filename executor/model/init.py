"""Deterministic logical initialisation: the same full tensor per parameter name for a given seed,
whatever the plan. Every rank generates only the parameters it holds (``names``) and slices its
shard, so all plans start from the same model as the dense reference.

Each parameter draws from its own CPU ``torch.Generator`` seeded with ``crc32(name) ^ seed-mix``,
so a tensor does not depend on which other tensors a rank generates. Matrices are normal with
std 0.02; the output projections (``wo``, ``w_down``) use ``0.02 / sqrt(2 * num_layers)`` (GPT-2
style residual scaling); RMSNorm scales start at 1.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable

import torch

from planner.layout import logical_params
from planner.model import ModelSpec

INIT_STD = 0.02


def param_seed(seed: int, name: str) -> int:
    return (zlib.crc32(name.encode()) ^ (seed * 0x9E3779B1)) & 0x7FFF_FFFF_FFFF_FFFF


def init_tensor(model: ModelSpec, seed: int, name: str, shape: tuple[int, ...],
                device: torch.device | str = "cpu") -> torch.Tensor:
    """The fp32 tensor of logical parameter ``name``, drawn on ``device`` by that device's generator.
    Only the CPU's values are the contract (every plan, the dense reference); another device draws
    the same distribution with other values, much faster (a 13B's tensors: ~1 min of a CPU core),
    for runs whose figures do not depend on the values (benchmarks.fidelity.engine_start)."""
    if name.endswith("norm.weight"):
        return torch.ones(shape, dtype=torch.float32, device=device)
    std = INIT_STD
    if name.endswith(("attn.wo.weight", "mlp.w_down.weight")):
        std = INIT_STD / math.sqrt(2 * model.num_layers)
    gen = torch.Generator(device=device)
    gen.manual_seed(param_seed(seed, name))
    return torch.randn(shape, generator=gen, dtype=torch.float32, device=device) * std


def logical_init(model: ModelSpec, seed: int, names: Iterable[str] | None = None,
                 device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Full logical fp32 tensors (on ``device``, by default the CPU) for ``names`` (default: every
    parameter)."""
    wanted = None if names is None else set(names)
    return {p.name: init_tensor(model, seed, p.name, p.shape, device)
            for p in logical_params(model) if wanted is None or p.name in wanted}
