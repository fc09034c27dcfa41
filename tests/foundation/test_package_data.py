"""A non-editable install carries the device and link profiles and the measured length histograms:
build the project from a copy of its sources into a folder, then use that folder (not the repository)
from somewhere else."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("setup.cfg", "pyproject.toml", "README.md", "planner", "executor", "hexiscale")


@pytest.mark.slow
def test_non_editable_install_finds_profiles(tmp_path: Path) -> None:
    src, site = tmp_path / "src", tmp_path / "site"
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(site), str(src)], check=True, capture_output=True)
    env = {k: v for k, v in os.environ.items() if k != "HEXISCALE_PROFILES"} | {"PYTHONPATH": str(site)}
    code = ("import planner, planner.catalog as c, planner.calibration.store as s\n"
            "print(planner.__file__); print(c.profiles_dir()); print(len(c.default_catalog().entries))\n"
            "print(s.default_calibration_path('h100').exists())\n"
            "from planner.varlen.measured import measured_histogram; print(measured_histogram('code-32k').context)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                         check=True).stdout.split("\n")
    assert Path(out[0]).is_relative_to(site), f"planner came from {out[0]}, not the install"
    assert Path(out[1]) == site / "planner" / "profiles"
    assert int(out[2]) == len(list((ROOT / "planner/profiles/devices").glob("*.json")))
    assert out[3] == "True"
    assert out[4] == "32768"
    cli = subprocess.run([sys.executable, "-m", "hexiscale", "devices"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, check=True)
    assert "h100-sxm-measured" in cli.stdout
