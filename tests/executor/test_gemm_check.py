"""executor.model.gemm_check on the CPU: the product check catches unwritten and wrong tiles, and the
SM-count target search settles on the largest target that checks right or refuses in one line."""

from __future__ import annotations

import pytest
import torch

from executor.model import gemm_check
from executor.model.gemm_check import GemmCheckError, failing_products, linear_shapes, settle, targets_below
from planner.hf_config import resolve_model

SHAPES = ((48, 32), (32, 80))


def test_right_products_pass() -> None:
    assert failing_products(torch.device("cpu"), torch.float32, SHAPES, (64, 96)) == []


@pytest.mark.parametrize("damage", ["unwritten", "wrong"])
def test_a_damaged_tile_is_caught(monkeypatch: pytest.MonkeyPatch, damage: str) -> None:
    real = torch.mm

    def mm(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
        full = real(a, b)
        if damage == "unwritten":  # a 16x16 tile never written: it keeps the NaN poison
            full[16:32, :16] = out[16:32, :16]
        else:  # a tile written with other finite values
            full[:16, 16:32] += 0.5 * full[:16, 16:32].abs().mean() + 1.0
        out.copy_(full)
        return out

    monkeypatch.setattr(torch, "mm", mm)
    bad = failing_products(torch.device("cpu"), torch.float32, SHAPES, (64,))
    assert bad == ["M64.48x32.fwd", "M64.48x32.dx", "M64.48x32.dw", "M64.32x80.fwd", "M64.32x80.dx",
                   "M64.32x80.dw"]


def test_settles_on_the_largest_target_that_checks_right() -> None:
    calls: list[int | None] = []
    target: list[int | None] = [None]

    def check() -> list[str]:  # wrong unless the target is 66 SMs or fewer (as cuBLAS 13.1 at 98 SMs)
        return [] if target[0] is not None and target[0] <= 66 else ["M2048.2048x2048.fwd"]

    def set_target(_sms: int, t: int | None) -> None:
        calls.append(t)
        target[0] = t

    found = settle(98, check, set_target)
    assert (found.sms, found.target, found.failed) == (98, 66, ("M2048.2048x2048.fwd",))
    assert calls == [90, 82, 74, 66]


def test_right_by_default_sets_nothing() -> None:
    def set_target(_sms: int, _t: int | None) -> None:
        raise AssertionError("must not change the library's choice")

    assert settle(132, lambda: [], set_target).target is None


def test_refuses_in_one_line_when_no_target_helps() -> None:
    calls: list[int | None] = []
    with pytest.raises(GemmCheckError) as err:
        settle(98, lambda: ["M8192.5632x2048.dw"], lambda _s, t: calls.append(t))
    text = str(err.value)
    assert "\n" not in text and "98 SMs" in text and "M8192.5632x2048.dw" in text and "MPS share" in text
    assert calls[-1] is None and calls[:-1] == targets_below(98)


def test_targets_go_down_to_half_the_device() -> None:
    assert targets_below(98) == [90, 82, 74, 66, 58, 50, 49]
    assert targets_below(132) == [124, 116, 108, 100, 92, 84, 76, 68, 66]


def test_linear_shapes_of_a_stage() -> None:
    m = resolve_model("llama-1.3b")
    assert linear_shapes(m, 1, first=True, last=False) == ((2048, 2048), (2048, 5632), (5632, 2048))
    assert (16000, 2048) in linear_shapes(m, 2, first=False, last=True)
    assert gemm_check.EXTRA_TOKENS  # the kernel choice depends on M: more than the plan's own is checked


def test_a_pools_layouts_are_checked_as_one_set() -> None:
    """Stages of several TP degrees (a strategy pool on one rank): every layout's shards, once."""
    from types import SimpleNamespace

    m = resolve_model("llama-1.3b")
    home = SimpleNamespace(tp=1, is_first=True, is_last=True)
    other = SimpleNamespace(tp=2, is_first=True, is_last=False)
    shapes = gemm_check.stage_shapes(m, [home, other])
    assert set(linear_shapes(m, 1, first=True, last=True)) | set(linear_shapes(m, 2, first=True, last=False)) \
        == set(shapes)
    assert (1024, 2048) in shapes and (32000, 2048) in shapes and len(shapes) == len(set(shapes))
