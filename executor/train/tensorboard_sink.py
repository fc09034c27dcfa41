"""The optional TensorBoard sink beside the JSONL log (``hexiscale train --tensorboard DIR``).

Rank 0 writes each step's numeric metrics as scalars named ``train/<metric>`` at the step number
(``torch.utils.tensorboard``, which needs the ``tensorboard`` package; without it the run stops in
pre-flight with one line saying what to install).
"""

from __future__ import annotations

from typing import Any

from planner.errors import SpecError

INSTALL_HINT = "pip install 'hexiscale[tensorboard]' (the tensorboard package), or drop --tensorboard"


def summary_writer_class() -> Any:
    """``SummaryWriter``, or a SpecError naming the missing package."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise SpecError("--tensorboard", "needs the tensorboard package", INSTALL_HINT) from None
    return SummaryWriter


class TensorBoardSink:
    def __init__(self, folder: str):
        self.writer = summary_writer_class()(log_dir=folder)

    def write(self, record: dict[str, Any]) -> None:
        """One step's record (the JSONL record: ``step`` plus metrics; non-numbers are skipped)."""
        step = int(record["step"])
        for key, value in record.items():
            if key not in ("step", "time") and isinstance(value, int | float) and not isinstance(value, bool):
                self.writer.add_scalar(f"train/{key}", value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
