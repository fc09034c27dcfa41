"""Generated launch commands and scripts: golden text for every example cluster, plus checks that
the text really maps each plan rank to its device (parsed back from the scripts)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from executor.job.env import rank_env
from hexiscale.launch.layout import build_layout
from hexiscale.launch.scripts import LaunchOptions, node_script, slurm_script, torchrun_lines
from planner.cluster import ClusterSpec, load_cluster
from planner.errors import SpecError
from planner.model import PRESETS
from planner.plan import Plan, load_plan
from planner.seed_flags import plan_from_flags

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GOLDEN = Path(__file__).resolve().parent / "golden"


def _flags_plan(cluster: ClusterSpec, tps: str, parts: str, bsz: str, chunks: str) -> Plan:
    return plan_from_flags(model=PRESETS["llama2-7b"], cluster=cluster, hetero_configs=tps, layer_partitions=parts,
                           global_bsz_size=bsz, chunks=chunks)


def example_plan(name: str) -> Plan:
    """A plan for every example cluster (bundled files where they exist, else seed flags)."""
    cluster = load_cluster(EXAMPLES / "clusters" / f"{name}.yaml")
    files = {"demo-cpu-6": "demo-cpu-6-tiny", "h20-h800": "h20-h800-llama2-13b",
             "seed-32gpu-4types": "seed-32gpu-4types-llama2-7b", "seed-uneven-nodes": "seed-uneven-nodes-llama2-7b",
             "h100x4-mps-100-100-50-50": "h100x4-mps-llama2-13b", "h200x4-mps-100-100-50-50": "h200x4-mps-llama2-13b"}
    if name in files:
        return load_plan(EXAMPLES / "plans" / f"{files[name]}.json")
    if name == "a100-pcie-2x8-tcp":
        return _flags_plan(cluster, "[[4, 4], [4, 4]]", "[[16, 16], [16, 16]]", "64", "16")
    if name == "a100-pcie-4x8-tcp":
        return _flags_plan(cluster, "[[8, 8], [8, 8]]", "[[16, 16], [16, 16]]", "128", "32")
    if name == "h100x4":  # one 4-GPU host, TP 2 x PP 2
        return _flags_plan(cluster, "[[2, 2]]", "[[16, 16]]", "8", "4")
    if name == "nvlink-pcie-slow-link":  # what the planner picks there: the NVLink node alone, TP 4 x PP 2
        return _flags_plan(cluster, "[[4, 4]]", "[[16, 16]]", "32", "8")
    if name == "seed-40gpu-3types":
        return _flags_plan(cluster, "[[4, 4], [8, 8], [8, 8]]", "[[16, 16], [16, 16], [16, 16]]", "32 48 48",
                           "8 12 12")
    raise AssertionError(name)


CLUSTERS = sorted(p.stem for p in (EXAMPLES / "clusters").glob("*.yaml"))
OPTS = LaunchOptions(plan_path="/work/run/plan.json", master_addr="10.0.0.1", master_port=29500,
                     python="/opt/venv/bin/python3",
                     train_args=("--steps", "100", "--data", "corpus"), env=(("NCCL_SOCKET_IFNAME", "eth0"),),
                     run_id="golden")


def render(name: str) -> str:
    cluster = load_cluster(EXAMPLES / "clusters" / f"{name}.yaml")
    layout = build_layout(example_plan(name), cluster)
    out = [f"### {name}: {layout.world_size} ranks, {len(layout.nodes)} nodes, uniform={layout.uniform}"]
    if layout.uniform:
        out += ["### torchrun"] + [f"# {n.name}\n{line}" for n, line in torchrun_lines(layout, OPTS)]
    for n in layout.nodes:
        out += [f"### node script {n.name}", node_script(layout, n, OPTS)]
    out += ["### slurm", slurm_script(layout, OPTS)]
    return "\n".join(out)


def test_every_example_cluster_is_covered() -> None:
    assert {"seed-uneven-nodes", "demo-cpu-6", "a100-pcie-2x8-tcp"} <= set(CLUSTERS)


@pytest.mark.parametrize("name", CLUSTERS)
def test_golden(name: str) -> None:
    text = render(name)
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("HEXISCALE_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run with HEXISCALE_UPDATE_GOLDEN=1"
    assert text == path.read_text()


def _exports(script: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in script.splitlines():
        if line.startswith("export "):
            for k, v in re.findall(r"(\w+)=(\S+)", line[7:]):
                if "${" not in v:  # MASTER_ADDR/PORT defaults are bash expansions
                    env[k] = v.strip("'\"")
    return env


@pytest.mark.parametrize("name", CLUSTERS)
def test_scripts_map_every_rank_to_its_plan_device(name: str) -> None:
    cluster = load_cluster(EXAMPLES / "clusters" / f"{name}.yaml")
    plan = example_plan(name)
    layout = build_layout(plan, cluster)
    devices = {r.rank: r.device for r in plan.ranks()}
    seen: list[int] = []
    for node in layout.nodes:
        script = node_script(layout, node, OPTS)
        env = _exports(script)
        assert env["WORLD_SIZE"] == str(plan.world_size) and env["NCCL_SOCKET_IFNAME"] == "eth0"
        gpus = env["CUDA_VISIBLE_DEVICES"].split(",")
        starts = re.findall(r"^start_rank (\d+) (\d+)$", script, flags=re.M)
        assert len(starts) == len(gpus) == node.nproc
        for rank_s, local_s in starts:
            rank, local = int(rank_s), int(local_s)
            # what the trainer will compute from this environment
            renv = rank_env({**env, "RANK": rank_s, "LOCAL_RANK": local_s})
            assert renv.rank == rank
            assert devices[rank] == f"{node.name}:{gpus[local]}"  # cuda:LOCAL_RANK is the plan's GPU
            seen.append(rank)
    assert sorted(seen) == list(range(plan.world_size))
    assert layout.nodes[0].ranks[0] == 0  # node 0 hosts rank 0


def test_uneven_cluster_gets_scripts_not_torchrun() -> None:
    cluster = load_cluster(EXAMPLES / "clusters" / "seed-uneven-nodes.yaml")
    layout = build_layout(example_plan("seed-uneven-nodes"), cluster)
    assert not layout.uniform and {n.nproc for n in layout.nodes} == {4, 8}
    with pytest.raises(ValueError, match="same process count"):
        torchrun_lines(layout, OPTS)
    text = slurm_script(layout, OPTS)
    assert "#SBATCH --nodes=8" in text and "--gpus-per-node" not in text
    assert "pkill" not in text and "killall" not in text


def test_non_contiguous_ranks_on_a_node(tmp_path: Path) -> None:
    """Pipelines that interleave nodes: torchrun numbering cannot match, HEXISCALE_NODE_RANKS does."""
    cluster = load_cluster(EXAMPLES / "clusters" / "demo-cpu-6.yaml")
    plan = plan_from_flags(model=PRESETS["tiny"], cluster=cluster, hetero_configs="[[1, 1], [1, 1]]",
                           layer_partitions="[[2, 2], [2, 2]]", global_bsz_size="4", chunks="2",
                           devices_id="[[[0], [1]], [[0], [1]]]")
    layout = build_layout(plan, cluster)
    a100 = layout.node("a100")
    assert a100.ranks == [0, 2] and a100.visible_devices == "0,1"
    line = dict((n.name, ln) for n, ln in torchrun_lines(layout, OPTS))["a100"]
    assert "HEXISCALE_NODE_RANKS=0,2" in line and "--nproc-per-node 2" in line
    # torchrun may give this node RANK 2,3; local rank 1 is still plan rank 2
    env = {"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1", "HEXISCALE_NODE_RANKS": "0,2"}
    assert rank_env(env).rank == 2
    with pytest.raises(SpecError, match="LOCAL_RANK"):
        rank_env({**env, "LOCAL_RANK": "2"})
    with pytest.raises(SpecError, match="node 'r3090'"):
        layout.node("r3090")
