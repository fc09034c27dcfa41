"""Layout-independent checkpoints and gathering of sharded tensors to the logical layout.

A checkpoint is a directory::

    model.pt    {name: full fp32 logical tensor}
    optim.pt    {"exp_avg": {name: tensor}, "exp_avg_sq": {name: tensor}}
    meta.json   {"format": "hexiscale.ckpt/1", "model": ModelSpec dict, "step": k, "extra": {...}}

Nothing in it depends on the plan, so a checkpoint written under one plan loads under any other
plan of the same model: every rank reads the logical tensors (memory-mapped) and copies out its own
shards. ``meta.json`` is written last, so a directory without it is an incomplete checkpoint.

Gathering (:func:`gather_logical`) uses pipeline 0, which holds every parameter: per stage, the TP
ranks all-gather their shards (one flat buffer), the stage leader assembles the full tensors and
either broadcasts them over the plan's ranks or sends them to global rank 0.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from executor.groups import ProcessGroups
from executor.model import shard_of
from executor.topology import stage_params
from planner.errors import SpecError
from planner.model import ModelSpec, model_from_dict

if TYPE_CHECKING:
    from executor.engine import Engine

CKPT_FORMAT = "hexiscale.ckpt/1"


def gather_logical(groups: ProcessGroups, local: dict[str, torch.Tensor], *, to_all: bool) -> dict[str, torch.Tensor]:
    """Collective over the plan's ranks: full logical CPU tensors from every rank's shards
    (``local``: this rank's shard per name). ``to_all=False`` delivers to global rank 0 only."""
    topo = groups.topology
    rank = groups.rank
    model = topo.model
    out: dict[str, torch.Tensor] = {}
    device = next(iter(local.values())).device
    for st in topo.pipelines[0]:
        infos = stage_params(model, st.layers, st.is_first, st.is_last)
        total = sum(i.numel for i in infos)
        full: torch.Tensor | None = None
        if rank in st.ranks:
            shards = [local[i.name].detach().float().reshape(-1) for i in infos if i.shard_dim is not None]
            flat = torch.cat(shards)
            if st.tp > 1:
                parts = [torch.empty_like(flat) for _ in range(st.tp)]
                dist.all_gather(parts, flat, group=groups.group(st.ranks))
            else:
                parts = [flat]
            if rank == st.leader:
                tensors, off = [], 0
                for i in infos:
                    if i.shard_dim is None:
                        tensors.append(local[i.name].detach().float().reshape(-1))
                        continue
                    shape = list(i.shape)
                    shape[i.shard_dim] //= st.tp
                    n = i.numel // st.tp
                    pieces = [p[off:off + n].view(shape) for p in parts]
                    tensors.append(torch.cat(pieces, dim=i.shard_dim).reshape(-1))
                    off += n
                full = torch.cat(tensors)
        if to_all:
            if full is None:
                full = torch.empty(total, dtype=torch.float32, device=device)
            if topo.world_size > 1:
                dist.broadcast(full, src=st.leader, group=groups.world)
        elif st.leader != 0:
            if rank == st.leader:
                assert full is not None
                dist.send(full, dst=0)
            elif rank == 0:
                full = torch.empty(total, dtype=torch.float32, device=device)
                dist.recv(full, src=st.leader)
        if full is not None:
            flat_cpu = full.cpu()
            off = 0
            for i in infos:
                out[i.name] = flat_cpu[off:off + i.numel].view(i.shape).clone()
                off += i.numel
    return out


def _barrier(groups: ProcessGroups, device: torch.device) -> None:
    """All-reduce of one element over the plan's ranks (works where ``dist.barrier`` needs CUDA
    context)."""
    if groups.topology.world_size > 1:
        dist.all_reduce(torch.zeros(1, device=device), group=groups.world)


def save(engine: Engine, path: Path, extra: dict[str, Any]) -> None:
    """Collective: gather model and optimizer state to rank 0, which writes ``path``."""
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
                        "pass a directory written by save_checkpoint") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise SpecError("checkpoint", f"cannot read {meta_path}: {exc}", "the checkpoint is damaged") from None
    if not isinstance(meta, dict) or meta.get("format") != CKPT_FORMAT:
        raise SpecError("checkpoint", f"{meta_path} is not a {CKPT_FORMAT} checkpoint",
                        "pass a directory written by save_checkpoint")
    return {k: meta.get(k) for k in ("format", "model", "step", "extra")}


def model_differences(saved: Any, model: ModelSpec) -> list[str]:
    """The fields in which a checkpoint's model (its ``meta["model"]``) and ``model`` differ in
    their weights (:meth:`ModelSpec.weights_identity`: the name and seq_len do not count)."""
    want = model.weights_identity()
    try:
        got = model_from_dict(saved).weights_identity()
    except SpecError:
        got = dict(saved) if isinstance(saved, dict) else {}
    return sorted(k for k in set(want) | set(got) if got.get(k) != want.get(k))


def load(engine: Engine, path: Path) -> dict[str, Any]:
    """Collective: every rank reads the logical tensors and keeps its shards. Returns ``extra``."""
    meta = read_meta(path)
    diff = model_differences(meta["model"], engine.plan.model)
    if diff:
        raise SpecError("checkpoint", f"{path} holds another model (differs in {', '.join(diff)})",
                        f"load a checkpoint of model {engine.plan.model.name!r} or train from scratch")
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
