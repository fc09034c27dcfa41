"""Start a CPU (gloo) rank by forking the launcher instead of exec'ing a new interpreter.

A rank started as ``python -m hexiscale train`` pays ~2 s to import torch, ~1.3 s for
``torch._dynamo`` (torch's ``Optimizer.add_param_group`` imports it) and ~0.3 s for our modules;
with 4 ranks on 2 cores that is ~10 s of a launch before any work. Here the launcher imports them
once (:func:`preload`) and each rank is an ``os.fork()`` of it that runs the same ``hexiscale
train`` entry with the same argv and environment, then leaves with ``os._exit``.

Only CPU launches fork (:func:`spawn_mode`): CUDA and NCCL must never be initialised in a forked
parent, so GPU ranks are always exec'd. ``HEXISCALE_SPAWN=exec`` forces the exec path everywhere.

What the child undoes of the launcher. The parent must have run no parallel torch ops (an OpenMP
pool does not survive a fork): ``hexiscale launch`` runs none; an in-process caller that did (a test
calling ``main``) is safe only with ``OMP_NUM_THREADS=1`` in the ranks, the launchers' default.

* threads: only the forking thread lives on (the store server's and the output pumps' are gone);
  the child never touches the launcher's store or its ``sys.stdout`` (a pump may have held its
  lock at the fork) — it writes to fresh text streams on fds 1 and 2, the rank's pipe;
* file descriptors: every fd above 2 is closed (the store's listening and client sockets, the other
  ranks' pipes, log files), as ``Popen(close_fds=True)`` does; the garbage collector is frozen so
  no inherited Python file object can close a reused fd number;
* signals: handlers the launcher installed go back to their defaults (SIGINT keeps Python's
  KeyboardInterrupt handler, as in a new interpreter), faulthandler and the wakeup fd are off;
* random state: ``random`` is reseeded (numpy's too, if loaded), as in a new interpreter;
* exit: the launcher's atexit handlers and finalizers are dropped (they would do the launcher's
  clean-up); the child runs its own and joins its non-daemon threads as an interpreter would at exit,
  flushes its streams and leaves with ``os._exit`` (never the launcher's exit path).

:class:`ForkedRank` has the part of the ``Popen`` interface the launchers use (``pid``,
``stdout``, ``poll``, ``wait``, ``terminate``, ``kill``, ``returncode``), with the same exit codes
(negative for a signal).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import IO

from planner.errors import SpecError

SPAWN_ENV = "HEXISCALE_SPAWN"
SPAWN_MODES = ("fork", "exec")
_HELD = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}  # blocked across the fork (see ForkedRank)


def spawn_mode(device: str, env: Mapping[str, str] | None = None) -> str:
    """``"fork"`` for CPU ranks (unless ``HEXISCALE_SPAWN=exec``), else ``"exec"``; never fork for
    CUDA, whatever the variable says."""
    env = os.environ if env is None else env
    wanted = env.get(SPAWN_ENV, "")
    if wanted and wanted not in SPAWN_MODES:
        raise SpecError(SPAWN_ENV, f"unknown spawn mode {wanted!r}",
                        f"use one of {', '.join(SPAWN_MODES)}, or unset it")
    if device != "cpu" or wanted == "exec" or not hasattr(os, "fork"):
        return "exec"
    return "fork"


def preload() -> None:
    """Import once, in the launcher, what every rank would import (see the module docstring)."""
    import torch._dynamo  # noqa: F401

    import executor.train.entry  # noqa: F401
    from hexiscale.cli.main import build_parser

    build_parser()


class ForkedRank:
    """A forked child running ``target`` (its return value is the exit code) with ``env`` as its
    environment and its stdout and stderr on ``self.stdout``; looked after like a ``Popen``."""

    def __init__(self, target: Callable[[], int], env: Mapping[str, str], *, args: Sequence[str] = ()):
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        read, write = os.pipe()
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)  # until the child has reset its handlers
        try:
            with warnings.catch_warnings():  # the launcher's threads are accounted for (module docstring)
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
            if pid == 0:  # pragma: no cover - the child never returns
                os.close(read)
                _run_child(target, dict(env), write, mask)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(write)
        self.pid = pid
        self.args = list(args)
        self.stdout: IO[bytes] = os.fdopen(read, "rb")
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if timeout is None:
            if self.returncode is None:
                self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
            return self.returncode
        deadline = time.monotonic() + timeout
        while (code := self.poll()) is None:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.01)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # never a reaped pid (it may belong to someone else by now)
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def train_target(argv: Sequence[str]) -> Callable[[], int]:
    """``hexiscale ARGV`` (``["train", ...]``) as a :class:`ForkedRank` target."""

    def run() -> int:
        from hexiscale.cli.main import main

        sys.argv = [os.path.join(os.path.dirname(os.path.dirname(__file__)), "__main__.py"), *argv]
        return main(list(argv))

    return run


def _run_child(target: Callable[[], int], env: dict[str, str], out_fd: int,
               mask: set[int | signal.Signals]) -> None:  # pragma: no cover - in the child
    code = 1
    try:
        code = _child_main(target, env, out_fd, mask)
    except BaseException:  # noqa: BLE001 - the child must reach os._exit whatever happens
        try:
            import traceback

            traceback.print_exc()
        except BaseException:  # noqa: BLE001, S110
            pass
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:  # noqa: BLE001, S110
            pass
        os._exit(code)


def _child_main(target: Callable[[], int], env: dict[str, str], out_fd: int,
                mask: set[int | signal.Signals]) -> int:  # pragma: no cover - in the child
    import faulthandler
    import gc
    import random

    gc.freeze()  # inherited objects are never collected here: none may close a reused fd
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    os.closerange(3, os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 65536)
    # fresh streams on the rank's pipe: a pump thread may have held the launcher's streams' locks
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    sys.__stdout__, sys.__stderr__ = sys.stdout, sys.stderr  # type: ignore[misc]
    faulthandler.disable()
    signal.set_wakeup_fd(-1)
    for sig in signal.valid_signals():
        try:
            handler = signal.getsignal(sig)
        except (OSError, ValueError):
            continue
        if callable(handler) and handler is not signal.default_int_handler:
            signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    os.environ.clear()
    os.environ.update(env)
    _forget_exit_handlers()
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    _name_process(env)
    try:
        code = target()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else _print_exit(exc.code))
    _at_exit()
    return code


def _forget_exit_handlers() -> None:  # pragma: no cover - in the child
    """Drop the launcher's atexit handlers and its finalizers' exit calls (a new interpreter has
    none): run in the child they would do the launcher's clean-up, e.g. a ``TemporaryDirectory``'s
    finalizer deleting a folder the launcher still uses. The rank's own registrations run as usual."""
    import atexit
    import weakref

    atexit._clear()
    registry = getattr(weakref.finalize, "_registry", {})
    for info in list(registry.values()):
        info.atexit = False
    weakref.finalize._registered_with_atexit = False  # type: ignore[attr-defined]


def _name_process(env: Mapping[str, str]) -> None:  # pragma: no cover - in the child
    """Name the child after its device or rank (``ps``, ``top``; its ``/proc/PID/environ`` still shows
    the launcher's environment, which only an exec replaces)."""
    import ctypes
    import ctypes.util

    name = env.get("HEXISCALE_DEVICE") or f"rank-{env.get('RANK', '?')}"
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError, TypeError):
        pass


def _print_exit(message: object) -> int:  # pragma: no cover - in the child
    print(message, file=sys.stderr)
    return 1


def _at_exit() -> None:  # pragma: no cover - in the child
    """What an interpreter does at exit: join the non-daemon threads, run the atexit handlers."""
    import atexit
    import threading

    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
