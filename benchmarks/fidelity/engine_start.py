"""The fidelity worker's hooks into the engine's start-up (one process runs many plans).

* **Initial weights reused between plans.** The engine draws each parameter's full logical tensor
  from its own seeded generator (:func:`executor.model.init.logical_init`) on the CPU, every plan
  again: ~10 s of one core per rank for llama-1.3b, ~5x that for a 7B. The tensors depend only on
  the model, the seed and the name, so the worker keeps the current model's and hands the engine
  the same values without drawing them again (a new model drops the old one's).
* **The GEMM check timed as its own phase** (:mod:`benchmarks.fidelity.phases`): it runs inside
  the engine's construction.

Both wrap the names :mod:`executor.train.engine` calls, for this process only (:func:`installed`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from benchmarks.fidelity.phases import PhaseClock
from planner.layout import logical_params
from planner.model import ModelSpec


class InitCache:
    """``logical_init`` with the current model's tensors kept (module docstring)."""

    def __init__(self, draw: Callable[..., dict[str, torch.Tensor]]):
        self.draw = draw
        self.key: tuple[ModelSpec, int] | None = None
        self.tensors: dict[str, torch.Tensor] = {}
        self.drawn = 0  # tensors drawn (the rest were reused)

    def __call__(self, model: ModelSpec, seed: int, names: Iterable[str] | None = None) -> dict[str, torch.Tensor]:
        if self.key != (model, seed):
            self.key, self.tensors = (model, seed), {}
        wanted = list(names) if names is not None else [p.name for p in logical_params(model)]
        missing = [n for n in wanted if n not in self.tensors]
        if missing:
            new = self.draw(model, seed, missing)
            self.drawn += len(new)
            self.tensors.update(new)
        return {n: self.tensors[n] for n in wanted}


@contextmanager
def installed(clock: Callable[[], PhaseClock | None]) -> Iterator[InitCache]:
    """Wrap the engine's ``logical_init`` (:class:`InitCache`) and ``ensure_right_products`` (its
    time added to ``clock()``'s ``gemm_check``) while the block runs."""
    from executor.train import engine

    check = engine.ensure_right_products

    def timed_check(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return check(*args, **kwargs)
        finally:
            c = clock()
            if c is not None:
                c.add("gemm_check", time.perf_counter() - t0)

    cache = InitCache(engine.logical_init)
    saved = engine.logical_init, engine.ensure_right_products
    engine.logical_init, engine.ensure_right_products = cache, timed_check  # type: ignore[assignment]
    try:
        yield cache
    finally:
        engine.logical_init, engine.ensure_right_products = saved
