"""The fidelity program's expected wall time on 4x H100, per phase: printed when a GPU run starts and
used to balance ``--part`` (:mod:`benchmarks.planner.fidelity_split`).

Where the figures come from (4x H100, torch 2.11, the fidelity worker's ``phases_s``, recorded by the
long-context program that runs plans through the same worker, ``long_context_cuda_20261127T*.json``,
llama-1.3b): a plan after its launch's first costs ``groups`` 0.4-3 s + ``gemm_check`` 0.3-0.8 s +
``build`` 0.3-3 s + ``teardown`` 0.6-1.9 s, ~5.5 s (:data:`PLAN_FIXED_S`) besides its steps; the
first plan of a model paid 20-26 s more of ``build``: every rank drawing the model's initial weights
on one CPU core (~5x that for a 7B, ~10x for a 13B), now drawn on the GPU
(:mod:`benchmarks.fidelity.engine_start`, :data:`WEIGHTS_S`). Steps: 2 warm-up + 3-5 timed + 1
traced at the model's step time (:data:`STEP_S`: 1.3B gb 32 0.40-0.49 s, 2026-11-27 partial run;
13B 3.1-3.7 s, issue 32's table; 7B between), the first warm-up step ~2 s more (allocator, cuDNN
plans). A compiled plan's warm-up compiles (:data:`COMPILE_S`). Calibration: ``hexiscale calibrate``
~75 s with its compiled layer, ~60 s more per MPS share (``--sm-percent``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks.planner.fidelity_plans import Case, Launch

STEP_S = {"llama-1.3b": 0.45, "llama2-7b": 1.5, "llama2-13b": 3.5}  # one training step, 4x H100
WEIGHTS_S = {"llama-1.3b": 2.0, "llama2-7b": 5.0, "llama2-13b": 8.0}  # drawn on the GPU, once per model and launch
PLAN_FIXED_S = 5.5  # groups, GEMM check, engine build, teardown
FIRST_STEP_S = 2.0  # the first warm-up step's extra
COMPILE_S = 45.0
SEARCH_S = 10.0  # the planner's searches, at once (benchmarks.planner.fidelity_search)
LAUNCH_S = 15.0  # one process per GPU started: interpreter, torch, CUDA context
CALIBRATE_S = 75.0
CALIBRATE_SHARE_S = 60.0  # each MPS share below 100 %
STEPS = 2 + 5 + 1  # warm-up, timed at most, traced


def plan_s(case: Case) -> float:
    """Expected device seconds of one plan (module docstring; an unknown model counts as a 1.3B)."""
    step = STEP_S.get(case.model.name, STEP_S["llama-1.3b"])
    s = PLAN_FIXED_S + FIRST_STEP_S + STEPS * step
    if case.plan is not None and case.plan.options.compile:
        s += COMPILE_S
    return s


@dataclass(frozen=True)
class Budget:
    """Expected seconds per phase, in the order the program runs them."""

    phases: tuple[tuple[str, float], ...]

    @property
    def total_s(self) -> float:
        return sum(s for _, s in self.phases)

    def line(self) -> str:
        parts = ", ".join(f"{name} ~{s:.0f} s" for name, s in self.phases)
        return f"expected wall time on 4x H100: ~{self.total_s / 60:.1f} min ({parts})"


def budget(launches: Sequence[Launch], wanted: Sequence[str], *, shares: Sequence[int], calibrating: bool) -> Budget:
    """The expected phases of a run of the plans ``wanted``: calibration (the whole GPU and each share
    in ``shares`` below 100 %) unless a calibration is given, the planner's searches, then per launch
    its start, its models' initial weights and its plans."""
    phases: list[tuple[str, float]] = []
    if calibrating:
        phases.append(("calibrate", CALIBRATE_S + CALIBRATE_SHARE_S * sum(1 for s in shares if s < 100)))
    cases = [c for launch in launches for c in launch.cases if c.name in wanted]
    if any(c.planner for c in cases):
        phases.append(("planner searches", SEARCH_S))
    for launch in launches:
        mine = [c for c in launch.cases if c.name in wanted]
        if not mine:
            continue
        models = {c.model.name for c in mine}
        weights = sum(WEIGHTS_S.get(m, WEIGHTS_S["llama-1.3b"]) for m in models)
        phases.append((f"{launch.name} ({len(mine)} plans)", LAUNCH_S + weights + sum(plan_s(c) for c in mine)))
    return Budget(tuple(phases))
