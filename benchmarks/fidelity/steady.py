"""When a plan's timed steps may stop: the median of steady steps, with fewer steps where they agree.

The fidelity program used to time 6 steps of every plan after 2 warm-up steps (steps 3-8). Once
the timings agree, more steps move the median by less than the noise: :func:`steady` says the
last ``window`` step times (the slowest rank's) lie within ``tolerance`` of their median, and the
worker then stops at ``min_steps`` or later instead of ``max_steps``. The figure is still the
median of every timed step, all of them after the warm-up; a plan whose steps keep moving runs
all ``max_steps``.

Why 5 %: in the recorded runs with 5 timed steps per plan (``fidelity_runs_h100.json``, 2x H100, 28
plan-ranks), the median of the first 3 lies within 0.12 % of the median of all 5 for 9 plans in 10
and 2.0 % at worst, while the steps' spread ((max - min) / median) is 1.9 % for the median plan and
15 % at the 90th percentile (one slow step, which the median ignores); 2 % (the earlier tolerance)
sent about half of the plans to ``max_steps`` for no change of their figure.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

WINDOW = 3
TOLERANCE = 0.05  # (max - min) / median of the window


def steady(times: Sequence[float], *, window: int = WINDOW, tolerance: float = TOLERANCE) -> bool:
    """Whether the last ``window`` of ``times`` spread by at most ``tolerance`` of their median."""
    if window < 1 or len(times) < window:
        return False
    last = list(times[-window:])
    mid = statistics.median(last)
    return mid > 0 and (max(last) - min(last)) <= tolerance * mid


def enough(times: Sequence[float], *, min_steps: int, max_steps: int) -> bool:
    """Stop timing: ``max_steps`` reached, or ``min_steps`` reached and the last ones are steady."""
    return len(times) >= max_steps or (len(times) >= min_steps and steady(times, window=min(WINDOW, min_steps)))
