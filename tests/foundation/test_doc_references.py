"""Docstrings and READMEs cite files and modules that exist: every path of a ``.py`` file and every
Sphinx role (``:mod:``, ``:func:``, ``:class:``, ``:meth:``) naming a project module resolves."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("planner", "executor", "hexiscale", "benchmarks", "tests")
PATH = re.compile(r"(?<![\w/.<])((?:[\w-]+/)+[\w-]+\.py)\b")
ROLE = re.compile(r":(?:mod|func|class|meth|attr):`~?(\.*[\w.]+)`")


def sources() -> list[Path]:
    files = [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]
    return files + [ROOT / "README.md", ROOT / "benchmarks" / "README.md", ROOT / "benchmarks" / "NOTES.md"]


def module_file(dotted: str) -> Path | None:
    base = ROOT.joinpath(*dotted.split("."))
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.exists():
            return cand
    return None


def role_resolves(ref: str, where: Path) -> bool:
    """``ref`` names a module, or a name defined or imported in the deepest module it starts with; a
    bare name, one defined in the citing file."""
    if "." not in ref and where.suffix == ".py":
        if module_file(ref) is not None or (where.parent / f"{ref}.py").exists():
            return True
        name = re.escape(ref)
        defined = rf"^\s*(def|class)\s+{name}\b|^\s*(self\.)?{name}\s*[:=]|^(from|import)\s.*\b{name}\b"
        return re.search(defined, where.read_text(), re.M) is not None
    if ref.startswith("."):  # relative to the citing module's package
        package = list(where.relative_to(ROOT).parent.parts)
        dots = len(ref) - len(ref.lstrip("."))
        ref = ".".join(package[:len(package) - dots + 1] + [ref.lstrip(".")])
    parts = ref.split(".")
    if parts[0] not in PACKAGES:
        return True  # another project's name (torch, ...): not ours to check
    for i in range(len(parts), 0, -1):
        found = module_file(".".join(parts[:i]))
        if found is not None:
            return i == len(parts) or re.search(rf"\b{re.escape(parts[i])}\b", found.read_text()) is not None
    return False


def broken() -> list[str]:
    out = []
    for path in sources():
        text = path.read_text()
        for m in PATH.finditer(text):
            if not any((base / m.group(1)).exists() for base in (ROOT, path.parent)):
                out.append(f"{path.relative_to(ROOT)}: {m.group(1)}")
        out += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in ROLE.finditer(text)
                if not role_resolves(m.group(1), path)]
    return out


def test_every_cited_file_and_module_exists() -> None:
    assert not broken(), "\n".join(broken())


def test_the_check_sees_a_missing_module() -> None:
    where = ROOT / "planner" / "search" / "candidate.py"
    assert role_resolves(".layer_split", where) and role_resolves("planner.search.layer_split.split_layers", where)
    assert not role_resolves("planner.search.refine", where)
    assert not role_resolves(".refine", where)
    assert not role_resolves("planner.search.layer_split.no_such_function", where)
    assert role_resolves("evaluate", where) and not role_resolves("refine", where)
