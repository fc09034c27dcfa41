"""The NaN/Inf guard: a step whose loss or gradient norm is not finite never reaches the weights.

Every rank sees the same all-reduced ``[loss, ‖g‖²]`` (:meth:`executor.train.engine.Engine.train_step`),
so every rank takes the same decision and no collective is left half-done. The decision comes
before clipping and the optimizer step, so nothing of a non-finite step is applied, and a stopped
job saves nothing afterwards (``latest`` keeps pointing at the last good checkpoint). Policies:

* ``stop`` (default): raise :class:`NonFiniteStep`; the watchdog stops the job with exit code 3
  and the message names the step and the values;
* ``skip``: drop the step's gradients and leave weights and optimizer state as they were (the data
  position and the step counter move on, as for any step); after ``MAX_SKIPS_IN_A_ROW``
  consecutive skipped steps the job stops as under ``stop`` (a run that only skips trains nothing).

With a fused AdamW the engine does not wait for the host's decision to launch the update: the
optimizer gets a flag made on the device from the same values and skips the update there (torch's
``found_inf``, GradScaler's hook: weights, moments and step count stay as they were), so the
step's kernels run back to back and the host decides afterwards, at the same step, as above.
"""

from __future__ import annotations

import math

POLICIES = ("stop", "skip")
MAX_SKIPS_IN_A_ROW = 10


class NonFiniteStep(RuntimeError):
    """A step's loss or gradient norm is NaN or infinite."""


def should_skip(loss: float, grad_sq: float, *, step: int, policy: str, skipped_in_a_row: int) -> bool:
    """False for a finite step; True to skip it; raises :class:`NonFiniteStep` to stop."""
    if math.isfinite(loss) and math.isfinite(grad_sq):
        return False
    norm = math.sqrt(grad_sq) if grad_sq >= 0 else grad_sq
    what = f"not finite (loss {loss:.4g}, gradient norm {norm:.4g})"
    if policy == "skip" and skipped_in_a_row + 1 < MAX_SKIPS_IN_A_ROW:
        return True
    if policy == "skip":
        raise NonFiniteStep(f"{what}: {MAX_SKIPS_IN_A_ROW} steps in a row were not finite; stopped (nothing of "
                            "them was applied) - lower --lr or check the data")
    raise NonFiniteStep(f"{what}: stopped before the optimizer step, nothing of it was applied or saved - "
                        "lower --lr or check the data (--on-nonfinite skip skips such steps)")
