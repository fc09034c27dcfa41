"""Launch command lines and scripts for a layout (pure text generation; golden-tested).

Three forms, all running ``python -m hexiscale train --plan PLAN [train args]`` once per plan rank:

* **torchrun lines** (every node runs the same number of processes): one line per node with
  ``--nnodes``, ``--nproc-per-node``, ``--node-rank`` and a c10d rendezvous at the master address.
  torchrun numbers nodes in rendezvous order, not plan order, so each line also sets
  ``HEXISCALE_NODE_RANKS`` (the node's plan ranks by local rank) and ``CUDA_VISIBLE_DEVICES`` (their
  GPUs in the same order); the trainer takes its global rank from those (``executor.job.env``).
* **per-node scripts** (any layout, needed when nodes run different process counts): a bash
  script per node that starts one process per local plan rank with ``RANK``, ``WORLD_SIZE``,
  ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` and ``CUDA_VISIBLE_DEVICES``, logs each rank to a
  file, and supervises only the processes it started (no ``pkill``): when one fails, the others
  get ``grace`` seconds to exit on their own (the trainers' heartbeat tells them), then SIGTERM.
* **an sbatch script**: the same per node, dispatched by ``$SLURMD_NODENAME`` (when the cluster
  file's node names are the hosts' names) or else by ``$SLURM_NODEID`` (node k of the allocation runs
  the plan's node k).

Network options (``NCCL_SOCKET_IFNAME``, ``GLOO_SOCKET_IFNAME``, ``NCCL_IB_HCA``, any ``--env
KEY=VALUE``) are exported as given; nothing names a device or interface on its own.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from hexiscale.launch.layout import LaunchLayout, NodeLaunch
from hexiscale.launch.shell import comment, default_var, master_host, printable, sbatch_value, word, words
from planner.errors import SpecError
from planner.names import check_name

# The rank entry: ``python -m hexiscale train`` (torchrun passes the words after its -m through).
TRAIN_ENTRY = ("-m", "hexiscale", "train")


@dataclass(frozen=True)
class LaunchOptions:
    plan_path: str
    master_addr: str
    master_port: int = 29500
    train_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    run_id: str = "hexiscale"
    python: str = sys.executable  # absolute: the interpreter that generated the scripts has hexiscale
    torchrun: str = ""  # empty: ``PYTHON -m torch.distributed.run`` (the torchrun of that interpreter)
    log_dir: str = "logs"
    grace_s: int = 30

    def __post_init__(self) -> None:
        """Everything that is pasted into scripts is checked here (see :mod:`hexiscale.launch.shell`)."""
        for flag, value in (("plan", self.plan_path), ("--master", self.master_addr), ("--python", self.python),
                            ("torchrun", self.torchrun), ("--log-dir", self.log_dir)):
            printable(value, flag)
        for i, arg in enumerate(self.train_args):
            printable(arg, f"train arguments[{i}]")
        for key, value in self.env:
            if not key.isidentifier():
                raise SpecError("--env", f"{key!r} is not a variable name", "write --env KEY=VALUE")
            printable(value, f"--env {key}")
        master_host(self.master_addr)
        check_name(self.run_id, "--run-id", "run id")
        if not 0 < self.master_port < 65536:
            raise SpecError("--master", f"port {self.master_port} is not in 1..65535", "write ADDR:PORT")
        if self.grace_s < 0:
            raise SpecError("--grace", f"must be >= 0 seconds, got {self.grace_s}", "pass e.g. --grace 30")

    def train_argv(self) -> list[str]:
        return ["--plan", self.plan_path, *self.train_args]

    def torchrun_argv(self) -> list[str]:
        return [self.torchrun] if self.torchrun else [self.python, "-m", "torch.distributed.run"]


def import_check(opts: LaunchOptions) -> str:
    """A bash condition that is true when ``--python`` can import hexiscale on this node, else says
    which flag fixes it (on stderr) and is false."""
    py = word(opts.python)
    env = f"{_assign(list(opts.env))} " if opts.env else ""  # a user's --env PYTHONPATH=... counts
    return (f"{env}{py} -c 'import hexiscale' >/dev/null 2>&1 || {{ echo 'hexiscale launch: '{py}' cannot import "
            "hexiscale on '\"$(hostname)\"' (hint: pass --python PATH, an interpreter with hexiscale installed on "
            "every node, or --env PYTHONPATH=REPO to hexiscale launch)' >&2; false; }")


def _assign(items: list[tuple[str, str]]) -> str:
    return " ".join(f"{k}={word(v)}" for k, v in items)


def node_env(layout: LaunchLayout, node: NodeLaunch, opts: LaunchOptions) -> list[tuple[str, str]]:
    """Environment every process of ``node`` shares (user env last, so it may override)."""
    return [("CUDA_VISIBLE_DEVICES", node.visible_devices), ("HEXISCALE_NODE", node.name),
            ("HEXISCALE_NODE_RANKS", node.rank_list), ("HEXISCALE_RUN_ID", opts.run_id), *opts.env]


def torchrun_argv(layout: LaunchLayout, node: NodeLaunch, opts: LaunchOptions) -> list[str]:
    return [*opts.torchrun_argv(), "--nnodes", str(len(layout.nodes)), "--nproc-per-node", str(node.nproc),
            "--node-rank", str(node.node_rank), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"{opts.master_addr}:{opts.master_port}",
            "--rdzv-id", opts.run_id, "--max-restarts", "0", *TRAIN_ENTRY, *opts.train_argv()]


def torchrun_lines(layout: LaunchLayout, opts: LaunchOptions) -> list[tuple[NodeLaunch, str]]:
    """One shell line per node (only for layouts where every node runs as many processes)."""
    if not layout.uniform:
        raise ValueError("torchrun lines need the same process count on every node; use node scripts")
    return [(n, f"{import_check(opts)} && {_assign(node_env(layout, n, opts))} {words(torchrun_argv(layout, n, opts))}")
            for n in layout.nodes]


def _node_body(layout: LaunchLayout, node: NodeLaunch, opts: LaunchOptions, indent: str = "") -> list[str]:
    """Bash that starts and supervises ``node``'s processes (expects MASTER_ADDR/PORT exported)."""
    train = words([opts.python, *TRAIN_ENTRY, *opts.train_argv()])
    lines = [
        comment(f"# node {node.name} (node {node.node_rank} of {len(layout.nodes)}): global ranks "
                f"{node.rank_list} of {layout.world_size}"),
        f"export WORLD_SIZE={layout.world_size} LOCAL_WORLD_SIZE={node.nproc}",
        *[f"export {k}={word(v)}" for k, v in node_env(layout, node, opts)],
        *default_var("LOG_DIR", "HEXISCALE_LOG_DIR", f"{opts.log_dir}/{opts.run_id}"),
        f"{import_check(opts)} || exit 1",
        'mkdir -p "$LOG_DIR"',
        f"TRAIN=({train})",
        "pids=(); ranks=()",
        "start_rank() {  # global rank, local rank",
        '  RANK=$1 LOCAL_RANK=$2 "${TRAIN[@]}" >"$LOG_DIR/rank-$1.log" 2>&1 &',
        "  pids+=($!); ranks+=($1)",
        '  echo "started rank $1 (local rank $2, pid $!) on $(hostname)"',
        "}",
        'stop_ranks() { for p in "${pids[@]}"; do kill -"$1" "$p" 2>/dev/null; done; }',
        "trap 'stop_ranks TERM; exit 130' INT TERM",
        *[f"start_rank {s.rank} {i}" for i, s in enumerate(node.slots)],
        "# Wait for every rank. After the first failure the others get GRACE_S seconds to exit on",
        "# their own (the heartbeat tells them which rank failed), then this node's remaining ones",
        "# are stopped: only the processes started above, by pid.",
        f"GRACE_S={opts.grace_s}; status=0; failed_at=-1; declare -A ended=()",
        "while :; do",
        "  alive=0",
        '  for i in "${!pids[@]}"; do',
        '    p=${pids[$i]}; [ -n "${ended[$p]:-}" ] && continue',
        '    if kill -0 "$p" 2>/dev/null; then alive=$((alive + 1)); continue; fi',
        '    wait "$p"; rc=$?; ended[$p]=1',
        '    if [ "$rc" -ne 0 ]; then',
        '      echo "rank ${ranks[$i]} on $(hostname) exited with code $rc (log: $LOG_DIR/rank-${ranks[$i]}.log)" >&2',
        '      if [ "$status" -eq 0 ]; then status=$rc; failed_at=$SECONDS; fi',
        "    fi",
        "  done",
        '  [ "$alive" -eq 0 ] && break',
        '  if [ "$failed_at" -ge 0 ] && [ $((SECONDS - failed_at)) -ge "$GRACE_S" ]; then',
        '    echo "stopping the remaining ranks on $(hostname)" >&2; stop_ranks TERM; sleep 5; stop_ranks KILL',
        "    failed_at=$((SECONDS + 3600))",
        "  fi",
        "  sleep 1",
        "done",
        'exit "$status"',
    ]
    return [indent + ln if ln else ln for ln in lines]


