"""Two nodes, for real: one plan run as two "nodes" of 2 devices on one host, each node's script (as
``hexiscale launch PLAN --cluster CLUSTER -o DIR`` writes it) started on its own in its own process
group, the rendezvous over TCP on 127.0.0.1.

The plan changes TP degree across the node boundary: stage 0 is TP 2 on node ``a`` (a:0, a:1),
stages 1 and 2 are TP 1 on node ``b`` (b:2, b:3; node b's script sets CUDA_VISIBLE_DEVICES=2,3, so
the two nodes use different GPUs of the host). On GPUs NCCL is forced onto its socket transport
(``NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=lo``, and
``NCCL_NVLS_ENABLE=0``), so the two nodes talk as over a network; on CPU the ranks use gloo.

* the losses equal the single-process reference (:mod:`tests.support.reference`);
* node b killed mid-run (SIGKILL to its process group): node a's ranks stop on their own within a
  bound (the watchdog names the silent rank; no hang), and the checkpoint written before stays
  loadable (a one-process run resumes from it).

GPU: ``python -m pytest -m gpu tests/gpu/test_two_nodes.py`` on a host with >= 4 CUDA devices (the
repo root on PYTHONPATH is enough: the scripts run this interpreter and check it imports
hexiscale). The CPU variant (2 gloo ranks per node) runs anywhere; it starts 4 trainers, so it is
marked slow.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from executor.data.stream import DataPosition, global_batch, make_source
from executor.job.spawn import free_port
from executor.train.config import TrainConfig
from executor.train.setup import optim_config
from hexiscale.cli.main import main as cli
from planner.model import PRESETS
from planner.plan import Pipeline, Plan, PlanOptions, Stage, save_plan
from tests.support.reference import reference_train

ROOT = Path(__file__).resolve().parents[2]
MODEL = PRESETS["tiny"]  # 4 layers, 4 heads, 2 kv-heads: TP 2 divides both
BATCH, MICRO = 4, 2
STEPS = 3
JOB_TIMEOUT_S = 300.0
DEAD_AFTER_S = 10.0
GRACE_S = 5
# node a's ranks must be gone this long after node b died: the watchdog's --dead-after, the
# script's grace and a generous margin for a loaded machine (a hang is what this rules out)
STOP_BOUND_S = DEAD_AFTER_S + GRACE_S + 60.0
NCCL_SOCKETS = ("NCCL_P2P_DISABLE=1", "NCCL_SHM_DISABLE=1", "NCCL_IB_DISABLE=1", "NCCL_SOCKET_IFNAME=lo",
                "NCCL_NVLS_ENABLE=0")
PORT_TAKEN = "Address already in use"


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


VARIANTS = [
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(_gpus() < 4, reason="needs 4 CUDA devices")],
                 id="nccl"),
    pytest.param("cpu", marks=pytest.mark.slow, id="gloo"),
]


def two_node_plan() -> Plan:
    """Stage 0 TP 2 on node a, stages 1 and 2 TP 1 on node b: the TP degree changes across the nodes."""
    stages = (Stage(("a:0", "a:1"), 2, (0, 2)), Stage(("b:2",), 1, (2, 3)), Stage(("b:3",), 1, (3, 4)))
    return Plan(MODEL, BATCH, (Pipeline(BATCH, MICRO, stages),), PlanOptions(dtype="fp32"), cluster="two-nodes")


def write_inputs(tmp: Path) -> tuple[Path, Path]:
    cluster = tmp / "two-nodes.yaml"
    cluster.write_text("name: two-nodes\nnodes:\n"
                       "  - {name: a, gpu: h100-sxm, gpus: 4, intra_link: {bandwidth_GBps: 20}}\n"
                       "  - {name: b, gpu: h100-sxm, gpus: 4, intra_link: {bandwidth_GBps: 20}}\n"
                       "inter_node: {bandwidth_GBps: 1}\n")
    plan = tmp / "plan.json"
    save_plan(two_node_plan(), plan)
    return plan, cluster


@dataclass
class Node:
    name: str
    proc: subprocess.Popen[str]

    def stop(self) -> None:
        """SIGKILL this node's process group (its script and every rank the script started)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HEXISCALE_", "TORCHELASTIC_"))}
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES"):
        env.pop(key, None)
    # the scripts run from another folder: the repo must stay importable from there
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["OMP_NUM_THREADS"] = "1"
    return env


def start_nodes(tmp: Path, device: str, train_args: list[str]) -> tuple[list[Node], Path]:
    """Write the node scripts through ``hexiscale launch`` and start each in its own process group."""
    plan, cluster = write_inputs(tmp)
    port = free_port()
    out, logs = tmp / f"scripts-{port}", tmp / "logs"
    env_flags = [f"--env={e}" for e in NCCL_SOCKETS] if device == "cuda" else []
    assert cli(["launch", str(plan), "--cluster", str(cluster), "--master", f"127.0.0.1:{port}", "-o", str(out),
                "--log-dir", str(logs), "--run-id", f"two-nodes-{port}", "--grace", str(GRACE_S), *env_flags, "--",
                "--device", device, "--startup-timeout", "120", "--dead-after", str(DEAD_AFTER_S),
                *train_args]) == 0
    nodes = [Node(name, subprocess.Popen(["bash", str(out / f"{name}.sh")], cwd=tmp, env=_env(), text=True,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True))
             for name in ("a", "b")]
    return nodes, logs / f"two-nodes-{port}"


