"""The fidelity worker's hooks into the engine's start-up (one process runs many plans).

* **Initial weights reused between plans.** The engine draws each parameter's full logical tensor
  from its own seeded generator (:func:`executor.model.init.logical_init`) on the CPU, every plan
  again: ~10 s of one core per rank for llama-1.3b, ~5x that for a 7B. The tensors depend only on
  the model, the seed and the name, so the worker keeps the current model's and hands the engine
  the same values without drawing them again (a new model drops the old one's).
* **Drawn on the GPU.** Even once per model, the CPU draw was the largest fixed cost of the
  program's 7B and 13B plans (~25-60 s per rank and model). On a GPU the cache draws each tensor
  with the device's generator (same distribution, other values: a step's time and memory do not
  depend on them) and keeps a CPU copy, one tensor on the device at a time; the worker fills it
  (:meth:`InitCache.fill`) before a plan's peak-memory window opens, so the engine then builds from
  CPU tensors exactly as training does. On the CPU (``--quick``) the values are the executor's.
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

    def __init__(self, draw: Callable[..., dict[str, torch.Tensor]], device: torch.device | None = None):
        self.draw = draw
        self.device = device  # a CUDA device: draw there (module docstring); None / CPU: as the engine does
        self.key: tuple[ModelSpec, int] | None = None
        self.tensors: dict[str, torch.Tensor] = {}
        self.drawn = 0  # tensors drawn (the rest were reused)

    def __call__(self, model: ModelSpec, seed: int, names: Iterable[str] | None = None) -> dict[str, torch.Tensor]:
        if self.key != (model, seed):
            self.key, self.tensors = (model, seed), {}
        wanted = list(names) if names is not None else [p.name for p in logical_params(model)]
        missing = [n for n in wanted if n not in self.tensors]
        if missing and (self.device is None or self.device.type == "cpu"):
            new = self.draw(model, seed, missing)
            self.drawn += len(new)
            self.tensors.update(new)
        for n in missing if self.device is not None and self.device.type != "cpu" else ():
            self.tensors[n] = self.draw(model, seed, [n], device=self.device)[n].cpu()  # one on the device at a time
            self.drawn += 1
        return {n: self.tensors[n] for n in wanted}

    def fill(self, model: ModelSpec, seed: int, names: Iterable[str]) -> None:
        """Draw what a plan's engine will ask for, before its measured window (module docstring)."""
        self(model, seed, names)


@contextmanager
def installed(clock: Callable[[], PhaseClock | None], device: torch.device | None = None) -> Iterator[InitCache]:
    """Wrap the engine's ``logical_init`` (:class:`InitCache`, drawing on ``device`` when it is a GPU)
    and ``ensure_right_products`` (its time added to ``clock()``'s ``gemm_check``) while the block runs."""
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

    cache = InitCache(engine.logical_init, device)
    saved = engine.logical_init, engine.ensure_right_products
    engine.logical_init, engine.ensure_right_products = cache, timed_check  # type: ignore[assignment]
    try:
        yield cache
    finally:
        engine.logical_init, engine.ensure_right_products = saved
