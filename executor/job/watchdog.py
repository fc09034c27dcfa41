"""Failures that never hang: exit codes, a heartbeat through the TCPStore, one verdict per job.

Exit codes of ``hexiscale train`` / ``hexiscale launch`` (**contract**, documented in the README):

    0  success
    1  user error: bad plan, flags, data file or checkpoint (found before training starts)
    2  command-line usage error (argparse)
    3  rank failure: a rank died, hung, or raised; every other rank stops with this code too
    4  out of device memory on some rank (every other rank stops with this code too)
    130 interrupted (Ctrl-C / SIGTERM from the launcher)

How a failure reaches every rank within a bound:

* Every rank runs a :class:`Watchdog` thread with its own store connection. Every ``interval``
  seconds it bumps ``hb/<rank>`` (a counter with the current step) and reads everyone's.
* On NCCL a rank that waits for its peers does so on the GPU: its host runs ahead and blocks in
  the step's one device synchronisation (:mod:`executor.parallel.host_sync`). There the flight recorder
  (:mod:`executor.job.flight`) says whether a collective is unfinished (``comm:<op>[ranks]#seq``:
  waiting for peers) or not (``device``: the GPU computes), so a hang names the stuck rank on NCCL
  as on gloo. The process group's own timeout (``--pg-timeout``) must exceed ``hang_after``, else
  NCCL aborts a *waiting* rank first and the verdict would blame it.
* A rank whose counter has not moved for ``dead_after`` seconds (measured on the observer's own
  monotonic clock, so host clocks need not agree) is declared dead. A job where no rank finished a
  step for ``hang_after`` seconds is declared hung; each heartbeat says where the rank's training
  thread is (``comm``: inside a torch.distributed call or a p2p wait; else the function and line),
  so the verdict blames the rank at the lowest step that is *not* waiting for its peers.
* A rank that raises (or runs out of memory) records why; a communication error (a peer vanished)
  first waits up to ``dead_after + 2 * interval`` for the heartbeat verdict, so the rank that
  really died is named rather than its neighbour.
* The first verdict wins (``compare_set`` on ``abort``); every watchdog sees it within one
  interval, prints ``rank R (host H) failed at step S: why`` and exits with the verdict's code
  (``os._exit``: a rank blocked in a collective cannot be unblocked any other way).
* Losing the store itself (its host died) is a verdict too, naming the host rank; so is a store
  that stops answering (its host froze): every watchdog call is bounded by ``dead_after``
  (:mod:`executor.job.bounded_store`), so the watchdog never blocks on the store it watches.

So a dead rank stops the whole job within ``dead_after + 2 * interval`` seconds, and a hung one
within ``hang_after + interval``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from executor.job import flight
from executor.job.bounded_store import BoundedStore, StoreTimeout
from executor.job.env import RankEnv, connect_store

EXIT_OK = 0
EXIT_USER_ERROR = 1
EXIT_USAGE = 2
EXIT_RANK_FAILURE = 3
EXIT_OOM = 4
EXIT_INTERRUPTED = 130

# Our modules whose time is spent waiting for peers (p2p exchange, gradient reduction, ZeRO gathers).
COMM_MODULES = ("executor/parallel/p2p.py", "executor/parallel/grad_sync.py", "executor/parallel/zero.py",
                "executor/parallel/groups.py")
HOST_SYNC = "executor/parallel/host_sync.py"  # where the host waits for the device (see the module docstring)


@dataclass(frozen=True)
class Verdict:
    rank: int
    host: str
    step: int
    reason: str
    code: int

    def message(self) -> str:
        when = f"at step {self.step}" if self.step > 0 else "during set-up"
        who = "the launcher" if self.rank < 0 else f"rank {self.rank}"
        return f"{who} (host {self.host}) failed {when}: {self.reason}"

    def encode(self) -> bytes:
        return json.dumps(self.__dict__).encode()

    @staticmethod
    def decode(raw: bytes) -> Verdict:
        return Verdict(**json.loads(raw.decode()))


def log_error(renv: RankEnv, text: str) -> None:
    print(f"[{renv.where}] error: {text}", file=sys.stderr, flush=True)


class Watchdog:
    """Heartbeat thread of one rank (see the module docstring)."""

    def __init__(self, renv: RankEnv, *, interval: float = 1.0, dead_after: float = 30.0,
                 hang_after: float = 1800.0):
        self.renv = renv
        self.interval = interval
        self.dead_after = dead_after
        self.hang_after = hang_after
        self.step = 0  # the step (1-based, as in the logs) this rank is working on; see begin_step
        self._store: Any = None
        self._main_store: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._hosts: dict[int, str] = {}
        self._main_ident = threading.main_thread().ident
        self._exiting = threading.Lock()  # held by the thread that ends the process (see _exit)

    def _key(self, name: str) -> str:
        return f"{self.renv.prefix}/wd/{name}"

    def begin_step(self, step: int) -> None:
        """Called by the training loop as it starts ``step`` (1-based): published for verdicts."""
        self.step = step
        if self._main_store is not None:
            self._main_store.set(self._key(f"step/{self.renv.rank}"), str(step))

    def start(self, main_store: Any = None) -> None:
        """Start the thread. ``main_store`` (the training thread's connection) publishes steps."""
        self._main_store = main_store
        renv = self.renv
        # its own client, every call bounded: a frozen store host cannot block the watchdog
        self._store = BoundedStore(lambda: connect_store(renv, max(30.0, self.dead_after), host=False),
                                   self.dead_after, what=f"the store at {renv.master_addr}:{renv.master_port}")
        try:
            self._store.set(self._key(f"host/{renv.rank}"), renv.host)
        except Exception:
            pass  # the thread's first beat finds the same problem and turns it into a verdict
        self._thread = threading.Thread(target=self._run, name="hexiscale-watchdog", daemon=True)
        self._thread.start()

    def finish(self) -> None:
        """This rank ended normally: others stop watching it; then the thread stops."""
        if self._store is not None:
            try:
                self._store.set(self._key(f"done/{self.renv.rank}"), "1")
                self._store.add(self._key("ndone"), 1)
            except Exception:
                pass
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * self.interval)

    def host_of(self, rank: int) -> str:
        if rank not in self._hosts and self._store is not None:
            try:
                self._hosts[rank] = self._store.get(self._key(f"host/{rank}")).decode()
            except Exception:
                return "?"
        return self._hosts.get(rank, "?")

    # ---------------------------------------------------------------- verdicts
    def _propose(self, verdict: Verdict) -> Verdict:
        """Record ``verdict`` unless another came first; return the winning one."""
        if self._store is None:
            return verdict
        key = self._key("abort")
        try:
            won = self._store.compare_set(key, b"", verdict.encode())
            return Verdict.decode(won)
        except Exception:
            return verdict

    def _exit(self, verdict: Verdict) -> None:
        """Print the verdict once and end the process. The training thread (a failure of its own)
        and the watchdog thread (a verdict seen in the store) may both get here: the second waits
        for the first's ``os._exit`` instead of printing the verdict again."""
        if not self._exiting.acquire(blocking=False):
            while True:
                time.sleep(3600)
        log_error(self.renv, f"stopping: {verdict.message()}")
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(verdict.code)

    def current_verdict(self) -> Verdict | None:
        try:
            if self._store is not None and self._store.check([self._key("abort")]):
                return Verdict.decode(self._store.get(self._key("abort")))
        except Exception:
            return None
        return None

    def fail(self, reason: str, code: int, *, suspect_peer: bool) -> None:
        """This rank cannot go on: name the culprit for everyone, then exit (never returns).

        ``suspect_peer``: the error may be a symptom of another rank's death (a communication
        error); then wait for the heartbeat verdict before blaming this rank.
        """
        if suspect_peer and self._store is not None:
            deadline = time.monotonic() + self.dead_after + 2 * self.interval
            while time.monotonic() < deadline:
                found = self.current_verdict()
                if found is not None:
                    self._exit(found)
                time.sleep(self.interval / 2)
        self._exit(self._propose(Verdict(self.renv.rank, self.renv.host, self.step, reason, code)))

    def _step_of(self, rank: int, fallback: int) -> int:
        try:
            return int(self._store.get(self._key(f"step/{rank}")).decode())
        except Exception:
            return fallback

    # ---------------------------------------------------------------- the thread
    def _read(self, world: int, done: set[int], ndone: int) -> tuple[dict[int, str], set[int], int]:
        """Everyone's heartbeat values and the set of finished ranks (few store round trips)."""
        keys = [self._key(f"hb/{q}") for q in range(world)]
        if self._store.check(keys):
            values = {q: v.decode() for q, v in enumerate(self._store.multi_get(keys))}
        else:  # start-up: not every rank has beaten yet
            values = {q: self._store.get(k).decode() for q, k in enumerate(keys) if self._store.check([k])}
        for q in values:
            self.host_of(q)
        count = int(self._store.add(self._key("ndone"), 0))
        if count != ndone:
            done = {q for q in range(world) if self._store.check([self._key(f"done/{q}")])}
        return values, done, count

    def _run(self) -> None:
        r, world = self.renv.rank, self.renv.world_size
        beat, ndone = 0, 0
        done: set[int] = set()
        started = time.monotonic()
        last_seen: dict[int, tuple[str, float]] = {}
        last_progress = (-1, started)  # (lowest step of any rank, when it last changed)
        first = True
        while first or not self._stop.wait(self.interval):  # the first beat at once: a rank that dies
            first = False  # within its first interval is then seen to stop, not to have never started
            beat += 1
            now = time.monotonic()
            try:
                self._store.set(self._key(f"hb/{r}"), f"{beat} {self.step} {self._where()}")
                found = self.current_verdict()
                if found is not None:
                    self._exit(found)
                values, done, ndone = self._read(world, done, ndone)
            except Exception as exc:  # the store is gone (its host died) or does not answer (froze)
                self._exit(self._store_verdict(exc))
                return
            never = [q for q in range(world) if q not in values and q not in done]
            if never and now - started > 2 * self.dead_after:
                self._exit(self._propose(Verdict(never[0], self.host_of(never[0]), 0,
                                                 f"never started its heartbeat ({now - started:.0f} s after "
                                                 "the others; it died during set-up)", EXIT_RANK_FAILURE)))
            for q, value in values.items():
                if q not in last_seen or last_seen[q][0] != value:
                    last_seen[q] = (value, now)
            for q, (value, seen) in last_seen.items():
                if q != r and q not in done and now - seen > self.dead_after:
                    step = self._step_of(q, int(value.split()[1]))
                    self._exit(self._propose(Verdict(
                        q, self.host_of(q), step,
                        f"no heartbeat for {now - seen:.0f} s (process died or froze)", EXIT_RANK_FAILURE)))
            if len(values) == world and len(done) < world:
                steps = {q: int(v.split()[1]) for q, v in values.items() if q not in done}
                low = min(steps.values())
                if low != last_progress[0] or low == 0:  # set-up (step 0) is bounded by the pg timeout
                    last_progress = (low, now)
                elif now - last_progress[1] > self.hang_after:
                    self._exit(self._propose(self._hang_verdict(values, steps, low, now - last_progress[1])))

    def _store_verdict(self, exc: Exception) -> Verdict:
        """The verdict when the store fails: it names the store's host (rank 0 or the launcher)."""
        renv = self.renv
        host_rank = -1 if renv.store_hosted else 0
        who = "the launcher that hosts it" if renv.store_hosted else "rank 0, which hosts it,"
        addr = f"{renv.master_addr}:{renv.master_port}"
        if isinstance(exc, StoreTimeout):
            why = (f"the store at {addr} has not answered for {self.dead_after:.0f} s: {who} froze or its host "
                   "is unreachable")
        else:
            why = f"lost contact with the store at {addr} ({type(exc).__name__}): {who} died"
        return Verdict(host_rank, self._hosts.get(0, renv.master_addr), self.step, why, EXIT_RANK_FAILURE)

    def _where(self) -> str:
        """Where the training thread is: ``comm`` when its innermost Python frame is a
        torch.distributed call or one of our communication modules (a C++ ``work.wait()`` leaves the
        caller as the innermost Python frame), else ``func@file:line``."""
        frame = sys._current_frames().get(self._main_ident or -1)
        if frame is None:
            return "gone"
        code = frame.f_code
        if "torch/distributed" in code.co_filename or code.co_filename.endswith(COMM_MODULES):
            return "comm"
        if code.co_filename.endswith(HOST_SYNC):
            return device_wait(flight.pending())
        return f"{code.co_name}@{os.path.basename(code.co_filename)}:{frame.f_lineno}"

    def _hang_verdict(self, values: dict[int, str], steps: dict[int, int], low: int, idle: float) -> Verdict:
        """Blame a rank at the lowest step that is *not* waiting for peers, if there is one."""
        stuck = [q for q, s in steps.items() if s == low]
        where = {q: values[q].split(maxsplit=2)[2] if len(values[q].split()) > 2 else "?" for q in stuck}
        busy = [q for q in stuck if not where[q].startswith("comm")]
        waiting = [q for q in stuck if where[q].startswith("comm")]
        if busy:
            q = busy[0]
            why = (f"no step finished for {idle:.0f} s: it is stuck in {where[q]} while ranks {waiting} wait "
                   "for it in communication")
        else:
            q = stuck[0]
            ops = "; ".join(f"{r}: {where[r]}" for r in stuck if where[r] != "comm")
            why = (f"no step finished for {idle:.0f} s: ranks {stuck} all wait in communication (deadlock?)"
                   + (f" [{ops}]" if ops else ""))
        return Verdict(q, self.host_of(q), low, why, EXIT_RANK_FAILURE)


def device_wait(pending: list[str] | None) -> str:
    """How a rank blocked in :mod:`executor.parallel.host_sync` is counted: waiting for peers when a
    collective is unfinished (or no flight recorder can tell), else busy on its device."""
    if pending is None:
        return "comm"
    return f"comm:{pending[0]}" if pending else "device"
