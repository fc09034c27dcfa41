"""Checkpoint storage through ``torch.distributed.checkpoint`` (DCP): every rank writes its own
pieces (:mod:`executor.state.checkpoint_pieces`) to its own file and reads the stored pieces that overlap
what it holds, whatever plan wrote them.

* **Save** (:func:`write_pieces`): a DCP save planner that turns each piece into one ``SHARD`` write
  item at its offsets inside the logical tensor. DCP's global plan check refuses overlapping or
  incomplete rectangles, so a checkpoint always covers each logical tensor exactly once. Then each
  rank reads back the items it wrote and returns their CRC32s (:func:`item_checksums`). In the
  background variant the pieces are first copied to host memory and DCP writes them from a thread
  (``async_save``) over a gloo group of its own, while training goes on.
* **Load** (:func:`read_pieces`): a DCP load planner that asks, for each piece, for the stored
  rectangles overlapping it (DCP's resharding), after checking that the checkpoint has the tensor
  and with the full logical shape expected. The reader checks each stored item it opens against
  its CRC32 and length: a truncated, missing or altered file fails with the file and tensor named.
  DCP's index (``.metadata``, a pickle) is never unpickled by DCP: it is checked against its CRC32
  and read with a restricted unpickler first (:mod:`executor.state.checkpoint_index`).
* **Errors**: DCP gathers every rank's exception and raises it on all of them; :func:`one_line`
  turns that into one ``SpecError`` line (the lowest failing rank's reason).
"""

from __future__ import annotations

import io
import warnings
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadPlan, ReadItem, SavePlan, TensorWriteData, WriteItem, WriteItemType
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list
from torch.distributed.checkpoint.storage import WriteResult

from executor.state.checkpoint_index import index_bytes, read_index
from executor.state.checkpoint_pieces import Piece
from planner.errors import SpecError

Checksums = dict[str, dict[str, list[int]]]  # relative file -> {str(offset): [length, crc32]}


def _key(fqn: str, offsets: Iterable[int]) -> tuple[str, tuple[int, ...]]:
    return fqn, tuple(int(x) for x in offsets)


class _PieceSavePlanner(DefaultSavePlanner):
    """One SHARD write item per piece (no state dict: the pieces are the state)."""

    def __init__(self, pieces: list[Piece]):
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self.pieces = {_key(p.chunk.name, p.chunk.offsets): p for p in pieces}

    def set_up_planner(self, state_dict: Any, storage_meta: Any = None, is_coordinator: bool = False) -> None:
        self.state_dict, self.is_coordinator = {}, is_coordinator

    def create_local_plan(self) -> SavePlan:
        items = [WriteItem(index=MetadataIndex(p.chunk.name, torch.Size(p.chunk.offsets)), type=WriteItemType.SHARD,
                           tensor_data=TensorWriteData(
                               chunk=ChunkStorageMetadata(torch.Size(p.chunk.offsets), torch.Size(p.chunk.sizes)),
                               properties=TensorProperties(dtype=p.tensor.dtype), size=torch.Size(p.shape)))
                 for p in self.pieces.values()]
        self.plan = SavePlan(items)
        return self.plan

    def resolve_data(self, write_item: WriteItem) -> torch.Tensor:
        piece = self.pieces[_key(write_item.index.fqn, write_item.index.offset or ())]
        return piece.tensor.detach().to("cpu").contiguous()


class _PieceLoadPlanner(DefaultLoadPlanner):
    """Read items for the stored rectangles overlapping each piece; copies land in the pieces."""

    def __init__(self, pieces: list[Piece]):
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self.pieces = {_key(p.chunk.name, p.chunk.offsets): p for p in pieces}

    def set_up_planner(self, state_dict: Any, metadata: Any = None, is_coordinator: bool = False) -> None:
        self.state_dict, self.original_state_dict = {}, {}
        self.metadata, self.is_coordinator = metadata, is_coordinator

    def create_local_plan(self) -> LoadPlan:
        assert self.metadata is not None
        stored = self.metadata.state_dict_metadata
        items: list[ReadItem] = []
        for p in self.pieces.values():
            md = stored.get(p.chunk.name)
            if not isinstance(md, TensorStorageMetadata):
                raise SpecError("checkpoint", f"it has no tensor {p.chunk.name}", "resume from a complete checkpoint")
            if tuple(md.size) != p.shape:
                raise SpecError("checkpoint", f"{p.chunk.name} has shape {tuple(md.size)}, the model needs "
                                f"{p.shape}", "resume with a plan of the model the checkpoint was saved from")
            local = ChunkStorageMetadata(torch.Size(p.chunk.offsets), torch.Size(p.chunk.sizes))
            items += create_read_items_for_chunk_list(p.chunk.name, md, [local])
        return LoadPlan(items)

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        """Never: DCP would ``torch.load(weights_only=False)`` the bytes (only tensors are asked for)."""
        raise SpecError("checkpoint", f"it stores {read_item.dest_index.fqn} as bytes, not as a tensor",
                        "the checkpoint is damaged: resume from an earlier one")

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        piece = self.pieces[_key(read_item.dest_index.fqn, read_item.dest_index.offset or ())]
        out = piece.tensor
        for dim, (start, length) in enumerate(zip(read_item.dest_offsets, read_item.lengths)):
            out = out.narrow(dim, start, length)
        return out


