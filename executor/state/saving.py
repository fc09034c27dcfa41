"""When ``hexiscale train`` saves: every ``--save-every`` steps and at the end, under
``--checkpoint-dir`` as ``step-NNNNNN``; ``DIR/latest`` names a checkpoint only once it is complete.

With ``--async-save`` a save copies this rank's pieces to host memory and returns; the files are
written by a background thread over a gloo group of its own (created here, by every rank, in the
same place of the start-up order), and the checkpoint is completed (``meta.json``, rename,
``latest``) when the next save starts or training ends. The next step overlaps the writing.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist

from executor.state import checkpoint
from executor.train.engine import Engine


def checkpoint_path(directory: str, step: int) -> Path:
    return Path(directory) / f"step-{step:06d}"


def mark_latest(directory: str, step: int) -> None:
    """Point ``DIR/latest`` at the checkpoint of ``step`` (rank 0, after the save completed)."""
    tmp = Path(directory) / "latest.tmp"
    tmp.write_text(checkpoint_path(directory, step).name + "\n")
    os.replace(tmp, Path(directory) / "latest")


class Saver:
    """Checkpoints of one training run (module docstring)."""

    def __init__(self, engine: Engine, directory: str | None, every: int, background: bool):
        self.engine, self.directory, self.every = engine, directory, every
        self.group = None
        if directory and background:
            self.group = dist.new_group(list(range(engine.topology.world_size)), backend="gloo")
        self.pending: checkpoint.PendingSave | None = None

    def after_step(self, step: int, last: bool, extra: dict[str, Any], on_written: Callable[[], None]) -> None:
        """Collective: save after optimizer step ``step`` (1-based) if it is due."""
        if not self.directory or not (last or (self.every and step % self.every == 0)):
            return
        self.finish()
        self.pending = checkpoint.start_save(self.engine, checkpoint_path(self.directory, step), extra,
                                             background=self.group, on_written=on_written)
        if self.group is None:
            self.finish()

    def finish(self) -> None:
        """Collective: complete the save in flight (if any) and point ``latest`` at it."""
        if self.pending is None or self.directory is None:
            return
        pending, self.pending = self.pending, None
        pending.finish()
        if self.engine.rank == 0:
            mark_latest(self.directory, pending.step)
