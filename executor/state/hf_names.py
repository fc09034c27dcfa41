"""Hugging Face ``LlamaForCausalLM`` parameter names <-> our logical names (:mod:`planner.layout`).

Shapes and layouts are the same on both sides (``nn.Linear`` weights ``[out, in]``; q/k rows in the
rotate-half RoPE order that both models use), so a tensor moves as it is::

    model.embed_tokens.weight                      embed.weight
    model.layers.i.input_layernorm.weight          layers.i.attn_norm.weight
    model.layers.i.self_attn.{q,k,v,o}_proj.weight layers.i.attn.{wq,wk,wv,wo}.weight
    model.layers.i.post_attention_layernorm.weight layers.i.mlp_norm.weight
    model.layers.i.mlp.{gate,up,down}_proj.weight  layers.i.mlp.{w_gate,w_up,w_down}.weight
    model.norm.weight                              final_norm.weight
    lm_head.weight                                 lm_head.weight
"""

from __future__ import annotations

_LAYER = {"attn_norm": "input_layernorm", "attn.wq": "self_attn.q_proj", "attn.wk": "self_attn.k_proj",
          "attn.wv": "self_attn.v_proj", "attn.wo": "self_attn.o_proj", "mlp_norm": "post_attention_layernorm",
          "mlp.w_gate": "mlp.gate_proj", "mlp.w_up": "mlp.up_proj", "mlp.w_down": "mlp.down_proj"}
_TOP = {"embed.weight": "model.embed_tokens.weight", "final_norm.weight": "model.norm.weight",
        "lm_head.weight": "lm_head.weight"}


def hf_name(name: str) -> str:
    """The Hugging Face name of our logical parameter ``name``."""
    if name in _TOP:
        return _TOP[name]
    _, index, rest = name.split(".", 2)  # layers.<i>.<module>.weight
    return f"model.layers.{index}.{_LAYER[rest.removesuffix('.weight')]}.weight"
