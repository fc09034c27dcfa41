"""A cluster node's ``calibration:`` field: which host calibration prices that node.

The value is a calibration file (``.../calibration/<key>.json`` as ``hexiscale calibrate`` writes it;
relative paths are relative to the cluster file) or the id of one of this host's calibrations (its file
name without ``.json`` under ``$HEXISCALE_HOME/calibration``, e.g. ``h100-sxm-measured``). The file must
exist when the cluster is loaded; its contents are checked against the node's GPU type when the cluster
is priced (:func:`planner.calibration.local.choose`).
"""

from __future__ import annotations

from pathlib import Path

from planner.catalog import calibration_home
from planner.errors import SpecError


def resolve_calibration_ref(value: str, path: str, base_dir: Path | None) -> str:
    """The calibration file ``value`` names (module docstring), as an absolute path; a ``SpecError`` at
    ``path`` when there is none."""
    is_file = value.endswith(".json") or "/" in value
    if is_file:
        target = Path(value)
        target = target if target.is_absolute() else (base_dir or Path.cwd()) / target
    else:
        target = calibration_home() / "calibration" / f"{value}.json"
    try:
        found = target.is_file()
    except OSError:  # a name too long for the file system, a component that is not a folder
        found = False
    if not found:
        what = "no calibration file" if is_file else "no host calibration with this id"
        raise SpecError(path, f"{what} {value!r} (looked for {target})",
                        "name a calibration file written by 'hexiscale calibrate', or the id of one under "
                        "$HEXISCALE_HOME/calibration (its file name without .json)")
    return str(target.resolve())
