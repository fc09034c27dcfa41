"""What a rank's unfinished collectives are, from torch.distributed's flight recorder.

Every process group records its operations (kind, group, sequence number, state) in a ring buffer
of ``TORCH_FR_BUFFER_SIZE`` entries (:func:`enable` turns it on before the process group exists).
:func:`pending` reads the entries not yet completed, so the watchdog can tell a rank whose GPU waits
in a collective from one whose GPU computes — on NCCL the host shows no difference.
"""

from __future__ import annotations

import json
import os
from typing import Any

BUFFER_ENTRIES = "2000"


def enable() -> None:
    """Turn the flight recorder on for process groups created after this call (unless the user
    chose a size)."""
    if "TORCH_NCCL_TRACE_BUFFER_SIZE" not in os.environ:
        os.environ.setdefault("TORCH_FR_BUFFER_SIZE", BUFFER_ENTRIES)


def _dumps() -> list[dict[str, Any]]:
    """Every recorder's active entries: NCCL keeps its own (CUDA-event) recorder next to the
    generic one other backends use, so both are read."""
    try:
        import torch._C._distributed_c10d as c10d
    except ImportError:
        return []
    out = []
    for name in ("_dump_nccl_trace_json", "_dump_fr_trace_json"):
        fn = getattr(c10d, name, None)
        if fn is None:
            continue
        try:
            out.append(json.loads(fn(True, True)))  # collectives included, only the active ones
        except Exception:  # noqa: BLE001 - no recorder for this backend/build
            continue
    return out


def describe(entry: dict[str, Any], ranks_of: dict[str, str]) -> str:
    """``nccl:all_reduce[0,3]#12`` (no spaces: it travels in a heartbeat)."""
    name = entry.get("process_group", ["?"])[0]
    ranks = ranks_of.get(name, "?").replace(" ", "")
    seq = entry.get("p2p_seq_id") if entry.get("is_p2p") else entry.get("collective_seq_id")
    op = str(entry.get("profiling_name", "?")).replace(" ", "")
    return f"{op}{ranks}#{seq}"


def _group_ranks() -> dict[str, str]:
    """Process-group name -> ``[r0, r1, ...]`` from torch.distributed's own registry."""
    try:
        import torch.distributed as dist

        names = dist.distributed_c10d._world.pg_names
        return {name: str(dist.get_process_group_ranks(pg)) for pg, name in names.items()}
    except Exception:  # noqa: BLE001 - not initialised, or the private registry changed
        return {}


def pending(traces: list[dict[str, Any]] | None = None) -> list[str] | None:
    """Descriptions of this process's unfinished operations, oldest first (None: no recorder).

    From the recorded entries not yet completed; where a recorder keeps no entries (buffer size
    0), from each group's counters (``pg_status``: enqueued beyond completed)."""
    traces = _dumps() if traces is None else traces
    if not traces:
        return None
    ranks_of = _group_ranks()
    active: list[dict[str, Any]] = []
    behind: list[str] = []
    for trace in traces:
        ranks_of.update({name: cfg["ranks"] for name, cfg in trace.get("pg_config", {}).items()
                         if name and "ranks" in cfg})
        active += [e for e in trace.get("entries", []) if e.get("state") != "completed" and not e.get("retired")]
        for name, st in trace.get("pg_status", {}).items():
            done, queued = int(st.get("last_completed_collective", -1)), int(st.get("last_enqueued_collective", -1))
            if queued > done:
                behind.append(f"collective{ranks_of.get(name, '?').replace(' ', '')}#{done + 1}")
    active.sort(key=lambda e: e.get("time_created_ns", 0))
    return [describe(e, ranks_of) for e in active] or behind
