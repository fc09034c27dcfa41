"""``hexiscale launch PLAN``: start a plan's ranks (torchrun lines, per-node scripts, Slurm, local).

    hexiscale launch PLAN --cluster CLUSTER [--master ADDR:PORT] [--dry-run]    print + write scripts
    hexiscale launch PLAN --cluster CLUSTER --node NAME [...]                   run one node's ranks
    hexiscale launch PLAN --cluster CLUSTER --slurm [-o job.sbatch]             an sbatch script
    hexiscale launch PLAN --local [-- TRAIN ARGS]                               every rank here

PLAN may be a strategy pool (``hexiscale plan --lengths ... -o POOL.json``): its home plan places
the ranks, and ``hexiscale train`` trains mixed-length data with hot switching (e.g. ``-- --cluster
CLUSTER --step-tokens 131072 --data corpus``).

Everything after ``--`` goes to ``hexiscale train`` (e.g. ``-- --steps 100 --data corpus``).
Nodes running equal process counts get torchrun lines (c10d rendezvous); every layout gets one
bash script per node. Exit codes: 0 ok, 1 user error, 3 rank failure, 4 out of memory.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from hexiscale.cli.flag_names import add_renamed
from hexiscale.cli.launch_train_args import checked_train_args
from hexiscale.cli.output import console
from hexiscale.cli.writing import writing
from planner.errors import SpecError
from planner.ranges import check_int


class _SplitParser(argparse.ArgumentParser):
    """Everything after the first ``--`` becomes ``train_args`` untouched (argparse alone would
    bind an empty list to a trailing positional before it reaches the ``--``)."""

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def,override]
        args = list(args or [])
        rest: list[str] = []
        if "--" in args:
            cut = args.index("--")
            args, rest = args[:cut], args[cut + 1:]
        ns, extra = super().parse_known_args(args, namespace)
        ns.train_args = rest
        return ns, extra


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    saved = sub._parser_class
    sub._parser_class = _SplitParser
    try:
        p = sub.add_parser("launch", help="launch a plan: torchrun lines, per-node scripts, Slurm, or --local",
                           usage="hexiscale launch PLAN [--cluster CLUSTER] [options] [-- TRAIN ARGS...]",
                           description="Start one 'hexiscale train' process per plan device. Exit codes: 0 ok, "
                           "1 user error, 3 rank failure, 4 out of memory, 130 interrupted.")
    finally:
        sub._parser_class = saved
    p.add_argument("plan", help="plan file, or strategy pool (the same path must exist on every node)")
    p.add_argument("--cluster", help="cluster file (required except with --local)")
    p.add_argument("--master", help="ADDR:PORT of the rendezvous (default: first plan node's name, port 29500)")
    p.add_argument("--node", help="run this node's ranks now (torchrun or its script)")
    p.add_argument("--dry-run", action="store_true", help="print commands and scripts; write and run nothing")
    p.add_argument("--slurm", action="store_true", help="print (or -o write) an sbatch script")
    p.add_argument("--local", action="store_true", help="run every rank on this machine and supervise them")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="--local: cuda when this machine has a GPU per rank, else cpu")
    p.add_argument("-o", "--output", help="--slurm: write the script here; else the node-script folder "
                   "(default launch/RUN_ID)")
    p.add_argument("--run-id", help="rendezvous id and log folder name (default hexiscale-PLANNAME)")
    p.add_argument("--python", default=sys.executable, help="interpreter on the nodes (default: this one, "
                   f"{sys.executable.replace('%', '%%')}; the scripts check that it can import hexiscale)")
    p.add_argument("--log-dir", default="logs", help="where node scripts write rank logs")
    p.add_argument("--grace", type=int, default=30, help="seconds the others get to exit after a rank fails")
    p.add_argument("--nccl-socket-ifname", help="exported as NCCL_SOCKET_IFNAME")
    p.add_argument("--gloo-socket-ifname", help="exported as GLOO_SOCKET_IFNAME")
    p.add_argument("--nccl-ib-hca", help="exported as NCCL_IB_HCA")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="export on every node")
    p.add_argument("--sm-percent", action="append", default=[], metavar="NODE=PCT",
                   help="--local on GPUs: ranks on plan node NODE run with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=PCT "
                        "(emulates slower GPUs; needs the MPS daemon: nvidia-cuda-mps-control -d)")
    p.add_argument("--elastic", action="store_true", help="--local: devices may leave and join while it trains "
                   "('hexiscale elastic leave|join'); a failed rank is dropped and the job resumes from the newest "
                   "checkpoint (needs --cluster)")
    trace = p.add_argument("--elastic-trace", dest="elastic_trace", metavar="TRACE",
                           help="--local: an elastic trace (hexiscale.trace/1 YAML): the device set phase by phase; "
                           "implies --elastic")
    add_renamed(p, "--trace", trace)  # train's --trace is a timing trace
    p.add_argument("--max-restarts", type=int, default=3, help="--elastic: recoveries from failed ranks")
    p.add_argument("--elastic-log", help="--elastic: append one JSON line per switch and recovery to this file")
    p.epilog = "Arguments after -- go to 'hexiscale train', e.g. -- --steps 100 --data corpus"
    p.set_defaults(func=run)


def _env(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    """The variables to export on every node; a value a script cannot carry names the flag it came from."""
    from hexiscale.launch.shell import printable

    env = [(k, printable(v, flag)) for k, flag, v in (
        ("NCCL_SOCKET_IFNAME", "--nccl-socket-ifname", args.nccl_socket_ifname),
        ("GLOO_SOCKET_IFNAME", "--gloo-socket-ifname", args.gloo_socket_ifname),
        ("NCCL_IB_HCA", "--nccl-ib-hca", args.nccl_ib_hca)) if v]
    for i, item in enumerate(args.env):
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise SpecError(f"--env[{i}]", f"{item!r} is not KEY=VALUE", "write e.g. --env NCCL_DEBUG=WARN")
        env.append((key, value))
    return tuple(env)


def _master(text: str | None, default_host: str) -> tuple[str, int]:
    if not text:
        return default_host, 29500
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SpecError("--master", f"{text!r} is not ADDR:PORT", "write e.g. --master 10.0.0.1:29500")
    return host, int(port)


def run(args: argparse.Namespace) -> int:
    from hexiscale.launch.shell import run_id as checked_run_id
    from planner.schedules.trained import check_no_chunks, check_plan_trained
    from planner.varlen.pool import load_plan_or_pool

    check_int("--grace", args.grace, 0, 86400, "pass seconds, e.g. --grace 30")
    plan, pool = load_plan_or_pool(args.plan)  # a strategy pool: its home plan places the ranks
    elastic = bool(args.elastic or args.elastic_trace)
    for prefix, each in ([(f"strategies[{i}].plan.", st.plan) for i, st in enumerate(pool.strategies)]
                         if pool is not None else [("", plan)]):
        check_plan_trained(each, prefix)  # a schedule only priced so far: one line before any rank starts
        if elastic:  # layouts that switch keep one layer range per stage (a pool refuses interleaving itself)
            check_no_chunks(each, prefix, "an elastic job")
    # every node gets absolute paths and checked train arguments (one error line here, not one per rank)
    args.plan = os.path.abspath(args.plan)
    mode = ("elastic_pool" if pool is not None else "elastic") if elastic \
        else "pool" if pool is not None else "plan"
    args.train_args = checked_train_args(args.train_args, plan_path=args.plan, mode=mode)
    run_id = checked_run_id(args.run_id, args.plan)
    if args.elastic or args.elastic_trace:
        if args.dry_run:
            raise SpecError("--dry-run", "an elastic job's commands depend on what happens while it runs",
                            "drop --dry-run (or --elastic/--elastic-trace to see the ranks' commands)")
        from hexiscale.launch.elastic_cli import launch_elastic

        return launch_elastic(args, pool if pool is not None else plan, run_id, env=dict(_env(args)))
    if args.local:
        return _run_local(args, plan, run_id)
    if not args.cluster:
        raise SpecError("--cluster", "missing", "multi-node launch needs the cluster file (or use --local)")
    from hexiscale.launch.layout import build_layout
    from hexiscale.launch.scripts import LaunchOptions, node_script, slurm_script, torchrun_lines
    from planner.cluster import load_cluster

    layout = build_layout(plan, load_cluster(args.cluster))
    addr, port = _master(args.master, layout.nodes[0].name)
    opts = LaunchOptions(plan_path=args.plan, master_addr=addr, master_port=port, train_args=tuple(args.train_args),
                         env=_env(args), run_id=run_id, python=args.python, log_dir=args.log_dir,
                         grace_s=args.grace)
    if args.slurm:
        text = slurm_script(layout, opts)
        if args.output and not args.dry_run:
            with writing("-o", args.output):
                Path(args.output).write_text(text)
            console.print(f"wrote {args.output}; submit it with: sbatch {args.output}", highlight=False)
        else:
            print(text, end="")
        return 0
    scripts = {n.name: node_script(layout, n, opts) for n in layout.nodes}
    if args.node:
        node = layout.node(args.node)
        if args.dry_run:
            print(scripts[node.name], end="")
            return 0
        if layout.uniform:
            line = dict((n.name, ln) for n, ln in torchrun_lines(layout, opts))[node.name]
            return subprocess.call(["bash", "-c", line])
        return subprocess.call(["bash", "-c", scripts[node.name]])
    return _print_plan_launch(args, layout, opts, scripts)


def _print_plan_launch(args: argparse.Namespace, layout, opts, scripts: dict[str, str]) -> int:  # type: ignore[no-untyped-def]
    from hexiscale.launch.scripts import torchrun_lines
    from hexiscale.launch.shell import inside, word

    out = Path(args.output or f"launch/{opts.run_id}")
    print(f"# {layout.world_size} ranks on {len(layout.nodes)} nodes; rendezvous at {opts.master_addr}:"
          f"{opts.master_port} (global rank 0 on {layout.nodes[0].name})")
    if layout.uniform:
        print("# torchrun, one line per node:")
        for node, line in torchrun_lines(layout, opts):
            print(f"# on {node.name}:\n{line}")
    else:
        print("# nodes run different process counts: use the per-node scripts")
    if args.dry_run:
        for name, text in scripts.items():
            print(f"\n# ---- {out / (name + '.sh')} ----\n{text}", end="")
        return 0
    paths = {name: inside(out, f"{name}.sh") for name in scripts}
    with writing("-o", out, folder=True):
        out.mkdir(parents=True, exist_ok=True)
        for name, text in scripts.items():
            paths[name].write_text(text)
            paths[name].chmod(0o755)
    print(f"# per-node scripts written to {out}/; on each node run:")
    for name in scripts:
        print(f"bash {word(str(paths[name]))}    # on {name}")
    return 0


def sm_shares(items: list[str], plan) -> dict[int, dict[str, str]]:  # type: ignore[no-untyped-def]
    """``--sm-percent NODE=PCT`` -> the MPS share of every rank on plan node NODE."""
    from hexiscale.launch.elastic_cli import parse_sm_percent

    nodes = [dev.partition(":")[0] for dev in plan.devices]
    out: dict[int, dict[str, str]] = {}
    for i, (node, value) in enumerate(parse_sm_percent(items)):
        if node not in nodes:
            raise SpecError(f"--sm-percent[{i}]", f"node {node!r} holds no device of the plan",
                            f"use one of: {', '.join(dict.fromkeys(nodes))}")
        for rank, n in enumerate(nodes):
            if n == node:
                out[rank] = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": f"{value:g}"}
    return out


def _run_local(args: argparse.Namespace, plan, run_id: str) -> int:  # type: ignore[no-untyped-def]
    from hexiscale.launch.elastic_cli import refuse_sm_share_on_cpu
    from hexiscale.launch.local import rank_commands, run_local

    world_size = plan.world_size
    per_rank = sm_shares(args.sm_percent, plan)
    device = args.device
    if device == "auto":
        from executor.model.devices import cuda_device_count

        device = "cuda" if cuda_device_count() >= world_size else "cpu"
    refuse_sm_share_on_cpu(args.sm_percent, device)
    train_args = list(args.train_args) + (["--cluster", os.path.abspath(args.cluster)] if args.cluster else [])
    if args.dry_run:
        print(f"# {world_size} ranks on this machine ({device}); the launcher picks MASTER_PORT when it runs")
        for line in rank_commands(args.plan, world_size, train_args, device=device, rank_env=per_rank):
            print(line)
        return 0
    return run_local(args.plan, world_size, train_args, device=device, grace_s=args.grace,
                     log_dir=None, run_id=run_id, extra_env=dict(_env(args)), rank_env=per_rank)
