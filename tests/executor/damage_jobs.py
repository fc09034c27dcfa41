"""A pool job that damages checkpoints in each way a disk or a run can, and loads each one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from exec_jobs import ORACLE_OPTIM

from executor.parallel.groups import ProcessGroups
from executor.state.checkpoint import load, save
from executor.train.engine import Engine
from executor.train.nonfinite import NonFiniteStep
from planner.errors import SpecError
from planner.layout import build_topology
from planner.model import ModelSpec
from planner.plan import Plan
from tests.support.checkpoint_damage import nan_item_with_valid_checksum

DAMAGES = ("truncated", "missing", "flipped", "shape", "nan", "model")


def damage(path: Path, kind: str, other: ModelSpec) -> None:
    """Damage the checkpoint at ``path`` in place (``other``: a model of other shapes)."""
    files = sorted(path.glob("__*.distcp"), key=lambda f: f.stat().st_size)
    meta = json.loads((path / "meta.json").read_text())
    if kind == "truncated":
        data = files[-1].read_bytes()
        files[-1].write_bytes(data[:len(data) // 2])
    elif kind == "missing":
        files[-1].unlink()
    elif kind == "flipped":
        data = bytearray(files[-1].read_bytes())
        data[len(data) // 2] ^= 0x40
        files[-1].write_bytes(bytes(data))
    elif kind == "shape":  # meta.json claims the model the plan trains; the tensors are another's
        meta["model"] = other.to_dict()
    elif kind == "nan":  # what a checkpoint saved from a diverged run would hold
        nan_item_with_valid_checksum(path, files[-1].name)
        return
    elif kind == "model":
        meta["model"] = {**meta["model"], "num_layers": meta["model"]["num_layers"] * 2}
    (path / "meta.json").write_text(json.dumps(meta))


def damaged_checkpoints_job(plan_x: Plan, plan_y: Plan, plan_other: Plan, root: str) -> dict[str, str] | None:
    """Save under ``plan_x`` (and try once with NaN weights: ``refused``), damage copies, load each
    under ``plan_y`` (``shape``: under ``plan_other``); per damage, this rank's error or 'loaded'."""
    rank, base = dist.get_rank(), Path(root)
    topo = build_topology(plan_x)
    groups = ProcessGroups.create(topo)
    out: dict[str, Any] = {}
    if rank < topo.world_size:
        eng = Engine(plan_x, topo, groups, device=torch.device("cpu"), optim=ORACLE_OPTIM)
        save(eng, base / "good", {})
        if rank == 0:
            with torch.no_grad():
                next(iter(eng.params.values())).fill_(float("nan"))
        try:  # refused on every rank: a diverged checkpoint is never written
            save(eng, base / "refused", {})
        except NonFiniteStep as exc:
            out["refused"] = str(exc)
    dist.barrier()
    if rank == 0:
        for kind in DAMAGES:
            shutil.copytree(base / "good", base / kind)
            damage(base / kind, kind, plan_other.model)
    dist.barrier()
    for kind in ("good", *DAMAGES):
        plan = plan_other if kind == "shape" else plan_y
        topo = build_topology(plan)
        groups = ProcessGroups.create(topo)
        if rank >= topo.world_size:
            continue
        eng = Engine(plan, topo, groups, device=torch.device("cpu"), optim=ORACLE_OPTIM)
        try:
            load(eng, base / kind)
            out[kind] = "loaded"
        except SpecError as exc:
            out[kind] = str(exc)
    return out or None
