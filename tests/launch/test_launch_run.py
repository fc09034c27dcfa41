"""The generated commands really run: two "nodes" on this machine rendezvous through torchrun's
c10d backend (torchrun numbers the nodes its own way; plan rank order must still hold), and the
per-node scripts of an uneven layout start and supervise their ranks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from executor.job.spawn import free_port
from hexiscale.launch.layout import build_layout
from hexiscale.launch.scripts import LaunchOptions, node_script, torchrun_lines
from planner.cluster import load_cluster
from planner.model import PRESETS
from planner.plan import Pipeline, Plan, PlanOptions, Stage, load_plan, save_plan

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("hexiscale-jobs"),
              pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")]
TIMEOUT = 240


def setup(tmp_path: Path, gpus: list[int], pipelines: list[list[str]], batch: list[int]) -> tuple[Path, Path]:
    nodes = "\n".join(f"  - {{name: box{i}, gpu: rtx4090, gpus: {g}, intra_link: {{bandwidth_GBps: 20}}}}"
                      for i, g in enumerate(gpus))
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"name: boxes\nnodes:\n{nodes}\ninter_node: {{bandwidth_GBps: 1}}\n")
    model = PRESETS["tiny"]
    pipes = []
    for devs, bs in zip(pipelines, batch):
        per = model.num_layers // len(devs)
        pipes.append(Pipeline(bs, 2, tuple(Stage((d,), 1, (i * per, (i + 1) * per)) for i, d in enumerate(devs))))
    plan = Plan(model, sum(batch), tuple(pipes), PlanOptions(dtype="fp32"))
    path = tmp_path / "plan.json"
    save_plan(plan, path)
    return cluster, path


def env() -> dict[str, str]:
    out = {k: v for k, v in os.environ.items() if not k.startswith(("HEXISCALE_", "TORCHELASTIC_"))}
    out.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    return out


def run_all(commands: list[str], cwd: Path) -> list[subprocess.CompletedProcess[str]]:
    procs = [subprocess.Popen(["bash", "-c", c], env=env(), cwd=cwd, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for c in commands]
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=TIMEOUT)
        outs.append(subprocess.CompletedProcess(p.args, p.returncode, out, ""))
    return outs


PORT_TAKEN = "Address already in use"
# a rank that cannot reach the store gives up after this (the default 600 s outlasts TIMEOUT)
STARTUP = ("--startup-timeout", "60")


def run_on_a_free_port(make: Callable[[int], list[str]], cwd: Path, logs: Path | None = None
                       ) -> list[subprocess.CompletedProcess[str]]:
    """Run the commands ``make(port)`` gives. A port free_port() found free can be taken by a test
    running beside this one before rank 0 binds it; rank 0 then says so in one line and the job
    fails: run once more on another port."""
    for attempt in range(2):
        results = run_all(make(free_port()), cwd)
        text = "\n".join(r.stdout for r in results)
        if logs is not None and logs.is_dir():
            text += "\n".join(p.read_text() for p in logs.glob("*.log"))
        if attempt or all(r.returncode == 0 for r in results) or PORT_TAKEN not in text:
            return results
    raise AssertionError("unreachable")


def test_torchrun_lines_keep_plan_rank_order(tmp_path: Path) -> None:
    # ranks 0 and 2 on box0, 1 and 3 on box1: torchrun can never number these as the plan does
    cluster, plan_path = setup(tmp_path, [2, 2], [["box0:0", "box1:0"], ["box0:1", "box1:1"]], [2, 2])
    layout = build_layout(load_plan(plan_path),
                          load_cluster(cluster))
    assert [n.rank_list for n in layout.nodes] == ["0,2", "1,3"]
    def lines(port: int) -> list[str]:
        opts = LaunchOptions(plan_path=str(plan_path), master_addr="127.0.0.1", master_port=port,
                             train_args=("--steps", "2", "--device", "cpu", "--log-jsonl", str(tmp_path / "m.jsonl"),
                                         *STARTUP),
                             run_id="trtest", torchrun=str(Path(sys.executable).parent / "torchrun"))
        return [line for _, line in torchrun_lines(layout, opts)]

    results = run_on_a_free_port(lines, tmp_path)
    text = "\n".join(r.stdout for r in results)
    assert all(r.returncode == 0 for r in results), text
    assert "step 2/2 pipeline 0 rank 0" in text and "step 2/2 pipeline 1 rank 2" in text
    assert len((tmp_path / "m.jsonl").read_text().splitlines()) == 2


def test_uneven_node_scripts_run(tmp_path: Path) -> None:
    cluster, plan_path = setup(tmp_path, [1, 2], [["box0:0"], ["box1:0", "box1:1"]], [2, 2])
    layout = build_layout(load_plan(plan_path),
                          load_cluster(cluster))
    assert not layout.uniform
    def scripts(port: int) -> list[str]:
        opts = LaunchOptions(plan_path=str(plan_path), master_addr="127.0.0.1", master_port=port,
                             train_args=("--steps", "2", "--device", "cpu", "--log-jsonl", str(tmp_path / "m.jsonl"),
                                         *STARTUP),
                             run_id="sctest", python=sys.executable, log_dir=str(tmp_path / "logs"))
        return [node_script(layout, n, opts) for n in layout.nodes]

    results = run_on_a_free_port(scripts, tmp_path, tmp_path / "logs" / "sctest")
    assert all(r.returncode == 0 for r in results), "\n".join(r.stdout for r in results)
    logs = {p.name: p.read_text() for p in (tmp_path / "logs" / "sctest").glob("rank-*.log")}
    assert sorted(logs) == ["rank-0.log", "rank-1.log", "rank-2.log"]
    assert "step 2/2 pipeline 1 rank 1" in logs["rank-1.log"]
    assert [json.loads(x)["step"] for x in (tmp_path / "m.jsonl").read_text().splitlines()] == [1, 2]
