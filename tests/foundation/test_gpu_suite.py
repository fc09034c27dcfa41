"""The parallel GPU-suite runner finds every GPU test file and keeps the MPS ones apart."""

from __future__ import annotations

from tests.gpu_suite import MARK, ROOT, alone, gpu_files


def test_runner_finds_the_gpu_files_and_runs_mps_files_alone() -> None:
    files = gpu_files([])
    names = {str(f.relative_to(ROOT)) for f in files}
    assert {"tests/executor/test_exec_nccl4.py", "tests/gpu/test_gpu_smoke.py", "tests/gpu/test_two_nodes.py"} <= names
    assert all(MARK.search(f.read_text()) for f in files)
    assert "tests/foundation/test_gpu_suite.py" not in names  # names the marker in text only
    solo = {str(f.relative_to(ROOT)) for f in files if alone(f)}
    # every file that starts the MPS daemon must run alone: MPS would take in its neighbours' processes
    starts_mps = {str(f.relative_to(ROOT)) for f in files if "nvidia-cuda-mps-control" in f.read_text()}
    assert starts_mps and starts_mps <= solo
