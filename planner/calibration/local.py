"""This host's calibration, found by default: what ``hexiscale calibrate`` writes and what ``plan``,
``estimate`` and ``whatif`` read.

Layout under :func:`planner.catalog.calibration_home` (``$HEXISCALE_HOME``, else ``~/.hexiscale``)::

    devices/<key>.json        measured device entries (the profiler's format); an entry here
                              replaces the packaged entry of the same key, e.g. ``h100-sxm-measured``,
                              the measured twin a cluster's ``gpu: h100-sxm`` is planned with
    calibration/<key>.json    fitted CostParams terms (``hexiscale.calibration/1``) with
                              ``applies_to``: the catalog keys they were measured for

Choice of the cost-model terms, per GPU type (issue 31: one set per cluster let an unused H100 node
change an A100 plan's estimate): for each type of the cluster, a calibration a node of that type names
(its ``calibration:`` field, :mod:`planner.calibration.ref`; :func:`named`), else a calibration of this
host that applies to it (the type, or the measured entry planning it), else a packaged one, then the
newer; none matching: the defaults. Terms of what several types do together (links, collectives) are
the types' own when they agree, else the defaults (:meth:`planner.cost.profile_set.ProfileSet.shared`).
:func:`describe` says in one line per estimate which profiles and calibration were used and which GPU
types have datasheet figures only; :mod:`planner.calibration.priced_by`, in another, which calibration
priced each node.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from planner.calibration.priced_by import priced_by, priced_by_line
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
    held_out: dict[str, float] | None = None  # fits.compute.held_out: the fit's cross-validated error
    forced: bool = False  # installed above the held-out limit (calibrate --force)
    packed_left_out: str | None = None  # fits.packed.left_out: why calibrate left the packed terms out

    def quality(self) -> str:
        """`` (held-out error M % mean, W % worst)``, or nothing for a calibration without the figure."""
        h = self.held_out
        if not h:
            return ""
        forced = ", installed with --force above the limit" if self.forced else ""
        return f" (held-out error {h['mean_abs_rel'] * 100:.1f} % mean, {h['max_abs_rel'] * 100:.1f} % worst{forced})"


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
                       str(prov.get("host_fingerprint", "")), *_held_out(data), _packed_left_out(data))


def _packed_left_out(data: dict[str, Any]) -> str | None:
    """``fits.packed.left_out``: why the packed rows price nothing (None: installed, or none measured)."""
    fits = data.get("fits")
    packed = fits.get("packed") if isinstance(fits, dict) else None
    reason = packed.get("left_out") if isinstance(packed, dict) else None
    return reason if isinstance(reason, str) and reason else None


def _held_out(data: dict[str, Any]) -> tuple[dict[str, float] | None, bool]:
    """``fits.compute.held_out``'s errors and whether ``--force`` installed it (None, False: not recorded)."""
    fits = data.get("fits")
    held = fits.get("compute", {}).get("held_out") if isinstance(fits, dict) and isinstance(
        fits.get("compute"), dict) else None
    if not isinstance(held, dict):
        return None, False
    try:
        return {k: float(held[k]) for k in ("mean_abs_rel", "max_abs_rel")}, held.get("forced") is True
    except (KeyError, TypeError, ValueError):
        return None, False


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


def named(cluster: ClusterSpec, profiles: ProfileSet) -> dict[str, Calibration]:
    """GPU type -> the calibration its nodes name (``calibration:``), checked: a readable calibration
    measured for that type. Cost terms are per GPU type, so nodes of different types may name
    different calibrations, nodes of one type the same one (it then prices every node of the type)."""
    chosen: dict[str, Calibration] = {}
    for node in cluster.nodes:
        if node.calibration is None:
            continue
        where = f"nodes.{node.name}.calibration"
        have = chosen.get(node.gpu)
        if have is not None:
            if str(have.path) != node.calibration:
                raise SpecError(where, f"names {node.calibration} while another {node.gpu} node names {have.path}; "
                                "cost terms are per GPU type", f"point every {node.gpu} node that names one at the "
                                "same calibration")
            continue
        cal = _read(Path(node.calibration), True)
        if cal is None:
            raise SpecError(where, f"{node.calibration} is not a calibration (no applies_to list)",
                            "name a file written by 'hexiscale calibrate'")
        if node.gpu not in cal.applies_to and _planned_as(profiles, node.gpu) not in cal.applies_to:
            raise SpecError(where, f"{cal.path} was measured for {', '.join(cal.applies_to) or 'nothing'}, not "
                            f"{node.gpu}", "point the node at a calibration of its GPU type")
        chosen[node.gpu] = cal
    return chosen


