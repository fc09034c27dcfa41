"""What a forward saves for its backward: every tensor autograd packs, with its size and origin.

``record_saved(stage)`` is a context manager around :func:`forward_by_layer` (a stage module's
blocks, its ``layers`` ModuleDict, run in order). Inside it, ``saved_tensors_hooks`` sees every
tensor an autograd node saves, and a ``TorchFunctionMode`` names the torch function that was
running when it was saved (``linear``, ``rms_norm``, ``scaled_dot_product_attention``, ``mul``,
...). Each tensor becomes one :class:`Saved` entry:

* ``layer``: the key of the block whose forward saved it ("" outside every block);
* ``kind``: ``weight`` (a storage of the stage's parameters or buffers: kept anyway, costs nothing
  more), ``weight-cast`` (another 2-D tensor holding a parameter's values, or its transpose's, in
  its own dtype: autocast's compute-dtype copy of a weight, saved by its matmul; compared by
  value), else ``activation``;
* ``bytes``: the bytes of its whole storage the first time that storage is saved, 0 after (views
  of one storage, such as q/k/v cut from one output, or a tensor saved by several nodes, cost
  their storage once). That is the memory the saved tensors keep alive, less whatever else holds
  the same storages (the stage input, which its caller holds, counts as layer 0's activation).

Compiled blocks (:func:`executor.model.fast_path.compile_blocks`) save through their compiled autograd
function, which these hooks see too (``name_ops=False``, see :func:`record_saved`).
Non-reentrant checkpoints install their own hooks, so what they save is not seen here: use it
with ``recompute="none"``. Works on any device (on CPU it is the only measurement we have).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode


@dataclass(frozen=True)
class Saved:
    """One tensor a forward saved for its backward (module docstring)."""

    layer: str
    op: str
    kind: str  # "activation" | "weight-cast" | "weight"
    shape: tuple[int, ...]
    dtype: str
    bytes: int  # storage bytes, 0 when the storage was already counted
    storage: int  # which storage: 0, 1, ... in the order first saved


class _OpName(TorchFunctionMode):
    """Remembers the torch function being run (the outermost one: inside ``__torch_function__``
    the mode is off, so nested calls are not seen)."""

    def __init__(self) -> None:
        super().__init__()
        self.current = ""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.current = getattr(func, "__name__", str(func))
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.current = ""


def _storage_key(t: torch.Tensor) -> tuple[str, int]:
    return str(t.device), t.untyped_storage().data_ptr()


def _copy_of(t: torch.Tensor, weights: list[torch.Tensor]) -> bool:
    """Whether ``t`` holds the values of one of the 2-D ``weights`` (or of its transpose) in its own
    dtype: a compute-dtype copy. Compared by value, since a graph output has no history to follow
    and an activation can have a weight's shape (``b·s == h``)."""
    if t.dim() != 2:
        return False
    for w in weights:
        for view in (w, w.t()):
            if view.shape == t.shape and torch.equal(t, view.to(t.dtype)):
                return True
    return False


class Recorder:
    """What :func:`record_saved` yields: ``saved`` fills as forwards run; set ``layer`` to the key of
    the block about to run (:func:`forward_by_layer` does)."""

    def __init__(self) -> None:
        self.layer = ""
        self.saved: list[Saved] = []


@contextlib.contextmanager
def record_saved(stage: nn.Module, *, name_ops: bool = True) -> Iterator[Recorder]:
    """Record what the forwards run inside the block save (module docstring). ``name_ops=False``:
    no torch-function mode (compiled blocks: Dynamo guards on the mode stack and would recompile
    them; their saved tensors come from one compiled graph, named ``compiled`` here)."""
    rec = Recorder()
    weights = {_storage_key(t) for t in (*stage.parameters(), *stage.buffers())}
    matrices = [p.detach() for p in stage.parameters() if p.dim() == 2]
    seen: dict[tuple[str, int], tuple[int, str]] = {}  # storage -> (its number, its kind)
    names = _OpName()

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key in seen:
            storage, kind = seen[key]
            size = 0
        else:
            kind = "weight" if key in weights else "weight-cast" if _copy_of(t, matrices) else "activation"
            storage, size = len(seen), 0 if kind == "weight" else t.untyped_storage().nbytes()
            seen[key] = storage, kind
        op = names.current if name_ops else "compiled"
        rec.saved.append(Saved(rec.layer, op, kind, tuple(t.shape), str(t.dtype).removeprefix("torch."), size,
                               storage))
        return t

    modes = names if name_ops else contextlib.nullcontext()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), modes:
        yield rec


def forward_by_layer(stage: nn.Module, x: torch.Tensor, rec: Recorder) -> torch.Tensor:
    """A middle stage's forward (:meth:`executor.model.llama.StageModule.forward` without embedding,
    packed documents or parameter gate: its blocks in order on the stage's RoPE tables), telling
    ``rec`` which block runs. Explicit, not module hooks: hooks would run inside compiled blocks."""
    cos, sin = stage.get_buffer("rope_cos"), stage.get_buffer("rope_sin")
    for key, block in stage.get_submodule("layers").items():
        rec.layer = key
        x = block(x, cos, sin)
    rec.layer = ""
    return x


def bytes_by_kind(saved: list[Saved], layer: str | None = None) -> dict[str, int]:
    """New bytes per kind (of one ``layer``, or of all)."""
    out = {"activation": 0, "weight-cast": 0, "weight": 0}
    for s in saved:
        if layer is None or s.layer == layer:
            out[s.kind] += s.bytes
    return out


def breakdown(saved: list[Saved], layer: str) -> list[dict[str, Any]]:
    """One layer's saved storages, the most bytes first: each with the shape and dtype it was first
    saved as, its ``bytes``, and ``saved_by``: the torch functions that saved it, in order, with how
    many tensors each (views of the storage included), e.g. ``rms_norm, linear x3``."""
    rows: dict[int, dict[str, Any]] = {}
    for s in saved:
        if s.layer != layer:
            continue
        row = rows.setdefault(s.storage, {"kind": s.kind, "shape": list(s.shape), "dtype": s.dtype, "bytes": 0,
                                          "saved_by": {}})
        row["bytes"] += s.bytes
        row["saved_by"][s.op] = row["saved_by"].get(s.op, 0) + 1
    out = []
    for row in rows.values():
        row["saved_by"] = ", ".join(op if n == 1 else f"{op} x{n}" for op, n in row["saved_by"].items())
        out.append(row)
    return sorted(out, key=lambda r: -r["bytes"])
