"""The knobs of one planning run (:class:`PlannerConfig`), checked before the search starts."""

from __future__ import annotations

from dataclasses import dataclass, replace

from planner.errors import SpecError
from planner.model import RECOMPUTE_MODES
from planner.schedules import TRAINED_SCHEDULES, schedule_named

# the schedules of plans whose layout switches while training (an elastic job, a strategy pool): one
# layer range per stage (planner.schedules.trained.check_no_chunks)
SWITCHABLE: tuple[str, ...] = tuple(n for n in TRAINED_SCHEDULES if schedule_named(n).chunks == 1)


@dataclass(frozen=True)
class PlannerConfig:
    """Knobs of the search (the CLI exposes time limit, seed and objective)."""

    time_limit_s: float = 30.0
    seed: int = 0
    objective: str = "throughput"
    micro_batch_sizes: tuple[int, ...] = (1, 2, 4)
    recompute: tuple[str, ...] = RECOMPUTE_MODES
    zero: tuple[int, ...] = (0, 1)
    # plans the executor trains; zb-h1 (4x H100: -30 % bubble at +15 % peak memory, issue 35) and
    # interleaved-1f1b are priced as twins of each 1F1B finalist with a multi-stage pipeline
    # (.schedule_variant, .interleaved_variant); layouts that switch while training use SWITCHABLE
    schedules: tuple[str, ...] = ("1f1b", "gpipe", "zb-h1", "interleaved-1f1b")
    dtype: str = "bf16"
    compile: bool = False  # the plan's blocks are compiled (PlanOptions.compile): less activation memory
    residual_dtype: str = "fp32"  # the plans' options.residual_dtype (fp32 or dtype), costed as such
    local_search: bool = True
    polish: bool = True  # move single layers under the full estimate at the end (small clusters)
    max_evaluations: int = 2000
    context_parallel: bool = True  # try CP degrees for long sequences (planner.search.context)
    finalists: int = 3

    def check(self) -> None:
        if self.objective != "throughput":
            raise SpecError("--objective", f"{self.objective!r} is not supported", "use throughput")
        if self.time_limit_s <= 0:
            raise SpecError("--time-limit", f"must be > 0, got {self.time_limit_s}", "give seconds, e.g. 10")
        for r in self.recompute:
            if r not in RECOMPUTE_MODES:
                raise SpecError("recompute", f"{r!r} is not one of {list(RECOMPUTE_MODES)}", "none, selective, full")
        if not self.schedules:
            raise SpecError("schedules", "need at least one schedule", f"e.g. {TRAINED_SCHEDULES[:1]}")
        for sc in self.schedules:
            if schedule_named(sc, "schedules").chunks > 1 and "1f1b" not in self.schedules:
                raise SpecError("schedules", f"{sc} is searched as a twin of 1F1B plans (its layer chunks cut "
                                "from a 1F1B split), but 1f1b is not among the schedules",
                                f"add 1f1b to the schedules, e.g. ('1f1b', '{sc}')")
        if not self.micro_batch_sizes or min(self.micro_batch_sizes) < 1:
            raise SpecError("micro_batch_sizes", "need positive micro-batch sizes", "e.g. (1, 2, 4)")
        if self.residual_dtype not in ("fp32", self.dtype):
            raise SpecError("--residual-dtype", f"{self.residual_dtype!r} is neither fp32 nor the compute dtype "
                            f"{self.dtype!r}", f"use fp32 or {self.dtype}")


def elastic_config(config: PlannerConfig) -> PlannerConfig:
    """``config`` for a plan whose layout switches while training: an elastic job's first plan
    (``hexiscale plan --elastic``) and its re-plans (:func:`planner.replan.replan`). SWITCHABLE
    schedules only (one layer range per stage), else the launcher refuses the plan; context
    parallelism stays (an elastic switch moves the state into and out of CP layouts)."""
    return replace(config, schedules=tuple(sc for sc in config.schedules if sc in SWITCHABLE))
