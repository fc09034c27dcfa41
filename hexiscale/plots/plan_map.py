"""The plan map: where a plan puts its stages, by layer (top) and by device (bottom).

Top: one row per pipeline along the layer axis; each stage is a box over its layer range, split
into one strip per device of its TP group. Bottom: the cluster's nodes as rows of GPUs, each GPU
in its stage's colour (grey: unused), each TP group framed. Colours: a hue per pipeline, a shade
per stage (:mod:`.style`).
"""

from __future__ import annotations

from pathlib import Path

from hexiscale.plots import finish, pyplot
from hexiscale.plots.style import UNUSED, pipeline_colour, stage_colour
from planner.cluster import ClusterSpec
from planner.plan import Plan

MAX_NODE_ROWS = 48  # more nodes than this: the first ones are drawn, the rest counted
TEXT_CELLS = 32  # GPUs a node row may have and still get a label in every cell


def _node_rows(plan: Plan, cluster: ClusterSpec | None) -> list[tuple[str, str, list[str]]]:
    """(node, GPU type, device ids in local order) for the cluster's nodes, or the plan's."""
    if cluster is not None:
        rows: dict[str, list[str]] = {}
        for d in cluster.devices:
            rows.setdefault(d.node, []).append(d.id)
        return [(n.name, n.gpu, rows.get(n.name, [])) for n in cluster.nodes]
    by_node: dict[str, list[str]] = {}
    for dev in plan.devices:
        by_node.setdefault(dev.rpartition(":")[0] or dev, []).append(dev)
    return [(n, "", sorted(ds, key=lambda d: (len(d), d))) for n, ds in by_node.items()]


def plot_plan_map(plan: Plan, path: str | Path, cluster: ClusterSpec | None = None) -> Path:
    """Write the plan map of ``plan`` (on ``cluster`` when given: unused GPUs and GPU types) to ``path``."""
    plt = pyplot()
    from matplotlib.patches import Rectangle
    from matplotlib.ticker import MaxNLocator

    m = plan.model
    nodes = _node_rows(plan, cluster)
    shown = nodes[:MAX_NODE_ROWS]
    width = max([len(devs) for _, _, devs in shown] + [1])
    n_pipes = len(plan.pipelines)
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(13, 1.6 + 0.75 * n_pipes + 0.42 * len(shown) + 1.4),
        gridspec_kw={"height_ratios": [0.75 * n_pipes + 0.6, 0.42 * len(shown) + 0.6]})

    where: dict[str, tuple[int, int, int]] = {}  # device -> (pipeline, stage, tp rank)
    for pi, pipe in enumerate(plan.pipelines):
        y = n_pipes - 1 - pi
        for si, st in enumerate(pipe.stages):
            for c, (a, b) in enumerate(st.chunks):  # an interleaved stage: one box per layer chunk
                colour = stage_colour(pi, si)
                h = 0.8 / st.tp
                for ti, dev in enumerate(st.devices):
                    where[dev] = (pi, si, ti)
                    top.add_patch(Rectangle((a, y + 0.1 + ti * h), b - a, h, facecolor=colour, edgecolor="white",
                                            lw=0.8))
                    if st.tp <= 8 and (b - a) / m.num_layers > 0.07:
                        top.text(a + 0.15, y + 0.1 + (ti + 0.5) * h, dev, fontsize=6, va="center", color="#222222")
                top.add_patch(Rectangle((a, y + 0.1), b - a, 0.8, fill=False, edgecolor="#333333", lw=1.0))
                extra = (" +emb" if si == 0 and c == 0 else "") + \
                    (" +head" if si == len(pipe.stages) - 1 and c == len(st.chunks) - 1 else "")
                span = f"L{a}" if b - a == 1 else f"L{a}-{b - 1}"
                top.text((a + b) / 2, y + 0.5, f"s{si} TP{st.tp}\n{span}{extra}", ha="center", va="center",
                         fontsize=7 if (b - a) / m.num_layers > 0.1 else 5, fontweight="bold")
    top.set_xlim(0, m.num_layers)
    top.xaxis.set_major_locator(MaxNLocator(integer=True))
    top.set_ylim(0, n_pipes)
    labels = [f"pipeline {pi}\nbatch {p.batch_size}, {p.micro_batches} mb" for pi, p in enumerate(plan.pipelines)]
    top.set_yticks([n_pipes - 1 - pi + 0.5 for pi in range(n_pipes)], labels, fontsize=8)
    top.set_xlabel("layer")
    top.set_title(f"{m.name}: {n_pipes} pipelines, {plan.world_size} devices, global batch {plan.global_batch_size}"
                  f" x seq {m.seq_len} ({plan.options.dtype}, recompute {plan.options.recompute}, "
                  f"ZeRO-{plan.options.zero})", fontsize=10)

    for row, (_, _, devs) in enumerate(shown):
        y = len(shown) - 1 - row
        for x, dev in enumerate(devs):
            pos = where.get(dev)
            colour = UNUSED if pos is None else stage_colour(pos[0], pos[1])
            bottom.add_patch(Rectangle((x + 0.05, y + 0.1), 0.9, 0.8, facecolor=colour, edgecolor="white"))
            if pos is not None and width <= TEXT_CELLS:
                bottom.text(x + 0.5, y + 0.5, f"p{pos[0]} s{pos[1]}\ntp{pos[2]}", ha="center", va="center", fontsize=6)
        for pi, pipe in enumerate(plan.pipelines):  # frame every TP group's run of cells on this node
            for st in pipe.stages:
                xs = [x for x, d in enumerate(devs) if d in st.devices]
                if len(st.devices) > 1 and xs:
                    bottom.add_patch(Rectangle((min(xs) + 0.02, y + 0.06), max(xs) - min(xs) + 0.96, 0.88,
                                               fill=False, edgecolor=pipeline_colour(pi), lw=2.0))
    bottom.set_xlim(0, width)
    bottom.set_ylim(0, max(1, len(shown)))
    bottom.set_yticks([len(shown) - 1 - r + 0.5 for r in range(len(shown))],
                      [f"{n} ({g})" if g else n for n, g, _ in shown], fontsize=7)
    bottom.set_xticks([x + 0.5 for x in range(width)], [str(x) for x in range(width)], fontsize=6)
    bottom.set_xlabel("GPU on node" + (f" (first {MAX_NODE_ROWS} of {len(nodes)} nodes)" if len(nodes) > len(shown)
                                       else "") + "; frames: TP groups; grey: unused")
    legend = {f"pipeline {pi}": pipeline_colour(pi) for pi in range(min(n_pipes, 10))}
    return finish(fig, [top, bottom], {**legend, "unused": UNUSED}, path, 0.04)
