"""``hexiscale convert``: seed-style flags <-> plan file. ``--from-flags`` takes a seed user's launch
line as typed (:mod:`planner.seed_layout`): the model from ``--model-size``/``--layer-num``, the
batch from ``--accum-iter``; without ``--cluster`` a layout on node 0 only is this machine's.
Launcher flags (``--master_addr``, ``--current_device``, ``--run-iter``) are accepted and say what
they become in ``hexiscale train``."""

from __future__ import annotations

import argparse
import json
import shlex

from hexiscale.cli.output import console, err_console
from hexiscale.cli.writing import writing
from planner.cluster import load_cluster
from planner.plan import load_plan, plan_to_dict, save_plan
from planner.seed_flags import plan_to_flags
from planner.seed_layout import SeedLayout, add_seed_flag_arguments
from planner.seed_options import option_flags


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("convert", help="convert seed-style flags to a plan, or a plan to flags")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--from-flags", action="store_true", help="build a plan from the seed flags below")
    mode.add_argument("--to-flags", metavar="PLAN", help="print the seed flags of a plan file")
    p.add_argument("--cluster", help="cluster file (--from-flags: unless every device is on this machine; "
                   "--to-flags: adds --devices_id)")
    p.add_argument("--model", help="model preset or config.json (for --from-flags; or --model-size)")
    p.add_argument("--seq-len", type=int, dest="seq_len")
    p.add_argument("--recompute", default="none", choices=("none", "selective", "full"))
    p.add_argument("--zero", type=int, default=0, choices=(0, 1))
    p.add_argument("--dtype", default="bf16", choices=("fp32", "bf16", "fp16"))
    p.add_argument("-o", "--output", help="write the plan here (default: print JSON)")
    add_seed_flag_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.to_flags:
        plan = load_plan(args.to_flags)
        flags = plan_to_flags(plan, load_cluster(args.cluster) if args.cluster else None)
        options, lost = option_flags(plan)
        for note in lost:
            err_console.print(f"note: not carried by the flags: {note}", soft_wrap=True)
        console.print(f"{flags.as_command_line()} {shlex.join(options)}", soft_wrap=True)
        return 0
    layout = SeedLayout.from_args(args)
    plan = layout.plan(args.cluster)
    for note in layout.notes() + _launcher_notes(args):
        err_console.print(f"note: {note}", highlight=False, markup=False, soft_wrap=True)
    if args.output:
        with writing("-o", args.output):
            save_plan(plan, args.output)
        console.print(f"wrote {args.output}", highlight=False)
    else:
        print(json.dumps(plan_to_dict(plan), indent=2))
    return 0


def _launcher_notes(args: argparse.Namespace) -> list[str]:
    given = [f for f, v in (("--master_addr", args.master_addr), ("--master_port", args.master_port),
                            ("--current_device", args.current_device)) if v is not None]
    if not given:
        return []
    return [f"{', '.join(given)}: not part of a plan; 'hexiscale train' uses them where the launcher's "
            "environment (MASTER_ADDR, MASTER_PORT, LOCAL_RANK) does not say"]
