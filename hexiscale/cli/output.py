"""Shared terminal output (rich) for the CLI: error lines and plan/cluster tables."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from planner.cluster import ClusterSpec
from planner.plan import Plan, Stage, uses_cp


def _console(stderr: bool = False) -> Console:
    """A console that keeps tables readable when output is piped (no terminal width to ask) and
    prints text as it is: no markup, emoji codes or highlighting are read from strings, so a path
    such as ``runs/[/x]:smile:`` prints literally (styles come from :func:`styled` only)."""
    probe = Console(stderr=stderr)
    return Console(stderr=stderr, width=None if probe.is_terminal else 160, markup=False, emoji=False,
                   highlight=False)


console = _console()
err_console = _console(stderr=True)


def styled(*parts: str | tuple[str, str]) -> Text:
    """Plain strings and ``(text, style)`` pairs as one line; no part is parsed as markup."""
    return Text.assemble(*parts)


def print_error(message: str) -> None:
    err_console.print(styled(("error:", "bold red"), " ", message), soft_wrap=True)


def print_note(message: str) -> None:
    """One ``note: ...`` line on stderr."""
    err_console.print(f"note: {message}", soft_wrap=True)


def print_warning(message: str | None) -> None:
    """One ``warning: ...`` line on stderr (nothing for ``None``)."""
    if message:
        err_console.print(styled(("warning:", "bold yellow"), " ", message), soft_wrap=True)


def layers_label(st: Stage) -> str:
    """``0-3``, or an interleaved stage's chunks ``0-1,4-5`` (inclusive layer indices)."""
    return ",".join(f"{a}-{b - 1}" for a, b in st.chunks)


def _ranges(devices: tuple[str, ...] | list[str]) -> str:
    """Compact device list: a100:0-3 instead of a100:0, a100:1, a100:2, a100:3."""
    parts: list[str] = []
    run: list[tuple[str, int]] = []

    def flush() -> None:
        if run:
            node, first, last = run[0][0], run[0][1], run[-1][1]
            parts.append(f"{node}:{first}" if first == last else f"{node}:{first}-{last}")
            run.clear()

    for dev in devices:
        node, _, idx = dev.rpartition(":")
        if idx.isdigit() and run and run[-1][0] == node and run[-1][1] + 1 == int(idx):
            run.append((node, int(idx)))
            continue
        flush()
        if idx.isdigit():
            run.append((node, int(idx)))
        else:
            parts.append(dev)
    flush()
    return ", ".join(parts)


def plan_table(plan: Plan, cluster: ClusterSpec | None = None) -> Table:
    title = (f"plan: {plan.model.name}, global batch {plan.global_batch_size}, seq {plan.model.seq_len}, "
             f"{plan.world_size} devices, recompute={plan.options.recompute}, zero={plan.options.zero}, "
             f"dtype={plan.options.dtype}" + (", compiled" if plan.options.compile else "")
             + (f", residual {plan.options.residual_dtype}" if plan.options.residual_dtype != "fp32" else ""))
    table = Table(title=title, title_justify="left")
    cp = uses_cp(plan)  # context parallelism: a cp column
    for col in ("pipeline", "stage", "devices", "gpu", "tp", *(("cp",) if cp else ()), "layers", "batch",
                "micro-batches", "schedule"):
        table.add_column(col, justify="right" if col in ("tp", "cp", "batch", "micro-batches") else "left")
    for pi, pipe in enumerate(plan.pipelines):
        for si, st in enumerate(pipe.stages):
            gpu = ""
            if cluster is not None:
                gpu = ",".join(sorted({cluster.device(d).gpu for d in st.devices if cluster.has_device(d)}))
            first = si == 0
            table.add_row(str(pi) if first else "", str(si), _ranges(st.devices), gpu, str(st.tp),
                          *((str(st.cp),) if cp else ()), f"{layers_label(st)} ({st.num_layers})",
                          str(pipe.batch_size) if first else "", str(pipe.micro_batches) if first else "",
                          pipe.schedule if first else "")
        if pi != len(plan.pipelines) - 1:
            table.add_section()
    return table


def cluster_table(cluster: ClusterSpec) -> Table:
    table = Table(title=f"cluster: {cluster.name}, {cluster.num_devices} devices", title_justify="left")
    for col in ("node", "gpu", "gpus", "memory GiB", "bf16 TFLOP/s", "intra-node link"):
        table.add_column(col)
    for n in cluster.nodes:
        dt = cluster.catalog.get(n.gpu)
        peak = dt.peak_tflops.get("bf16", dt.peak_tflops.get("fp16", 0.0))
        lk = n.intra_link
        table.add_row(n.name, n.gpu, str(n.gpus), f"{dt.memory_gib:g}", f"{peak:g}",
                      f"{lk.kind} {lk.bandwidth_GBps:g} GB/s, {lk.latency_us:g} us")
    lk = cluster.inter_node
    table.caption = f"between nodes: {lk.kind} {lk.bandwidth_GBps:g} GB/s, {lk.latency_us:g} us" + (
        f"; groups: {', '.join(g.name for g in cluster.groups)}" if cluster.groups else "")
    return table
