"""benchmarks.executor.sm_share_gemms on a machine without a GPU: one line, exit 2, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.executor import sm_share_gemms


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU path runs on the device machine")
def test_without_a_gpu_it_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert sm_share_gemms.main(["--out", str(tmp_path)]) == 2
    assert capsys.readouterr().out.strip() == "sm_share_gemms: needs a CUDA GPU"
    assert not list(tmp_path.iterdir())
