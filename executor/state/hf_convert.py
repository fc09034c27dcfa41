"""Hugging Face Llama folders <-> our layout-independent checkpoints, a tensor at a time.

* :func:`import_hf`: ``config.json`` (every field checked, :mod:`planner.hf_config`) and the
  safetensors weights (one file or shards with an index) become a step-0 checkpoint with a fresh
  optimizer; the weights are memory-mapped and written one by one, in their own dtype (loading
  casts to fp32). Any plan of the model resumes from it: ``hexiscale train --resume CKPT``
  fine-tunes the imported model.
* :func:`export_hf`: a checkpoint written under any plan becomes ``config.json`` + safetensors
  (sharded above ``max_shard_bytes``) in the dtype asked for, each tensor read and cast in turn
  and written a shard at a time; ``transformers.LlamaForCausalLM.from_pretrained`` loads the folder. The folder is
  written under a fresh sibling and swapped in whole (:mod:`executor.state.folder_swap`), so no file of
  an earlier export survives to be read instead; a non-empty folder that is not an earlier export
  of ours (:func:`is_export`) is refused and never touched.

Both refuse an output that exists and is not theirs (a checkpoint, an export) before any work.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import torch

from executor.state.checkpoint import read_logical, write_logical
from executor.state.folder_swap import check_replaceable, fresh_sibling, swap_in
from executor.state.hf_names import hf_name
from executor.state.safetensors_io import (
    INDEX,
    SINGLE,
    WRITER,
    Planned,
    file_metadata,
    model_entries,
    tensor,
    write_model,
)
from planner.errors import SpecError
from planner.hf_config import config_path, hf_config_of, load_hf_config
from planner.layout import logical_params
from planner.model import ModelSpec

EXPORT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
CONFIG_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
AN_EXPORT = "an export of hexiscale hf export"
_SHARD = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")


def is_export(folder: Path) -> bool:
    """``folder`` holds only what :func:`export_hf` writes, each weight file marked as ours."""
    files = list(folder.iterdir())
    weights = [f for f in files if f.name == SINGLE or _SHARD.fullmatch(f.name)]
    if not weights or any(not f.is_file() or f.is_symlink() for f in files) or any(
            f.name not in ("config.json", INDEX) and f not in weights for f in files):
        return False
    try:
        return all(file_metadata(f).get("writer") == WRITER["writer"] for f in weights)
    except SpecError:
        return False


def import_hf(folder: str | Path, output: str | Path, seq_len: int | None = None) -> ModelSpec:
    """Write the checkpoint ``output`` from the Hugging Face Llama folder ``folder``."""
    folder = Path(folder)
    if not folder.is_dir() or not config_path(folder).is_file():
        raise SpecError("HF_DIR", f"{folder} is not a model folder with a config.json",
                        "pass the folder save_pretrained wrote")
    model = load_hf_config(folder, seq_len)
    if model.tie_embeddings:
        raise SpecError("config.tie_word_embeddings", "tied embeddings are not supported by the executor",
                        "import a model with an untied LM head")
    entries = model_entries(folder)
    weights = {}
    for info in logical_params(model):
        name = hf_name(info.name)
        if name not in entries:
            raise SpecError(name, f"missing from the weights of {folder}", "pass a complete LlamaForCausalLM folder")
        if entries[name].shape != info.shape:
            raise SpecError(name, f"has shape {entries[name].shape}, config.json implies {info.shape}",
                            "the weights do not belong to this config.json")
        weights[info.name] = tensor(entries[name])
    extra = sorted(set(entries) - {hf_name(i.name) for i in logical_params(model)})
    if extra:
        raise SpecError(extra[0], f"a weight the executor has no place for ({len(extra)} such)",
                        "import a plain LlamaForCausalLM (no biases or extra modules)")
    write_logical(output, model, weights)
    return model


def export_hf(checkpoint: str | Path, folder: str | Path, *, dtype: str = "fp32",
              max_shard_bytes: int = 2 << 30) -> list[Path]:
    """Write the checkpoint as a Hugging Face Llama folder; returns the files written."""
    if dtype not in EXPORT_DTYPES:
        raise SpecError("--dtype", f"{dtype!r} is not one of {', '.join(EXPORT_DTYPES)}", "pick one")
    folder = Path(folder)
    check_replaceable(folder, is_export, "-o", AN_EXPORT)
    model, weights = read_logical(checkpoint)
    out_dtype = EXPORT_DTYPES[dtype]
    planned = [Planned(hf_name(info.name), info.shape, out_dtype, partial(_next, weights, info.name))
               for info in logical_params(model)]
    tmp = fresh_sibling(folder)
    try:
        names = [f.name for f in write_model(tmp, planned, max_shard_bytes)]
        config = hf_config_of(model, CONFIG_DTYPES[dtype])
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        swap_in(tmp, folder, is_export, "-o", AN_EXPORT)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # ours alone (a fresh sibling); gone once swapped in
    return [folder / n for n in [*names, "config.json"]]


def _next(weights: Iterator[tuple[str, torch.Tensor]], name: str) -> torch.Tensor:
    """The next tensor of the checkpoint's stream; it must be ``name`` (files are written in order)."""
    got, value = next(weights)
    if got != name:
        raise RuntimeError(f"export order: expected {name}, read {got}")
    return value
