"""``hexiscale elastic leave|join DEVICE... --store ADDR:PORT``: change a running elastic job's devices.

The job (``hexiscale launch PLAN --local --elastic --cluster CLUSTER``) prints its store address
and run id when it starts. The command writes a request into that store
(:mod:`executor.switch.elastic_channel`) and waits for the supervisor's answer: the job re-plans for the
new device set, starts the joining devices, and switches layout in process after the next step;
leaving devices hand their state over and exit. Exit code 0 when the switch is done, 1 when the
supervisor refused the request (its reason is printed), 3 when no answer came in ``--timeout``.
"""

from __future__ import annotations

import argparse
import json
import socket
import time
from datetime import timedelta

from planner.errors import SpecError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("elastic", help="make devices leave or join a running elastic job",
                       description="Ask a running 'hexiscale launch --elastic' job to switch to another device set.")
    p.add_argument("action", choices=("leave", "join"), help="leave: devices hand their state over and exit; "
                   "join: devices start and receive state")
    p.add_argument("devices", nargs="+", help="device ids of the cluster file, e.g. r4090:3")
    p.add_argument("--store", required=True, help="ADDR:PORT the job printed when it started")
    p.add_argument("--run-id", required=True, help="the job's run id (printed with the store)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the switch")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from torch.distributed import TCPStore

    from executor.switch.elastic_channel import request_prefix

    host, sep, port = args.store.rpartition(":")
    if not sep or not port.isdigit():
        raise SpecError("--store", f"{args.store!r} is not ADDR:PORT", "copy it from the job's first lines")
    try:  # a plain connect first: an unreachable store is one line, not c10d's retries and stack traces
        socket.create_connection((host, int(port)), timeout=5).close()
        store = TCPStore(host, int(port), world_size=None, is_master=False, timeout=timedelta(seconds=10),
                         wait_for_workers=False)
    except Exception as exc:  # DistNetworkError / RuntimeError
        raise SpecError("--store", f"cannot reach the job's store at {args.store} ({type(exc).__name__})",
                        "is the job still running? check the address it printed") from None
    prefix = request_prefix(args.run_id)
    n = int(store.add(f"{prefix}/request/count", 1))
    store.set(f"{prefix}/request/{n}", json.dumps({args.action: list(args.devices)}))
    key = f"{prefix}/request/{n}/status"
    deadline = time.monotonic() + args.timeout
    said = ""
    while time.monotonic() < deadline:
        if store.check([key]):
            status = store.get(key).decode()
            if status != said:
                print(status, flush=True)
                said = status
            if status.startswith("ok"):
                return 0
            if status.startswith("error"):
                return 1
        time.sleep(0.2)
    print(f"no answer from the job within {args.timeout:.0f} s (last: {said or 'none'})", flush=True)
    return 3
