"""The layers of the code: ``planner`` (no torch) <- ``executor`` (torch) <- ``hexiscale`` (CLI).

Every import statement counts, wherever it sits (top level, inside a function, under ``if
TYPE_CHECKING``), and so does ``importlib.import_module("...")`` / ``__import__("...")`` with a
literal name: a lazy import is still a dependency. ``make lint`` runs this file too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# package -> top-level modules it must never import
FORBIDDEN = {
    "planner": ("torch", "executor", "hexiscale"),
    "executor": ("hexiscale",),
}


def imported_names(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, dotted module name) of every import in ``tree``; relative imports are returned with
    their leading dots."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.lineno, "." * node.level + (node.module or "")))
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


def violations(package: str, banned: tuple[str, ...]) -> list[str]:
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for line, name in imported_names(ast.parse(path.read_text(), str(path))):
            top = name.split(".")[0]
            if name.startswith(".") or top in banned:
                bad.append(f"{path.relative_to(ROOT)}:{line}: imports {name}")
    return bad


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_no_higher_layer(package: str) -> None:
    """Relative imports are refused too: they would hide the layer of what they name."""
    assert not violations(package, FORBIDDEN[package]), "\n".join(violations(package, FORBIDDEN[package]))


def test_scanner_sees_lazy_and_dynamic_imports() -> None:
    code = ("def f():\n    import torch.nn\n    from executor import model\n"
            "import importlib\nimportlib.import_module(f'hexiscale.cli.{x}')\n__import__('torch')\n")
    assert sorted(n for _, n in imported_names(ast.parse(code))) == sorted([
        "importlib", "torch.nn", "executor", "hexiscale.cli.", "torch"])
