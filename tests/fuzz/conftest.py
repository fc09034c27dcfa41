"""The fuzz suites call the command line in-process under a per-case deadline: import what its
commands import lazily (torch, the executor) once, up front, so that no deadline ever interrupts an
import half-way (a half-imported torch breaks every later case)."""

from __future__ import annotations

import executor.state.checkpoint_verify  # noqa: F401
import executor.train.entry  # noqa: F401
import hexiscale.cli.main  # noqa: F401
