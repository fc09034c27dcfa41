"""Llama-family model description, presets, and the parameter/FLOP counts every other part uses
(one formula, defined here). Hugging Face ``config.json`` files are read by :mod:`planner.hf_config`.

FLOPs per token (the convention used for MFU everywhere in HexiScale, after PaLM/Megatron)::

    model_flops_per_token = 6 * N + 12 * L * h * s

where ``N`` counts the parameters that take part in matrix multiplies (all parameters except the
input embedding table, which is a gather; the LM head counts) and ``12·L·h·s`` is attention's
score and value products (forward + backward, counted without the causal half, as is usual).
Hardware FLOPs add what recompute repeats: full recompute one more forward (``2N + 4Lhs``),
selective recompute the attention core's forward (``4Lhs``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from planner.errors import SpecError
from planner.fields import check_keys, expect_mapping, get_bool, get_float, get_int, get_str
from planner.names import check_label
from planner.rope import RopeScaling, rope_scaling_from_dict

RECOMPUTE_MODES = ("none", "selective", "full")
# Upper bounds far beyond any real model: they keep absurd values (10**30 layers) out of the
# cost model's arithmetic and the executor's allocations.
MODEL_LIMITS = {"num_layers": 10_000, "hidden_size": 1 << 20, "ffn_hidden_size": 1 << 22, "num_heads": 1 << 16,
                "num_kv_heads": 1 << 16, "vocab_size": 1 << 24, "seq_len": 1 << 24}


@dataclass(frozen=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    seq_len: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    rope_scaling: RopeScaling | None = None  # None: plain RoPE (planner.rope)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise SpecError("model.name", f"expected text, got {self.name!r}", "write the model's name in quotes")
        check_label(self.name, "model.name", "the model's name")
        for name in ("num_layers", "hidden_size", "ffn_hidden_size", "num_heads", "num_kv_heads",
                     "vocab_size", "seq_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SpecError(f"model.{name}", f"must be a positive integer, got {value!r}", "fix the model config")
            if value > MODEL_LIMITS[name]:
                raise SpecError(f"model.{name}", f"{value} is more than {MODEL_LIMITS[name]:,}",
                                "fix the model config (no Llama-style model comes near this)")
        for name in ("rope_theta", "norm_eps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
                raise SpecError(f"model.{name}", f"must be a finite positive number, got {value!r}",
                                "fix the model config")
        if self.hidden_size % self.num_heads:
            raise SpecError("model.hidden_size", f"{self.hidden_size} is not divisible by num_heads={self.num_heads}",
                            "hidden_size must be num_heads * head_dim")
        if self.num_heads % self.num_kv_heads:
            raise SpecError("model.num_kv_heads", f"num_heads={self.num_heads} is not divisible by "
                            f"num_kv_heads={self.num_kv_heads}", "grouped-query attention needs whole groups")
        if self.head_dim % 2:
            raise SpecError("model.hidden_size", f"head_dim={self.head_dim} is odd", "RoPE needs an even head_dim")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    # ---------------------------------------------------------------- parameter counts
    def layer_params(self) -> int:
        h, f = self.hidden_size, self.ffn_hidden_size
        attn = h * h + 2 * h * self.kv_dim + h * h  # q, k, v, o
        mlp = 3 * h * f  # gate, up, down
        return attn + mlp + 2 * h  # two RMSNorm weights

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def head_params(self) -> int:
        """Final norm + LM head (the head shares the embedding when tied)."""
        return self.hidden_size + (0 if self.tie_embeddings else self.vocab_size * self.hidden_size)

    def param_count(self) -> int:
        return self.num_layers * self.layer_params() + self.embedding_params() + self.head_params()

    def matmul_params(self) -> int:
        """Parameters that take part in matrix multiplies (N in the FLOP formula)."""
        return self.num_layers * self.layer_params() + self.vocab_size * self.hidden_size + self.hidden_size

    # ---------------------------------------------------------------- FLOPs
    def attention_flops_per_token(self) -> float:
        """Forward score + value products per token, all layers: 4 * L * h * s."""
        return 4.0 * self.num_layers * self.hidden_size * self.seq_len

    def model_flops_per_token(self) -> float:
        """Training FLOPs per token without recompute: 6N + 12·L·h·s."""
        return 6.0 * self.matmul_params() + 3.0 * self.attention_flops_per_token()

    def hardware_flops_per_token(self, recompute: str = "none") -> float:
        """Training FLOPs per token actually executed under ``recompute``."""
        base = self.model_flops_per_token()
        if recompute == "none":
            return base
        if recompute == "selective":
            return base + self.attention_flops_per_token()
        if recompute == "full":
            return base + 2.0 * self.matmul_params() + self.attention_flops_per_token()
        raise SpecError("options.recompute", f"unknown recompute mode {recompute!r}",
                        f"use one of {', '.join(RECOMPUTE_MODES)}")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.rope_scaling is None:
            del out["rope_scaling"]  # plan files and checkpoints of unscaled models stay as they were
        else:
            out["rope_scaling"] = self.rope_scaling.to_dict()
        return out

    def weights_identity(self) -> dict[str, Any]:
        """What decides the weights' shapes and meaning: everything but the name and seq_len, so a
        checkpoint loads whatever the model was called and whatever sequence length trains next."""
        out = self.to_dict()
        del out["name"], out["seq_len"]
        return out


PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("llama2-7b", 32, 4096, 11008, 32, 32, 32000, 4096),
        ModelSpec("llama2-13b", 40, 5120, 13824, 40, 40, 32000, 4096),
        ModelSpec("llama-30b", 60, 6656, 17920, 52, 52, 32000, 2048, norm_eps=1e-6),
        ModelSpec("llama2-70b", 80, 8192, 28672, 64, 8, 32000, 4096),
        ModelSpec("llama3-8b", 32, 4096, 14336, 32, 8, 128256, 8192, rope_theta=500000.0),
        ModelSpec("llama-1.3b", 24, 2048, 5632, 16, 16, 32000, 4096),
        # CPU test sizes: tiny enough for gloo oracles in CI, with GQA and heads divisible by 4.
        ModelSpec("tiny", 4, 64, 176, 4, 2, 256, 32),
        ModelSpec("tiny-8l", 8, 64, 176, 8, 4, 256, 32),
    )
}

MODEL_KEYS = tuple(ModelSpec.__dataclass_fields__)


def model_from_dict(data: Any, path: str = "model") -> ModelSpec:
    """A ModelSpec from plan-file JSON (strict keys)."""
    data = expect_mapping(data, path)
    check_keys(data, path, ("num_layers", "hidden_size", "ffn_hidden_size", "num_heads", "vocab_size", "seq_len"),
               ("name", "num_kv_heads", "rope_theta", "norm_eps", "tie_embeddings", "rope_scaling"))
    heads = get_int(data, "num_heads", path, minimum=1)
    try:
        return ModelSpec(
            name=get_str(data, "name", path, default="custom"),
            num_layers=get_int(data, "num_layers", path, minimum=1),
            hidden_size=get_int(data, "hidden_size", path, minimum=1),
            ffn_hidden_size=get_int(data, "ffn_hidden_size", path, minimum=1),
            num_heads=heads,
            num_kv_heads=get_int(data, "num_kv_heads", path, minimum=1, default=heads),
            vocab_size=get_int(data, "vocab_size", path, minimum=1),
            seq_len=get_int(data, "seq_len", path, minimum=1),
            rope_theta=get_float(data, "rope_theta", path, positive=True, default=10000.0),
            norm_eps=get_float(data, "norm_eps", path, positive=True, default=1e-5),
            tie_embeddings=get_bool(data, "tie_embeddings", path, default=False),
            rope_scaling=(rope_scaling_from_dict(data["rope_scaling"], f"{path}.rope_scaling")
                          if data.get("rope_scaling") is not None else None),
        )
    except SpecError as exc:
        if exc.path.startswith("model.") and path != "model":
            raise SpecError(path + exc.path[len("model"):], exc.message, exc.hint) from None
        raise
