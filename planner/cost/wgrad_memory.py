"""Memory of a split backward (ZB-H1): what a micro-batch keeps between its ``B`` and its ``W``,
and a stage's activations at its peak from the schedule's moments (:mod:`planner.schedules.held`).

A deferring ``B`` (:mod:`executor.parallel.weight_grad_store`) queues, per linear, the input it
saved (compute dtype ``e``) and its output gradient (``e``); everything else of the micro-batch is
freed by the ``B``. Per layer and token of a ``t``-way TP stage::

    e·[(5 if r != e else 2)·h      the norm outputs in the compute dtype (q, k, v, gate, up each cast
                                    its own copy when the residual dtype r differs; else the two
                                    norms' outputs are shared), as the activation formula counts them
       + h/t + f/t                  wo's and w_down's inputs (attention output; silu(gate)·up)
       + (h + 2·kv)/t + 2·f/t       q, k, v, gate, up output gradients
       + 2·h]                       wo's and w_down's output gradients (row-parallel: the full h)

and on the last stage the LM head's ``e·(h + V/t)`` (its input, the logits' gradient). The weight
operand is not queued (the ``W`` reads ``.grad``'s parameter), and the ``B`` has dropped the
weight copies. A stage's activations at a moment are ``full · A + deferred · D`` (``A`` one
micro-batch held whole, :func:`planner.cost.memory.stage_memory`'s per-micro-batch term), its
gradients those allocated by then; the peak is the largest moment.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.cost.ops import Numerics
from planner.cost.params import DEFAULT_PARAMS, CostParams
from planner.model import ModelSpec
from planner.schedules.held import Held


def deferred_wgrad_bytes(model: ModelSpec, *, micro_batch: int, tp: int, dtype: str, layers: int, last: bool,
                         seq_len: int | None = None, params: CostParams = DEFAULT_PARAMS) -> float:
    """Bytes one micro-batch keeps queued from its deferring ``B`` until its ``W`` (module docstring)."""
    num = Numerics.from_params(dtype, params)
    e, r = num.e, num.rl
    h, f, kv = model.hidden_size, model.ffn_hidden_size, model.kv_dim
    tokens = micro_batch * (seq_len or model.seq_len)
    per_layer = (5 if r != e else 2) * h + h / tp + f / tp + (h + 2 * kv) / tp + 2 * f / tp + 2 * h
    head = h + model.vocab_size / tp if last else 0.0
    return tokens * e * (layers * per_layer + head)


def held_peak(held: Sequence[Held], *, per_mb: float, deferred: float, early_gradients: float,
              gradients: float) -> tuple[float, float]:
    """(activations, gradients) at the stage's largest moment: ``full · per_mb + deferred · deferred``
    beside the gradients allocated by then (``early_gradients`` before the first backward op ends)."""
    def moment(h: Held) -> tuple[float, float]:
        return h.full * per_mb + h.deferred * deferred, gradients if h.grads else early_gradients
    return max((moment(h) for h in held), key=sum, default=(0.0, early_gradients))
