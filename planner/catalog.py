"""Device catalog: one JSON file per GPU type under ``planner/profiles/devices/``.

Each entry carries spec-derived figures (vendor datasheet; ``"derived": "spec"``) and room for a
``measured`` section that the profiler fills (``"derived": "measured"`` entries carry it). A
measured device type that is a throttled copy of another (e.g. an H100 with 60 % of its SMs under
MPS) is its own entry: that is how a cluster file names it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from planner.documents import load_json_file
from planner.errors import SpecError
from planner.fields import check_keys, expect_mapping, get_float, get_str, join

ENTRY_KEYS_REQUIRED = ("key", "name", "memory_gib", "peak_tflops", "memory_bandwidth_GBps", "source",
                       "derived")
ENTRY_KEYS_OPTIONAL = ("aliases", "measured", "notes", "sm_percent", "base")
PROFILES_VAR = "HEXISCALE_PROFILES"


@dataclass(frozen=True)
class DeviceType:
    """One GPU type. ``peak_tflops`` maps dtype ('bf16', 'fp16', 'tf32', 'fp32') to dense TFLOP/s."""

    key: str
    name: str
    memory_gib: float
    peak_tflops: dict[str, float]
    memory_bandwidth_GBps: float
    source: str
    derived: str  # "spec" or "measured"
    aliases: tuple[str, ...] = ()
    measured: dict[str, Any] | None = field(default=None, compare=False, hash=False)
    sm_percent: float | None = None
    base: str | None = None

    def peak(self, dtype: str) -> float:
        """Peak dense TFLOP/s for ``dtype`` (fp32 training on tensor cores counts as tf32)."""
        if dtype in self.peak_tflops:
            return self.peak_tflops[dtype]
        if dtype == "fp32" and "tf32" in self.peak_tflops:
            return self.peak_tflops["tf32"]
        raise SpecError(f"devices.{self.key}.peak_tflops", f"no peak for dtype {dtype!r}",
                        f"add '{dtype}' to the catalog entry")


def profiles_dir() -> Path:
    """Where device/link profiles live: ``$HEXISCALE_PROFILES``, else the ``profiles`` package data
    of :mod:`planner` (found through the installed package, editable or not)."""
    env = os.environ.get(PROFILES_VAR)
    if not env:
        return Path(str(resources.files("planner") / "profiles"))
    folder = Path(env)
    if not folder.is_dir():
        raise SpecError(PROFILES_VAR, f"{env!r} is not a folder", f"point {PROFILES_VAR} at a profiles folder "
                        "(one holding devices/*.json) or unset it")
    if not any((folder / "devices").glob("*.json")):
        raise SpecError(PROFILES_VAR, f"{env!r} holds no device profiles (devices/*.json)",
                        f"point {PROFILES_VAR} at a profiles folder or unset it")
    return folder


def parse_device_entry(data: Any, path: str = "") -> DeviceType:
    data = expect_mapping(data, path)
    check_keys(data, path, ENTRY_KEYS_REQUIRED, ENTRY_KEYS_OPTIONAL)
    peaks = expect_mapping(data["peak_tflops"], join(path, "peak_tflops"))
    peak_values = {k: get_float(peaks, k, join(path, "peak_tflops"), positive=True) for k in peaks}
    if "bf16" not in peak_values and "fp16" not in peak_values:
        raise SpecError(join(path, "peak_tflops"), "needs a 'bf16' or 'fp16' entry", "add the dense tensor peak")
    aliases = data.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise SpecError(join(path, "aliases"), "expected a list of strings", "write [\"name\", ...]")
    measured = data.get("measured")
    if measured is not None:
        expect_mapping(measured, join(path, "measured"))
    sm = data.get("sm_percent")
    return DeviceType(
        key=get_str(data, "key", path),
        name=get_str(data, "name", path),
        memory_gib=get_float(data, "memory_gib", path, positive=True),
        peak_tflops=peak_values,
        memory_bandwidth_GBps=get_float(data, "memory_bandwidth_GBps", path, positive=True),
        source=get_str(data, "source", path),
        derived=get_str(data, "derived", path, choices=("spec", "measured")),
        aliases=tuple(aliases),
        measured=dict(measured) if measured is not None else None,
        sm_percent=get_float(data, "sm_percent", path, positive=True) if sm is not None else None,
        base=get_str(data, "base", path) if "base" in data else None,
    )


class Catalog:
    """All known device types, looked up by key or alias (case-insensitive)."""

    def __init__(self, entries: list[DeviceType]):
        self._by_key: dict[str, DeviceType] = {}
        for entry in entries:
            for name in (entry.key, *entry.aliases):
                low = name.lower()
                if low in self._by_key and self._by_key[low].key != entry.key:
                    raise SpecError(f"devices.{entry.key}", f"name {name!r} is used by two entries",
                                    "rename one alias")
                self._by_key[low] = entry
        self.entries = sorted({e.key: e for e in entries}.values(), key=lambda e: e.key)

    def __contains__(self, name: str) -> bool:
        return name.lower() in self._by_key

    def get(self, name: str, path: str = "gpu") -> DeviceType:
        try:
            return self._by_key[name.lower()]
        except KeyError:
            import difflib

            close = difflib.get_close_matches(name.lower(), list(self._by_key), n=3)
            hint = f"did you mean {', '.join(close)}?" if close else "run 'hexiscale devices' for the list"
            raise SpecError(path, f"unknown GPU type {name!r}", hint) from None

    def keys(self) -> list[str]:
        return [e.key for e in self.entries]


def load_catalog_dir(directory: Path) -> Catalog:
    entries = []
    for file in sorted(directory.glob("*.json")):
        data = load_json_file(file, "device profile")
        try:
            entries.append(parse_device_entry(data))
        except SpecError as exc:
            raise exc.with_file(str(file)) from None
    return Catalog(entries)


def calibration_home() -> Path:
    """This host's measured profiles and calibrations (``hexiscale calibrate`` writes them):
    ``$HEXISCALE_HOME``, else ``~/.hexiscale``."""
    return Path(os.environ.get("HEXISCALE_HOME") or Path.home() / ".hexiscale")


def with_host_entries(base: Catalog, folder: Path) -> Catalog:
    """``base`` with the entries under ``folder`` in place of same-key ones (and new keys added)."""
    if not folder.is_dir() or not any(folder.glob("*.json")):
        return base
    mine = [_retimed(e, folder.parent / "calibration" / f"{e.key}.json") for e in load_catalog_dir(folder).entries]
    keys = {e.key for e in mine}
    return Catalog([e for e in base.entries if e.key not in keys] + mine)


def _retimed(entry: DeviceType, calibration: Path) -> DeviceType:
    """``entry`` with the layer point its calibration timed again as ``measured.retimed`` rows.

    ``hexiscale calibrate`` times the layer once more at the end of its run, eager before compiled
    (``fits.compile.eager``, executor/profiler/compiled.py): a second timing of a table point, which
    the tables read as a bound (:func:`planner.cost.measured_tables.bounded`: of two timings of one
    point the lower holds). On 4x H100 (2026-11-27) the table's micro-batch-2 row, among the first
    timed, took 1.76 ms forward; the same point at the end 1.34 ms; the steps traced 1.26 ms."""
    if not entry.measured or "retimed" in entry.measured or not calibration.is_file():
        return entry
    try:
        comp = load_json_file(calibration, "calibration")["fits"]["compile"]
        row = {"micro_batch": comp["micro_batch"], "seq_len": comp["seq_len"], "tp": comp["tp"], "recompute": "none",
               **{k: comp["eager"][k] for k in ("forward_s", "backward_s")}}
    except (SpecError, KeyError, TypeError):  # no compile check, or not a calibration: nothing timed again
        return entry
    return replace(entry, measured={**entry.measured, "retimed": [row]})


@lru_cache(maxsize=4)
def _cached(directory: str, host: str) -> Catalog:
    return with_host_entries(load_catalog_dir(Path(directory)), Path(host))


def default_catalog() -> Catalog:
    """The packaged catalog (``planner/profiles/devices``) with this host's measured entries
    (``calibration_home()/devices``) in place of same-key ones; cached per pair of directories."""
    return _cached(str(profiles_dir() / "devices"), str(calibration_home() / "devices"))
