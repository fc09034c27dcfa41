"""Trace recording pieces that need no processes: the traced window and the cost of tracing off."""

from __future__ import annotations

import sys

import pytest

from executor.train.tensorboard_sink import summary_writer_class
from executor.train.trace import NO_TRACE, trace_window
from planner.errors import SpecError


def test_trace_window_skips_the_warm_up_step() -> None:
    assert list(trace_window(0, 10, 3)) == [1, 2, 3]
    assert list(trace_window(5, 10, 3)) == [6, 7, 8]  # after a resume at step 5
    assert list(trace_window(0, 3, 3)) == [0, 1, 2]  # too short to skip one
    assert list(trace_window(0, 2, 3)) == [0, 1]


def test_tracing_off_allocates_nothing_per_op() -> None:
    assert NO_TRACE.span("forward", 3) is NO_TRACE.span("p2p") and not NO_TRACE.active


def test_missing_tensorboard_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(SpecError, match=r"--tensorboard: needs the tensorboard package.*hexiscale\[tensorboard\]"):
        summary_writer_class()
