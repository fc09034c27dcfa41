"""``hexiscale launch`` as a user types it: ``--dry-run`` writes and runs nothing, the train arguments
after ``--`` are checked once in the launcher, generated commands use this interpreter and
absolute paths."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hexiscale.cli.main import main as cli

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "examples" / "plans" / "demo-cpu-4-tiny.json"


def _no_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a process was started: {args}")

    for name in ("Popen", "call", "run"):
        monkeypatch.setattr(subprocess, name, refuse)


def test_local_dry_run_writes_and_runs_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    _no_processes(monkeypatch)
    monkeypatch.chdir(tmp_path)
    assert cli(["launch", str(PLAN), "--local", "--device", "cpu", "--dry-run", "--",
                "--steps", "2", "--checkpoint-dir", "ck"]) == 0
    out = capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []
    lines = [ln for ln in out.splitlines() if not ln.startswith("#")]
    assert len(lines) == 4 and all(sys.executable in ln and "RANK=" in ln for ln in lines)
    assert str(tmp_path / "ck") in lines[0]  # the path the ranks would get, absolute


def test_elastic_dry_run_is_refused(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    _no_processes(monkeypatch)
    assert cli(["launch", str(PLAN), "--local", "--elastic", "--dry-run"]) == 1
    assert capsys.readouterr().err.startswith("error: --dry-run:")


UNEVEN_PLAN = ROOT / "examples" / "plans" / "seed-uneven-nodes-llama2-7b.json"
UNEVEN = ROOT / "examples" / "clusters" / "seed-uneven-nodes.yaml"


def test_scripts_use_this_interpreter_and_absolute_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plan.json").write_bytes(UNEVEN_PLAN.read_bytes())
    assert cli(["launch", "plan.json", "--cluster", str(UNEVEN), "--dry-run", "--slurm", "--",
                "--data", "corpus", "--checkpoint-dir", "ck"]) == 0
    sbatch = capsys.readouterr().out
    for path in ("plan.json", "corpus", "ck"):
        assert f" {tmp_path / path}" in sbatch
    assert f"{sys.executable} -m hexiscale train" in sbatch and "python3 -m" not in sbatch


def test_node_script_names_the_flag_when_the_interpreter_lacks_hexiscale(tmp_path: Path) -> None:
    from hexiscale.launch.layout import build_layout
    from hexiscale.launch.scripts import LaunchOptions, node_script
    from planner.cluster import load_cluster
    from planner.plan import load_plan

    bare = tmp_path / "python"
    bare.write_text("#!/bin/sh\nexit 1\n")  # an interpreter that imports nothing
    bare.chmod(0o755)
    layout = build_layout(load_plan(UNEVEN_PLAN), load_cluster(UNEVEN))
    opts = LaunchOptions(plan_path=str(UNEVEN_PLAN), master_addr="127.0.0.1", python=str(bare),
                         log_dir=str(tmp_path / "logs"))
    done = subprocess.run(["bash", "-c", node_script(layout, layout.nodes[0], opts)], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PATH": os.environ.get("PATH", "")})
    assert done.returncode == 1 and "started rank" not in done.stdout
    assert "cannot import hexiscale" in done.stderr and "--python PATH" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize(("train_args", "expected"), [
    (["--stepz", "3"], "error: --stepz: 'hexiscale train' has no such flag (hint: did you mean --steps?)"),
    (["--steps", "0"], "error: --steps: must be an integer"),
    (["--steps", "x"], "error: train arguments after --: argument --steps: invalid int value"),
])
def test_train_arguments_are_checked_once_before_any_rank(train_args: list[str], expected: str,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    _no_processes(monkeypatch)
    assert cli(["launch", str(PLAN), "--local", "--device", "cpu", "--", *train_args]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(expected) and "\n" not in err


@pytest.mark.parametrize(("argv", "flag", "near"), [
    (["train", "--stepz", "3"], "--stepz", "--steps"),
    (["plan", "c.yaml", "--model", "tiny", "--time-limt", "3"], "--time-limt", "--time-limit"),
    (["launch", "p.json", "--dryrun"], "--dryrun", "--dry-run"),
    # a required argument missing as well: argparse printed its usage text, hiding the hint
    (["launch", "--dryrun"], "--dryrun", "--dry-run"),
    (["hf", "import", "--outptu", "x", "m"], "--outptu", "--output"),
    (["hf", "import", "m", "--outptu=x"], "--outptu", "--output"),
])
def test_a_mistyped_flag_names_the_nearest_one(argv: list[str], flag: str, near: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(argv) == 2
    err = capsys.readouterr().err.strip()
    command = " ".join(argv[:2]) if argv[0] == "hf" else argv[0]
    assert err == f"error: {flag}: 'hexiscale {command}' has no such flag (hint: did you mean {near}?)"


def test_a_missing_required_flag_alone_still_gets_argparse_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli(["hf", "import", "m", "--seq-len", "-1"])
    assert exc.value.code == 2
    assert "the following arguments are required: -o/--output" in capsys.readouterr().err


def test_sm_percent_on_a_cpu_run_is_refused(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    _no_processes(monkeypatch)
    node = json.loads(PLAN.read_text())["pipelines"][0]["stages"][0]["devices"][0].partition(":")[0]
    assert cli(["launch", str(PLAN), "--local", "--device", "cpu", f"--sm-percent={node}=50"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --sm-percent: this run is on the CPU") and "\n" not in err


SEED_LINE = ["train", "--model-size", "tiny", "--hetero_configs", "[[1, 1]]", "--layer_partitions", "[[2, 2]]",
             "--global_batch_size", "2", "--chunks", "1", "--devices_id", "[[[0], [0]]]", "--device", "cpu"]


def test_a_seed_line_starting_its_ranks_listens_on_its_master_port(monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    asked = _seed_line_store(monkeypatch)
    assert cli([*SEED_LINE, "--master_port", "29611"]) == 1
    assert asked == [("127.0.0.1", 29611)]
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: --master_port: cannot listen on 127.0.0.1:29611")


def _seed_line_store(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """The (address, port) a seed line's own ranks' store was asked to listen on (busy: exit 1)."""
    import errno

    import executor.job.env as launch_env

    _no_processes(monkeypatch)
    for key in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT"):
        # set, then deleted: the undo removes what the CLI sets for its ranks (a bare delenv of an
        # absent key records nothing, and MASTER_ADDR leaked into the worker's later trainer jobs)
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    asked: list[tuple[str, int]] = []

    def busy(addr: str, port: int) -> None:
        asked.append((addr, port))
        raise OSError(errno.EADDRINUSE, "Address already in use")

    monkeypatch.setattr(launch_env, "serve_store", busy)
    return asked


def test_a_seed_line_leaves_no_rendezvous_variables_behind() -> None:
    """What the seed line sets for its ranks stays in its test: a trainer this worker starts later
    inherits os.environ, and a leaked MASTER_ADDR made it serve its store there (port in use)."""
    before = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT")}
    with pytest.MonkeyPatch.context() as mp:
        _seed_line_store(mp)
        assert cli([*SEED_LINE, "--master_addr", "127.0.0.2", "--master_port", "29612"]) == 1
    assert {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT")} == before


def test_a_seed_line_starting_its_ranks_listens_on_its_master_addr(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _seed_line_store(monkeypatch)
    assert cli([*SEED_LINE, "--master_addr", "127.0.0.2", "--master_port", "29612"]) == 1  # loopback, not the default
    assert asked == [("127.0.0.2", 29612)]


def test_a_seed_line_starting_its_ranks_refuses_another_machines_master_addr(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    asked = _seed_line_store(monkeypatch)
    assert cli([*SEED_LINE, "--master_addr", "192.0.2.1"]) == 1  # TEST-NET-1: never this machine's
    assert asked == []
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: --master_addr: '192.0.2.1' is not this machine") and "drop --master_addr" in err
