"""Local rank processes: a free TCP port, and N fresh processes that each run ``target(rank, *args)``.

The one spawner of the project: the profiler's link sweep, the GPU benchmarks and the test pool
(``tests/support/dist_testing.py``) start their ranks here. (``hexiscale launch --local`` is not a
user of it: it starts whole ``hexiscale train`` commands, each with its own launcher environment.)
Processes start through ``spawn`` by default (a fresh interpreter: safe with CUDA), or any
``multiprocessing`` context given. :func:`spawn` waits for every rank and stops the others as soon
as one fails, so that ranks left blocked in a collective never hang the caller.
"""

from __future__ import annotations

import multiprocessing as mp
import socket
import time
from collections.abc import Callable, Sequence
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any

from executor.model import allocator


class RanksFailed(RuntimeError):
    """Some ranks exited with an error or were stopped; ``codes`` has each rank's exit code (None:
    still running at the deadline, or when another rank failed, and then stopped)."""

    def __init__(self, message: str, codes: list[int | None]):
        super().__init__(message)
        self.codes = codes


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port the OS reports free now (another process may take it before it is bound again:
    prefer a ``TCPStore`` on port 0 where the parent can host the store)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def start_processes(target: Callable[..., Any], nprocs: int, args: Sequence[Any] = (), *,
                    context: BaseContext | str = "spawn", daemon: bool = False) -> list[BaseProcess]:
    """Start ``target(rank, *args)`` for rank 0..nprocs-1 and return the processes (not joined). They
    inherit the executor's CUDA allocator setting (:mod:`executor.model.allocator`)."""
    allocator.use_default()
    ctx = mp.get_context(context) if isinstance(context, str) else context
    procs = [ctx.Process(target=target, args=(rank, *args), daemon=daemon) for rank in range(nprocs)]  # type: ignore[attr-defined]
    for p in procs:
        p.start()
    return procs


def stop_processes(procs: Sequence[BaseProcess], grace_s: float = 5.0) -> None:
    """Terminate the processes still running (SIGTERM, then SIGKILL after ``grace_s``) and reap them."""
    for p in procs:
        if p.pid is not None and p.is_alive():
            p.terminate()
    for p in procs:
        if p.pid is not None:
            p.join(grace_s)
            if p.is_alive():
                p.kill()
                p.join()


def join_processes(procs: Sequence[BaseProcess], timeout: float | None = None,
                   fail_fast: bool = True) -> list[int | None]:
    """Wait for every process; with ``fail_fast``, stop the rest once one exits non-zero. Processes
    still running then, or after ``timeout`` seconds, are stopped; their code is ``None``."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while any(p.is_alive() for p in procs):
        if fail_fast and any(p.exitcode not in (None, 0) for p in procs):
            break
        if deadline is not None and time.monotonic() > deadline:
            break
        for p in procs:
            if p.is_alive():
                p.join(0.05)
                break
    codes: list[int | None] = [None if p.is_alive() else p.exitcode for p in procs]
    stop_processes(procs)
    return codes


def spawn(target: Callable[..., Any], nprocs: int, args: Sequence[Any] = (), *, timeout: float | None = None,
          context: BaseContext | str = "spawn", check: bool = True) -> list[int | None]:
    """Run ``target(rank, *args)`` on ``nprocs`` fresh processes and wait; the exit codes by rank.
    With ``check``, any code other than 0 raises :class:`RanksFailed` (the child's traceback is on
    its stderr)."""
    codes = join_processes(start_processes(target, nprocs, args, context=context), timeout)
    if check and any(c != 0 for c in codes):
        bad = {r: c for r, c in enumerate(codes) if c != 0}
        raise RanksFailed(f"{getattr(target, '__name__', target)}: ranks {sorted(bad)} failed or were stopped "
                          f"(exit codes {bad}; None: stopped)", codes)
    return codes
