"""Hostile names and paths in launch scripts: generated scripts run under bash with ``$(...)``,
quotes, spaces and ``..`` in every value that reaches them, execute nothing, pass every value
through unchanged and write only where they were told (the launch folder, the log folder)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hexiscale.cli.main import main
from hexiscale.launch.layout import build_layout
from hexiscale.launch.scripts import LaunchOptions, node_script, slurm_script, torchrun_lines
from planner.cluster import load_cluster, parse_cluster
from planner.documents import load_yaml_text
from planner.errors import SpecError
from planner.plan import Plan, load_plan, plan_from_dict

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PLAN = EXAMPLES / "plans" / "demo-cpu-6-tiny.json"
CLUSTER = EXAMPLES / "clusters" / "demo-cpu-6.yaml"
BASH = shutil.which("bash")


def hostile(tmp: Path, tag: str) -> str:
    """A value that runs ``touch`` on a marker if any shell ever evaluates it."""
    return f"{tag} $(touch {tmp}/pwned-{tag}) `touch {tmp}/pwned2-{tag}` ' \" ; & | < > * ? ~ {{a,b}} \\ #"


def _stub(folder: Path, name: str) -> Path:
    """An executable that prints its argv and launcher environment as JSON (stands in for python)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                    "print(json.dumps({'argv': sys.argv[1:], 'env': {k: v for k, v in os.environ.items() "
                    "if k.startswith(('RANK', 'MASTER', 'HEXISCALE', 'MY_'))}}))\n")
    path.chmod(0o755)
    return path


def _uniform_plan() -> Plan:
    """Two pipelines of one TP-2 stage each: two ranks on each node (torchrun lines fit)."""
    data = json.loads(PLAN.read_text())
    stage = {"layers": [0, data["model"]["num_layers"]], "tp": 2}
    data["pipelines"] = [{"batch_size": 4, "micro_batches": 1, "stages": [dict(stage, devices=devs)]}
                         for devs in (["a100:0", "a100:1"], ["r4090:0", "r4090:1"])]
    data["global_batch_size"] = 8
    return plan_from_dict(data)


def _pwned(tmp: Path) -> list[Path]:
    return sorted(tmp.glob("pwned*"))  # where the markers land if anything ran


