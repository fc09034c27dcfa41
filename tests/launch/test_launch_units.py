"""Launcher pieces without training: CLI output, script syntax, rank environment, pre-flight
agreement through a real TCPStore, checkpoint lookup, exit codes, fault specs."""

from __future__ import annotations

import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from torch.distributed import TCPStore

from executor.job.env import RankEnv, rank_env
from executor.job.faults import parse_fault
from executor.job.watchdog import Verdict
from executor.state.checkpoint_verify import candidates
from executor.train.preflight import agree
from hexiscale.cli.main import main as cli
from hexiscale.launch.local import describe_exit, job_exit_code
from planner.errors import SpecError

ROOT = Path(__file__).resolve().parents[2]
UNEVEN_PLAN = ROOT / "examples" / "plans" / "seed-uneven-nodes-llama2-7b.json"
UNEVEN = ROOT / "examples" / "clusters" / "seed-uneven-nodes.yaml"


def test_launch_cli_writes_node_scripts_that_bash_accepts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "scripts"
    code = cli(["launch", str(UNEVEN_PLAN), "--cluster", str(UNEVEN), "--master", "10.1.2.3:4000", "-o", str(out),
                "--gloo-socket-ifname", "ib0", "--env", "NCCL_DEBUG=WARN", "--", "--steps", "7"])
    assert code == 0
    printed = capsys.readouterr().out
    names = sorted(p.name for p in out.glob("*.sh"))
    assert names == sorted(f"{n}.sh" for n in ("a100", "r3090", "r4090-0", "r4090-1", "r4090-2", "r4090-3",
                                                "r4090s-0", "r4090s-1"))
    assert "rendezvous at 10.1.2.3:4000 (global rank 0 on a100)" in printed
    text = (out / "r4090s-1.sh").read_text()
    assert "export GLOO_SOCKET_IFNAME=ib0" in text and "export NCCL_DEBUG=WARN" in text
    assert "--steps 7" in text and "LOCAL_WORLD_SIZE=4" in text
    if shutil.which("bash"):
        for script in out.glob("*.sh"):
            subprocess.run(["bash", "-n", str(script)], check=True)
    slurm = tmp_path / "job.sbatch"
    assert cli(["launch", str(UNEVEN_PLAN), "--cluster", str(UNEVEN), "--slurm", "-o", str(slurm)]) == 0
    if shutil.which("bash"):
        subprocess.run(["bash", "-n", str(slurm)], check=True)


@pytest.mark.parametrize("argv, field", [
    (["--master", "nohost"], "--master"), (["--env", "1BAD"], "--env[0]"), (["--node", "ghost"], "--node"),
])
def test_launch_cli_user_errors(argv: list[str], field: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["launch", str(UNEVEN_PLAN), "--cluster", str(UNEVEN), "--dry-run", *argv]) == 1
    assert field in capsys.readouterr().err


def test_rank_env_defaults_and_errors() -> None:
    single = rank_env({})
    assert (single.rank, single.world_size, single.local_rank) == (0, 1, 0) and not single.store_hosted
    agent = rank_env({"WORLD_SIZE": "4", "RANK": "3", "TORCHELASTIC_USE_AGENT_STORE": "True",
                      "TORCHELASTIC_RESTART_COUNT": "2", "HEXISCALE_RUN_ID": "x"})
    assert agent.rank == 3 and agent.store_hosted and agent.prefix == "hexiscale/x/2"
    with pytest.raises(SpecError, match="RANK"):
        rank_env({"WORLD_SIZE": "2", "RANK": "2"})
    with pytest.raises(SpecError, match="not an integer"):
        rank_env({"WORLD_SIZE": "two"})


def _renv(rank: int, world: int, port: int) -> RankEnv:
    return RankEnv(rank=rank, world_size=world, local_rank=rank, master_addr="127.0.0.1", master_port=port,
                   host=f"h{rank}", node=f"h{rank}", store_hosted=True, prefix="t")