def choose(gpu: str, profiles: ProfileSet, found: list[Calibration]) -> Calibration | None:
    """The calibration for devices of type ``gpu`` among ``found``: this host's first, then the newer
    (a node's ``calibration:`` field goes before this choice: :func:`named`)."""
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
    priced_by: dict[str, dict[str, Any]]  # per node (planner.calibration.priced_by)

    def say(self, file: TextIO) -> None:
        """The two lines ``plan``, ``estimate`` and ``whatif`` print: profiles and terms; what priced each node."""
        print(self.line, file=file, flush=True)
        print(priced_by_line(self.priced_by), file=file, flush=True)


def resolve_profiles(cluster: ClusterSpec, *, params: CostParams | None = None, spec_only: bool = False
                     ) -> ResolvedProfiles:
    """Profiles and cost-model terms for ``cluster``: this host's measured entries and calibration
    when present (module docstring); ``params`` (``--params``) overrides the calibration."""
    from planner.calibration.store import load_params

    catalog = cluster.catalog  # the packaged catalog with this host's entries (planner.catalog.default_catalog)
    types = sorted({d.gpu for d in cluster.devices})
    if params is not None:
        profiles = ProfileSet(catalog, params, prefer_measured=not spec_only, default_terms="--params file")
        return ResolvedProfiles(profiles, {}, describe(cluster, profiles, {}, True),
                                priced_by(cluster, profiles, {}, True))
    probe = ProfileSet(catalog, DEFAULT_PARAMS, prefer_measured=not spec_only)
    found = calibrations()
    pointed = named(cluster, probe)
    cals = {gpu: pointed.get(gpu) or choose(gpu, probe, found) for gpu in types}
    loaded = {cal.path: load_params(cal.path) for cal in cals.values() if cal is not None}
    by_type = {gpu: loaded[cal.path] for gpu, cal in cals.items() if cal is not None}
    terms = {gpu: label(cal) for gpu, cal in cals.items() if cal is not None}
    distinct = {by_type.get(gpu, DEFAULT_PARAMS) for gpu in types}
    base = distinct.pop() if len(distinct) == 1 else DEFAULT_PARAMS  # one cluster-wide set only where all agree
    profiles = ProfileSet(catalog, base, prefer_measured=not spec_only, by_type=by_type, terms=terms)
    return ResolvedProfiles(profiles, cals, describe(cluster, profiles, cals, False),
                            priced_by(cluster, profiles, cals, False))


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
    def said(cal: Calibration | None) -> str:
        if cal is None:
            return "default terms (no calibration matches; run 'hexiscale calibrate' on such a host)"
        where = f"host calibration {cal.path}" if cal.host else f"packaged calibration '{cal.path.stem}'"
        return where + cal.quality()

    if overridden:
        terms = "--params file"
    elif len({c.path if c else None for c in cals.values()}) <= 1:  # one set for every type
        terms = said(next(iter(cals.values()), None))
    else:
        terms = "; ".join(f"{gpu}: {said(cal)}" for gpu, cal in cals.items())
    line = f"profiles: {', '.join(parts)}; cost terms: {terms}"
    if spec_only:
        line += (f". Warning: {', '.join(spec_only)}: datasheet figures only; run 'hexiscale calibrate' on such a "
                 "GPU for measured ones")
    return line
