"""A Hugging Face model folder's safetensors weights, read and written with the ``safetensors``
package (the format's reference implementation: it bounds and checks every header, offset and
length, so a hostile or truncated file is one :class:`SpecError` naming the file and the reason).

Which files hold the weights is decided as transformers' ``from_pretrained`` decides it (transformers
5, ``modeling_utils._get_resolved_checkpoint_files``): ``model.safetensors`` when it exists, else
the shards that ``model.safetensors.index.json`` names (``{"metadata": {"total_size": bytes},
"weight_map": {name: file}}``); every tensor of those files counts. The index must agree with its
shards: a tensor a shard holds but the index does not list (an index edited to drop it), a tensor
listed under a file that does not hold it, or one name in two shards is refused, naming the tensor
and the files.

Reading memory-maps each file (``safe_open``: ``get_tensor`` is a view of the mapping; the OS pages
it in as it is used). Writing makes one shard's tensors and writes them with ``save_file``, so one
shard (at most ``max_shard_bytes``, or one larger tensor) is in memory at a time, as with
``save_pretrained``. Each file says in its metadata that hexiscale wrote it (:data:`WRITER`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from planner.errors import SpecError

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
WRITER = {"format": "pt", "writer": "hexiscale"}
_HINT = "pass a Hugging Face model folder (save_pretrained writes one)"


@dataclass(frozen=True)
class Entry:
    file: Path
    name: str
    dtype: str
    shape: tuple[int, ...]


def _bad(file: Path, what: str) -> SpecError:
    return SpecError("", what, _HINT, str(file))


def _open(file: Path) -> safe_open:
    if not file.is_file():
        raise _bad(file, "missing, or not a regular file")
    try:
        return safe_open(str(file), framework="pt")
    except (SafetensorError, OSError) as exc:
        reason = str(exc).removeprefix("Error while deserializing header: ")
        raise _bad(file, f"not a valid safetensors file: {reason} ({file.stat().st_size} bytes)") from None


def read_header(file: Path) -> dict[str, Entry]:
    """The tensors of one safetensors file (SpecError naming the file if it is not one)."""
    with _open(file) as f:
        out = {}
        for name in f.keys():  # noqa: SIM118 - safe_open has keys(), no iteration
            part = f.get_slice(name)
            if part.get_dtype() not in DTYPES:
                raise SpecError(name, f"dtype {part.get_dtype()} is not one of {', '.join(DTYPES)}",
                                "convert the weights to float32, bfloat16 or float16", str(file))
            out[name] = Entry(file, name, part.get_dtype(), tuple(part.get_shape()))
    return out


def file_metadata(file: Path) -> dict[str, str]:
    """The text metadata of one safetensors file (SpecError if it is not one)."""
    with _open(file) as f:
        return dict(f.metadata() or {})


def _weight_map(index: Path) -> dict[str, str]:
    try:
        raw = json.loads(index.read_text())
        weight_map = raw["weight_map"]
    except (OSError, KeyError, TypeError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _bad(index, f"not a model index ({type(exc).__name__}: {exc})") from None
    if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and v and "/" not in v and "\\" not in v and v not in (".", "..")
            for k, v in weight_map.items()):
        raise _bad(index, "weight_map must map each tensor name to a file name in the folder")
    return weight_map


def model_entries(folder: Path) -> dict[str, Entry]:
    """Every tensor that ``from_pretrained`` reads from ``folder`` (module docstring)."""
    if (folder / SINGLE).is_file():
        return read_header(folder / SINGLE)
    index = folder / INDEX
    if not index.is_file():
        raise SpecError("HF_DIR", f"{folder} has neither {SINGLE} nor {INDEX}",
                        "pass a Hugging Face model folder with safetensors weights")
    listed = _weight_map(index)
    out: dict[str, Entry] = {}
    for file in sorted(set(listed.values())):
        if not (folder / file).is_file():
            held = sorted(k for k, v in listed.items() if v == file)
            raise _bad(index, f"lists {held[0]} in {file}, which is missing or not a regular file")
        for name, entry in read_header(folder / file).items():
            if name in out:
                raise _bad(index, f"{name} is in two shards, {out[name].file.name} and {file}")
            if name not in listed:
                raise _bad(index, f"does not list {name}, which {file} holds (an edited or stale index)")
            if listed[name] != file:
                raise _bad(index, f"lists {name} in {listed[name]}, but {file} holds it")
            out[name] = entry
    missing = sorted(set(listed) - set(out))
    if missing:
        raise _bad(index, f"lists {missing[0]} in {listed[missing[0]]}, which does not hold it "
                   f"({len(missing)} such)")
    return out


def tensor(entry: Entry) -> torch.Tensor:
    """The tensor, memory-mapped (nothing is read until used)."""
    with _open(entry.file) as f:
        return f.get_tensor(entry.name)


@dataclass(frozen=True)
class Planned:
    """A tensor to write: its name, shape, dtype, and how to make it when its turn comes."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    make: Callable[[], torch.Tensor]

    @property
    def nbytes(self) -> int:
        return torch.Size(self.shape).numel() * torch.empty((), dtype=self.dtype).element_size()


def write_file(file: Path, tensors: list[Planned]) -> None:
    """One safetensors file of ``tensors``, each made in turn (module docstring)."""
    made = {}
    for t in tensors:
        value = t.make().to(t.dtype).contiguous()
        if tuple(value.shape) != t.shape:
            raise ValueError(f"{t.name}: made {tuple(value.shape)}, planned {t.shape}")
        made[t.name] = value
    save_file(made, str(file), metadata=WRITER)


def write_model(folder: Path, tensors: list[Planned], max_shard_bytes: int) -> list[Path]:
    """``model.safetensors``, or shards of at most ``max_shard_bytes`` (a larger tensor gets a
    shard of its own) with their index; returns the files written."""
    shards: list[list[Planned]] = [[]]
    size = 0
    for t in tensors:
        if shards[-1] and size + t.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += t.nbytes
    folder.mkdir(parents=True, exist_ok=True)
    if len(shards) == 1:
        write_file(folder / SINGLE, shards[0])
        return [folder / SINGLE]
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for name, shard in zip(names, shards, strict=True):
        write_file(folder / name, shard)
    index = {"metadata": {"total_size": sum(t.nbytes for t in tensors)},
             "weight_map": {t.name: name for name, shard in zip(names, shards, strict=True) for t in shard}}
    (folder / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    return [folder / n for n in names] + [folder / INDEX]
