"""The CP attention timing ``hexiscale calibrate`` takes on a GPU (executor.profiler.cp_attention),
run on the CPU kernel at a small size, and the one-GPU program's refusal without CUDA."""

from __future__ import annotations

import pytest
import torch

from executor.profiler.cp_attention import measure_cp_attention
from planner.model import ModelSpec

TINY = ModelSpec("t", 1, 128, 352, 4, 4, 256, 256)


def test_every_rank_is_timed_and_the_slowest_is_the_figure() -> None:
    res = measure_cp_attention(TINY, dtype="fp32", device=torch.device("cpu"), warmup=1, repeats=1,
                               seq_len=256, cp=2)
    assert res is not None and res["kernel"] == "cpu-flash" and res["cp"] == 2 and res["seq_len"] == 256
    assert len(res["per_rank_s"]) == 2 and res["seconds"] == max(res["per_rank_s"]) > 0


def test_the_one_gpu_program_refuses_without_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine runs the program")
    from benchmarks.executor.cp_attention import main

    assert main(["--seq-len", "1024"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["cp_attention: needs a CUDA GPU (it times CUDA kernels)"]
