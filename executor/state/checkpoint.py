"""Layout-independent, sharded checkpoints: ``save(engine, path, extra)`` and ``load(engine, path)``.

A checkpoint is a directory::

    meta.json      {"format": "hexiscale.ckpt/2", "model": ModelSpec dict, "step": k, "extra": {...},
                    "tensors": {logical name: full shape}, "checksums": {file: {offset: [length, crc32]}}}
                   (``.metadata`` has one checksum of the whole file)
    .metadata      DCP's index: which rectangle of which logical tensor is stored where
    __R_0.distcp   the rectangles rank R wrote

The logical contract does not depend on the plan: tensors are named by logical parameter
(``model/<param>``, ``optim/exp_avg/<param>``, ``optim/exp_avg_sq/<param>``) with full logical
shapes, so a checkpoint written under one plan (and ZeRO-0 or ZeRO-1) loads under any plan of the
same model. Each rank writes only what it holds and nothing passes through one host
(:mod:`executor.state.checkpoint_pieces`, :mod:`executor.state.checkpoint_io`).

:func:`write_logical` and :func:`read_logical` do the same from one process without an engine, a
tensor at a time (Hugging Face import and export, :mod:`executor.state.hf_convert`).

Atomicity: ranks write into ``<path>.tmp`` (marked as an unfinished save of ours, so that only such a
leftover is ever deleted); global rank 0 adds ``meta.json`` last and then swaps the folder in as
``<path>`` (:mod:`executor.state.folder_swap`: an older checkpoint there is replaced in one rename and
deleted only after it; a folder that is not a checkpoint is refused, never deleted), so a folder
named like a checkpoint is complete, and a save killed half-way leaves only ``<path>.tmp``.
``DIR/latest`` moves after that (``executor.train.setup``).
:func:`start_save` can write in the background (``--async-save``): the pieces are copied to host
memory, training goes on, and :meth:`PendingSave.finish` completes the checkpoint later.

Nothing is saved when any value is NaN or infinite. Pre-flight verifies a checkpoint before the
process group exists (:mod:`executor.state.checkpoint_verify`: every checksum, shape and value, with
fallback to the newest intact checkpoint). Loading checks again, each failing with one
``SpecError`` line on every rank: ``meta.json`` (format,
model), every tensor present with its full shape, the length and CRC32 of every stored item read,
and every loaded value finite (a destination no stored rectangle covers stays NaN).
"""

from __future__ import annotations

import json
import os
import shutil
import zlib
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from executor.parallel.groups import ProcessGroups
from executor.parallel.zero import MOMENTS
from executor.state.checkpoint_index import DAMAGED
from executor.state.checkpoint_pieces import Piece, load_targets, save_pieces
from executor.state.checkpoint_verify import CKPT_FORMAT, METADATA, PARTIAL, expected_tensors, is_checkpoint
from executor.state.folder_swap import check_replaceable, fresh_sibling, swap_in
from executor.train.engine import Engine
from executor.train.nonfinite import NonFiniteStep
from planner.chunks import Chunk
from planner.errors import SpecError
from planner.layout import logical_params
from planner.model import ModelSpec, model_from_dict

if TYPE_CHECKING:
    from executor.state.checkpoint_io import Writing

A_CHECKPOINT = "a hexiscale checkpoint"


def _barrier(groups: ProcessGroups, device: torch.device) -> None:
    """All-reduce of one element over the plan's ranks (works where ``dist.barrier`` needs CUDA
    context)."""
    if groups.topology.world_size > 1:
        dist.all_reduce(torch.zeros(1, device=device), group=groups.world)


def _gather(groups: ProcessGroups, obj: Any) -> list[Any]:
    """Every plan rank's ``obj`` (in rank order), on every plan rank."""
    if groups.topology.world_size == 1:
        return [obj]
    out: list[Any] = [None] * groups.topology.world_size
    dist.all_gather_object(out, obj, group=groups.world)
    return out


class PendingSave:
    """A checkpoint whose pieces are being written; :meth:`finish` (collective) completes it."""

    def __init__(self, engine: Engine, path: Path, extra: dict[str, Any], writing: Writing,
                 on_written: Callable[[], None] | None):
        self.engine, self.path, self.extra, self.writing = engine, path, extra, writing
        self.step = engine.step  # training may move on while the pieces are written
        self.on_written = on_written

    def finish(self) -> None:
        """Wait for this rank's pieces, then rank 0 writes ``meta.json`` and renames the folder."""
        engine, groups = self.engine, self.engine.groups
        sums = self.writing.wait()
        if self.on_written is not None:
            self.on_written()
        every = _gather(groups, sums)
        if engine.rank == 0:
            _finish(self.writing.path, self.path, engine.plan.model, self.step, self.extra, every)
        _barrier(groups, engine.device)


