"""The fidelity program's calibration: ``hexiscale calibrate`` for the whole GPU and every MPS share the
plans run under, or a calibration given with ``--calibration``.

The MPS rows run GPUs at 50 % of their SMs, a cluster type ``<gpu>-mps50``. Without a measurement of
that share on this host the planner prices it from the shipped ``h100-sxm-mps50`` profile of another
host, uncalibrated; ``calibrate --sm-percent 100,50`` measures both here (one child process per share,
:mod:`hexiscale.cli.calibrate_shares`) and writes ``<gpu>-mps50-measured``, which the cluster's
``<gpu>-mps50`` nodes are then planned and priced with
(:meth:`planner.cost.profile_set.ProfileSet._measured_entry`). Each launch prints which calibration
priced each node, and :func:`unpriced_here` names the nodes this host's calibration did not price.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SHARE = re.compile(r"-mps\d+(-measured)?$")  # a share's key (its measured twin's too)


def install_calibration(path: Path, home: Path) -> None:
    """Copy a calibration written by ``hexiscale calibrate`` (``HOME/calibration/<key>.json``) into
    ``home``, with its measured device entry (``HOME/devices/<key>.json``) when that exists, and the
    MPS shares calibrated beside it (``<key-type>-mps<P>-measured``, ``calibrate --sm-percent``)."""
    try:
        data = json.loads(path.read_text())
        key = str(data["applies_to"][0])
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise SystemExit(f"--calibration: {path} is not a calibration written by 'hexiscale calibrate' ({exc}); "
                         "pass HOME/calibration/<key>.json") from None
    prefix = key.removesuffix("-measured")
    shares = [p.stem for p in path.parent.glob(f"{prefix}-mps*-measured.json") if SHARE.search(p.stem)]
    for k in [key, *sorted(shares)]:
        for folder in ("calibration", "devices"):
            src = path if (folder, k) == ("calibration", key) else path.parent.parent / folder / f"{k}.json"
            if src.is_file():
                (home / folder).mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, home / folder / src.name)


def calibrate_command(home: Path, quick: bool, force: bool, shares: Sequence[int]) -> list[str]:
    """``hexiscale calibrate`` into ``home``: the CPU rehearsal forced past its gate (``quick``), else
    llama-1.3b at seq 2048, with ``--sm-percent`` when ``shares`` holds a share below 100 %."""
    cmd = [sys.executable, "-m", "hexiscale", "calibrate", "--quiet", "--home", str(home)]
    if quick:
        return cmd + ["--cpu", "--force", "--comm-ranks", "0"]
    cmd += ["--model", "llama-1.3b", "--seq-len", "2048"]
    if any(s < 100 for s in shares):
        cmd += ["--sm-percent", ",".join(str(s) for s in sorted(set(shares) | {100}, reverse=True))]
    return cmd + (["--force"] if force else [])


def calibrate(home: Path, quick: bool, force: bool = False, shares: Sequence[int] = ()) -> dict[str, Any]:
    """Run :func:`calibrate_command`; its output printed, its wall time returned."""
    cmd = calibrate_command(home, quick, force, shares)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "HEXISCALE_HOME": str(home)}, capture_output=True,
                          text=True, timeout=900)
    print(proc.stdout + proc.stderr, flush=True)
    if proc.returncode != 0:
        raise SystemExit(f"calibrate failed ({proc.returncode})")
    return {"wall_s": time.perf_counter() - t0, "command": cmd[2:]}


def read_calibration(home: Path) -> dict[str, Any]:
    """The whole GPU's calibration under ``home`` (a share's, ``*-mps<P>-measured``, is not it) and
    ``shares``: the share calibrations' files."""
    files = sorted((home / "calibration").glob("*.json"))
    full = [f for f in files if not SHARE.search(f.stem)]
    if not full:
        raise SystemExit(f"no calibration under {home}/calibration")
    return {"file": str(full[0]), "shares": [str(f) for f in files if SHARE.search(f.stem)],
            **json.loads(full[0].read_text())}


def unpriced_here(priced_by: dict[str, dict[str, Any]]) -> list[str]:
    """Nodes (``g2 (h100-sxm-mps50: shipped profile, uncalibrated)``) that no calibration of this host
    priced (:mod:`planner.calibration.priced_by`): their rows measure another host's figures."""
    return [f"{name} ({row['gpu']}: {row.get('note')})" for name, row in priced_by.items()
            if row.get("note") != "host calibration"]
