"""This process's place in the job, from the environment the launchers set.

Read: ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` (torchrun, the
per-node scripts, ``--local`` and Slurm all set them), plus HexiScale's own:

* ``HEXISCALE_NODE_RANKS`` — the plan ranks of this node's processes by local rank. When set, the
  global rank is ``NODE_RANKS[LOCAL_RANK]`` whatever ``RANK`` says: torchrun's c10d rendezvous
  numbers nodes in join order, so this is how plan rank order survives it.
* ``HEXISCALE_NODE`` — the cluster node's name (for messages).
* ``HEXISCALE_STORE_HOSTED=1`` — someone else (the ``--local`` supervisor) hosts the TCPStore at
  ``MASTER_ADDR:MASTER_PORT``; torchrun says the same with ``TORCHELASTIC_USE_AGENT_STORE=True``.
  Otherwise global rank 0 hosts it.

The store carries the pre-flight verdicts and the heartbeats; the process group is built on a
prefix of it, so rank numbering is ours, not the launcher's.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from planner.errors import SpecError


@dataclass(frozen=True)
class RankEnv:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    host: str
    node: str
    store_hosted: bool  # True: connect to an existing store; False: rank 0 hosts it
    prefix: str  # namespace of this run's keys in the store

    @property
    def where(self) -> str:
        """``rank 3 (host gpu7, node r4090-1)`` for messages."""
        node = f", node {self.node}" if self.node and self.node != self.host else ""
        return f"rank {self.rank} (host {self.host}{node})"


def _int(environ: Mapping[str, str], key: str, default: int | None = None) -> int:
    raw = environ.get(key)
    if raw is None:
        if default is None:
            raise SpecError(key, "is not set", "run under torchrun or 'hexiscale launch' (or set RANK, "
                            "WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)")
        return default
    try:
        return int(raw)
    except ValueError:
        raise SpecError(key, f"{raw!r} is not an integer", "fix the launcher environment") from None


def rank_env(environ: Mapping[str, str] | None = None) -> RankEnv:
    """Parse the launcher environment (a single process with none of it is rank 0 of 1)."""
    env = os.environ if environ is None else environ
    world = _int(env, "WORLD_SIZE", 1)
    rank = _int(env, "RANK", 0)
    local = _int(env, "LOCAL_RANK", 0)
    node_ranks = env.get("HEXISCALE_NODE_RANKS")
    if node_ranks:
        try:
            ranks = [int(r) for r in node_ranks.split(",")]
        except ValueError:
            raise SpecError("HEXISCALE_NODE_RANKS", f"{node_ranks!r} is not a list of ranks",
                            "regenerate the launch command") from None
        if not 0 <= local < len(ranks):
            raise SpecError("LOCAL_RANK", f"{local} but HEXISCALE_NODE_RANKS lists {len(ranks)} ranks",
                            "--nproc-per-node must match the node's plan devices")
        rank = ranks[local]
    if not 0 <= rank < world:
        raise SpecError("RANK", f"{rank} is not in [0, WORLD_SIZE={world})", "fix the launcher environment")
    restart = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    hosted = env.get("HEXISCALE_STORE_HOSTED") == "1" or env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    host = socket.gethostname()
    return RankEnv(rank=rank, world_size=world, local_rank=local,
                   master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
                   # a lone process with no launcher picks a free port (0) for its own store
                   master_port=_int(env, "MASTER_PORT", 0 if world == 1 else 29500),
                   host=host, node=env.get("HEXISCALE_NODE", host), store_hosted=hosted,
                   prefix=f"hexiscale/{env.get('HEXISCALE_RUN_ID', 'run')}/{restart}")


def connect_store(renv: RankEnv, timeout_s: float, *, host: bool | None = None) -> Any:
    """A TCPStore client (or, for rank 0 when nobody else hosts it, the server) within ``timeout_s``
    (``--startup-timeout``) of wall time, whatever holds the port; a failure is a ``SpecError``
    naming the address (wrong MASTER_ADDR, port taken, master not started).

    c10d bounds its constructor only while nothing accepts on the port (and then by about twice
    the timeout, through its retries). A holder that accepts the connection and never answers the
    store protocol (another program on MASTER_PORT, a frozen master) blocks the constructor's first
    handshake for good: measured over 400 s with ``timeout=3 s`` on torch 2.13 (CPU) and over
    280 s on torch 2.11 (CUDA). So the store is made on a daemon thread, which releases the GIL
    while it waits in c10d, and this call waits for it at most ``timeout_s``; a thread that
    overruns is left behind (a daemon never holds the process at exit)."""
    from torch.distributed import TCPStore

    is_master = (renv.rank == 0 and not renv.store_hosted) if host is None else host
    where = f"{renv.master_addr}:{renv.master_port}"

    def connect() -> Any:
        if is_master and is_loopback(renv.master_addr):
            return serve_store(renv.master_addr, renv.master_port, timeout_s)
        if not is_master:
            await_listener(renv.master_addr, renv.master_port, time.monotonic() + max(0.0, timeout_s - 0.25))
        return TCPStore(renv.master_addr, renv.master_port, world_size=None, is_master=is_master,
                        timeout=timedelta(seconds=timeout_s), wait_for_workers=False)

    box: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            box["store"] = connect()
        except Exception as exc:  # noqa: BLE001 - handed to the caller below
            box["error"] = exc
        done.set()

    threading.Thread(target=run, name="hexiscale-store-connect", daemon=True).start()
    if not done.wait(timeout_s):
        raise SpecError("--startup-timeout", f"could not reach the job's store at {where} within "
                        f"{timeout_s:g} s (the port may be held by another program, or the store's "
                        "host is frozen)", "check MASTER_ADDR/MASTER_PORT (--master) or raise "
                        "--startup-timeout")
    if "error" in box:  # DistNetworkError / RuntimeError / OSError from c10d or the bind
        exc = box["error"]
        what = "serve" if is_master else "reach"
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise SpecError("MASTER_ADDR", f"cannot {what} the rendezvous store at {where} ({first})",
                        "check --master / MASTER_ADDR and MASTER_PORT, that the port is free on the "
                        "master and that rank 0's node was started")
    return box["store"]


def await_listener(addr: str, port: int, deadline: float) -> None:
    """Return once something accepts TCP connections at ``addr:port``; ``ConnectionError`` at
    ``deadline`` (``time.monotonic()``). c10d's own retries print a C++ stack trace per attempt to
    stderr, so a client waits here, in Python, until the store's port is open."""
    while True:
        try:
            with socket.create_connection((addr, port), timeout=max(0.05, min(1.0, deadline - time.monotonic()))):
                return
        except OSError as exc:
            if time.monotonic() + 0.1 >= deadline:
                raise ConnectionError(f"nothing accepts connections there ({exc.strerror or exc})") from None
            time.sleep(0.1)


def is_loopback(addr: str) -> bool:
    return addr == "localhost" or addr.startswith("127.") or addr == "::1"


def serve_store(addr: str, port: int, timeout_s: float = 300.0) -> Any:
    """A TCPStore server listening on ``addr`` only. c10d binds every interface when it opens the
    port itself, so a job meant for this machine (``--local``, a lone process) would accept
    connections from the network; here the socket is bound first and handed over."""
    from torch.distributed import TCPStore

    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1" if addr == "localhost" else addr, port))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    fd = sock.detach()  # the store owns the listening socket from here on
    return TCPStore(addr, port or _port_of(fd), world_size=None, is_master=True,
                    timeout=timedelta(seconds=timeout_s), wait_for_workers=False, master_listen_fd=fd)


def _port_of(fd: int) -> int:
    with socket.socket(fileno=os.dup(fd)) as probe:
        return int(probe.getsockname()[1])
