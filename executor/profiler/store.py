"""The profiler's output file: a device-catalog entry (``planner.catalog`` schema) whose ``measured``
section holds the measured tables. Written after every point (atomically), so an interrupted run
resumes where it stopped: points already in the file are skipped.

``measured`` layout (``hexiscale.measured/1``)::

    {"format": "hexiscale.measured/1",
     "meta": {"gpu_name", "driver", "torch", "cuda", "date", "sm_percent", "mode": "gpu"|"cpu", "device_count",
              "device_times"?: "full-queue"},   # CUDA: forward_s/backward_s host-free (planner.cost.pass_times)
     "model": {ModelSpec fields},  "dtype": "bf16",
     "ceilings":  {"gemm_tflops", "copy_GBps", ...},
     "layer":     [{"micro_batch", "seq_len", "tp", "recompute", "forward_s", "backward_s",
                    "forward_host_s"?, "backward_host_s"?,             # the host's issue time (timing.phase_times)
                    "activation_bytes", "peak_bytes", "chain"}, ...,    # per layer; peak_bytes of the chain
                   {"micro_batch", "seq_len", "tp", "recompute", "collectives": true, "forward_s",
                    "backward_s", "forward_host_s"?, "backward_host_s"?,
                    "chain", "ranks", "backend"}, ...],   # live TP rows (profiler.live_tp)
     "embedding": [{"micro_batch", "seq_len", "tp", "forward_s", "backward_s", ...}, ...],
     "head":      [{"micro_batch", "seq_len", "tp", "forward_s", "backward_s", ...}, ...],
     "optimizer": [{"layers", "tp", "seconds", "num_params", "num_tensors"}, ...],
     "comm":      {"world", "backend", "points": {"p2p": [...], "allreduce": [...]},
                   "fit": {"p2p": {"latency_us", "bandwidth_GBps"}, "allreduce": {...}}}}
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from planner.documents import load_json_file
from planner.errors import SpecError

MEASURED_FORMAT = "hexiscale.measured/1"
TABLE_KEYS: dict[str, tuple[str, ...]] = {
    "layer": ("micro_batch", "seq_len", "tp", "recompute"),
    "embedding": ("micro_batch", "seq_len", "tp"),
    "head": ("micro_batch", "seq_len", "tp"),
    "optimizer": ("layers", "tp"),
}


# rows resumed into a file must be timed alike: the SM share, and the device timing (host-free rows,
# planner.cost.pass_times, never mixed with older ones under one meta)
SAME_META = ("sm_percent", "device_times")


class ProfileFile:
    """A catalog entry being filled by the profiler."""

    def __init__(self, path: Path, entry: dict[str, Any]):
        self.path = path
        self.entry = entry

    @property
    def measured(self) -> dict[str, Any]:
        return self.entry["measured"]  # type: ignore[no-any-return]

    @classmethod
    def open(cls, path: Path, fresh_entry: dict[str, Any], *, resume: bool = True) -> ProfileFile:
        """Load ``path`` if it exists and was measured with the same model, dtype and SM share (else start
        from ``fresh_entry``)."""
        if resume and path.exists():
            try:
                old = load_json_file(path, "profile")
            except SpecError as exc:
                raise SpecError("--out", f"cannot read {path}: {exc.message}",
                                "delete it or pass --no-resume") from None
            if not isinstance(old, dict):
                raise SpecError("--out", f"{path} is not a JSON object", "delete it or pass --no-resume")
            m_old, m_new = old.get("measured") or {}, fresh_entry["measured"]
            same = (m_old.get("format") == MEASURED_FORMAT and m_old.get("model") == m_new["model"]
                    and m_old.get("dtype") == m_new["dtype"]
                    and all((m_old.get("meta") or {}).get(k) == m_new["meta"].get(k) for k in SAME_META))
            if not same:
                raise SpecError("--out", f"{path} holds a profile of another model/dtype/SM share/timing method",
                                "pass another --out, or --no-resume to overwrite it")
            for table in TABLE_KEYS:
                m_old.setdefault(table, [])
            return cls(path, old)
        return cls(path, fresh_entry)

    def has(self, table: str, point: dict[str, Any]) -> bool:
        """Whether ``point`` has its row (a live row and a shard-only row of one point are two rows)."""
        keys = TABLE_KEYS[table]
        live = bool(point.get("collectives", False))
        return any(all(row.get(k) == point[k] for k in keys) and bool(row.get("collectives", False)) == live
                   for row in self.measured.get(table, []))

    def add(self, table: str, point: dict[str, Any], result: dict[str, Any]) -> None:
        self.measured.setdefault(table, []).append({**point, **result})
        self.save()

    def set(self, section: str, value: Any) -> None:
        self.measured[section] = value
        self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.entry, indent=1) + "\n")
        os.replace(tmp, self.path)
