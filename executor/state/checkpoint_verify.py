"""Checking a checkpoint before anything loads it (pre-flight; no process group needed).

Two levels, both raising one ``SpecError`` line that names the checkpoint and what is wrong:

* :func:`verify_meta` (every rank, cheap): ``meta.json`` is a bounded, strict JSON document of
  this format; it holds the plan's model; its step is a count that agrees with the folder name
  (``step-000006`` holds step 6) and with the data position; it lists every logical tensor of the
  model with its full shape (weights and both Adam moments); every file it has checksums for
  exists and is long enough, ``.metadata`` (DCP's index, a pickle) included; the index matches its
  checksum, is read without running anything from it, and agrees with ``meta.json`` (every tensor,
  shape and stored item: :mod:`executor.state.checkpoint_index`).
* :func:`verify_files` (a share of the files per rank, so the job reads each byte once): every
  stored item's length and CRC32 against ``meta.json`` (``.metadata`` as a whole), and every stored
  tensor is finite (a checkpoint saved from a diverged run is refused).

:func:`candidates` lists what ``--resume`` may use, newest first: a checkpoint folder given
directly is the only candidate (it was asked for by name); a ``--checkpoint-dir`` offers its
``latest`` first, then every ``step-N`` folder from the newest, so the caller can fall back to the
newest intact one.
"""

from __future__ import annotations

import io
import re
import zlib
from pathlib import Path
from typing import Any

import torch

from executor.data.stream import DataPosition
from executor.parallel.zero import MOMENTS
from executor.state.checkpoint_index import METADATA, index_bytes, index_problem, read_index
from planner.documents import load_json_file
from planner.errors import SpecError
from planner.layout import logical_params
from planner.model import ModelSpec

CKPT_FORMAT = "hexiscale.ckpt/2"
PARTIAL = ".hexiscale-partial"  # in ``step-N.tmp`` while a save of ours writes it
_STEP_DIR = re.compile(r"step-(\d+)")


def _damaged(ck: Path, what: str) -> SpecError:
    return SpecError("--resume", f"{ck}: {what}", "the checkpoint is damaged: resume from an earlier one")


def candidates(resume: str) -> tuple[list[Path], bool]:
    """(checkpoint folders to try, newest first; True when ``resume`` named one checkpoint)."""
    p = Path(resume)
    if (p / "meta.json").is_file():
        return [p], True
    if not p.is_dir():
        raise SpecError("--resume", f"{p} does not exist", "pass a checkpoint or a --checkpoint-dir")
    steps = sorted((d for d in p.iterdir() if _STEP_DIR.fullmatch(d.name) and (d / "meta.json").is_file()),
                   key=lambda d: int(d.name[5:]), reverse=True)
    out = []
    latest = p / "latest"
    if latest.is_file():
        try:
            name = latest.read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            name = ""
        if _STEP_DIR.fullmatch(name) and (p / name / "meta.json").is_file():
            out.append(p / name)
    out += [d for d in steps if d not in out]
    if not out:
        raise SpecError("--resume", f"{p} holds no complete checkpoint (no step-N/meta.json)",
                        "train with --checkpoint-dir first, or drop --resume")
    return out, False


def is_checkpoint(path: Path) -> bool:
    """``path`` holds a ``meta.json`` of this format: a checkpoint that a new one may replace."""
    try:
        meta = load_json_file(path / "meta.json", "checkpoint meta.json")
    except SpecError:
        return False
    return isinstance(meta, dict) and meta.get("format") == CKPT_FORMAT


def check_checkpoint_dir(directory: str) -> None:
    """Pre-flight: every ``step-N`` (``step-N.tmp``) under ``directory`` is a checkpoint (an unfinished
    save) of ours, so that saving will never meet, let alone delete, somebody else's folder."""
    d = Path(directory)
    for entry in sorted(d.iterdir()) if d.is_dir() else []:
        name = entry.name.removesuffix(".tmp")
        if not _STEP_DIR.fullmatch(name):
            continue
        ours = (entry.is_dir() and not entry.is_symlink()
                and ((entry / PARTIAL).is_file() if entry.name.endswith(".tmp") else is_checkpoint(entry)))
        if not ours:
            raise SpecError("--checkpoint-dir", f"{entry} is named like a checkpoint but is not one of hexiscale's",
                            "move it away or pass another --checkpoint-dir (saving never deletes it)")


def expected_tensors(model: ModelSpec) -> dict[str, list[int]]:
    """Every logical tensor a checkpoint of ``model`` holds, with its full shape."""
    params = logical_params(model)
    out = {f"model/{i.name}": list(i.shape) for i in params}
    out |= {f"optim/{k}/{i.name}": list(i.shape) for k in MOMENTS for i in params}
    return out


