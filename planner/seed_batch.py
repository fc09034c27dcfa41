"""``--global-batch-size`` beside the seed-style layout flags: one number, the samples per optimizer
step over every pipeline (Megatron's meaning, and ``hexiscale plan``'s). Each pipeline's batch is
``--pipeline-batch-sizes`` (the seeds' ``--global_bsz_size`` / ``--global_batch_size``).

Until issue 30, ``--global-batch-size`` was one more spelling of the per-pipeline list, so an old
line may mean either. Where the two readings give the same layout (one pipeline: ``[8]`` is 8 in
all), it still works; where they differ, the command stops with one line naming the new flag,
instead of training a batch the user did not ask for: several values (``4 4``, argparse's extra
value: :mod:`hexiscale.cli.flag_hints` names the flag and its meaning), or one number that the
layout's pipelines do not sum to (``8`` padded to two pipelines of 8). Given together with
``--pipeline-batch-sizes``, the list must sum to it.
"""

from __future__ import annotations

import argparse
from typing import Any

from planner.errors import SpecError
from planner.plan import Plan

TOTAL = "total"  # its argparse dest (SeedLayout.total): (the spelling used, the total)
PER_PIPELINE = "--pipeline-batch-sizes"


class TotalBatch(argparse.Action):
    """Records the total with the spelling typed (a flag of its own, so that an error names what
    the user typed); the layout takes it as the batch where no per-pipeline list was given
    (:meth:`planner.seed_layout.SeedLayout.plan`)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, TOTAL, (option_string or self.option_strings[0], int(values)))


def add_total_batch_argument(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument("--global-batch-size", "--global-batch", dest=TOTAL, type=int, metavar="N",
                   action=TotalBatch, help=f"samples per step, the total over every pipeline (one number; "
                   f"each pipeline's is {PER_PIPELINE})")


def total_given(args: argparse.Namespace) -> tuple[str, int] | None:
    """(spelling, total) of ``--global-batch-size``, if given."""
    found = getattr(args, TOTAL, None)
    return None if found is None else (str(found[0]), int(found[1]))


def check_total(plan: Plan, total: tuple[str, int] | None) -> None:
    """The plan's global batch is the ``--global-batch-size`` given (see the module docstring)."""
    if total is None or plan.global_batch_size == total[1]:
        return
    flag, value = total
    each = " ".join(str(p.batch_size) for p in plan.pipelines)
    raise SpecError(flag, f"{value} is the total samples per step, but the layout's {len(plan.pipelines)} "
                    f"pipeline(s) take {each} = {plan.global_batch_size}",
                    f"give each pipeline's batch with {PER_PIPELINE} (the seed's --global_bsz_size), "
                    f"summing to {value}")