def rank_logs(logs: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')}" for p in sorted(logs.glob("rank-*.log")))


def wait_all(nodes: list[Node], timeout_s: float) -> list[str]:
    deadline = time.monotonic() + timeout_s
    outs = []
    try:
        for node in nodes:
            out, _ = node.proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            outs.append(out)
    finally:
        for node in nodes:
            node.stop()
    return outs


def run_job(tmp: Path, device: str, train_args: list[str]) -> tuple[list[Node], list[str], Path]:
    """Both nodes to the end (once more on another port if a test beside this one took the port)."""
    for attempt in range(2):
        nodes, logs = start_nodes(tmp, device, train_args)
        outs = wait_all(nodes, JOB_TIMEOUT_S)
        if attempt or all(n.proc.returncode == 0 for n in nodes) or PORT_TAKEN not in rank_logs(logs):
            return nodes, outs, logs
    raise AssertionError("unreachable")


def reference_losses(plan_path: Path, steps: int) -> list[float]:
    plan = two_node_plan()
    source = make_source(plan, data=None, seed=0)
    batches = [global_batch(source, DataPosition(k, k * BATCH), BATCH) for k in range(steps)]
    optim = optim_config(TrainConfig.flat(plan=str(plan_path), steps=steps))
    return reference_train(MODEL, batches, optim=optim, seed=0).losses


def jsonl(path: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("device", VARIANTS)
def test_two_nodes_train_as_one_process(device: str, tmp_path: Path) -> None:
    log = tmp_path / "m.jsonl"
    nodes, outs, logs = run_job(tmp_path, device, ["--steps", str(STEPS), "--log-jsonl", str(log)])
    text = "\n".join(outs) + rank_logs(logs)
    assert [n.proc.returncode for n in nodes] == [0, 0], text
    assert "started rank 0 " in outs[0] and "started rank 2 " in outs[1]  # each node started its own ranks
    got = [r["loss"] for r in jsonl(log)]
    want = reference_losses(tmp_path / "plan.json", STEPS)
    tol = {"rtol": 1e-4, "atol": 1e-5} if device == "cuda" else {"rtol": 1e-5, "atol": 1e-6}
    torch.testing.assert_close(torch.tensor(got, dtype=torch.float64), torch.tensor(want, dtype=torch.float64),
                               **tol, msg=lambda m: f"{m}\n{text}")


def _latest_step(ck: Path) -> int:
    try:
        name = (ck / "latest").read_text().strip()  # DIR/latest names the newest complete checkpoint
        return int(json.loads((ck / name / "meta.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return 0


@pytest.mark.parametrize("device", VARIANTS)
def test_a_killed_node_stops_the_other_and_keeps_the_checkpoint(device: str, tmp_path: Path) -> None:
    ck, log = tmp_path / "ck", tmp_path / "m.jsonl"
    nodes, logs = start_nodes(tmp_path, device, ["--steps", "100000", "--checkpoint-dir", str(ck),
                                                 "--save-every", "2", "--log-jsonl", str(log)])
    node_a, node_b = nodes
    try:
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while _latest_step(ck) < 2:  # a checkpoint is complete, training goes on
            assert node_a.proc.poll() is None and node_b.proc.poll() is None, rank_logs(logs)
            assert time.monotonic() < deadline, "no checkpoint in time\n" + rank_logs(logs)
            time.sleep(0.5)
        node_b.stop()
        killed = time.monotonic()
        try:
            out, _ = node_a.proc.communicate(timeout=STOP_BOUND_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"node a still running {STOP_BOUND_S:.0f} s after node b died\n"
                                 + rank_logs(logs)) from None
        stopped_s = time.monotonic() - killed
    finally:
        for node in nodes:
            node.stop()
    text = out + rank_logs(logs)
    assert node_a.proc.returncode not in (0, None), text
    assert stopped_s < STOP_BOUND_S
    a_logs = "\n".join((logs / f"rank-{r}.log").read_text(errors="replace") for r in (0, 1))
    assert "error" in a_logs and ("rank 2" in a_logs or "rank 3" in a_logs), text  # names a rank of node b
    saved = _latest_step(ck)
    assert saved >= 2
    # the checkpoint written before the failure loads: one process resumes it and trains one more step
    one = tmp_path / "one.json"
    save_plan(Plan(MODEL, BATCH, (Pipeline(BATCH, MICRO, (Stage(("a:0",), 1, (0, 4)),)),), PlanOptions(dtype="fp32")),
              one)
    env = {**_env(), "CUDA_VISIBLE_DEVICES": "0"} if device == "cuda" else _env()
    resumed = subprocess.run([sys.executable, "-m", "hexiscale", "train", "--plan", str(one), "--device", device,
                              "--resume", str(ck), "--steps", str(saved + 1), "--log-jsonl", str(tmp_path / "r.jsonl")],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert [r["step"] for r in jsonl(tmp_path / "r.jsonl")] == [saved + 1]
