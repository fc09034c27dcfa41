"""PNG pictures of plans and steps (matplotlib, Agg backend: no display needed).

:mod:`.plan_map` draws where a plan puts its stages (by layer and by device), :mod:`.timeline`
what every stage or rank does during a step; :mod:`.style` holds the shared colours.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from planner.errors import SpecError


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend, or a SpecError saying what to install."""
    try:
        import matplotlib
    except ImportError:
        raise SpecError("--plot", "pictures need the matplotlib package", "pip install 'hexiscale[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def finish(fig: Any, axes: list[Any], legend: dict[str, str], path: str | Path, bottom: float) -> Path:
    """Bare axes (no top/right spines), a legend row of ``{label: colour}`` under the figure, and
    the PNG at ``path`` (folders made as needed); closes the figure."""
    from matplotlib.patches import Patch

    plt = pyplot()
    for ax in axes:
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    handles = [Patch(facecolor=colour, label=label) for label, colour in legend.items()]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 6), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
