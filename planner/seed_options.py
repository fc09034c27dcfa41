"""What of a plan besides its layout a seed-style flag line can carry (``convert --to-flags``), so
that ``convert --from-flags`` on the printed line gives the same plan back.

Carried: the model (a preset name, ``--seq-len`` where it differs, ``--layer-num`` for a preset cut
to its first layers), ``--recompute``, ``--zero`` and ``--dtype`` (always printed: the flag's
default, bf16, would otherwise turn an fp32 plan into a bf16 one). Not carried, and said so: a
model that is no preset (a ``config.json``), ``compile`` and a residual dtype other than fp32.
"""

from __future__ import annotations

import re
from dataclasses import replace

from planner.model import PRESETS, ModelSpec
from planner.plan import Plan, PlanOptions

_CUT = re.compile(r"(?P<base>.+)-L(?P<layers>\d+)")  # planner.seed_layout names a cut model NAME-L<N>


def _model_flags(model: ModelSpec) -> list[str] | None:
    """``--model NAME [--seq-len N] [--layer-num N]`` that make ``model`` again, or None."""
    cut = _CUT.fullmatch(model.name)
    for base, layers in ((model.name, None), *(((cut["base"], int(cut["layers"])),) if cut else ())):
        preset = PRESETS.get(base)
        if preset is None or layers == preset.num_layers:  # a cut to every layer keeps the preset's name
            continue
        again = replace(preset, seq_len=model.seq_len)
        if layers is not None:
            again = replace(again, name=model.name, num_layers=layers)
        if again == model:
            return (["--model", base] + (["--seq-len", str(model.seq_len)] if model.seq_len != preset.seq_len else [])
                    + (["--layer-num", str(layers)] if layers is not None else []))
    return None


def option_flags(plan: Plan) -> tuple[list[str], list[str]]:
    """(the flags carrying the model and options, what the flags cannot carry)."""
    flags: list[str] = []
    lost: list[str] = []
    model = _model_flags(plan.model)
    if model is None:
        lost.append(f"model {plan.model.name!r} is no preset: pass its config.json with --model")
    else:
        flags += model
    opts, default = plan.options, PlanOptions()
    if opts.recompute != default.recompute:
        flags += ["--recompute", opts.recompute]
    if opts.zero != default.zero:
        flags += ["--zero", str(opts.zero)]
    flags += ["--dtype", opts.dtype]
    if opts.compile:
        lost.append("compile: pass --compile to 'hexiscale train'")
    if opts.residual_dtype != default.residual_dtype:
        lost.append(f"residual dtype {opts.residual_dtype}: the seed flags run an fp32 residual stream")
    return flags, lost
