"""Run a function on N gloo ranks in fresh processes (for tests and small CPU experiments).

``run_distributed(fn, n, *args)`` starts ``n`` processes, initialises a gloo process group in each
(a ``TCPStore`` created by the parent on a free port the OS picks — no port races under xdist),
calls ``fn(*args, **kwargs)`` on every rank and returns the per-rank results in rank order. If a rank
raises, the child's traceback is re-raised in the parent as :class:`DistributedError`; a job that
runs past ``timeout`` seconds (e.g. a deadlock) raises ``TimeoutError``. Children use one thread.

``DistPool`` keeps the ranks alive across several jobs (process start-up is the main cost on a
small machine): ``with DistPool(8) as pool: pool.run(fn, ...)``. After a failure or timeout the
pool is torn down and restarted on the next ``run``. ``fn`` must be importable (module-level) and
finds its rank with ``torch.distributed.get_rank()``; results travel back serialised with
``torch.save`` (tensors included). ``backend="nccl"`` gives rank ``r`` accelerator ``r`` (for GPU
checks on a multi-GPU machine; never used on the CPU path). Processes start through
``forkserver`` (torch and the modules named in ``preload`` imported once, then forked per rank)
where the platform has it, else ``spawn``; they are started and stopped by :mod:`executor.job.spawn`.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import queue
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from executor.job.spawn import start_processes, stop_processes


class DistributedError(RuntimeError):
    """A rank raised; the message holds the child's traceback."""


def _dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _loads(data: bytes) -> Any:
    return torch.load(io.BytesIO(data), weights_only=False)


def _worker(rank: int, world: int, port: int, backend: str, all_tasks: list[Any], results: Any,
            timeout_s: float) -> None:
    tasks = all_tasks[rank]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    try:
        device = None
        if backend == "nccl":  # one accelerator per rank, bound to the group (eager NCCL set-up)
            device = torch.device("cuda", rank % torch.cuda.device_count())
            torch.cuda.set_device(device)
        store = dist.TCPStore("127.0.0.1", port, world + 1, False, timeout=timedelta(seconds=120))
        dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s), device_id=device)
    except Exception:  # noqa: BLE001 - reported to the parent
        results.put((rank, False, traceback.format_exc().encode()))
        return
    while True:
        item = tasks.get()
        if item is None:
            break
        fn, args, kwargs = item
        try:
            res = fn(*args, **kwargs)
            results.put((rank, True, _dumps(res)))
        except BaseException:  # noqa: BLE001 - reported to the parent
            results.put((rank, False, traceback.format_exc().encode()))
    dist.destroy_process_group()


def _context(preload: tuple[str, ...]) -> Any:
    """A fresh-interpreter start method: ``forkserver`` where available (torch and ``preload`` are
    imported once in the server, each worker is a cheap fork of it), else ``spawn``."""
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo", *preload])
        return ctx
    return mp.get_context("spawn")


class DistPool:
    """``world_size`` gloo ranks kept alive between jobs."""

    def __init__(self, world_size: int, *, timeout: float = 300.0, preload: tuple[str, ...] = (),
                 backend: str = "gloo", pg_timeout: float = 600.0):
        self.world_size = world_size
        self.pg_timeout = pg_timeout  # the process group's own collective timeout (NCCL aborts after it)
        self.backend = backend
        self.timeout = timeout
        self.preload = preload
        self._procs: list[Any] = []
        self._tasks: list[Any] = []
        self._results: Any = None
        self._store: Any = None

    def _start(self) -> None:
        ctx = _context(self.preload)
        self._store = dist.TCPStore("127.0.0.1", 0, self.world_size + 1, True, timeout=timedelta(seconds=120),
                                    wait_for_workers=False)
        self._results = ctx.Queue()
        self._tasks = [ctx.Queue() for _ in range(self.world_size)]
        self._procs = start_processes(_worker, self.world_size, (self.world_size, self._store.port, self.backend,
                                                                 self._tasks, self._results, self.pg_timeout),
                                      context=ctx, daemon=True)

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        """``fn(*args, **kwargs)`` on every rank; the results in rank order."""
        if not self._procs:
            self._start()
        for q in self._tasks:
            q.put((fn, args, kwargs))
        out: dict[int, Any] = {}
        deadline = time.monotonic() + self.timeout
        while len(out) < self.world_size:
            try:
                rank, ok, payload = self._results.get(timeout=1.0)
            except queue.Empty:
                dead = [i for i, p in enumerate(self._procs) if not p.is_alive()]
                if dead:
                    codes = [self._procs[i].exitcode for i in dead]
                    self.close(force=True)
                    raise DistributedError(f"rank(s) {dead} died without a result (exit codes {codes})") from None
                if time.monotonic() > deadline:
                    missing = sorted(set(range(self.world_size)) - set(out))
                    self.close(force=True)
                    raise TimeoutError(f"{getattr(fn, '__name__', fn)} did not finish on ranks {missing} within "
                                       f"{self.timeout:.0f} s (deadlock?)") from None
                continue
            if not ok:
                self.close(force=True)
                raise DistributedError(f"rank {rank} failed:\n{payload.decode()}")
            out[rank] = _loads(payload)
        return [out[r] for r in range(self.world_size)]

    def close(self, force: bool = False) -> None:
        """Stop the workers: politely when idle, by terminating them with ``force`` (a failed job
        may leave ranks blocked in a collective)."""
        if not force:
            for q in self._tasks:
                try:
                    q.put(None)
                except (OSError, ValueError):
                    pass
            for p in self._procs:
                if p.pid is not None:
                    p.join(timeout=10)
        stop_processes(self._procs)
        self._procs, self._tasks, self._results, self._store = [], [], None, None

    def __enter__(self) -> DistPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_distributed(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 300.0,
                    preload: tuple[str, ...] = (), backend: str = "gloo", **kwargs: Any) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` once on ``world_size`` fresh ranks; per-rank results."""
    with DistPool(world_size, timeout=timeout, preload=preload, backend=backend) as pool:
        return pool.run(fn, *args, **kwargs)
