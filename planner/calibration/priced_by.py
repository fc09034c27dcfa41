"""Which calibration priced each node of an estimate: ``priced_by`` in the plan JSON's ``estimate`` and a
line of ``plan``/``estimate`` output.

Per node: its GPU type (``gpu``), the catalog entry that type is planned with (``profile``: a measured
entry, or the datasheet), and the calibration whose cost terms priced that type (``calibration``: its
file, with the host fingerprint of the machine it was measured on and its held-out error), or none:
``"shipped profile, uncalibrated"`` (a packaged measured entry priced with the default terms) or
``"datasheet, uncalibrated"``; ``packed_left_out`` (only where it applies): why that calibration's packed
(varlen) terms were left out, so the node's packed steps were priced from its layer table. Cost terms
are chosen per GPU type (:func:`planner.calibration.local.resolve_profiles`), so this table is the
per-node view of the same choice that the estimate's ``calibration`` (GPU type -> the label of its terms,
:meth:`planner.cost.profile_set.ProfileSet.terms_of`) records per type: ``estimate.calibration[row["gpu"]]``
names the calibration of ``row["calibration"]`` for every row; the plan JSON keeps only the rows of the
nodes the plan uses (:func:`used_by`), each of whose types ``estimate.calibration`` has.
"""


from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from planner.cluster import ClusterSpec
from planner.cost.profile_set import ProfileSet


class CalibrationFacts(Protocol):
    """What is said of a calibration (:class:`planner.calibration.local.Calibration` has it)."""

    @property
    def path(self) -> Path: ...
    @property
    def host(self) -> bool: ...
    @property
    def fingerprint(self) -> str: ...
    @property
    def held_out(self) -> dict[str, float] | None: ...
    @property
    def packed_left_out(self) -> str | None: ...


def priced_by(cluster: ClusterSpec, profiles: ProfileSet, cals: Mapping[str, CalibrationFacts | None],
              params_file: bool) -> dict[str, dict[str, Any]]:
    """``{node name: {"gpu", "profile", "calibration", "host", "held_out", "note"[, "packed_left_out"]}}``
    from ``cals``, the calibration chosen for each GPU type (module docstring)."""
    out: dict[str, dict[str, Any]] = {}
    for node in cluster.nodes:
        prof = profiles.get(node.gpu)
        measured = prof.source == "measured"
        cal = cals.get(node.gpu)
        entry: dict[str, Any] = {"gpu": node.gpu, "profile": prof.device.key, "calibration": None, "host": None,
                                 "held_out": None}
        if params_file:
            entry["note"] = "--params file"
        elif cal is not None:
            entry.update(calibration=str(cal.path), host=cal.fingerprint or None, held_out=cal.held_out,
                         note="host calibration" if cal.host else "packaged calibration")
            if cal.packed_left_out:  # its packed steps are priced from the layer table (planner.calibration.packed)
                entry["packed_left_out"] = cal.packed_left_out
        else:
            entry["note"] = "shipped profile, uncalibrated" if measured else "datasheet, uncalibrated"
        out[node.name] = entry
    return out


def used_by(table: dict[str, dict[str, Any]], cluster: ClusterSpec, devices: Iterable[str]
            ) -> dict[str, dict[str, Any]]:
    """The rows of ``table`` for the nodes of ``devices`` (a plan's): the nodes its estimate priced."""
    nodes = {cluster.device(d).node for d in devices}
    return {name: row for name, row in table.items() if name in nodes}


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
        if e.get("packed_left_out"):
            what += ", packed terms left out (held-out error above the limit)"
        groups.setdefault(what, []).append(name)
    parts = []
    for what, names in groups.items():
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        parts.append(f"{shown}: {what}")
    return "priced by: " + "; ".join(parts)
