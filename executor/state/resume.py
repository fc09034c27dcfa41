"""Which checkpoint ``--resume`` uses: the newest intact one, verified and agreed on by every rank
before the process group exists (pre-flight).

The candidates (:func:`executor.state.checkpoint_verify.candidates`) are tried newest first. For each,
every rank checks ``meta.json`` against the model and the files, and verifies its share of the
stored bytes (checksums, finite values: :mod:`executor.state.checkpoint_verify`); the ranks then exchange
verdicts through the store (:func:`executor.train.preflight.exchange`), so all of them see the same
failures and choose the same checkpoint. A damaged newest checkpoint of a ``--checkpoint-dir`` is
skipped with one line saying which and why; a checkpoint named directly is never replaced by
another (the run stops with the reason). The chosen checkpoint must be before ``--steps``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from executor.job.env import RankEnv
from executor.state.checkpoint_verify import candidates, verify_files, verify_meta
from executor.train.preflight import exchange
from planner.errors import SpecError
from planner.plan import Plan


@dataclass(frozen=True)
class ResumePoint:
    path: Path
    step: int


def choose_checkpoint(store: Any, renv: RankEnv, plan: Plan, resume: str, steps: int,
                      timeout_s: float) -> ResumePoint:
    """The newest intact checkpoint of ``resume`` (the same on every rank), or a ``SpecError``."""
    found, explicit = candidates(resume)
    skipped: list[str] = []
    for i, ck in enumerate(found):
        error, step = None, -1
        try:
            meta = verify_meta(ck, plan.model)
            step = int(meta["step"])
            verify_files(ck, meta, renv.rank, renv.world_size)
        except SpecError as exc:
            error = SpecError(exc.path, exc.message)  # the reason only: the hint is chosen below
        bad = exchange(store, renv, f"resume/{i}", error, timeout_s)
        if not bad:
            if skipped and renv.rank == 0:
                print(f"hexiscale train: resume: {'; '.join(skipped)}; using {ck} (step {step})",
                      file=sys.stderr, flush=True)
            if step >= steps:
                raise SpecError("--steps", f"{steps}, but the checkpoint {ck} is already at step {step}; nothing "
                                "was trained", f"pass --steps above {step} (steps count from the first run)")
            return ResumePoint(ck, step)
        rank, verdict = bad[0]
        reason = verdict["msg"].removeprefix("--resume: ") + (f" (found by rank {rank})" if rank else "")
        if explicit:
            raise SpecError("--resume", f"{reason}; nothing was trained", "resume from another checkpoint, e.g. "
                            "the --checkpoint-dir (its newest intact one is used)")
        skipped.append(f"skipped {reason}")
    raise SpecError("--resume", f"no intact checkpoint in {resume}: {skipped[0]}"
                    + (f" (and {len(skipped) - 1} older ones)" if len(skipped) > 1 else "") + "; nothing was trained",
                    "train from scratch (drop --resume) or restore the checkpoint files")
