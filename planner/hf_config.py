"""Hugging Face Llama ``config.json`` <-> :class:`ModelSpec`.

Read: every field the executor honours (layers, sizes, heads, GQA, vocabulary, context length,
RMSNorm epsilon, RoPE θ and scaling from ``rope_parameters`` — transformers 5.x — or the legacy
top-level ``rope_theta`` and ``rope_scaling``), and one clear ``SpecError`` for what it would
silently compute differently: biases, an activation other than SiLU, attention dropout, a
``head_dim`` other than ``hidden_size / num_attention_heads``, another ``model_type``, a RoPE
scaling rule it does not implement. Tied embeddings are read (the planner costs them); the
executor refuses to train them.

The model's name comes from the config's content (``llama-L32-H4096``), never from the folder it
sits in, so the same model loaded from two places is the same model.

:func:`resolve_model` takes what ``--model`` accepts: a preset name or a config (file or folder).
Write (:func:`hf_config_of`): the config ``transformers`` needs to load an exported model.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from planner.documents import load_json_file
from planner.errors import SpecError
from planner.fields import expect_mapping, get_bool, get_float, get_int
from planner.model import MODEL_LIMITS, PRESETS, ModelSpec
from planner.ranges import check_int
from planner.rope import ROPE_TYPES, RopeScaling

REQUIRED = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")
HF_DEFAULT_EPS = 1e-6  # LlamaConfig's rms_norm_eps when a config leaves it out
HF_DEFAULT_CONTEXT = 2048  # LlamaConfig's max_position_embeddings


def _refuse_unsupported(data: Any) -> None:
    model_type = data.get("model_type", "llama")
    if model_type != "llama":
        raise SpecError("config.model_type", f"{model_type!r} is not a Llama model", "pass a Llama config")
    act = data.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise SpecError("config.hidden_act", f"{act!r}: the executor's MLP uses SiLU (SwiGLU)",
                        "use a model with hidden_act 'silu'")
    for key in ("attention_bias", "mlp_bias"):
        if data.get(key):
            raise SpecError(f"config.{key}", "biases are not implemented by the executor",
                            "use a model without biases (Llama models have none)")
    if data.get("attention_dropout"):
        raise SpecError("config.attention_dropout", f"{data['attention_dropout']}: the executor has no dropout",
                        "set attention_dropout to 0.0")


def _rope(data: Any) -> tuple[float, RopeScaling | None]:
    """θ and the scaling rule, from ``rope_parameters`` or the legacy ``rope_theta``/``rope_scaling``."""
    params = data.get("rope_parameters")
    if params is not None:
        params, path = expect_mapping(params, "config.rope_parameters"), "config.rope_parameters"
        theta = get_float(params, "rope_theta", path, positive=True,
                          default=get_float(data, "rope_theta", "config", positive=True, default=10000.0))
    else:
        theta = get_float(data, "rope_theta", "config", positive=True, default=10000.0)
        params, path = data.get("rope_scaling"), "config.rope_scaling"
        if params is None:
            return theta, None
        params = expect_mapping(params, path)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind not in ROPE_TYPES:
        raise SpecError(f"{path}.rope_type", f"{kind!r} RoPE scaling is not implemented by the executor",
                        f"use one of: default, {', '.join(ROPE_TYPES)}")
    factor = get_float(params, "factor", path, positive=True)
    if kind == "linear":
        return theta, RopeScaling("linear", factor)
    return theta, RopeScaling("llama3", factor, get_float(params, "low_freq_factor", path, positive=True),
                              get_float(params, "high_freq_factor", path, positive=True),
                              get_int(params, "original_max_position_embeddings", path, minimum=1))


def model_from_hf_config(data: Any, seq_len: int | None = None) -> ModelSpec:
    """A ModelSpec from a Hugging Face Llama ``config.json`` mapping (see the module docstring)."""
    data = expect_mapping(data, "config")
    for key in REQUIRED:
        if key not in data:
            raise SpecError(f"config.{key}", "missing from the Hugging Face config", "is this a Llama-family config?")
    _refuse_unsupported(data)
    layers = get_int(data, "num_hidden_layers", "config", minimum=1)
    hidden = get_int(data, "hidden_size", "config", minimum=1)
    heads = get_int(data, "num_attention_heads", "config", minimum=1)
    if data.get("head_dim") is not None:
        head_dim = get_int(data, "head_dim", "config", minimum=1)
        if head_dim * heads != hidden:
            raise SpecError("config.head_dim", f"{head_dim} x num_attention_heads={heads} != hidden_size={hidden}: "
                            "the executor's attention width is hidden_size", "use a model with head_dim = "
                            "hidden_size / num_attention_heads")
    theta, scaling = _rope(data)
    return ModelSpec(
        name=f"llama-L{layers}-H{hidden}",
        num_layers=layers,
        hidden_size=hidden,
        ffn_hidden_size=get_int(data, "intermediate_size", "config", minimum=1),
        num_heads=heads,
        num_kv_heads=heads if data.get("num_key_value_heads") is None
        else get_int(data, "num_key_value_heads", "config", minimum=1),
        vocab_size=get_int(data, "vocab_size", "config", minimum=1),
        seq_len=seq_len or get_int(data, "max_position_embeddings", "config", minimum=1, default=HF_DEFAULT_CONTEXT),
        rope_theta=theta,
        norm_eps=get_float(data, "rms_norm_eps", "config", positive=True, default=HF_DEFAULT_EPS),
        tie_embeddings=get_bool(data, "tie_word_embeddings", "config", default=False),
        rope_scaling=scaling,
    )


def config_path(path: str | Path) -> Path:
    """``config.json`` itself, or the one inside a model folder."""
    p = Path(path)
    return p / "config.json" if p.is_dir() else p


def load_hf_config(path: str | Path, seq_len: int | None = None) -> ModelSpec:
    """A ModelSpec from a ``config.json`` or a Hugging Face model folder."""
    p = config_path(path)
    if not p.exists():
        raise SpecError("--model", f"{str(path)!r} is neither a preset nor a config.json or model folder",
                        f"presets: {', '.join(PRESETS)}; or pass a config.json path")
    try:
        data = load_json_file(p, "model config")  # a regular file, bounded, UTF-8, no duplicate keys
    except SpecError as exc:
        raise SpecError("--model", exc.message, "pass a valid config.json") from None
    try:
        return model_from_hf_config(data, seq_len=seq_len)
    except SpecError as exc:
        raise exc.with_file(str(p)) from None


def resolve_model(name_or_path: str, seq_len: int | None = None) -> ModelSpec:
    """A preset name, or a Hugging Face ``config.json`` (or the folder holding one);
    ``seq_len`` overrides the length."""
    if seq_len is not None:
        check_int("--seq-len", seq_len, 1, MODEL_LIMITS["seq_len"], "pass a sequence length in tokens")
    if name_or_path in PRESETS:
        model = PRESETS[name_or_path]
        return replace(model, seq_len=seq_len) if seq_len else model
    return load_hf_config(name_or_path, seq_len)


def hf_config_of(model: ModelSpec, dtype: str = "float32") -> dict[str, Any]:
    """The ``config.json`` of ``model`` as ``transformers.LlamaConfig`` reads it (5.x and 4.x keys)."""
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": model.rope_theta}
    if model.rope_scaling is not None:
        rope = {**model.rope_scaling.to_dict(), "rope_theta": model.rope_theta}
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": model.num_layers,
        "hidden_size": model.hidden_size,
        "intermediate_size": model.ffn_hidden_size,
        "num_attention_heads": model.num_heads,
        "num_key_value_heads": model.num_kv_heads,
        "head_dim": model.head_dim,
        "vocab_size": model.vocab_size,
        "max_position_embeddings": model.seq_len,
        "rms_norm_eps": model.norm_eps,
        "rope_parameters": rope,
        "rope_theta": model.rope_theta,
        "rope_scaling": None if model.rope_scaling is None else model.rope_scaling.to_dict(),
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": model.tie_embeddings,
        "dtype": dtype,
        "torch_dtype": dtype,
    }
