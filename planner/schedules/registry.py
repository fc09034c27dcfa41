"""The schedule registry: every pipeline schedule by name, as data.

A :class:`Schedule` gives, per stage, its op order (:mod:`planner.schedules.ops`) and derives from
that order its in-flight and memory rules. The executor interprets these ops
(:mod:`executor.parallel.schedules`) and the cost model's simulator prices the same ops
(:mod:`planner.cost.simulate`), so the order is written once. A schedule the executor cannot run
yet (``trained=False``) is still priced; the executor refuses it in one line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from planner.errors import SpecError
from planner.schedules.gpipe import gpipe_ops
from planner.schedules.held import Held, held_moments
from planner.schedules.interleaved import CHUNKS, interleaved_ops, interleaved_requires
from planner.schedules.one_f_one_b import one_f_one_b_ops
from planner.schedules.ops import StageOp, held_with_grads_of, in_flight_of
from planner.schedules.zb_h1 import zb_h1_ops

OpOrder = Callable[..., list[StageOp]]  # (stages, stage index, micro-batches[, chunks]) -> ops
Requires = Callable[[int, int], str | None]  # (stages, micro-batches) -> why the schedule cannot run them


@dataclass(frozen=True)
class Schedule:
    """A named op order; ``chunks`` layer chunks per stage (above 1: an interleaved schedule, which
    runs any count from 2, the plan's; ``chunks`` is its default); ``trained``: the executor runs it;
    ``requires``: a condition on the pipeline's shape (None: any shape runs)."""

    name: str
    order: OpOrder
    chunks: int = 1
    trained: bool = True
    requires: Requires | None = None

    def check(self, stages: int, micro_batches: int, field: str = "micro_batches") -> None:
        """A pipeline shape this schedule cannot run is a :class:`SpecError` on ``field``."""
        why = self.requires(stages, micro_batches) if self.requires is not None else None
        if why is not None:
            raise SpecError(field, why, f"change micro_batches or use another schedule than {self.name}")

    def check_trained(self, field: str = "schedule") -> None:
        """A schedule the executor does not run yet is a :class:`SpecError` on ``field``."""
        if not self.trained:
            raise SpecError(field, f"schedule {self.name!r} is priced but not trained yet",
                            f"train with {', '.join(TRAINED_SCHEDULES)}; 'hexiscale estimate' prices {self.name}")

    def chunks_of(self, chunks: int | None) -> int:
        """Layer chunks per stage for a pipeline asking ``chunks`` (None: this schedule's default)."""
        if chunks is None:
            return self.chunks
        if (chunks > 1) != (self.chunks > 1) or chunks < 1:
            raise ValueError(f"schedule {self.name!r} runs {'2 or more' if self.chunks > 1 else 'one'} layer "
                             f"chunk(s) per stage, got {chunks}")
        return chunks

    def ops(self, stages: int, stage: int, micro_batches: int, chunks: int | None = None) -> list[StageOp]:
        """The ordered ops of ``stage`` (0-based) of a pipeline of ``stages`` stages (``chunks``
        layer chunks per stage; :attr:`Plan.pipelines[p].chunks <planner.plan.Pipeline.chunks>`)."""
        if not 0 <= stage < stages or micro_batches < 1:
            raise ValueError(f"need 0 <= stage < stages and micro_batches >= 1, got stage={stage} "
                             f"stages={stages} micro_batches={micro_batches}")
        v = self.chunks_of(chunks)
        return self.order(stages, stage, micro_batches, v) if v > 1 else self.order(stages, stage, micro_batches)

    def in_flight(self, stages: int, stage: int, micro_batches: int, chunks: int | None = None) -> int:
        """Micro-batches whose activations the stage holds at its peak."""
        return in_flight_of(self.ops(stages, stage, micro_batches, chunks), self.chunks_of(chunks))

    def held(self, stages: int, stage: int, micro_batches: int, chunks: int | None = None) -> tuple[Held, ...] | None:
        """The distinct moments (first seen first) of what the stage holds op by op where its ``B``
        ops defer weight gradients to ``W`` ops (:mod:`planner.schedules.held`; a peak is the largest,
        and the search's memory cache keys on them); None for a schedule without ``W`` ops or with
        several chunks per stage (its rule is :meth:`in_flight` and :meth:`held_with_grads`)."""
        ops = self.ops(stages, stage, micro_batches, chunks)
        if self.chunks_of(chunks) > 1 or not any(op.kind == "W" for op in ops):
            return None
        return tuple(dict.fromkeys(held_moments(ops, stage == 0)))

    def held_with_grads(self, stages: int, stage: int, micro_batches: int, chunks: int | None = None) -> int:
        """Micro-batches the stage holds, at most, once its first backward has allocated the gradients."""
        return held_with_grads_of(self.ops(stages, stage, micro_batches, chunks), self.chunks_of(chunks))


REGISTRY: dict[str, Schedule] = {s.name: s for s in (
    Schedule("1f1b", one_f_one_b_ops),
    Schedule("gpipe", gpipe_ops),
    Schedule("zb-h1", zb_h1_ops),
    Schedule("interleaved-1f1b", interleaved_ops, chunks=CHUNKS, requires=interleaved_requires),
)}
SCHEDULE_NAMES: tuple[str, ...] = tuple(REGISTRY)
TRAINED_SCHEDULES: tuple[str, ...] = tuple(n for n, s in REGISTRY.items() if s.trained)


def schedule_named(name: str, field: str = "schedule") -> Schedule:
    """The registered schedule ``name``; an unknown name is a :class:`SpecError` on ``field``."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise SpecError(field, f"unknown schedule {name!r}; known: {', '.join(SCHEDULE_NAMES)}",
                        f"use one of {', '.join(SCHEDULE_NAMES)}") from None
