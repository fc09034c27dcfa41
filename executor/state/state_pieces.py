"""The local tensors behind a rank's holdings (:class:`planner.state_layout.RankState`): views of a
running engine's state, and freshly allocated state for a rank of the next layout.

One tensor per holding, in the holding order, each of shape ``holding.chunk.sizes``:

* ``model/<p>`` — the parameter's local shard (the engine's fp32 master weight);
* ``optim/<key>/<p>`` without ZeRO-1 — the AdamW moment of that shard (zeros before the first step);
* ``optim/<key>/<p>`` under ZeRO-1 — elements ``[at, at + numel)`` of the rank's flat part
  ``holding.part``, viewed row-major as the rectangle (:mod:`executor.parallel.zero` stores parts flat).

:func:`held_tensors` gives views of an :class:`~executor.train.engine.Engine`'s live state (nothing is
copied; the engine must not step while they are read). :class:`NewState` gives the tensors of a
rank of another plan inside that plan's engine, built before the switch without its process groups
(``Engine(..., groups=None, init=False)``); the switch writes into them and :meth:`NewState.install`
sets the step count. Both check that the engine's ZeRO-1 parts have the sizes
:mod:`planner.state_layout` computed, so the two descriptions cannot drift apart.
"""

from __future__ import annotations

import torch

from executor.train.engine import Engine
from planner.chunks import Chunk
from planner.state_layout import MOMENTS, RankState

OPTIM = "optim/"


def narrow(t: torch.Tensor, base: Chunk, part: Chunk) -> torch.Tensor:
    """The ``part`` rectangle of ``t``, a tensor holding rectangle ``base`` (a strided view): one
    ``as_strided``, after checking that ``part`` lies inside ``base``."""
    strides = t.stride()
    starts = [o - b for o, b in zip(part.offsets, base.offsets)]
    if len(starts) != t.dim() or any(a < 0 or a + n > m for a, n, m in zip(starts, part.sizes, t.shape)):
        raise ValueError(f"{part} does not lie in {base} (a tensor of shape {tuple(t.shape)})")
    return t.as_strided(part.sizes, strides, t.storage_offset() + sum(a * s for a, s in zip(starts, strides)))


def key_name(tensor: str) -> tuple[str, str]:
    """``optim/exp_avg/layers.0.x`` -> ``("exp_avg", "layers.0.x")``."""
    key, _, name = tensor[len(OPTIM):].partition("/")
    return key, name


def _check_parts(engine: Engine, state: RankState) -> None:
    got = tuple(p.numel for p in engine.zero.parts) if engine.zero is not None else ()
    if got != state.part_sizes:
        raise RuntimeError(f"rank {engine.rank}: ZeRO-1 parts {got} differ from the planned {state.part_sizes} "
                           "(planner.state_layout and executor.parallel.zero disagree)")


def held_tensors(engine: Engine, state: RankState) -> list[torch.Tensor]:
    """Views of ``engine``'s weights and moments, one per holding of ``state`` (its rank in the
    engine's plan)."""
    _check_parts(engine, state)
    shard_moments: dict[str, dict[str, torch.Tensor]] = {}
    if engine.zero is None:
        for key in MOMENTS:
            shard_moments[key] = {}
            for n, p in engine.params.items():
                st = engine.optimizer.state.get(p, {})
                shard_moments[key][n] = st[key] if key in st else torch.zeros_like(p, dtype=torch.float32)
    out = []
    for h in state.holdings:
        if not h.tensor.startswith(OPTIM):
            out.append(engine.params[h.chunk.name].detach())
            continue
        key, name = key_name(h.tensor)
        if h.part is None:
            out.append(shard_moments[key][name])
        else:  # the master's own moment, not a concatenation of the part (a copy of it, 2.7 GB on 4x H100)
            assert engine.zero is not None
            out.append(engine.zero.moment_view(h.part, h.at, h.numel, key).view(h.chunk.sizes))
    return out


class NewState:
    """The state of one rank of a plan, received by the elastic switch straight into that plan's
    engine, built before the switch (``Engine(..., init=False)``, its process groups attached
    later): the holdings' tensors are the engine's own weights and freshly allocated moments that
    the engine's optimizer already holds as its state (no copy is made at install).

    Memory: the old engine and this one are alive together on a rank of both plans, from the build
    to the old engine's release after the switch: the new rank's weights and moments (no gradients,
    no activations yet) beside the old engine. Before the engine was built ahead, the switch held
    a separate copy of the new state and the engine made a second one while installing it, so the
    switch's peak is one new state lower now; what is added is the new state beside the old
    engine's last steps, which the elastic job only builds ahead where it fits
    (:func:`executor.switch.elastic_switch.fits_beside`)."""

    def __init__(self, state: RankState, engine: Engine):
        _check_parts(engine, state)
        self.state = state
        device = engine.device
        params = engine.params
        self.parts = [{key: torch.empty(n, dtype=torch.float32, device=device) for key in MOMENTS}
                      for n in state.part_sizes]
        moments: dict[str, dict[str, torch.Tensor]] = {key: {} for key in MOMENTS}
        self.tensors: list[torch.Tensor] = []
        for h in state.holdings:
            if not h.tensor.startswith(OPTIM):
                t = params[h.chunk.name].detach()
                if tuple(t.shape) != tuple(h.chunk.sizes):
                    raise RuntimeError(f"rank {engine.rank}: {h.chunk.name} is {tuple(t.shape)} in the engine, "
                                       f"{tuple(h.chunk.sizes)} in the plan's state (planner.state_layout)")
            elif h.part is None:
                key, name = key_name(h.tensor)
                t = moments[key][name] = torch.empty(h.chunk.sizes, dtype=torch.float32, device=device)
            else:
                key, _ = key_name(h.tensor)
                t = self.parts[h.part][key][h.at:h.at + h.numel].view(h.chunk.sizes)
            self.tensors.append(t)
        if engine.zero is not None:
            engine.zero.set_part_moments(self.parts, 0, copy=False)
        else:
            engine.set_optimizer_state(moments, 0, copy=False)
        self.engine = engine

    @property
    def nbytes(self) -> int:
        return sum(t.numel() for t in self.tensors) * 4

    def install(self, step: int) -> None:
        """The state is in the engine already (once the switch filled :attr:`tensors`): set its
        step count; this object lets go of the tensors."""
        self.engine.module.weights_changed()  # cast-once copies (executor.model.cast_once) made again
        self.engine.set_step(step)
        self.parts, self.tensors = [], []
