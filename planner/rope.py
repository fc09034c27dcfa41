"""RoPE frequency scaling (``rope_scaling`` / ``rope_parameters`` of a Hugging Face config).

Plain RoPE rotates the pair ``i`` of a head (``i < d/2``) by ``pos · f_i`` with
``f_i = θ^(-2i/d)``. A scaling rule rewrites the frequencies once; positions stay ``0, 1, ...``:

* ``linear`` (position interpolation): ``f_i / factor``.
* ``llama3`` (Llama 3.1+): with ``L`` = ``original_max_position_embeddings`` and wavelength
  ``λ_i = 2π / f_i``, long waves (``λ_i > L / low_freq_factor``) are divided by ``factor``, short
  waves (``λ_i < L / high_freq_factor``) are kept, and the band between blends the two with
  ``s = (L / λ_i - low_freq_factor) / (high_freq_factor - low_freq_factor)``:
  ``f'_i = (1 - s) · f_i / factor + s · f_i``.

Neither rule scales the attention logits. Rules that depend on the running sequence length
(``dynamic``) or rescale attention (``yarn``, ``longrope``) are refused: the executor's tables are
fixed per model.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from planner.errors import SpecError
from planner.fields import check_keys, expect_mapping, get_float, get_int, get_str

ROPE_TYPES = ("linear", "llama3")


@dataclass(frozen=True)
class RopeScaling:
    rope_type: str  # "linear" or "llama3"
    factor: float
    low_freq_factor: float = 1.0  # llama3 only
    high_freq_factor: float = 4.0  # llama3 only
    original_max_position_embeddings: int = 8192  # llama3 only

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise SpecError("model.rope_scaling.rope_type", f"{self.rope_type!r} is not supported",
                            f"the executor implements {', '.join(ROPE_TYPES)} (or no scaling)")
        if not self.factor > 0:
            raise SpecError("model.rope_scaling.factor", f"must be > 0, got {self.factor}", "fix the config")
        if self.rope_type == "llama3" and not self.high_freq_factor > self.low_freq_factor > 0:
            raise SpecError("model.rope_scaling.high_freq_factor", f"needs high_freq_factor={self.high_freq_factor} "
                            f"> low_freq_factor={self.low_freq_factor} > 0", "fix the config")

    def to_dict(self) -> dict[str, Any]:
        if self.rope_type == "linear":
            return {"rope_type": "linear", "factor": self.factor}
        return asdict(self)


def rope_scaling_from_dict(data: Any, path: str = "model.rope_scaling") -> RopeScaling:
    """A :class:`RopeScaling` from plan-file JSON (strict keys)."""
    data = expect_mapping(data, path)
    kind = get_str(data, "rope_type", path, choices=ROPE_TYPES)
    if kind == "linear":
        check_keys(data, path, ("rope_type", "factor"))
        return RopeScaling("linear", get_float(data, "factor", path, positive=True))
    check_keys(data, path, ("rope_type", "factor", "low_freq_factor", "high_freq_factor",
                            "original_max_position_embeddings"))
    return RopeScaling("llama3", get_float(data, "factor", path, positive=True),
                       get_float(data, "low_freq_factor", path, positive=True),
                       get_float(data, "high_freq_factor", path, positive=True),
                       get_int(data, "original_max_position_embeddings", path, minimum=1))


def inv_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None = None) -> list[float]:
    """The ``head_dim / 2`` rotation frequencies ``f'_i`` (float64), scaled per the module docstring."""
    freqs = [theta ** (-2 * i / head_dim) for i in range(head_dim // 2)]
    if scaling is None:
        return freqs
    if scaling.rope_type == "linear":
        return [f / scaling.factor for f in freqs]
    old = scaling.original_max_position_embeddings
    low_wave, high_wave = old / scaling.low_freq_factor, old / scaling.high_freq_factor
    out = []
    for f in freqs:
        wave = 2 * math.pi / f
        if wave < high_wave:
            out.append(f)
        elif wave > low_wave:
            out.append(f / scaling.factor)
        else:
            s = (old / wave - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
            out.append((1 - s) * f / scaling.factor + s * f)
    return out
