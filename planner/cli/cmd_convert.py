"""``hexiscale convert``: seed-style flags <-> plan file."""

from __future__ import annotations

import argparse
import json

from planner.cli.output import console
from planner.cluster import load_cluster
from planner.errors import SpecError
from planner.model import resolve_model
from planner.plan import Plan, PlanOptions, load_plan, plan_to_dict, save_plan
from planner.seed_flags import plan_from_flags, plan_to_flags


def add_seed_flag_arguments(p: argparse.ArgumentParser) -> None:
    """The seed systems' layout flags (shared by convert and train)."""
    p.add_argument("--hetero_configs", "--hetero-configs", dest="hetero_configs",
                   help="TP degree per stage per pipeline, e.g. \"[[1, 2, 1], [2, 2]]\"")
    p.add_argument("--layer_partitions", "--layer-partitions", dest="layer_partitions",
                   help="layers per stage per pipeline, e.g. \"[[8, 16, 8], [16, 16]]\"")
    p.add_argument("--global_bsz_size", "--global_batch_size", "--global-bsz-size", dest="global_bsz_size",
                   nargs="+", help="batch size per pipeline (a short list pads with its last value)")
    p.add_argument("--chunks", "--micro_batch_num", dest="chunks", nargs="+",
                   help="micro-batches per pipeline (a short list pads with its last value)")
    p.add_argument("--devices_id", "--devices-id", dest="devices_id",
                   help="node index of each GPU per stage per pipeline, e.g. \"[[[0], [0, 0]], [[1, 1]]]\"")


def plan_from_args(args: argparse.Namespace) -> Plan:
    """Build a plan from seed flags in ``args`` (needs --cluster and --model)."""
    missing = [f for f in ("hetero_configs", "layer_partitions", "global_bsz_size", "chunks")
               if getattr(args, f) is None]
    if missing:
        raise SpecError(f"--{missing[0]}", "missing", "seed-style flags need --hetero_configs, "
                        "--layer_partitions, --global_bsz_size and --chunks")
    if not args.cluster or not args.model:
        raise SpecError("--cluster" if not args.cluster else "--model", "missing",
                        "seed-style flags need --cluster CLUSTER.yaml and --model NAME")
    return plan_from_flags(
        model=resolve_model(args.model, getattr(args, "seq_len", None)), cluster=load_cluster(args.cluster),
        hetero_configs=args.hetero_configs, layer_partitions=args.layer_partitions,
        global_bsz_size=args.global_bsz_size, chunks=args.chunks, devices_id=args.devices_id,
        options=PlanOptions(recompute=args.recompute, zero=args.zero, dtype=args.dtype),
    )


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
    plan = plan_from_args(args)
    if args.output:
        save_plan(plan, args.output)
        console.print(f"wrote {args.output}", highlight=False)
    else:
        print(json.dumps(plan_to_dict(plan), indent=2))
    return 0
