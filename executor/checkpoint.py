"""Layout-independent checkpoints: ``save(engine, path, extra)`` and ``load(engine, path)``.

A checkpoint is a directory::

    model.pt    {name: full fp32 logical tensor}
    optim.pt    {"exp_avg": {name: tensor}, "exp_avg_sq": {name: tensor}}
    meta.json   {"format": "hexiscale.ckpt/1", "model": ModelSpec dict, "step": k, "extra": {...}}

Nothing in it depends on the plan, so a checkpoint written under one plan loads under any other
plan of the same model: every rank reads the logical tensors (memory-mapped) and copies out its own
shards. ``meta.json`` is written last, so a directory without it is an incomplete checkpoint.

Saving gathers the logical tensors to global rank 0 (:func:`executor.gather.gather_logical`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from executor.engine import Engine
from executor.gather import gather_logical
from executor.groups import ProcessGroups
from executor.model import shard_of
from planner.errors import SpecError

CKPT_FORMAT = "hexiscale.ckpt/1"


def _barrier(groups: ProcessGroups, device: torch.device) -> None:
    """All-reduce of one element over the plan's ranks (works where ``dist.barrier`` needs CUDA
    context)."""
    if groups.topology.world_size > 1:
        dist.all_reduce(torch.zeros(1, device=device), group=groups.world)


def save(engine: Engine, path: str | Path, extra: dict[str, Any]) -> None:
    """Collective: gather model and optimizer state to rank 0, which writes ``path``."""
    path = Path(path)
    model = engine.logical_state_dict(to_all=False)
    moments = engine.optimizer_moments()
    m1 = gather_logical(engine.groups, moments["exp_avg"], to_all=False)
    m2 = gather_logical(engine.groups, moments["exp_avg_sq"], to_all=False)
    if engine.rank == 0:
        path.mkdir(parents=True, exist_ok=True)
        meta_path = path / "meta.json"
        if meta_path.exists():
            meta_path.unlink()
        _atomic_save(model, path / "model.pt")
        _atomic_save({"exp_avg": m1, "exp_avg_sq": m2}, path / "optim.pt")
        meta = {"format": CKPT_FORMAT, "model": engine.plan.model.to_dict(), "step": engine.step,
                "extra": extra}
        tmp = path / "meta.json.tmp"
        tmp.write_text(json.dumps(meta, indent=2) + "\n")
        os.replace(tmp, meta_path)
    _barrier(engine.groups, engine.device)


def _atomic_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def read_meta(path: str | Path) -> dict[str, Any]:
    """``{"format", "model", "step", "extra"}`` of a checkpoint directory (SpecError if invalid)."""
    meta_path = Path(path) / "meta.json"
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise SpecError("checkpoint", f"{path} has no meta.json (not a checkpoint, or an incomplete one)",
                        "pass a directory written by hexiscale train --checkpoint-dir") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise SpecError("checkpoint", f"cannot read {meta_path}: {exc}", "the checkpoint is damaged") from None
    if not isinstance(meta, dict) or meta.get("format") != CKPT_FORMAT:
        raise SpecError("checkpoint", f"{meta_path} is not a {CKPT_FORMAT} checkpoint",
                        "pass a directory written by hexiscale train --checkpoint-dir")
    return {k: meta.get(k) for k in ("format", "model", "step", "extra")}


def load(engine: Engine, path: str | Path) -> dict[str, Any]:
    """Collective: every rank reads the logical tensors and keeps its shards. Returns ``extra``."""
    path = Path(path)
    meta = read_meta(path)
    want = engine.plan.model.to_dict()
    if meta["model"] != want:
        diff = sorted(k for k in set(want) | set(meta["model"] or {})
                      if (meta["model"] or {}).get(k) != want.get(k))
        raise SpecError("checkpoint", f"{path} holds another model (differs in {', '.join(diff)})",
                        f"load a checkpoint of model {want.get('name')!r} or train from scratch")
    tensors = torch.load(path / "model.pt", map_location="cpu", mmap=True, weights_only=True)
    optim = torch.load(path / "optim.pt", map_location="cpu", mmap=True, weights_only=True)
    tp, r = engine.stage.tp, engine.tp_rank
    with torch.no_grad():
        for name, p in engine.params.items():
            p.copy_(shard_of(tensors[name], engine.shard_dims[name], tp, r))
    moments = {key: {n: shard_of(optim[key][n], engine.shard_dims[n], tp, r) for n in engine.params}
               for key in ("exp_avg", "exp_avg_sq")}
    engine.set_optimizer_state(moments, int(meta["step"]))
    _barrier(engine.groups, engine.device)
    return dict(meta["extra"] or {})
