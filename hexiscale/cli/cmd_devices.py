"""``hexiscale devices``: the device catalog."""

from __future__ import annotations

import argparse

from rich.table import Table

from hexiscale.cli.output import console
from planner.catalog import default_catalog


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("devices", help="list the GPU types of the device catalog")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    table = Table(title="device catalog (planner/profiles/devices)", title_justify="left")
    for col in ("key", "name", "memory GiB", "bf16", "fp16", "mem GB/s", "figures"):
        table.add_column(col)
    for e in default_catalog().entries:
        table.add_row(e.key, e.name, f"{e.memory_gib:g}", f"{e.peak_tflops.get('bf16', 0):g}",
                      f"{e.peak_tflops.get('fp16', 0):g}", f"{e.memory_bandwidth_GBps:g}", e.derived)
    console.print(table)
    return 0