def _finish(tmp: Path, path: Path, model: ModelSpec, step: int, extra: dict[str, Any], sums: list[Any],
            flag: str = "--checkpoint-dir") -> None:
    """Rank 0, after every rank wrote into ``tmp``: ``meta.json`` last, then ``tmp`` becomes ``path``
    (an older checkpoint there is replaced atomically; anything else there is refused)."""
    checksums = {f: s for part in sums for f, s in part.items()}
    index = (tmp / METADATA).read_bytes()  # DCP's index (a pickle): checked before anything reads it
    checksums[METADATA] = {"0": [len(index), zlib.crc32(index)]}
    meta = {"format": CKPT_FORMAT, "model": model.to_dict(), "step": step, "extra": extra,
            "tensors": expected_tensors(model), "checksums": checksums}
    (tmp / "meta.json.tmp").write_text(json.dumps(meta, indent=1) + "\n")
    os.replace(tmp / "meta.json.tmp", tmp / "meta.json")
    (tmp / PARTIAL).unlink(missing_ok=True)
    swap_in(tmp, path, is_checkpoint, flag, A_CHECKPOINT)  # saved again at the same step: the new one wins


def _fresh_partial(tmp: Path) -> None:
    """An empty ``tmp`` for a save, marked as ours; only a leftover of ours is deleted first."""
    if tmp.exists() or tmp.is_symlink():
        if tmp.is_symlink() or not (tmp / PARTIAL).is_file():
            raise SpecError("--checkpoint-dir", f"{tmp} exists and is not an unfinished save of hexiscale's; "
                            "nothing was deleted", "move it away or pass another --checkpoint-dir")
        shutil.rmtree(tmp)  # a save of ours that was killed half-way
    tmp.mkdir(parents=True)
    (tmp / PARTIAL).touch()


def start_save(engine: Engine, path: str | Path, extra: dict[str, Any], *, background: Any = None,
               on_written: Callable[[], None] | None = None) -> PendingSave:
    """Collective over the plan's ranks: start writing a checkpoint of ``engine`` to ``path``
    (module docstring). ``background``: a gloo group of the plan's ranks used for nothing else; the
    pieces are then copied to host memory and written by a thread while training goes on.
    ``on_written`` runs once this rank's pieces are on disk (fault injection)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    groups = engine.groups
    if engine.rank == 0:
        _fresh_partial(tmp)
    _barrier(groups, engine.device)
    pieces = save_pieces(engine)
    _refuse_nonfinite(engine, pieces, path)
    from executor.state.checkpoint_io import write_pieces  # torch.distributed.checkpoint: ~0.5 s to import

    writing = write_pieces(tmp, pieces, background if background is not None else groups.world,
                           single=engine.topology.world_size == 1, background=background is not None)
    return PendingSave(engine, path, dict(extra), writing, on_written)


def save(engine: Engine, path: str | Path, extra: dict[str, Any], *,
         on_written: Callable[[], None] | None = None) -> None:
    """Collective over the plan's ranks: write a complete checkpoint of ``engine`` to ``path``."""
    start_save(engine, path, extra, on_written=on_written).finish()


def _refuse_nonfinite(engine: Engine, pieces: list[Piece], path: Path) -> None:
    """Collective: nothing is written when any rank holds a NaN or infinite value (the NaN guard of
    :mod:`executor.train.nonfinite` should make this unreachable; a diverged checkpoint must never exist)."""
    bad = next((p.chunk.name for p in pieces if not bool(torch.isfinite(p.tensor).all())), None)
    found = [(r, name) for r, name in enumerate(_gather(engine.groups, bad)) if name is not None]
    if found:
        rank, name = found[0]
        raise NonFiniteStep(f"refusing to save {path}: {name} holds NaN or infinite values on rank {rank}")


def _meta(path: Path) -> dict[str, Any]:
    meta_path = path / "meta.json"
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise SpecError("checkpoint", f"{path} has no meta.json (not a checkpoint, or an incomplete one)",
                        "pass a directory written by hexiscale train --checkpoint-dir") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SpecError("checkpoint", f"cannot read {meta_path}: {exc}", DAMAGED) from None
    if not isinstance(meta, dict) or meta.get("format") != CKPT_FORMAT:
        raise SpecError("checkpoint", f"{meta_path} is not a {CKPT_FORMAT} checkpoint",
                        "pass a directory written by hexiscale train --checkpoint-dir")
    return meta


