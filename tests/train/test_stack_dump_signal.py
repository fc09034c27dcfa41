"""``hexiscale train`` ranks print every thread's stack on SIGUSR1 (where a hung rank waits), and a
caller whose stderr is no file (pytest's capture) still trains: the handler is then left out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from executor.train.entry import _stacks_on_sigusr1

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(sys.platform == "win32", reason="no SIGUSR1")
def test_sigusr1_prints_every_threads_stack_and_the_process_goes_on() -> None:
    code = ("import os, signal\nfrom executor.train.entry import _stacks_on_sigusr1\n"
            "_stacks_on_sigusr1()\nos.kill(os.getpid(), signal.SIGUSR1)\nprint('alive')")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "alive", out.stderr
    assert "Current thread" in out.stderr and 'File "<string>"' in out.stderr


def test_a_captured_stderr_leaves_the_handler_out(capsys: pytest.CaptureFixture) -> None:
    _stacks_on_sigusr1()  # stderr is pytest's capture here: no file descriptor, no error
    assert capsys.readouterr().err == ""
