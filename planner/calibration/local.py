"""This host's calibration, found by default: what ``hexiscale calibrate`` writes and what ``plan``,
``estimate`` and ``whatif`` read.

Layout under :func:`planner.catalog.calibration_home` (``$HEXISCALE_HOME``, else ``~/.hexiscale``)::

    devices/<key>.json        measured device entries (the profiler's format); an entry here
                              replaces the packaged entry of the same key, e.g. ``h100-sxm-measured``,
                              the measured twin a cluster's ``gpu: h100-sxm`` is planned with
    calibration/<key>.json    fitted CostParams terms (``hexiscale.calibration/1``) with
                              ``applies_to``: the catalog keys they were measured for

Choice of the cost-model terms, per GPU type (issue 31: one set per cluster let an unused H100 node
change an A100 plan's estimate): for each type of the cluster, a calibration of this host that
applies to it (the type, or the measured entry planning it) beats a packaged one, then the newer;
none matching: the defaults. Terms of what several types do together (links, collectives) are the
types' own when they agree, else the defaults (:meth:`planner.cost.profile_set.ProfileSet.shared`).
:func:`describe` says in one line per estimate which profiles and calibration were used
and which GPU types have datasheet figures only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.catalog import calibration_home, profiles_dir
from planner.cluster import ClusterSpec
from planner.cost.params import DEFAULT_PARAMS, CostParams
from planner.cost.profile_set import ProfileSet
from planner.documents import load_json_file
from planner.errors import SpecError


@dataclass(frozen=True)
class Calibration:
    path: Path
    applies_to: tuple[str, ...]
    host: bool  # written by ``hexiscale calibrate`` on this host (not packaged)
    date: str
    fingerprint: str


def _read(path: Path, host: bool) -> Calibration | None:
    try:
        data = load_json_file(path, "calibration")
    except SpecError:  # unreadable, a FIFO, not UTF-8, not JSON, 10**5000, nested deep: not a calibration
        return None
    if not isinstance(data, dict) or not isinstance(data.get("applies_to"), list):
        return None
    prov = data.get("provenance")
    if not isinstance(prov, dict):
        prov = {}
    return Calibration(path, tuple(str(k) for k in data["applies_to"]), host, str(prov.get("date", "")),
                       str(prov.get("host_fingerprint", "")))


def calibrations() -> list[Calibration]:
    """Every calibration with an ``applies_to`` list: this host's, then the packaged ones."""
    out = []
    for folder, host in ((calibration_home() / "calibration", True), (profiles_dir() / "calibration", False)):
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            cal = _read(path, host)
            if cal is not None:
                out.append(cal)
    return out


def _planned_as(profiles: ProfileSet, gpu: str) -> str:
    """The catalog key whose figures plan ``gpu``: its measured twin when there is one."""
    return profiles.get(gpu).device.key


def choose(gpu: str, profiles: ProfileSet, found: list[Calibration]) -> Calibration | None:
    """The calibration for devices of type ``gpu`` among ``found``: this host's first, then the newer."""
    best: tuple[bool, str] | None = None
    chosen = None
    for cal in found:
        if gpu not in cal.applies_to and _planned_as(profiles, gpu) not in cal.applies_to:
            continue
        score = (cal.host, cal.date)
        if best is None or score > best:
            best, chosen = score, cal
    return chosen


def label(cal: Calibration) -> str:
    """How a plan file names a calibration (``Estimate.calibration``)."""
    where = f"host calibration {cal.path}" if cal.host else f"packaged calibration '{cal.path.stem}'"
    return where + (f" ({cal.date[:10]})" if cal.date else "")


@dataclass(frozen=True)
class ResolvedProfiles:
    profiles: ProfileSet
    calibrations: dict[str, Calibration | None]  # per GPU type of the cluster
    line: str  # what was used, for the user (one line)


def resolve_profiles(cluster: ClusterSpec, *, params: CostParams | None = None, spec_only: bool = False
                     ) -> ResolvedProfiles:
    """Profiles and cost-model terms for ``cluster``: this host's measured entries and calibration
    when present (module docstring); ``params`` (``--params``) overrides the calibration."""
    from planner.calibration.store import load_params

    catalog = cluster.catalog  # the packaged catalog with this host's entries (planner.catalog.default_catalog)
    types = sorted({d.gpu for d in cluster.devices})
    if params is not None:
        profiles = ProfileSet(catalog, params, prefer_measured=not spec_only, default_terms="--params file")
        return ResolvedProfiles(profiles, {}, describe(cluster, profiles, {}, True))
    probe = ProfileSet(catalog, DEFAULT_PARAMS, prefer_measured=not spec_only)
    found = calibrations()
    cals = {gpu: choose(gpu, probe, found) for gpu in types}
    loaded = {cal.path: load_params(cal.path) for cal in cals.values() if cal is not None}
    by_type = {gpu: loaded[cal.path] for gpu, cal in cals.items() if cal is not None}
    terms = {gpu: label(cal) for gpu, cal in cals.items() if cal is not None}
    distinct = {by_type.get(gpu, DEFAULT_PARAMS) for gpu in types}
    base = distinct.pop() if len(distinct) == 1 else DEFAULT_PARAMS  # one cluster-wide set only where all agree
    profiles = ProfileSet(catalog, base, prefer_measured=not spec_only, by_type=by_type, terms=terms)
    return ResolvedProfiles(profiles, cals, describe(cluster, profiles, cals, False))


def describe(cluster: ClusterSpec, profiles: ProfileSet, cals: dict[str, Calibration | None], overridden: bool) -> str:
    parts = []
    spec_only = []
    for gpu in sorted({d.gpu for d in cluster.devices}):
        prof = profiles.get(gpu)
        if prof.source == "measured":
            meta: dict[str, Any] = (prof.device.measured or {}).get("meta") or {}
            where = f"measured {str(meta.get('date', ''))[:10]} on {meta.get('gpu_name', '?')}"
            parts.append(f"{gpu} ({prof.device.key}: {where})")
        else:
            parts.append(f"{gpu} (datasheet)")
            spec_only.append(gpu)
    def named(cal: Calibration | None) -> str:
        if cal is None:
            return "default terms (no calibration matches; run 'hexiscale calibrate' on such a host)"
        return f"host calibration {cal.path}" if cal.host else f"packaged calibration '{cal.path.stem}'"

    if overridden:
        terms = "--params file"
    elif len({c.path if c else None for c in cals.values()}) <= 1:  # one set for every type
        terms = named(next(iter(cals.values()), None))
    else:
        terms = "; ".join(f"{gpu}: {named(cal)}" for gpu, cal in cals.items())
    line = f"profiles: {', '.join(parts)}; cost terms: {terms}"
    if spec_only:
        line += (f". Warning: {', '.join(spec_only)}: datasheet figures only; run 'hexiscale calibrate' on such a "
                 "GPU for measured ones")
    return line
