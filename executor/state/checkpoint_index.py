"""DCP's index of a checkpoint (``.metadata``, a pickle) read without running anything from it, and
checked against ``meta.json``.

``torch.distributed.checkpoint`` writes its index with ``pickle.dump`` and reads it back with a plain
``pickle.load``, which calls whatever the file names: a tampered index (its CRC updated in
``meta.json``) ran ``os.system`` on ``train --resume`` and on ``hf export``. :func:`read_index`
unpickles it with :class:`_IndexUnpickler`, which admits only the classes such an index holds
(found by unpickling the indexes our own saves write, torch 2.11 on the GPU machine and 2.13 here,
and listed in :data:`_ALLOWED`): DCP's metadata dataclasses, ``torch.Size``, the dtypes and layouts,
and the ``pathlib`` path of ``StorageMeta.checkpoint_id``. Anything else (``os.system``,
``builtins.exec``, ``subprocess``) is refused before it is looked up, as
``torch.load(weights_only=True)`` refuses it for tensors. DCP itself never unpickles the file:
:class:`executor.state.checkpoint_io._VerifyingReader` hands it the index read here.

:func:`index_problem` compares the index with ``meta.json`` (pre-flight): every tensor ``meta.json``
lists is in the index with its full shape and rectangles covering it, the index holds no other,
and every rectangle is stored at an item ``meta.json`` has a checksum for, so an index edited to
drop (or move) a tensor is named with where it went missing.
"""

from __future__ import annotations

import io
import math
import pickle
import zlib
from pathlib import Path
from typing import Any

import torch

from planner.errors import SpecError

METADATA = ".metadata"
DAMAGED = "the checkpoint is damaged: resume from an earlier one"
_DCP_METADATA = "torch.distributed.checkpoint.metadata"
_PATHS = {"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath"}
_ALLOWED: dict[str, set[str]] = {
    _DCP_METADATA: {"Metadata", "MetadataIndex", "ChunkStorageMetadata", "TensorStorageMetadata",
                    "BytesStorageMetadata", "TensorProperties", "StorageMeta", "_MEM_FORMAT_ENCODING"},
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},  # a layout by its name (torch's own pickling of layouts)
    "pathlib": _PATHS,
    "pathlib._local": _PATHS,  # Python 3.13 pickles paths under this module
}


class _IndexUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the names an index holds (module docstring)."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and (name == "Size" or isinstance(getattr(torch, name, None), torch.dtype)):
            return getattr(torch, name)
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it names {module}.{name}, which a checkpoint index never holds")


def index_bytes(ck: Path, checksums: dict[str, dict[str, list[int]]]) -> bytes:
    """The bytes of ``ck/.metadata`` once they match their checksum in ``meta.json``."""
    length, crc = checksums.get(METADATA, {}).get("0", [-1, -1])
    try:
        with open(ck / METADATA, "rb") as f:
            data = f.read(length + 1)
    except OSError as exc:
        raise SpecError("checkpoint", f"{ck}: cannot read {METADATA} ({exc.strerror})", DAMAGED) from None
    if len(data) != length or zlib.crc32(data) != crc:
        raise SpecError("checkpoint", f"{ck}: file {METADATA} does not match its checksum at byte 0", DAMAGED)
    return data


def read_index(data: bytes, where: Path) -> Any:
    """The ``Metadata`` pickled in ``data`` (the ``.metadata`` of checkpoint ``where``), or one
    ``SpecError`` line; nothing named in the file outside :data:`_ALLOWED` is ever called."""
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        md = _IndexUnpickler(io.BytesIO(data)).load()
    except Exception as exc:  # noqa: BLE001 - whatever the bytes do, the file is refused
        reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise SpecError("checkpoint", f"{where}: its index .metadata is refused ({reason}); nothing in it was run",
                        "the checkpoint is damaged or was tampered with: resume from another one") from None
    if not isinstance(md, Metadata) or not isinstance(md.state_dict_metadata, dict) \
            or not isinstance(md.storage_data, dict):
        raise SpecError("checkpoint", f"{where}: its index .metadata is not DCP metadata",
                        "the checkpoint is damaged or was tampered with: resume from another one")
    return md


def index_problem(md: Any, meta: dict[str, Any]) -> str | None:
    """What in the index ``md`` disagrees with ``meta.json`` (``tensors``, ``checksums``), if anything."""
    try:
        return _disagreement(md, meta)
    except (TypeError, ValueError, AttributeError, KeyError):
        return "its index .metadata is malformed (a field of the wrong type)"


def _disagreement(md: Any, meta: dict[str, Any]) -> str | None:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    stored = md.state_dict_metadata
    where = {(getattr(k, "fqn", None), tuple(getattr(k, "offset", None) or ())): v for k, v in md.storage_data.items()}
    for name, shape in meta["tensors"].items():
        got = stored.get(name)
        if not isinstance(got, TensorStorageMetadata):
            return f"its index .metadata has no tensor {name} (meta.json lists it with shape {shape})"
        if list(got.size) != list(shape):
            return f"its index .metadata has {name} with shape {list(got.size)}, meta.json {shape}"
        if sum(math.prod(c.sizes) for c in got.chunks) != math.prod(shape):
            return f"the rectangles of {name} in its index .metadata do not cover it exactly once"
        for c in got.chunks:
            info = where.get((name, tuple(c.offsets)))
            item = meta["checksums"].get(getattr(info, "relative_path", None), {}).get(str(getattr(info, "offset", "")))
            if item is None or item[0] != getattr(info, "length", None):
                return (f"its index .metadata places {name} at offset {list(c.offsets)} where meta.json has "
                        "no stored item")
    extra = sorted(set(stored) - set(meta["tensors"]))
    if extra:
        return f"its index .metadata holds {extra[0]}, which meta.json does not list ({len(extra)} such)"
    return None
