"""The rank whose traced step a fidelity row shows (no torch: the planner's tests re-price recorded
runs with it)."""

from __future__ import annotations

from collections.abc import Sequence


def bottleneck(traced: Sequence[dict[str, float]]) -> dict[str, float]:
    """Of the ranks' :func:`~benchmarks.fidelity.traced_step.span_totals`, the bottleneck rank's: the
    most forward and backward (the compute the others wait for). Not the largest ``step_s``: every
    rank ends with the step's last collective, so that picks any rank, and a fast rank shows its wait
    for the slow one as gradient sync or p2p (4x H200, 2026-11-27: the packed DP 4 row's 49.8 ms of
    "gradient sync" was GPU 3 waiting for GPU 0, which synced in 5.6 ms)."""
    return max(traced, key=lambda t: (t.get("forward", 0.0) + t.get("backward", 0.0), t.get("step_s", 0.0)))