@pytest.mark.skipif(BASH is None, reason="needs bash")
def test_node_scripts_run_hostile_values_as_data(tmp_path: Path) -> None:
    layout = build_layout(load_plan(PLAN), load_cluster(CLUSTER))
    python = _stub(tmp_path / hostile(tmp_path, "bin"), "python")
    log_dir = tmp_path / hostile(tmp_path, "logs")
    plan_path, env_value = hostile(tmp_path, "plan") + ".json", hostile(tmp_path, "env")
    train_args = ("--data", hostile(tmp_path, "data"), "--steps", "3")
    opts = LaunchOptions(plan_path=plan_path, master_addr="10.0.0.1", train_args=train_args,
                         env=(("MY_VAR", env_value),), run_id="run-1", python=str(python), log_dir=str(log_dir),
                         grace_s=1)
    work = tmp_path / "work"
    work.mkdir()
    for node in layout.nodes:
        script = work / f"{node.name}.sh"
        script.write_text(node_script(layout, node, opts))
        env = {k: v for k, v in os.environ.items() if not k.startswith("HEXISCALE")}
        done = subprocess.run([BASH, str(script)], cwd=work, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    assert _pwned(tmp_path) == []
    logs = sorted((log_dir / "run-1").iterdir())
    assert [p.name for p in logs] == [f"rank-{r}.log" for r in sorted(range(layout.world_size), key=str)]
    for log in logs:
        seen = json.loads(log.read_text())
        assert seen["argv"] == ["-m", "hexiscale", "train", "--plan", plan_path, *train_args]
        assert seen["env"]["MY_VAR"] == env_value and seen["env"]["MASTER_ADDR"] == "10.0.0.1"
    assert sorted(p.name for p in work.iterdir()) == sorted(f"{n.name}.sh" for n in layout.nodes)


@pytest.mark.skipif(BASH is None, reason="needs bash")
def test_slurm_script_and_torchrun_lines_keep_values_quoted(tmp_path: Path) -> None:
    layout = build_layout(load_plan(PLAN), load_cluster(CLUSTER))
    bin_dir = tmp_path / "bin"
    python = _stub(bin_dir, "python")
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho host-a; echo host-b\n")
    # srun: run the task once per plan node, as node k of the allocation
    (bin_dir / "srun").write_text('#!/bin/bash\nshift 3\nfor k in 0 1; do SLURM_NODEID=$k "$@" || exit $?; done\n')
    for f in ("scontrol", "srun"):
        (bin_dir / f).chmod(0o755)
    plan_path = hostile(tmp_path, "plan")
    opts = LaunchOptions(plan_path=plan_path, master_addr="10.0.0.1", train_args=("--data", hostile(tmp_path, "d")),
                         run_id="run-2", python=str(python), torchrun=str(python), log_dir="logs", grace_s=1)
    env = dict({k: v for k, v in os.environ.items() if not k.startswith("HEXISCALE")},
               PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_NODELIST="x")
    job = tmp_path / "job.sbatch"
    job.write_text(slurm_script(layout, opts))
    done = subprocess.run([BASH, str(job)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    ranks = sorted((tmp_path / "logs" / "run-2").glob("rank-*.log"))
    assert len(ranks) == layout.world_size
    assert all(json.loads(r.read_text())["argv"][-3:] == [plan_path, "--data", hostile(tmp_path, "d")] for r in ranks)
    for _node, line in torchrun_lines(build_layout(_uniform_plan(), load_cluster(CLUSTER)), opts):
        out = subprocess.run([BASH, "-c", line], env=env, capture_output=True, text=True, timeout=60)
        assert json.loads(out.stdout)["argv"][-3:] == [plan_path, "--data", hostile(tmp_path, "d")]
    assert _pwned(tmp_path) == []


@pytest.mark.parametrize("name", ["../../x", "a/b", "p$(touch x)", "a'b", 'a"b', "a b", "a\nb", ".hidden",
                                  "-rf", "x" * 200])
def test_node_names_that_are_not_plain_are_refused_with_the_line(name: str) -> None:
    text = ("nodes:\n  - {name: ok, gpu: a100, gpus: 1, intra_link: {bandwidth_GBps: 10}}\n"
            f"  - {{name: {json.dumps(name)}, gpu: a100, gpus: 1, intra_link: {{bandwidth_GBps: 10}}}}\n"
            "inter_node: {bandwidth_GBps: 1}\n")
    with pytest.raises(SpecError) as err:
        parse_cluster(load_yaml_text(text, "c.yaml"))
    assert err.value.path == "nodes[1].name" and "plain name" in err.value.message


@pytest.mark.parametrize(("field", "kwargs"), [
    ("--run-id", {"run_id": "../../x"}), ("--run-id", {"run_id": "a b"}),
    ("--master", {"master_addr": "$(touch x)"}), ("--master", {"master_addr": "a;b"}),
    ("plan", {"plan_path": "p\nHEXISCALE_NODE_TASK\ntouch x"}), ("--log-dir", {"log_dir": "l\rx"}),
    ("--env", {"env": (("A B", "1"),)}), ("--env MY", {"env": (("MY", "a\nb"),)}),
    ("train arguments[1]", {"train_args": ("--data", "a\nb")}), ("--grace", {"grace_s": -1}),
])
def test_launch_options_refuse_values_no_script_can_carry(field: str, kwargs: dict) -> None:
    base = {"plan_path": "plan.json", "master_addr": "10.0.0.1"}
    with pytest.raises(SpecError) as err:
        LaunchOptions(**{**base, **kwargs})
    assert err.value.path == field


def test_slurm_refuses_a_log_dir_sbatch_cannot_read() -> None:
    layout = build_layout(load_plan(PLAN), load_cluster(CLUSTER))
    with pytest.raises(SpecError, match="--log-dir"):
        slurm_script(layout, LaunchOptions(plan_path="p.json", master_addr="h", log_dir="my logs"))


def test_cli_writes_scripts_of_a_hostile_plan_name_inside_the_launch_folder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "p$(touch x) 'q'.json"
    shutil.copy(PLAN, plan)
    out = tmp_path / "launch folder $(touch y)"
    assert main(["launch", str(plan), "--cluster", str(CLUSTER), "-o", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["a100.sh", "r4090.sh"]
    assert "HEXISCALE_RUN_ID=hexiscale-p-touch-x-q" in (out / "a100.sh").read_text()
    printed = capsys.readouterr().out
    assert f"bash '{out}/a100.sh'" in printed
    assert main(["launch", str(plan), "--cluster", str(CLUSTER), "--run-id", "../../x", "--dry-run"]) == 1
    assert "--run-id" in capsys.readouterr().err
    assert main(["launch", str(plan), "--cluster", str(CLUSTER), "--master", "$(touch z):1", "--dry-run"]) == 1
    assert not list(tmp_path.rglob("x")) and not list(tmp_path.rglob("z"))
