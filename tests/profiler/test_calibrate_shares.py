"""``hexiscale calibrate --sm-percent P``: each MPS share measured in a child process (the share is fixed
when a process creates its CUDA context) under the MPS daemon, written as ``<type>-mps<P>-measured``; a
cluster's ``gpu: h100-sxm-mps50`` is then planned and priced from it as ``h100-sxm`` is from
``h100-sxm-measured``. The measurement itself is a GPU test: tests/gpu/test_calibrate_share_gpu.py."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from executor.profiler.calibrate import _applies_to, measured_key
from hexiscale.cli.calibrate_shares import child_command, run_shares
from hexiscale.cli.main import main
from hexiscale.launch.mps import mps_daemon
from planner.calibration.local import resolve_profiles
from planner.catalog import default_catalog
from planner.cluster import load_cluster
from planner.cost import estimate
from planner.hf_config import resolve_model
from planner.plan import Pipeline, Plan, PlanOptions, Stage
from tests.support.host_share import host_share

ROOT = Path(__file__).resolve().parents[2]
MPS_CLUSTER = ROOT / "examples" / "clusters" / "h100x4-mps-100-100-50-50.yaml"


@pytest.mark.parametrize("flags, said", [
    (["--sm-percent", "0"], "'0' is not a share of the SMs"),
    (["--sm-percent", "150"], "'150' is not a share of the SMs"),
    (["--sm-percent", "50,abc"], "'abc' is not a share of the SMs"),
    (["--sm-percent", "9" * 5000], "'99999999999999999999"),  # past int()'s digit limit: still one line
    (["--sm-percent", "\u00b2"], "'\u00b2' is not a share of the SMs"),  # a digit to isdigit(), not to int()
    (["--sm-percent", "50", "--cpu"], "a CPU calibration has no SMs to share"),
])
def test_bad_shares_are_one_line_naming_the_flag(flags: list[str], said: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--home", str(tmp_path), *flags]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--sm-percent" in err and said in err and "hint:" in err
    assert not (tmp_path / "devices").exists()


def test_a_bad_share_variable_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "half")
    assert main(["calibrate", "--home", str(tmp_path)]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE: 'half'" in err


def test_a_share_is_keyed_by_the_type_a_cluster_names() -> None:
    assert measured_key("NVIDIA H100 80GB HBM3", "h100-sxm", 50.0) == "h100-sxm-mps50-measured"
    assert measured_key("NVIDIA H100 80GB HBM3", "h100-sxm", 100.0) == "h100-sxm-measured"
    assert measured_key("NVIDIA H100 80GB HBM3", "h100-sxm", None) == "h100-sxm-measured"
    assert measured_key("NVIDIA H200", "h100-sxm", 35.0) == "h200-mps35-measured"
    h100 = default_catalog().get("h100-sxm")
    assert _applies_to("h100-sxm-mps50-measured", h100, 50.0) == ["h100-sxm-mps50-measured", "h100-sxm-mps50"]
    assert _applies_to("h100-sxm-measured", h100, None) == ["h100-sxm-measured", "h100-sxm"]
    assert _applies_to("h200-measured", h100, None) == ["h200-measured"]


def _args(**kw: Any) -> argparse.Namespace:
    base = dict(model="llama-1.3b", seq_len=2048, comm_ranks=None, quiet=True, force=False, max_held_out=10.0,
                cpu=False, sm_percent=["50", "100"])
    return argparse.Namespace(**{**base, **kw})


def test_each_share_runs_in_a_child_with_its_share_under_the_daemon(tmp_path: Path) -> None:
    calls: list[tuple[list[str], dict[str, str] | None]] = []

    def fake(cmd: list[str], **kw: Any) -> SimpleNamespace:
        calls.append((cmd, kw.get("env")))
        return SimpleNamespace(returncode=0)

    assert run_shares(_args(), tmp_path, [50, 100], fake) == 0
    assert calls[0][0] == ["nvidia-cuda-mps-control", "-d"] and calls[-1][0] == ["nvidia-cuda-mps-control"]
    children = calls[1:-1]
    assert [env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] for _, env in children if env] == ["50", "100"]
    cmd = children[0][0]
    assert cmd[1:4] == ["-m", "hexiscale", "calibrate"] and "--sm-percent" not in cmd
    assert cmd[cmd.index("--home") + 1] == str(tmp_path.resolve()) and cmd[cmd.index("--seq-len") + 1] == "2048"
    # the first child that fails stops the run (it printed why); the daemon is quit all the same
    calls.clear()
    assert run_shares(_args(), tmp_path, [50, 100], lambda cmd, **kw: (calls.append((cmd, kw.get("env"))),
                      SimpleNamespace(returncode=3 if kw.get("env") else 0))[1]) == 3
    assert [c[0][0] for c in calls] == ["nvidia-cuda-mps-control", cmd[0], "nvidia-cuda-mps-control"]
    # the whole GPU alone needs no daemon
    calls.clear()
    assert run_shares(_args(), tmp_path, [100], fake) == 0 and len(calls) == 1
    assert child_command(_args(force=True, comm_ranks=0), tmp_path, 50)[0][-3:] == ["0", "--quiet", "--force"]


def _step(cluster_path: Path) -> float:
    cluster = load_cluster(cluster_path)
    model = resolve_model("llama-1.3b", 2048)
    pipe = Pipeline(8, 4, (Stage(("fast:0",), 1, (0, 12)), Stage(("slow:0",), 1, (12, 24))))
    plan = Plan(model, 8, (pipe,), PlanOptions(dtype="bf16"), cluster=cluster.name)
    return estimate(plan, cluster, resolve_profiles(cluster).profiles).step_time_s


def test_a_host_share_prices_the_clusters_share_nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HEXISCALE_HOME", str(tmp_path / "empty"))
    shipped = _step(MPS_CLUSTER)
    home = tmp_path / "home"
    cal = host_share(home, slower=1.2)
    monkeypatch.setenv("HEXISCALE_HOME", str(home))
    resolved = resolve_profiles(load_cluster(MPS_CLUSTER))
    assert resolved.profiles.get("h100-sxm-mps50").device.key == "h100-sxm-mps50-measured"
    assert resolved.profiles.get("h100-sxm").device.key == "h100-sxm-measured"  # the full GPU's as before
    slow = resolved.priced_by["slow"]
    assert (slow["profile"], slow["calibration"], slow["host"]) == ("h100-sxm-mps50-measured", str(cal),
                                                                    "this-host:abc")
    assert resolved.priced_by["fast"]["calibration"] != str(cal)
    assert _step(MPS_CLUSTER) > shipped  # the host's slower share tables, not the shipped ones, price it
    # plan says so: the profile line names the share's measured entry, the priced-by line its calibration
    plan = str(tmp_path / "p.json")
    assert main(["plan", str(MPS_CLUSTER), "--model", "tiny", "--global-batch", "8", "-o", plan]) == 0
    profiles_line, priced_line = capsys.readouterr().out.splitlines()[:2]
    assert "h100-sxm-mps50 (h100-sxm-mps50-measured: measured" in profiles_line
    assert priced_line == (f"priced by: fast: packaged calibration 'h100'; slow: host calibration {cal} "
                           "(host this-host:abc)")


def test_a_daemon_already_running_is_left_running_and_a_slow_quit_is_no_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[list[str]] = []

    def running(cmd: list[str], **kw: Any) -> SimpleNamespace:
        calls.append(cmd)
        return SimpleNamespace(returncode=1)  # "An instance of this daemon is already running"

    with mps_daemon(running) as started:
        assert started is False
    assert calls == [["nvidia-cuda-mps-control", "-d"]]

    def slow_quit(cmd: list[str], **kw: Any) -> SimpleNamespace:
        if kw.get("input") == "quit\n":
            raise subprocess.TimeoutExpired(cmd, kw["timeout"])
        return SimpleNamespace(returncode=0)

    with mps_daemon(slow_quit) as started:
        assert started is True
    assert capsys.readouterr().out.strip() == "the MPS daemon did not stop within 60 s"


def test_a_share_without_the_mps_tools_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("hexiscale.cli.calibrate_shares.mps_available", lambda: False)
    assert main(["calibrate", "--home", str(tmp_path), "--sm-percent", "50"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--sm-percent: SM shares need the CUDA MPS daemon" in err
