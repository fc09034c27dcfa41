"""CPU ranks forked from the launcher (:mod:`hexiscale.launch.fork_spawn`): when it forks, and that a
forked rank is looked after exactly like an exec'd one (output, exit codes, signals)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hexiscale.launch.fork_spawn import ForkedRank, spawn_mode
from hexiscale.launch.local import describe_exit
from planner.errors import SpecError
from tests.train.test_train_jobs import losses, two_rank_plan

ROOT = Path(__file__).resolve().parents[2]


def test_only_cpu_ranks_fork_and_exec_forces_the_old_path() -> None:
    assert spawn_mode("cpu", {}) == "fork"
    assert spawn_mode("cpu", {"HEXISCALE_SPAWN": "exec"}) == "exec"
    for env in ({}, {"HEXISCALE_SPAWN": "fork"}):  # CUDA/NCCL must never start in a forked parent
        assert spawn_mode("cuda", env) == "exec"
    with pytest.raises(SpecError, match=r"^HEXISCALE_SPAWN: unknown spawn mode 'vfork' \(hint: use one of fork, exec"):
        spawn_mode("cpu", {"HEXISCALE_SPAWN": "vfork"})


def _sleep() -> int:
    time.sleep(60)
    return 0


def test_a_forked_rank_killed_by_sigkill_is_reported_as_such() -> None:
    rank = ForkedRank(_sleep, {})
    assert rank.poll() is None
    rank.kill()
    assert rank.wait(timeout=30) == -signal.SIGKILL and rank.returncode == -signal.SIGKILL
    assert describe_exit(rank.wait()) == "was killed by SIGKILL"
    rank.stdout.close()


def test_a_forked_rank_has_its_env_output_and_exit_code_and_none_of_the_launchers_fds_or_handlers() -> None:
    keep_r, keep_w = os.pipe()  # stands for the store's sockets and the other ranks' pipes

    def child() -> int:
        print(f"env {sorted(os.environ.items())}")
        print(f"term {signal.getsignal(signal.SIGTERM) == signal.SIG_DFL}")
        try:
            os.fstat(keep_w)
            print("fd open")
        except OSError:
            print("fd closed")
        sys.stderr.write("to stderr\n")
        return 7

    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        rank = ForkedRank(child, {"RANK": "3", "ONLY": "this"})
    finally:
        signal.signal(signal.SIGTERM, previous)
        os.close(keep_r)
        os.close(keep_w)
    out = rank.stdout.read().decode()
    rank.stdout.close()
    assert rank.wait(timeout=30) == 7
    assert out.splitlines() == ["env [('ONLY', 'this'), ('RANK', '3')]", "term True", "fd closed", "to stderr"]


def test_terminate_ends_a_forked_rank_with_sigterm_despite_the_launchers_handler() -> None:
    previous = signal.signal(signal.SIGTERM, lambda *_: None)  # the launcher's (run_local's on_term)
    try:
        rank = ForkedRank(_sleep, {})
    finally:
        signal.signal(signal.SIGTERM, previous)
    with pytest.raises(subprocess.TimeoutExpired):
        rank.wait(timeout=0.05)
    rank.terminate()  # at once: a signal that comes before the child reset its handlers waits for it
    assert rank.wait(timeout=30) == -signal.SIGTERM
    rank.stdout.close()


@pytest.mark.slow
def test_forked_and_execd_ranks_train_to_the_same_losses(tmp_path: Path) -> None:
    """One small plan (one pipeline, TP 2), two steps, launched both ways: the same losses."""
    plan = two_rank_plan(tmp_path)
    got = {}
    for mode in ("fork", "exec"):
        jsonl = tmp_path / f"{mode}.jsonl"
        env = {k: v for k, v in os.environ.items() if not k.startswith("HEXISCALE_")}
        env.update(OMP_NUM_THREADS="1", HEXISCALE_SPAWN=mode)
        run = subprocess.run([sys.executable, "-m", "hexiscale.cli.main", "launch", str(plan), "--local", "--device",
                              "cpu", "--", "--steps", "2", "--log-jsonl", str(jsonl)], env=env, capture_output=True,
                             text=True, timeout=240, cwd=ROOT)
        assert run.returncode == 0, run.stdout + run.stderr
        assert "step 2/2" in run.stdout  # the ranks' output reaches the launcher's
        got[mode] = losses(jsonl)
    assert len(got["fork"]) == 2 and got["fork"] == got["exec"]


def _register_at_exit(marker: Path) -> int:
    import atexit

    atexit.register(lambda: (marker.parent / "child-own").write_text("ran"))
    return 0


def test_a_forked_rank_runs_its_own_exit_handlers_not_the_launchers(tmp_path: Path) -> None:
    """The launcher's atexit handlers and finalizers (a TemporaryDirectory's clean-up) stay its own."""
    import atexit
    import tempfile

    kept = tempfile.TemporaryDirectory(dir=tmp_path)  # its finalizer would delete the folder at exit
    marker = tmp_path / "launcher-handler"

    def launchers() -> None:
        marker.write_text("ran")

    atexit.register(launchers)
    try:
        rank = ForkedRank(lambda: _register_at_exit(marker), {})
        assert rank.wait(timeout=30) == 0
        assert Path(kept.name).is_dir() and not marker.exists()
        assert (tmp_path / "child-own").read_text() == "ran"
    finally:
        atexit.unregister(launchers)
        kept.cleanup()
