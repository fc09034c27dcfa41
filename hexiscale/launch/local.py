"""``hexiscale launch --local``: run every rank of a plan on this machine and supervise them.

The supervisor hosts the job's TCPStore (so the store outlives any rank, rank 0 included), starts
one ``python -m hexiscale train`` per plan rank with the launcher environment (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``, ``HEXISCALE_STORE_HOSTED=1``),
forwards their output, and waits. When a rank fails, the others normally stop by themselves within
the heartbeat bound (:mod:`executor.job.watchdog`); any still running ``grace_s`` seconds later
are terminated (SIGTERM, then SIGKILL) — only the processes it started, by pid.

The job's exit code: 0 if every rank succeeded; 4 if any rank reported out-of-memory; 1 if every
failing rank reported a user error; else 3 (rank failure).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from executor.job.watchdog import EXIT_INTERRUPTED, EXIT_OK, EXIT_OOM, EXIT_RANK_FAILURE, EXIT_USER_ERROR
from hexiscale.launch.fork_spawn import ForkedRank, preload, spawn_mode, train_target
from hexiscale.launch.scripts import TRAIN_ENTRY
from planner.errors import SpecError

RankHandle = subprocess.Popen[bytes] | ForkedRank


@dataclass
class RankProcess:
    rank: int
    proc: RankHandle
    code: int | None = None
    ended_at: float | None = None


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def job_exit_code(codes: Sequence[int]) -> int:
    """The job's code from its ranks' codes (see the module docstring)."""
    bad = [c for c in codes if c != EXIT_OK]
    if not bad:
        return EXIT_OK
    if EXIT_OOM in bad:
        return EXIT_OOM
    if all(c == EXIT_USER_ERROR for c in bad):
        return EXIT_USER_ERROR
    if all(c == EXIT_INTERRUPTED for c in bad):
        return EXIT_INTERRUPTED
    return EXIT_RANK_FAILURE


def _pump(stream: IO[bytes], log: IO[bytes] | None) -> None:
    for line in iter(stream.readline, b""):
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()
        if log is not None:
            log.write(line)
            log.flush()
    stream.close()


def rank_argv(plan_path: str, device: str, train_args: Sequence[str]) -> list[str]:
    """One rank's command: this interpreter running ``hexiscale train``."""
    return [sys.executable, *TRAIN_ENTRY, "--plan", plan_path, "--device", device, *train_args]


def start_rank(cmd: Sequence[str], env: dict[str, str], mode: str) -> RankHandle:
    """Start one rank of ``cmd`` (a :func:`rank_argv`) with ``env``, its output on a pipe:
    exec'd, or for ``mode == "fork"`` forked from this process (:mod:`hexiscale.launch.fork_spawn`)."""
    if mode == "fork":
        preload()
        return ForkedRank(train_target(cmd[1 + TRAIN_ENTRY.index("train"):]), env, args=cmd)  # main(["train", ...])
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def rank_commands(plan_path: str, world_size: int, train_args: Sequence[str], *, device: str = "cpu",
                  rank_env: dict[int, dict[str, str]] | None = None) -> list[str]:
    """The shell line of every rank that :func:`run_local` starts (for ``--dry-run``; the store's port
    is chosen when it runs, so it shows as ``$MASTER_PORT``)."""
    from hexiscale.launch.shell import word, words

    cmd = rank_argv(plan_path, device, train_args)
    out = []
    for r in range(world_size):
        env = {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(world_size), **(rank_env or {}).get(r, {})}
        assign = " ".join(f"{k}={word(v)}" for k, v in env.items())
        out.append(f'{assign} MASTER_ADDR=127.0.0.1 MASTER_PORT="$MASTER_PORT" {words(cmd)}')
    return out