def node_script(layout: LaunchLayout, node: NodeLaunch, opts: LaunchOptions) -> str:
    """A self-contained bash script to run on ``node``."""
    node0 = layout.nodes[0].name
    head = [
        "#!/usr/bin/env bash",
        comment(f"# HexiScale launch script for node {node.name}; generated by `hexiscale launch`. Start "
                "every node's"),
        comment(f"# script (any order); the job waits for all {layout.world_size} ranks at the master "
                f"(global rank 0 runs on {node0})."),
        "set -u",
        *default_var("MASTER_ADDR", "HEXISCALE_MASTER_ADDR", opts.master_addr, export=True),
        *default_var("MASTER_PORT", "HEXISCALE_MASTER_PORT", str(opts.master_port), export=True),
    ]
    return "\n".join(head + _node_body(layout, node, opts)) + "\n"


def slurm_script(layout: LaunchLayout, opts: LaunchOptions) -> str:
    """An sbatch script running every node's processes (one srun task per node)."""
    n = len(layout.nodes)
    log_dir = sbatch_value(opts.log_dir, "--log-dir")
    head = ["#!/usr/bin/env bash", f"#SBATCH --job-name={opts.run_id}", f"#SBATCH --nodes={n}",
            "#SBATCH --ntasks-per-node=1", "#SBATCH --exclusive", f"#SBATCH --output={log_dir}/%x-%j.out"]
    if layout.uniform:
        head.append(f"#SBATCH --gpus-per-node={layout.nodes[0].nproc}")
    else:
        head.append("# Nodes run different GPU counts: request them with --nodelist or site constraints.")
    names = ",".join(nd.name for nd in layout.nodes)
    head += [comment(f"# Plan nodes in order: {names}. A host named like a plan node runs that node's ranks;"),
             "# otherwise node k of the allocation runs the plan's node k.",
             "set -u", f"mkdir -p {word(opts.log_dir)}",
             'HOSTS=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))',
             'export MASTER_ADDR="${HEXISCALE_MASTER_ADDR:-${HOSTS[0]}}"',
             f'export MASTER_PORT="${{HEXISCALE_MASTER_PORT:-{opts.master_port}}}"',
             "read -r -d '' NODE_TASK <<'HEXISCALE_NODE_TASK'",
             "set -u",
             f"{import_check(opts)} || exit 1",
             'case "${SLURMD_NODENAME:-}" in']
    body: list[str] = []
    for nd in layout.nodes:
        body.append(f"  {word(nd.name)}) NODE={nd.node_rank} ;;")
    body += ['  *) NODE="$SLURM_NODEID" ;;', "esac", 'case "$NODE" in']
    for nd in layout.nodes:
        body.append(f"  {nd.node_rank})")
        if layout.uniform:
            # every word quoted, except the endpoint, which bash expands from the variables above
            args = [word(a) for a in torchrun_argv(layout, nd, opts)]
            args[args.index("--rdzv-endpoint") + 1] = '"$MASTER_ADDR:$MASTER_PORT"'
            argv = " ".join(args)
            body.append(f"    {_assign(node_env(layout, nd, opts))} exec {argv}")
        else:
            body += _node_body(layout, nd, opts, indent="    ")
        body.append("    ;;")
    body += ['  *) echo "no plan node for slurm node $NODE" >&2; exit 1 ;;', "esac", "HEXISCALE_NODE_TASK",
             f'srun --nodes={n} --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c "$NODE_TASK"']
    return "\n".join(head + body) + "\n"
