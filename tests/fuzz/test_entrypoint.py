"""The real entry points (``python -m hexiscale`` and the ``hexiscale`` console script) in a
process of their own, for what the in-process fuzz cannot see: the exit status the shell gets,
stderr as a terminal-less reader gets it, and bounded time for a hostile file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.hostile_documents import ALIAS_BOMB

ROOT = Path(__file__).resolve().parents[2]
PLAN = str(ROOT / "examples" / "plans" / "demo-cpu-6-tiny.json")
CLUSTER = str(ROOT / "examples" / "clusters" / "demo-cpu-6.yaml")
SCRIPT = Path(sys.executable).parent / "hexiscale"


def _run(argv: list[str], cwd: Path, script: bool = False) -> subprocess.CompletedProcess[str]:
    command = [str(SCRIPT)] if script else [sys.executable, "-m", "hexiscale"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WORLD_SIZE", "RANK", "MASTER_"))}
    return subprocess.run(command + argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def _one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    err = done.stderr.strip()
    assert done.returncode == 1 and err.startswith("error: ") and "\n" not in err, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    return err


@pytest.mark.skipif(not SCRIPT.exists(), reason="the console script is not installed")
def test_console_script_prints_a_markup_like_path_literally(tmp_path: Path) -> None:
    err = _one_error_line(_run(["validate", "runs/[/x]:smile:[bold]c.yaml"], tmp_path, script=True))
    assert "runs/[/x]:smile:[bold]c.yaml" in err and "no such file" in err


def test_usage_errors_exit_2_naming_the_flag(tmp_path: Path) -> None:
    for argv, flag in ((["plan", CLUSTER, "--model", "tiny", "--global-batch", "many"], "--global-batch"),
                       (["estimate", PLAN, "--cluster", CLUSTER, "--save="], "--save"),
                       (["launch", PLAN, "--cluster", CLUSTER, "--env=--"], "--env")):
        done = _run(argv, tmp_path)
        assert done.returncode == 2 and flag in done.stderr.strip().splitlines()[-1], done.stderr
        assert "Traceback" not in done.stderr


def test_alias_bomb_and_a_fifo_end_at_once(tmp_path: Path) -> None:
    (tmp_path / "bomb.yaml").write_text(ALIAS_BOMB)
    assert "alias" in _one_error_line(_run(["validate", "bomb.yaml"], tmp_path))
    os.mkfifo(tmp_path / "fifo")
    assert "not a regular file" in _one_error_line(_run(["validate", "fifo"], tmp_path))
    err = _one_error_line(_run(["estimate", PLAN, "--cluster", CLUSTER, "--save", "fifo"], tmp_path))
    assert err.startswith("error: --save:") and "named pipe that nobody reads" in err


def test_a_closed_stdout_is_not_a_traceback(tmp_path: Path) -> None:
    reader = subprocess.Popen([sys.executable, "-m", "hexiscale", "convert", "--to-flags", PLAN, "--cluster",
                               CLUSTER], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert reader.stdout is not None and reader.stderr is not None
    reader.stdout.close()  # like '| head -0': the reader is gone before the first line
    err = reader.stderr.read().decode()
    assert reader.wait(timeout=60) in (0, 1) and "Traceback" not in err, err
