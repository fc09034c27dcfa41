"""Which calibration priced each node of an estimate: ``priced_by`` in the plan JSON's ``estimate`` and a
line of ``plan``/``estimate`` output.

Per node: the catalog entry its GPU type is planned with (``profile``: a measured entry, or the
datasheet), and the calibration whose cost terms were measured for it (``calibration``: its file, with
the host fingerprint of the machine it was measured on), or none: ``"shipped profile, uncalibrated"``
(a packaged measured entry priced with terms not measured for it) or ``"datasheet, uncalibrated"``.
One set of cost terms prices an estimate (:func:`planner.calibration.local.choose`), so a node whose
GPU type the chosen calibration does not apply to runs on terms measured for another GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from planner.cluster import ClusterSpec
from planner.cost.profile_set import ProfileSet


class CalibrationFacts(Protocol):
    """What is said of a calibration (:class:`planner.calibration.local.Calibration` has it)."""

    @property
    def path(self) -> Path: ...
    @property
    def applies_to(self) -> tuple[str, ...]: ...
    @property
    def host(self) -> bool: ...
    @property
    def fingerprint(self) -> str: ...
    @property
    def held_out(self) -> dict[str, float] | None: ...


def priced_by(cluster: ClusterSpec, profiles: ProfileSet, cal: CalibrationFacts | None, params_file: bool
              ) -> dict[str, dict[str, Any]]:
    """``{node name: {"profile", "calibration", "host", "held_out", "note"}}`` (module docstring)."""
    out: dict[str, dict[str, Any]] = {}
    for node in cluster.nodes:
        prof = profiles.get(node.gpu)
        measured = prof.source == "measured"
        entry: dict[str, Any] = {"profile": prof.device.key, "calibration": None, "host": None, "held_out": None}
        if params_file:
            entry["note"] = "--params file"
        elif cal is not None and (node.gpu in cal.applies_to or prof.device.key in cal.applies_to):
            entry.update(calibration=str(cal.path), host=cal.fingerprint or None, held_out=cal.held_out,
                         note="host calibration" if cal.host else "packaged calibration")
        else:
            entry["note"] = "shipped profile, uncalibrated" if measured else "datasheet, uncalibrated"
        out[node.name] = entry
    return out


def priced_by_line(table: dict[str, dict[str, Any]]) -> str:
    """One line: the nodes grouped by what priced them (a 4,096-node cluster stays one short line)."""
    groups: dict[str, list[str]] = {}
    for name, e in table.items():
        if e["calibration"] is None:
            what = e["note"]
        elif e["note"] == "packaged calibration":
            what = f"packaged calibration '{Path(e['calibration']).stem}'"
        else:
            what = f"{e['note']} {e['calibration']}" + (f" (host {e['host']})" if e["host"] else "")
        groups.setdefault(what, []).append(name)
    parts = []
    for what, names in groups.items():
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        parts.append(f"{shown}: {what}")
    return "priced by: " + "; ".join(parts)