class _CapturingWriter(dcp.FileSystemWriter):
    """A file writer that remembers where this rank's items went (for their checksums)."""

    written: list[WriteResult]

    def write_data(self, plan: SavePlan, planner: Any) -> Any:
        fut = super().write_data(plan, planner)
        self.written = list(fut.wait())
        return fut


class _VerifyingReader(dcp.FileSystemReader):
    """A file reader that checks every stored item it opens against its length and CRC32, and
    hands DCP the index read and checked before DCP started (DCP's own ``read_metadata`` is a plain
    ``pickle.load`` of the file: :mod:`executor.state.checkpoint_index`)."""

    def __init__(self, path: Path, checksums: Checksums, index: Any):
        super().__init__(path)
        self.checksums, self.index = checksums, index

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("rank") is not None:  # a per-rank index: we never write one, DCP must not read it
            raise SpecError("checkpoint", "it has no index .metadata", "the checkpoint is damaged: resume from an "
                            "earlier one")
        self.index.storage_meta = StorageMeta(load_id=getattr(self, "load_id", None))
        return self.index

    def _slice_file(self, file: Any, sinfo: Any) -> Any:
        file.seek(sinfo.offset)
        data = file.read(sinfo.length)
        name = sinfo.relative_path
        if len(data) != sinfo.length:
            raise SpecError("checkpoint", f"file {name} is truncated (ends {sinfo.length - len(data)} bytes early)",
                            "the checkpoint is damaged: resume from an earlier one")
        want = self.checksums.get(name, {}).get(str(sinfo.offset))
        if want is None or want[0] != sinfo.length or want[1] != zlib.crc32(data):
            raise SpecError("checkpoint", f"file {name} does not match its checksum at byte {sinfo.offset}",
                            "the checkpoint is damaged: resume from an earlier one")
        return io.BytesIO(data)


class Writing:
    """Pieces on their way to disk; :meth:`wait` returns this rank's item checksums once they are."""

    def __init__(self, path: Path, writer: _CapturingWriter, future: Any = None):
        self.path, self.writer, self.future = path, writer, future

    def wait(self) -> Checksums:
        if self.future is not None:
            with _one_line(self.path):
                self.future.result()
        return item_checksums(self.path, self.writer.written)


def write_pieces(path: Path, pieces: list[Piece], group: Any, *, single: bool, background: bool = False) -> Writing:
    """Collective over ``group``: write every rank's pieces under ``path``. ``single``: a one-rank
    plan. ``background``: copy the pieces to host memory now and write them from a thread (DCP's
    ``async_save``; ``group`` must then be a gloo group used by nothing else)."""
    writer = _CapturingWriter(path, single_file_per_rank=True, sync_files=True)
    writer.written = []
    if background:
        staged = [replace(p, tensor=p.tensor.detach().to("cpu", copy=True)) for p in pieces]
        future = dcp.async_save({}, storage_writer=writer, planner=_PieceSavePlanner(staged), process_group=group,
                                no_dist=single)
        return Writing(path, writer, getattr(future, "upload_completion", future))
    with _one_line(path), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled")  # ``single``: meant
        dcp.save({}, storage_writer=writer, planner=_PieceSavePlanner(pieces), process_group=group, no_dist=single)
    return Writing(path, writer)


def item_checksums(path: Path, written: list[WriteResult]) -> Checksums:
    """CRC32 and length of each item this rank wrote, read back from its files."""
    out: Checksums = {}
    by_file: dict[str, list[Any]] = {}
    for res in written:
        by_file.setdefault(res.storage_data.relative_path, []).append(res.storage_data)
    for name, infos in by_file.items():
        with open(path / name, "rb") as f:
            for info in infos:
                f.seek(info.offset)
                out.setdefault(name, {})[str(info.offset)] = [info.length, zlib.crc32(f.read(info.length))]
    return out


def read_pieces(path: Path, pieces: list[Piece], checksums: Checksums, group: Any, *, single: bool) -> None:
    """Collective over ``group``: fill every rank's pieces from the checkpoint under ``path`` (any
    plan wrote it). ``single``: a one-rank plan. The index is checked against its checksum and read
    without running anything from it before DCP starts (:mod:`executor.state.checkpoint_index`)."""
    index = read_index(index_bytes(path, checksums), path)
    with _one_line(path), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled")
        dcp.load({}, storage_reader=_VerifyingReader(path, checksums, index), planner=_PieceLoadPlanner(pieces),
                 process_group=group, no_dist=single)


@contextmanager
def _one_line(path: Path) -> Iterator[None]:
    try:
        yield
    except CheckpointException as exc:
        raise one_line(exc, path) from None


def one_line(exc: CheckpointException, path: Path) -> SpecError:
    """The lowest failing rank's reason as one ``SpecError`` (a ``SpecError`` keeps its hint)."""
    rank = min(exc.failures)
    cause = exc.failures[rank][0]
    while isinstance(cause, CheckpointException):
        cause = cause.failures[min(cause.failures)][0]
    if isinstance(cause, SpecError):
        return SpecError("checkpoint", f"{path}: {cause.message}", cause.hint)
    if isinstance(cause, FileNotFoundError):
        return SpecError("checkpoint", f"{path}: file {Path(str(cause.filename)).name} is missing",
                         "the checkpoint is incomplete or damaged: resume from an earlier one")
    text = f"{type(cause).__name__}: {cause}".splitlines()[0][:300]
    return SpecError("checkpoint", f"{path}: rank {rank}: {text}", "the checkpoint is damaged or unreadable")
