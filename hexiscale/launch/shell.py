"""Every value pasted into a generated shell line or script goes through here.

Three rules, so that no plan name, path, node name or flag value can run a command or write
outside its folder:

* values are single-quoted words (:func:`word`, ``shlex.quote``): ``$(...)``, backquotes, quotes,
  spaces and newlines stay data. Bash does not reliably unquote inside ``"${X:-...}"``, so
  defaults of overridable variables are assigned to a plain variable first (:func:`default_var`);
* comments carry only printable text (:func:`comment`), so a newline cannot end a comment;
* names that become file or folder names (node names, the run id) are plain names
  (:mod:`planner.names`), and :func:`inside` checks that a script path stays in its folder.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from planner.errors import SpecError
from planner.names import check_name, safe_name_from

_HOST = re.compile(r"[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]|[0-9A-Fa-f:.]+")
# what an #SBATCH directive value may hold (sbatch reads it, not bash)
_SBATCH = re.compile(r"[A-Za-z0-9._/%@+=,:-]+")


def word(value: str) -> str:
    """``value`` as one shell word that expands to exactly ``value``."""
    return shlex.quote(value)


def words(values: list[str] | tuple[str, ...]) -> str:
    return " ".join(word(v) for v in values)


def printable(value: str, field: str) -> str:
    """``value``, refused if it holds a control character (a newline could end a comment or a
    here-document in a generated script; no real path or name needs one)."""
    if not value.isprintable():
        raise SpecError(field, f"{value!r} holds a control character (newline, tab, ...)",
                        "use a value without control characters")
    return value


def comment(text: str) -> str:
    """``text`` safe inside a ``#`` comment line (control characters shown as ``?``)."""
    return "".join(c if c.isprintable() else "?" for c in text)


def default_var(name: str, env: str, default: str, export: bool = False) -> list[str]:
    """Lines setting ``name`` to ``$env`` if set, else to ``default`` (quoted, never expanded)."""
    return [f"{name}_DEFAULT={word(default)}",
            f'{"export " if export else ""}{name}="${{{env}:-${name}_DEFAULT}}"']


def run_id(given: str | None, plan_path: str) -> str:
    """``--run-id`` checked, or ``hexiscale-PLANSTEM`` with unsafe characters replaced."""
    if given is not None:
        return check_name(given, "--run-id", "run id")
    return safe_name_from(Path(plan_path).stem, "hexiscale")


def master_host(host: str) -> str:
    """A host name or IP address for ``--master`` (checked: it is pasted into scripts)."""
    if not _HOST.fullmatch(host):
        raise SpecError("--master", f"{host!r} is not a host name or IP address",
                        "write e.g. --master 10.0.0.1:29500 or --master gpu0:29500")
    return host


def sbatch_value(value: str, flag: str) -> str:
    """A value for an ``#SBATCH`` directive (no spaces, quotes or shell characters)."""
    if not _SBATCH.fullmatch(value):
        raise SpecError(flag, f"{value!r} cannot be written into an #SBATCH line",
                        "use a path of letters, digits and ./_-")
    return value


def inside(folder: Path, name: str) -> Path:
    """``folder / name``, refused unless it stays directly inside ``folder``."""
    path = folder / name
    if path.parent != folder or name in ("", ".", "..") or "/" in name:
        raise SpecError("nodes", f"node name {name!r} would write outside {folder}", "use a plain node name")
    return path
