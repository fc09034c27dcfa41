"""The compiled/eager ratio (:mod:`executor.profiler.compiled`) compares passes as a step pays them,
``max(device, host)`` each: the device times are host-free on CUDA (:mod:`executor.profiler.timing`), and
compiling mostly saves the host's launches."""

from __future__ import annotations

from executor.profiler.compiled import _pass_s


def test_the_compiled_ratio_compares_passes_as_a_step_pays_them() -> None:
    row = {"forward_s": 1.0, "forward_host_s": 3.0, "backward_s": 4.0, "backward_host_s": 2.0}
    assert _pass_s(row) == 3.0 + 4.0
