"""Each step's sequences and layout, computed one step ahead on the data loader's thread.

Dispatch and packing (:func:`planner.varlen.step_layout.plan_step`: randomised greedy plus
time-capped ILPs) take milliseconds to tenths of a second, so rank 0 runs them on a background
thread for step ``k + 1`` while step ``k`` trains. A time-capped ILP need not give the same answer
twice, so only rank 0 solves; at the start of each step it broadcasts the step's sequence indices
and layout to every rank over a gloo group (CPU objects, also in NCCL jobs; the group is created
with the job's other groups, :func:`executor.switch.hot_switch.switch_groups`). Every rank then reads the
tokens of the sequences its pipelines train (:class:`StepDocs`).

:attr:`StepPlan.solve_s` is the solver's time for the step (what the issue asks to report and keep
under 5 % of the step); :attr:`StepPlan.wait_s` is how long the training thread waited for it
(0 while the prefetch keeps ahead).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch.distributed as dist

from executor.data.doc_source import DocSource, step_sequences
from planner.varlen.step_layout import StepLayout, StrategyCost, plan_step


class StepDocs(Sequence[np.ndarray]):
    """The step's sequences, read from the source when a pipeline packs them."""

    def __init__(self, source: DocSource, indices: Sequence[int], lengths: Sequence[int]):
        self.source, self.indices, self.lengths = source, list(indices), list(lengths)
        self._cache: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, j):  # type: ignore[no-untyped-def, override]
        if isinstance(j, slice):
            return [self[k] for k in range(*j.indices(len(self)))]
        if j not in self._cache:
            self._cache[j] = self.source.tokens(self.indices[j])
        return self._cache[j]

    @property
    def label_tokens(self) -> int:
        return sum(self.lengths)


@dataclass(frozen=True)
class StepPlan:
    step: int
    docs: StepDocs
    layout: StepLayout
    solve_s: float  # rank 0's dispatch + packing time for this step
    wait_s: float  # time the training thread waited for it
    next_cursor: int = 0  # the first sequence of the next step (where a resumed run goes on)


class LayoutStream:
    """The step plans from ``cursor`` on (module docstring); ``group``: gloo group of all ranks
    (None with one rank)."""

    def __init__(self, source: DocSource, strategies: Sequence[StrategyCost], *, step_tokens: int, cursor: int = 0,
                 group: Any = None, assign: str = "cost", time_limit_s: float = 0.5, seed: int = 0,
                 prefetch: int = 1):
        self.source = source
        self.group = group
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.step = 0
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max(1, prefetch))
        if self.rank == 0:
            args = (list(strategies), step_tokens, cursor, assign, time_limit_s, seed)
            threading.Thread(target=self._produce, args=args, daemon=True, name="layout-prefetch").start()

    def _produce(self, strategies: list[StrategyCost], step_tokens: int, cursor: int, assign: str,
                 time_limit_s: float, seed: int) -> None:
        try:
            while True:
                indices, cursor = step_sequences(self.source, cursor, step_tokens)
                lengths = [self.source.length(i) for i in indices]
                layout = plan_step(lengths, strategies, assign=assign, time_limit_s=time_limit_s, seed=seed)
                self._queue.put((indices, lengths, layout, cursor))
        except BaseException as exc:  # surfaced in the training thread by next()
            self._queue.put(exc)

    def next(self) -> StepPlan:
        """The next step's plan (collective over ``group``)."""
        t0 = time.perf_counter()
        payload: list[Any] = [None]
        if self.rank == 0:
            item = self._queue.get()
            if isinstance(item, BaseException):
                raise item
            payload = [item]
        if self.group is not None:
            dist.broadcast_object_list(payload, src=0, group=self.group)
        indices, lengths, layout, cursor = payload[0]
        wait = time.perf_counter() - t0
        plan = StepPlan(self.step, StepDocs(self.source, indices, lengths), layout, layout.solve_s, wait, cursor)
        self.step += 1
        return plan