def test_preflight_agreement_one_bad_rank_stops_all() -> None:
    server = TCPStore("127.0.0.1", 0, world_size=None, is_master=True, wait_for_workers=False)
    world, results = 3, {}

    def rank(r: int) -> None:
        store = TCPStore("127.0.0.1", server.port, world_size=None, is_master=False, wait_for_workers=False)
        err = SpecError("--data", "no such file", "check", "/x/data.idx") if r == 1 else None
        try:
            agree(store, _renv(r, world, server.port), err, timeout_s=30)
            results[r] = "ok"
        except SpecError as exc:
            results[r] = str(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == world
    for msg in results.values():
        assert msg.startswith("pre-flight: rank 1 (host h1): /x/data.idx: --data: no such file")


def test_preflight_agreement_names_missing_ranks() -> None:
    server = TCPStore("127.0.0.1", 0, world_size=None, is_master=True, wait_for_workers=False)
    with pytest.raises(SpecError, match=r"rank\(s\) \[1\] did not start within 1 s"):
        agree(server, _renv(0, 2, server.port), None, timeout_s=1)


def test_resume_candidates_newest_first(tmp_path: Path) -> None:
    for step in (2, 4, 6, 10):
        (tmp_path / f"step-{step:06d}").mkdir()
    for step in (2, 4, 10):
        (tmp_path / f"step-{step:06d}" / "meta.json").write_text("{}")
    (tmp_path / "step-000012.tmp").mkdir()  # a save that was killed: never a candidate
    (tmp_path / "step-000012.tmp" / "meta.json").write_text("{}")
    names = lambda found: [p.name for p in found[0]]  # noqa: E731
    assert names(candidates(str(tmp_path))) == ["step-000010", "step-000004", "step-000002"]  # 6: no meta.json
    (tmp_path / "latest").write_text("step-000002\n")
    assert names(candidates(str(tmp_path))) == ["step-000002", "step-000010", "step-000004"]
    (tmp_path / "latest").write_bytes(b"\xff../../etc")  # damaged: ignored
    assert names(candidates(str(tmp_path)))[0] == "step-000010"
    assert candidates(str(tmp_path / "step-000004")) == ([tmp_path / "step-000004"], True)
    with pytest.raises(SpecError, match="no complete checkpoint"):
        candidates(str(tmp_path / "step-000006"))
    with pytest.raises(SpecError, match="does not exist"):
        candidates(str(tmp_path / "missing"))


def test_exit_codes_and_messages() -> None:
    assert job_exit_code([0, 0]) == 0
    assert job_exit_code([1, 1, 0]) == 1
    assert job_exit_code([3, 1]) == 3 and job_exit_code([-9, 3, 3]) == 3
    assert job_exit_code([4, 3, 3]) == 4
    assert describe_exit(-9) == "was killed by SIGKILL" and describe_exit(3) == "exited with code 3"
    v = Verdict(2, "gpu7", 5, "no heartbeat for 4 s", 3)
    assert Verdict.decode(v.encode()) == v
    assert v.message() == "rank 2 (host gpu7) failed at step 5: no heartbeat for 4 s"
    assert "during set-up" in Verdict(1, "h", 0, "x", 3).message()


def test_fault_spec() -> None:
    assert parse_fault(None) is None and parse_fault("1:2:kill") == (1, 2, "kill")
    with pytest.raises(SpecError, match="RANK:STEP:KIND"):
        parse_fault("1:kill")


def test_errors_map_to_exit_codes() -> None:
    import torch

    from executor.train.setup import classify

    assert classify(SpecError("--data", "bad"))[1:] == (1, False)
    assert classify(torch.OutOfMemoryError("CUDA out of memory"))[1:] == (4, False)
    assert classify(RuntimeError("[gloo/pair.cc:534] Connection closed by peer"))[1:] == (3, True)
    reason, code, suspect = classify(ValueError("shape mismatch\nmore"))
    assert (reason, code, suspect) == ("ValueError: shape mismatch", 3, False)


def test_launch_node_dry_run_prints_that_nodes_script(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["launch", str(UNEVEN_PLAN), "--cluster", str(UNEVEN), "--node", "r4090s-1", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "export HEXISCALE_NODE=r4090s-1" in out and "start_rank 47 3" in out and "a100" in out


def test_sm_percent_gives_each_rank_on_the_node_its_mps_share() -> None:
    from hexiscale.cli.cmd_launch import sm_shares
    from planner.plan import load_plan

    plan = load_plan(ROOT / "examples" / "plans" / "demo-cpu-4-tiny.json")
    assert plan.devices == ["a100:0", "r4090:0", "r4090:1", "r4090:2"]
    assert sm_shares(["r4090=50"], plan) == {r: {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"} for r in (1, 2, 3)}
    with pytest.raises(SpecError, match=r"--sm-percent\[0\].*0 < PCT <= 100"):
        sm_shares(["r4090=0"], plan)
    with pytest.raises(SpecError, match=r"--sm-percent\[1\].*holds no device"):
        sm_shares(["r4090=50", "nowhere=50"], plan)
