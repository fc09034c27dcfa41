"""On a GPU the profiler times the linears the engine runs (run on the device: ``pytest tests/gpu``):
under autocast every timed layer, packed row and head goes through the cast-once copies
(:class:`executor.model.cast_once.CastOnceLinear`), and its rows say so (``cast_once``), so the
activation reading takes no weight casts out of them (:mod:`planner.cost.measured`)."""

from __future__ import annotations

import pytest
import torch

from executor.model import cast_once
from executor.profiler import compute
from executor.profiler.packed import measure_packed_layer
from planner.model import ModelSpec

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
MODEL = ModelSpec("gpu-path", 1, 1024, 2816, 8, 8, 512, 1024)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    seen: list[int] = []
    apply = cast_once.CastOnceLinear.apply

    def counted(*args: object) -> object:
        seen.append(1)
        return apply(*args)

    monkeypatch.setattr(cast_once.CastOnceLinear, "apply", counted)
    return seen


def test_layer_packed_rows_and_head_run_the_cast_once_linears(calls: list[int]) -> None:
    dev = torch.device("cuda", 0)
    row = compute.measure_layer(MODEL, micro_batch=1, seq_len=MODEL.seq_len, tp=1, recompute="none", dtype="bf16",
                                device=dev, warmup=1, repeats=2, chain=2)
    assert row["cast_once"] is True and len(calls) >= 7 * 2  # 7 linears a layer, 2 layers a chain
    n = len(calls)
    (packed,) = measure_packed_layer(MODEL, [[512, 512]], dtype="bf16", device=dev, warmup=1, repeats=2)
    assert len(calls) > n and packed["forward_s"] > 0
    n = len(calls)
    head = compute.measure_head(MODEL, micro_batch=1, seq_len=MODEL.seq_len, tp=1, dtype="bf16", device=dev,
                                warmup=1, repeats=2)
    assert head["cast_once"] is True and len(calls) > n