def read_meta(path: str | Path) -> dict[str, Any]:
    """``{"format", "model", "step", "extra"}`` of a checkpoint directory (SpecError if invalid)."""
    meta = _meta(Path(path))
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


def _check_finite(engine: Engine, pieces: list[Piece], path: Path) -> None:
    """Collective: every rank's loaded values are finite, or every rank raises the same error."""
    bad = next((p.chunk.name for p in pieces if not bool(torch.isfinite(p.tensor).all())), None)
    found = [(r, name) for r, name in enumerate(_gather(engine.groups, bad)) if name is not None]
    if found:
        rank, name = found[0]
        raise SpecError("checkpoint", f"{path}: {name} holds NaN or infinite values after loading (rank {rank}): "
                        "a part of it was never written, or it was saved from a diverged run", DAMAGED)


def load(engine: Engine, path: str | Path) -> dict[str, Any]:
    """Collective over the plan's ranks: load a checkpoint written under any plan of the same model
    into ``engine``; returns its ``extra``."""
    path = Path(path)
    meta = _meta(path)
    diff = model_differences(meta.get("model") or {}, engine.plan.model)
    if diff:
        raise SpecError("checkpoint", f"{path} holds another model (differs in {', '.join(diff)})",
                        f"load a checkpoint of model {engine.plan.model.name!r} or train from scratch")
    if not isinstance(meta.get("checksums"), dict):
        raise SpecError("checkpoint", f"{path}/meta.json has no checksums", DAMAGED)
    pieces, install = load_targets(engine)
    from executor.state.checkpoint_io import read_pieces

    read_pieces(path, pieces, meta["checksums"], engine.groups.world, single=engine.topology.world_size == 1)
    _check_finite(engine, pieces, path)
    install(int(meta["step"]))
    _barrier(engine.groups, engine.device)
    return dict(meta.get("extra") or {})


def write_logical(path: str | Path, model: ModelSpec, weights: dict[str, torch.Tensor]) -> None:
    """One process, no engine: a step-0 checkpoint of ``model`` from full logical ``weights`` (any
    float dtype; loading casts to fp32) with zero AdamW moments, i.e. a fresh optimizer. Tensors are
    taken one at a time as they are written: memory-mapped weights and the moments (expanded zeros)
    never exist whole in memory at once."""
    path = Path(path)
    check_replaceable(path, is_checkpoint, "-o", A_CHECKPOINT)  # before any work
    tmp = fresh_sibling(path)
    from executor.state.checkpoint_io import write_pieces

    pieces = []
    for info in logical_params(model):
        full = Chunk("", (0,) * len(info.shape), info.shape)
        pieces.append(Piece(replace(full, name=f"model/{info.name}"), info.shape, weights[info.name]))
        zero = torch.zeros((), dtype=torch.float32).expand(info.shape)
        pieces += [Piece(replace(full, name=f"optim/{k}/{info.name}"), info.shape, zero) for k in MOMENTS]
    try:
        _finish(tmp, path, model, 0, {}, [write_pieces(tmp, pieces, None, single=True).wait()], "-o")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # ours alone (a fresh sibling); gone once swapped in


def read_logical(path: str | Path) -> tuple[ModelSpec, Iterator[tuple[str, torch.Tensor]]]:
    """One process, no engine: the checkpoint's model and its full fp32 weights one tensor at a
    time, in canonical order (``(name, tensor)``; the previous tensor may be freed)."""
    path = Path(path)
    meta = _meta(path)
    model = model_from_dict(meta.get("model"))
    from executor.state.checkpoint_io import read_pieces

    def weights() -> Iterator[tuple[str, torch.Tensor]]:
        for info in logical_params(model):
            out = torch.full(info.shape, float("nan"), dtype=torch.float32)
            chunk = Chunk(f"model/{info.name}", (0,) * len(info.shape), info.shape)
            read_pieces(path, [Piece(chunk, info.shape, out)], meta.get("checksums") or {}, None, single=True)
            if not bool(torch.isfinite(out).all()):
                raise SpecError("checkpoint", f"{path}: {info.name} holds NaN or infinite values", DAMAGED)
            yield info.name, out
    return model, weights()
