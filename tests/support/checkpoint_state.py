"""A checkpoint's whole training state on one process, for oracles that compare two runs:
every logical weight and both AdamW moments (``model/NAME``, ``optim/exp_avg/NAME``,
``optim/exp_avg_sq/NAME``), full fp32 tensors, whatever layout wrote them."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from executor.parallel.zero import MOMENTS
from executor.state.checkpoint_io import read_pieces
from executor.state.checkpoint_pieces import Piece
from planner.chunks import Chunk
from planner.layout import logical_params
from planner.model import model_from_dict


def training_state(path: str | Path) -> dict[str, torch.Tensor]:
    meta = json.loads((Path(path) / "meta.json").read_text())
    model = model_from_dict(meta["model"])
    out = {}
    for info in logical_params(model):
        for key in (f"model/{info.name}", *(f"optim/{m}/{info.name}" for m in MOMENTS)):
            t = torch.full(info.shape, float("nan"), dtype=torch.float32)
            read_pieces(Path(path), [Piece(Chunk(key, (0,) * len(info.shape), info.shape), info.shape, t)],
                        meta.get("checksums") or {}, None, single=True)
            out[key] = t
    return out
