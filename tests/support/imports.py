"""What a module imports, read from its source: every import statement wherever it sits (top level,
inside a function, under ``if TYPE_CHECKING``) and ``importlib.import_module("...")`` /
``__import__("...")`` with a literal name. Used by the layer and import-cycle tests."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("planner", "executor", "hexiscale")


def imported_names(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, dotted name) of every import in ``tree``; relative imports keep their leading dots."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):  # one entry per imported name: a.b.c for from a.b import c
            base = "." * node.level + (node.module or "")
            found += [(node.lineno, f"{base}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Call) and node.args:
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
            if name in ("import_module", "__import__"):
                arg = node.args[0]
                if isinstance(arg, ast.JoinedStr) and arg.values:  # f"pkg.{x}": its literal prefix
                    arg = arg.values[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.append((node.lineno, arg.value))
    return found


def project_modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the project's packages (a package is its __init__)."""
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def module_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules that ``path`` imports (``modules``: :func:`project_modules`). ``from a.b
    import c`` counts as ``a.b.c`` when that is a module, else as ``a.b``. The parent packages that a
    Python import also runs are not counted: a package that re-exports its submodules would
    otherwise form a cycle with each of them."""
    found: set[str] = set()
    for _, name in imported_names(ast.parse(path.read_text(), str(path))):
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            found.add(name)
    return found
