"""The layers of the code: ``planner`` (no torch) <- ``executor`` (torch) <- ``hexiscale`` (CLI).

Every import statement counts, wherever it sits (top level, inside a function, under ``if
TYPE_CHECKING``), and so does ``importlib.import_module("...")`` / ``__import__("...")`` with a
literal name: a lazy import is still a dependency. ``make lint`` runs this file too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.imports import imported_names

ROOT = Path(__file__).resolve().parents[2]

# package -> top-level modules it must never import
FORBIDDEN = {
    "planner": ("torch", "executor", "hexiscale"),
    "executor": ("hexiscale",),
}


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
        "importlib", "torch.nn", "executor.model", "hexiscale.cli.", "torch"])
