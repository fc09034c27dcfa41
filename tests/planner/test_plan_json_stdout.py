"""``hexiscale plan --json`` prints only JSON on file descriptor 1 (issue 31): METIS prints
``***Cannot bisect a graph with 0 vertices!`` from C on this cluster's partitions, which used to land
in the JSON. Run as a subprocess so that what C writes to descriptor 1 is captured too."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# an NVLink node and a PCIe node behind 0.5 GB/s: METIS is asked for nearly as many parts as units
CLUSTER = """name: metis-complains
nodes:
  - {name: nv, gpu: a100-sxm-80g, gpus: 8, intra_link: {kind: nvlink, bandwidth_GBps: 300, latency_us: 3}}
  - {name: pc, gpu: a100-pcie-80g, gpus: 8, intra_link: {kind: pcie, bandwidth_GBps: 24, latency_us: 8}}
inter_node: {kind: tcp, bandwidth_GBps: 0.5, latency_us: 60}
"""


def test_plan_json_prints_only_json(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CLUSTER)
    run = subprocess.run([sys.executable, "-m", "hexiscale", "plan", str(cluster), "--model", "llama2-7b",
                          "--global-batch", "32", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    plan = json.loads(run.stdout)  # nothing but the plan
    assert plan["format"] == "hexiscale.plan/1"
    assert "Cannot bisect" in run.stderr  # METIS still speaks, on stderr (so this cluster exercises it)
