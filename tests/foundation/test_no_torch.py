"""The planner must never import torch, and the command line must start without it: import every
planner module and build the CLI parser in a fresh interpreter (tests/foundation/test_layers.py
checks the import statements themselves)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_importing_every_planner_module_leaves_torch_out() -> None:
    code = (
        "import importlib, pkgutil, sys, planner\n"
        "names = [m.name for m in pkgutil.walk_packages(planner.__path__, 'planner.')]\n"
        "for n in names: importlib.import_module(n)\n"
        "from hexiscale.cli.main import build_parser; build_parser()\n"
        "assert len(names) >= 10, names\n"
        "print('torch' in sys.modules, len(names))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    loaded, count = out.stdout.split()
    assert loaded == "False", "a planner module imported torch"
    assert int(count) >= 10
