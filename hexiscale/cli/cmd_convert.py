"""``hexiscale convert``: seed-style flags <-> plan file."""

from __future__ import annotations

import argparse
import json

from hexiscale.cli.output import console
from hexiscale.cli.writing import writing
from planner.cluster import load_cluster
from planner.plan import load_plan, plan_to_dict, save_plan
from planner.seed_flags import SeedLayout, add_seed_flag_arguments, plan_to_flags


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("convert", help="convert seed-style flags to a plan, or a plan to flags")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--from-flags", action="store_true", help="build a plan from the seed flags below")
    mode.add_argument("--to-flags", metavar="PLAN", help="print the seed flags of a plan file")
    p.add_argument("--cluster", help="cluster file (needed for --from-flags; adds --devices_id to --to-flags)")
    p.add_argument("--model", help="model preset or config.json (for --from-flags)")
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
        console.print(flags.as_command_line(), highlight=False, soft_wrap=True)
        return 0
    plan = SeedLayout.from_args(args).plan(args.cluster)
    if args.output:
        with writing("-o", args.output):
            save_plan(plan, args.output)
        console.print(f"wrote {args.output}", highlight=False)
    else:
        print(json.dumps(plan_to_dict(plan), indent=2))
    return 0