def run_local(plan_path: str, world_size: int, train_args: Sequence[str], *, device: str = "cpu",
              grace_s: float = 30.0, log_dir: str | None = None, run_id: str = "local",
              extra_env: dict[str, str] | None = None, rank_env: dict[int, dict[str, str]] | None = None,
              store_port: int = 0, port_flag: str = "--master_port", store_addr: str = "127.0.0.1") -> int:
    """Start, supervise and reap every rank; return the job's exit code. ``rank_env`` adds
    variables to single ranks (e.g. an MPS SM share); ``store_port`` 0: any free port, else that one
    (the flag ``port_flag`` asked for it); ``store_addr``: one of this machine's addresses (loopback
    unless a flag asked for another, see :mod:`hexiscale.launch.own_address`)."""
    from executor.job.env import serve_store

    mode = spawn_mode(device, {**os.environ, **(extra_env or {})})
    try:  # listens on this machine only (loopback by default): the job never leaves it
        store = serve_store(store_addr, store_port)
    except OSError as exc:
        if not store_port:
            raise
        raise SpecError(port_flag, f"cannot listen on {store_addr}:{store_port}: {exc.strerror or exc}",
                        f"pass another port, or drop {port_flag} to take a free one") from None
    base = dict(os.environ)
    base.update({"WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": store_addr,
                 "MASTER_PORT": str(store.port), "HEXISCALE_STORE_HOSTED": "1", "HEXISCALE_RUN_ID": run_id,
                 "HEXISCALE_NODE": "local", "PYTHONUNBUFFERED": "1"})
    base.pop("HEXISCALE_NODE_RANKS", None)
    if device == "cpu":
        base["CUDA_VISIBLE_DEVICES"] = ""
        base.setdefault("OMP_NUM_THREADS", "1")
    base.update(extra_env or {})
    logs = Path(log_dir) if log_dir else None
    if logs is not None:
        logs.mkdir(parents=True, exist_ok=True)
    print(f"hexiscale launch: {world_size} ranks on this machine ({'GPU, nccl' if device == 'cuda' else 'CPU, gloo'})"
          f", store at {store_addr}:{store.port}", file=sys.stderr, flush=True)
    ranks: list[RankProcess] = []
    pumps: list[threading.Thread] = []
    cmd = rank_argv(plan_path, device, train_args)
    for r in range(world_size):
        env = dict(base, RANK=str(r), LOCAL_RANK=str(r), **(rank_env or {}).get(r, {}))
        proc = start_rank(cmd, env, mode)
        ranks.append(RankProcess(r, proc))
        log = open(logs / f"rank-{r}.log", "wb") if logs is not None else None  # noqa: SIM115
        assert proc.stdout is not None
        t = threading.Thread(target=_pump, args=(proc.stdout, log), daemon=True)
        t.start()
        pumps.append(t)
    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)  # a SIGTERM'd supervisor takes its ranks along
    try:
        first_failure = _supervise(ranks, grace_s)
    except KeyboardInterrupt:
        _terminate(ranks)
        return EXIT_INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, previous)
    for t in pumps:
        t.join(timeout=5)
    codes = [rp.code if rp.code is not None else EXIT_RANK_FAILURE for rp in ranks]
    code = job_exit_code(codes)
    if first_failure is not None:
        print(f"hexiscale launch: rank {first_failure.rank} (local, pid {first_failure.proc.pid}) "
              f"{describe_exit(first_failure.code or 0)} first; job exit code {code}", file=sys.stderr, flush=True)
    return code


def _supervise(ranks: list[RankProcess], grace_s: float) -> RankProcess | None:
    first: RankProcess | None = None
    stopped = False
    while True:
        now = time.monotonic()
        for rp in ranks:
            if rp.code is None and (code := rp.proc.poll()) is not None:
                rp.code, rp.ended_at = code, now
                if code != EXIT_OK and first is None:
                    first = rp
        if all(rp.code is not None for rp in ranks):
            return first
        if first is not None and not stopped and now - (first.ended_at or now) > grace_s:
            print(f"hexiscale launch: ranks still running {grace_s:.0f} s after rank {first.rank} failed; "
                  "stopping them", file=sys.stderr, flush=True)
            _terminate(ranks)
            stopped = True
        time.sleep(0.1)


def _terminate(ranks: list[RankProcess], wait_s: float = 5.0) -> None:
    live = [rp for rp in ranks if rp.proc.poll() is None]
    for rp in live:
        rp.proc.terminate()
    deadline = time.monotonic() + wait_s
    for rp in live:
        try:
            rp.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            rp.proc.kill()
            rp.proc.wait()
        rp.code = rp.proc.returncode