def _checksums(ck: Path, raw: Any) -> dict[str, dict[str, list[int]]]:
    ok = isinstance(raw, dict) and all(
        isinstance(f, str) and isinstance(items, dict) and all(
            isinstance(off, str) and off.isdigit() and isinstance(v, list) and len(v) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)
            for off, v in items.items())
        for f, items in raw.items())
    if not ok:
        raise _damaged(ck, "meta.json has no valid checksums")
    if METADATA not in raw:
        raise _damaged(ck, f"meta.json has no checksum of {METADATA}")
    for name in raw:
        if "/" in name or name.startswith(".."):
            raise _damaged(ck, f"meta.json names a file outside the checkpoint: {name!r}")
    return raw  # type: ignore[no-any-return]


def verify_meta(ck: Path, model: ModelSpec) -> dict[str, Any]:
    """``meta.json`` of ``ck`` checked against the model and the files present (module docstring)."""
    try:
        meta = load_json_file(ck / "meta.json", "checkpoint meta.json")
    except SpecError as exc:
        raise _damaged(ck, f"meta.json: {exc.message}") from None
    if not isinstance(meta, dict) or meta.get("format") != CKPT_FORMAT:
        raise SpecError("--resume", f"{ck} is not a {CKPT_FORMAT} checkpoint",
                        "pass a folder written by hexiscale train --checkpoint-dir")
    want, got = model.to_dict(), meta.get("model")
    if got != want:
        got = got if isinstance(got, dict) else {}
        diff = sorted(k for k in set(want) | set(got) if got.get(k) != want.get(k))
        raise SpecError("--resume", f"{ck} holds model {got.get('name')!r}, the plan trains {want['name']!r} "
                        f"(they differ in {', '.join(diff)})", "resume with a plan of the same model")
    step = meta.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise _damaged(ck, "meta.json has no valid step")
    named = _STEP_DIR.fullmatch(ck.name)
    if named and int(named.group(1)) != step:
        raise _damaged(ck, f"the folder is named for step {int(named.group(1))} but holds step {step}")
    extra = meta.get("extra")
    if not isinstance(extra, dict):
        raise _damaged(ck, "meta.json has no valid extra")
    if "data" in extra:
        try:
            position = DataPosition.from_dict(extra["data"])
        except SpecError as exc:
            raise _damaged(ck, f"meta.json {exc.path}: {exc.message}") from None
        if position.step != step:
            raise _damaged(ck, f"its data position is at step {position.step}, the weights at step {step}")
    if meta.get("tensors") != expected_tensors(model):
        raise _damaged(ck, "its tensors (names or shapes) are not those of the model")
    for name, items in _checksums(ck, meta.get("checksums")).items():
        path = ck / name
        end = max((int(off) + v[0] for off, v in items.items()), default=0)
        if not path.is_file():
            raise _damaged(ck, f"file {name} is missing")
        if path.stat().st_size < end:
            raise _damaged(ck, f"file {name} is truncated ({path.stat().st_size} bytes, items end at {end})")
    _check_index(ck, meta)
    return meta  # type: ignore[no-any-return]


def _check_index(ck: Path, meta: dict[str, Any]) -> None:
    """DCP's index: its checksum, then read without running anything from it
    (:mod:`executor.state.checkpoint_index`) and compared with ``meta.json``."""
    try:
        problem = index_problem(read_index(index_bytes(ck, meta["checksums"]), ck), meta)
    except SpecError as exc:
        problem = exc.message.removeprefix(f"{ck}: ")
    if problem:
        raise _damaged(ck, problem)


def verify_files(ck: Path, meta: dict[str, Any], rank: int = 0, world: int = 1) -> None:
    """CRC32 and length of every item in this rank's share of the files (file ``i`` of the sorted
    list when ``i % world == rank``), and every stored tensor finite."""
    files = sorted(meta["checksums"])
    for name in files[rank::world]:
        with open(ck / name, "rb") as f:
            for off, (length, crc) in sorted(meta["checksums"][name].items(), key=lambda kv: int(kv[0])):
                f.seek(int(off))
                data = f.read(length)
                if len(data) != length or zlib.crc32(data) != crc:
                    raise _damaged(ck, f"file {name} does not match its checksum at byte {off}")
                if name != METADATA:
                    _check_item(ck, name, off, data)


def _check_item(ck: Path, name: str, off: str, data: bytes) -> None:
    try:
        value = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any undecodable item is damage
        raise _damaged(ck, f"file {name} holds an unreadable item at byte {off} ({type(exc).__name__})") from None
    if isinstance(value, torch.Tensor) and value.is_floating_point() and not bool(torch.isfinite(value).all()):
        raise SpecError("--resume", f"{ck}: file {name} holds NaN or infinite values at byte {off}",
                        "it was saved from a diverged run: resume from an earlier checkpoint")


def find_checkpoint(resume: str | Path) -> Path:
    """A checkpoint folder itself, or the newest complete one (``latest`` first) under a
    ``--checkpoint-dir`` (not verified: :func:`executor.state.resume.choose_checkpoint` does that)."""
    return candidates(str(resume))[0][0]
