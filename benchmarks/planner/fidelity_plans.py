"""The plans :mod:`benchmarks.planner.fidelity` measures: what a user's 4-GPU host is asked to predict.

Two launches (one process per GPU each): every GPU at 100 % of its SMs, then GPUs 2 and 3 at 50 %
(MPS, the issue's {100, 100, 50, 50} cluster). Each holds the planner's own plans (solved on the
cluster the launch stands for, with this host's calibration), uniform DP / PP / TP layouts of
llama-1.3b, llama2-7b and llama2-13b (seq 2048; the 13B under full recompute, where it fits 80 GB),
a compiled plan and packed micro-batches (documents of mixed length in one row).

Sized for the 10-minute budget on 4x H100 (``--help`` says the expected time): global batches of
8-32 sequences, 2 warm-up + 6 timed steps (the median of steps 3-8), 18 plans of which 2 are 13B
(the compiled plan's warm-up holds its compilation, ~30-60 s).
``--quick`` keeps the same shapes on tiny models (CPU, gloo) so CI runs the whole program.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from planner.model import PRESETS, ModelSpec
from planner.plan import Pipeline, Plan, PlanOptions, Stage

N = 4
DEVS = tuple(f"g{k}:0" for k in range(N))
FULL = (100,) * N
MPS = (100, 100, 50, 50)
SEQ = 2048


@dataclass(frozen=True)
class Case:
    """One row of the table: a hand-written plan, or (``plan`` None) the planner's for ``model`` and
    ``global_batch``; ``packed``: run with packed micro-batches (documents of mixed length)."""

    name: str
    model: ModelSpec
    plan: Plan | None = None
    global_batch: int = 0
    packed: bool = False

    @property
    def planner(self) -> bool:
        return self.plan is None


@dataclass(frozen=True)
class Launch:
    name: str
    sm: tuple[int, ...]
    cases: tuple[Case, ...]


def models(quick: bool) -> tuple[ModelSpec, ModelSpec, ModelSpec]:
    """(1.3B, 7B, 13B) at seq 2048, or three tiny stand-ins (8 layers, CPU sizes) for ``--quick``."""
    if quick:
        t = PRESETS["tiny-8l"]
        return t, replace(t, name="tiny-8l-7b"), replace(t, name="tiny-8l-13b")
    return tuple(replace(PRESETS[n], seq_len=SEQ) for n in ("llama-1.3b", "llama2-7b", "llama2-13b"))  # type: ignore[return-value]


def uniform(model: ModelSpec, dp: int, pp: int, tp: int, batch: int, micro_batches: int, **options: object) -> Plan:
    """``dp`` equal pipelines of ``pp`` stages of ``tp`` devices (in device order), layers split evenly
    (the first stages take the remainder), ``batch`` samples per pipeline."""
    n, it = model.num_layers, iter(DEVS)
    pipes = []
    for _ in range(dp):
        stages, lo = [], 0
        for s in range(pp):
            k = n // pp + (1 if s < n % pp else 0)
            stages.append(Stage(tuple(next(it) for _ in range(tp)), tp, (lo, lo + k)))
            lo += k
        pipes.append(Pipeline(batch, micro_batches, tuple(stages)))
    return Plan(model, batch * dp, tuple(pipes), PlanOptions(**options))  # type: ignore[arg-type]


def launches(quick: bool) -> list[Launch]:
    small, mid, big = models(quick)
    return [
        Launch("sm100x4", FULL, (
            Case("planner-1.3b-gb32", small, global_batch=32),
            Case("1.3b-dp4", small, uniform(small, 4, 1, 1, 8, 4)),
            Case("1.3b-pp4-m16", small, uniform(small, 1, 4, 1, 16, 16)),
            Case("1.3b-tp4-m4", small, uniform(small, 1, 1, 4, 8, 4)),
            Case("1.3b-tp2xdp2", small, uniform(small, 2, 1, 2, 8, 4)),
            Case("1.3b-dp4-compiled", small, uniform(small, 4, 1, 1, 8, 4, compile=True)),
            Case("packed-1.3b-dp4", small, uniform(small, 4, 1, 1, 4, 2), packed=True),
            Case("packed-1.3b-pp2xdp2", small, uniform(small, 2, 2, 1, 8, 4), packed=True),
            Case("planner-7b-gb16", mid, global_batch=16),
            Case("7b-pp4-m8", mid, uniform(mid, 1, 4, 1, 8, 8)),
            Case("7b-tp2xpp2-m8", mid, uniform(mid, 1, 2, 2, 8, 8)),
        )),
        Launch("sm100-100-50-50", MPS, (
            Case("mps-planner-1.3b-gb32", small, global_batch=32),
            Case("mps-1.3b-dp4-even", small, uniform(small, 4, 1, 1, 8, 4)),
            Case("mps-1.3b-pp2xdp2-even", small, uniform(small, 2, 2, 1, 16, 8)),
            Case("mps-1.3b-tp2xdp2", small, uniform(small, 2, 1, 2, 16, 8)),
            Case("mps-packed-1.3b-dp4", small, uniform(small, 4, 1, 1, 4, 2), packed=True),
            Case("mps-planner-13b-gb16", big, global_batch=16),
            Case("mps-13b-tp2-tp2-full", big, uniform(big, 1, 2, 2, 16, 16, recompute="full")),
        )),
    ]
