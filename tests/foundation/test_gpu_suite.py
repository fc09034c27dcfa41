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


def test_the_longest_files_start_first_and_unknown_ones_before_all() -> None:
    """A long file started last is the run's long pole (4x H100, 2026-11-27: the train jobs started after
    16 shorter files and were cut at the part's 570 s): pieces run longest first by an earlier run's
    seconds, a shard by its file's where it has none of its own, a piece never timed before all."""
    from tests.gpu_suite import DURATIONS, load_seconds, longest_first

    seconds = {"a.py": 10.0, "b.py": 300.0, "c.py[1/2]": 50.0, "d.py": 120.0}
    pieces = [(n, [n]) for n in ("a.py", "b.py", "c.py[1/2]", "d.py[2/3]", "new.py")]
    assert [n for n, _ in longest_first(pieces, seconds)] == ["new.py", "b.py", "d.py[2/3]", "c.py[1/2]", "a.py"]
    recorded = load_seconds(DURATIONS)  # the committed times name files that exist
    assert recorded and all((ROOT / n.split("[")[0]).exists() for n in recorded)
