"""Closed-form pipeline schedule times from per-stage, per-micro-batch times.

Inputs: stage ``i`` (``S`` stages) takes ``f[i]`` per forward and ``b[i]`` per backward of one
micro-batch, with its blocking p2p sends already added (:func:`planner.cost.simulate.fold_p2p`:
``f[i]`` includes sending the activation to ``i+1``, ``b[i]`` the gradient to ``i-1``); ``m``
micro-batches. ``M = max_i (f[i] + b[i])`` is the bottleneck stage's per-micro-batch time.

**GPipe** (all forwards, then all backwards)::

    T = [Σ f + (m-1)·max f] + [Σ b + (m-1)·max b]

Exact under the simulator's model (``simulate.py``): each phase is a flow shop of ``m``
identical jobs (the forward from stage 0 down, the backward from stage S-1 up), whose makespan
is the sum of the stage times plus ``m-1`` times the slowest stage, and the backward phase starts
when the last stage finishes its last forward, when every stage is free.

**1F1B** (warm-up forwards, steady one-forward-one-backward, cool-down backwards)::

    T = Σ_i (f[i] + b[i])  +  (m-1)·M
        warm-up + cool-down     steady state on the bottleneck stage

Exactness, as checked against the simulator in tests/planner/test_cost_schedule.py:

* exact when the bottleneck stage is the last one (``f[S-1]+b[S-1] = M``), which includes every
  pipeline with equal stages;
* an upper bound when every stage has the same backward/forward ratio (``b[i] = r·f[i]``),
  which the per-layer model gives to stages without embedding/head;
* always at least the lower bound ``max(Σ(f+b), max_k Σ_{i<k}(f[i]+b[i]) + m·(f[k]+b[k]))``
  (the first micro-batch's round trip; stage ``k``'s own work after the first forward reaches it
  and before the last gradient leaves it) — and :func:`one_f_one_b_lower_bound` gives it.

In general (a bottleneck in the middle with unequal ratios) the closed form may be a few percent
below the simulated time; :func:`planner.cost.step.estimate` therefore evaluates the schedule
with :func:`planner.cost.simulate.simulate`, and the closed forms serve the planner's inner loops.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.schedules import schedule_named
from planner.schedules.held import Held


def _check(f: Sequence[float], b: Sequence[float], m: int) -> None:
    if not f or len(f) != len(b) or m < 1:
        raise ValueError("need one forward and one backward time per stage, and m >= 1")


def gpipe_time(f: Sequence[float], b: Sequence[float], m: int) -> float:
    """GPipe makespan (exact; see the module docstring)."""
    _check(f, b, m)
    return sum(f) + (m - 1) * max(f) + sum(b) + (m - 1) * max(b)


def one_f_one_b_time(f: Sequence[float], b: Sequence[float], m: int) -> float:
    """1F1B makespan: warm-up + steady state with the bottleneck stage + cool-down."""
    _check(f, b, m)
    return sum(f) + sum(b) + (m - 1) * max(x + y for x, y in zip(f, b, strict=True))


def one_f_one_b_lower_bound(f: Sequence[float], b: Sequence[float], m: int) -> float:
    """A lower bound of the 1F1B makespan that holds for any stage times."""
    _check(f, b, m)
    total = sum(f) + sum(b)
    best, prefix = total, 0.0
    for x, y in zip(f, b, strict=True):
        best = max(best, prefix + m * (x + y))
        prefix += x + y
    return best


def pipeline_time(f: Sequence[float], b: Sequence[float], m: int, schedule: str = "1f1b") -> float:
    """Closed-form makespan of one pipeline under ``schedule`` ('1f1b' or 'gpipe'; the registry's
    other schedules have none: :func:`planner.cost.simulate.simulate` prices them)."""
    schedule_named(schedule)  # an unknown name is a SpecError
    if schedule == "gpipe":
        return gpipe_time(f, b, m)
    if schedule == "1f1b":
        return one_f_one_b_time(f, b, m)
    raise ValueError(f"schedule {schedule!r} has no closed form; simulate it")


def bubble_fraction(f: Sequence[float], b: Sequence[float], m: int, schedule: str = "1f1b") -> float:
    """Idle fraction of the bottleneck stage: 1 - m·M / T."""
    t = pipeline_time(f, b, m, schedule)
    busy = m * max(x + y for x, y in zip(f, b, strict=True))
    return max(0.0, 1.0 - busy / t) if t > 0 else 0.0


def in_flight(schedule: str, stages: int, stage_index: int, micro_batches: int, chunks: int | None = None) -> int:
    """Micro-batches whose activations a stage holds at its peak (the registry's rule, derived from
    the schedule's op order): 1F1B ``min(S - i, m)``, GPipe ``m``; ``chunks``: an interleaved
    pipeline's layer chunks per stage. An unknown name is a SpecError."""
    return schedule_named(schedule).in_flight(stages, stage_index, micro_batches, chunks)


def held_with_grads(schedule: str, stages: int, stage_index: int, micro_batches: int,
                    chunks: int | None = None) -> int:
    """Micro-batches a stage holds, at most, once its first backward has allocated the gradients:
    1F1B ``min(S - i, m)`` when a forward follows that backward (``m > S - i``), else one less;
    GPipe ``m - 1`` (all forwards come first). From the registry, like :func:`in_flight`."""
    return schedule_named(schedule).held_with_grads(stages, stage_index, micro_batches, chunks)


def split_backward_held(schedule: str, stages: int, stage_index: int, micro_batches: int,
                        chunks: int | None = None) -> tuple[Held, ...] | None:
    """A split-backward (``W``) schedule's per-op moments, micro-batches held whole and with only
    their queued weight-gradient operands (:mod:`planner.schedules.held`); None for the others,
    whose rule is :func:`in_flight` and :func:`held_with_grads`."""
    return schedule_named(schedule).held(stages, stage_index, micro_batches, chunks)
