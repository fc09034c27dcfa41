"""The safetensors file format, read and written one tensor at a time (no whole-model copy).

A file is ``uint64 LE n`` + ``n`` bytes of JSON header + the data: the header maps each name to
``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets into the data, row-major little-endian
bytes; ``"__metadata__"`` holds strings). Reading memory-maps each tensor where it lies (the OS
pages it in as it is used); writing lays out the header from the names, shapes and dtypes first,
then streams each tensor's bytes. A sharded model has ``model.safetensors.index.json``:
``{"metadata": {"total_size": bytes}, "weight_map": {name: file}}``.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from planner.errors import SpecError

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
_NUMPY = {"F32": np.float32, "BF16": np.uint16, "F16": np.float16}  # bf16 is read as raw 16-bit words
_NAMES = {v: k for k, v in DTYPES.items()}
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


@dataclass(frozen=True)
class Entry:
    file: Path
    dtype: str
    shape: tuple[int, ...]
    offset: int  # absolute byte offset of the data in ``file``


def read_header(file: Path) -> dict[str, Entry]:
    """The tensors of one safetensors file (SpecError naming the file if it is not one)."""
    try:
        with open(file, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
    except (OSError, struct.error, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SpecError("", f"not a safetensors file ({exc})", "pass a Hugging Face model folder", str(file)) from None
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info.get("dtype") not in DTYPES:
            raise SpecError(name, f"dtype {info.get('dtype')} is not one of {', '.join(DTYPES)}",
                            "convert the weights to float32, bfloat16 or float16", str(file))
        out[name] = Entry(file, info["dtype"], tuple(info["shape"]), 8 + n + info["data_offsets"][0])
    return out


def model_entries(folder: Path) -> dict[str, Entry]:
    """Every tensor of a model folder: ``model.safetensors``, or the shards its index names."""
    index = folder / INDEX
    if index.exists():
        try:
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, KeyError, AttributeError, json.JSONDecodeError) as exc:
            raise SpecError("", f"bad index ({exc})", "pass a folder written by save_pretrained", str(index)) from None
    elif (folder / SINGLE).exists():
        files = [SINGLE]
    else:
        raise SpecError("HF_DIR", f"{folder} has neither {SINGLE} nor {INDEX}",
                        "pass a Hugging Face model folder with safetensors weights")
    out: dict[str, Entry] = {}
    for name in files:
        out.update(read_header(folder / name))
    return out


def tensor(entry: Entry) -> torch.Tensor:
    """The tensor, memory-mapped (copy-on-write: nothing is read until used)."""
    count = int(np.prod(entry.shape)) if entry.shape else 1
    arr = np.memmap(entry.file, dtype=_NUMPY[entry.dtype], mode="c", offset=entry.offset, shape=(count,))
    out = torch.from_numpy(arr)
    if entry.dtype == "BF16":
        out = out.view(torch.bfloat16)
    return out.view(entry.shape)


@dataclass(frozen=True)
class Planned:
    """A tensor to write: its name, shape, dtype, and how to make it when its turn comes."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    make: Callable[[], torch.Tensor]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * torch.empty((), dtype=self.dtype).element_size()


def write_file(file: Path, tensors: Iterable[Planned]) -> None:
    """One safetensors file: the header from the plan, then each tensor made and written in turn."""
    items = list(tensors)
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    off = 0
    for t in items:
        header[t.name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + t.nbytes]}
        off += t.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned
    with open(file, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for t in items:
            value = t.make().to(t.dtype).contiguous()
            if tuple(value.shape) != t.shape:
                raise ValueError(f"{t.name}: made {tuple(value.shape)}, planned {t.shape}")
            f.write(value.view(torch.uint8).numpy().tobytes() if value.numel() else b"")


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
