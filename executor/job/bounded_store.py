"""A store client whose every call returns or raises within a bound, whatever the store host does.

c10d's TCPStore client honours its timeout when the server is gone (connection refused or reset),
but not when the server process is frozen (SIGSTOP, a stuck host, a network that drops packets):
``check``, ``get``, ``add``, ``multi_get``, ``compare_set`` and ``wait`` then block in a socket
read forever (measured with torch 2.13). The watchdog must never block on the store it watches, so
its calls go through :class:`BoundedStore`: each runs on a daemon worker thread and the caller waits
at most ``timeout_s``. A call that overruns raises :class:`StoreTimeout` and leaves the client
*broken* (the worker may be stuck for good): every later call raises at once, and the caller turns
that into a verdict naming the store's host. The worker is a daemon, so a stuck one never holds the
process at exit.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

_METHODS = ("set", "get", "check", "add", "multi_get", "compare_set", "wait", "delete_key")


class StoreError(RuntimeError):
    """A store call failed (its host died: connection refused or reset)."""


class StoreTimeout(StoreError):
    """The store did not answer within the bound (its host froze or became unreachable)."""


class BoundedStore:
    """Wraps a c10d store (``set``, ``get``, ``check``, ``add``, ``multi_get``, ``compare_set``,
    ``wait``, ``delete_key``); calls from several threads are served one at a time, in order.

    ``open_store`` makes the client on the worker thread (connecting to a frozen server may block
    too); the first call waits for it within its own bound."""

    def __init__(self, open_store: Callable[[], Any], timeout_s: float, *, what: str = "the store"):
        self.timeout_s = timeout_s
        self.what = what
        self.broken: str | None = None
        self.store: Any = None
        self._calls: queue.Queue[tuple[Callable[[], Any], dict[str, Any], threading.Event]] = queue.Queue()
        threading.Thread(target=self._serve, name="hexiscale-store-client", daemon=True).start()
        self._open_error: BaseException | None = None
        self._submit(lambda: self._open(open_store))

    @classmethod
    def around(cls, store: Any, timeout_s: float, *, what: str = "the store") -> BoundedStore:
        """Bound the calls of an existing client."""
        return cls(lambda: store, timeout_s, what=what)

    def _open(self, open_store: Callable[[], Any]) -> None:
        try:
            self.store = open_store()
        except BaseException as exc:  # noqa: BLE001 - raised again by every call
            self._open_error = exc

    def _method(self, name: str) -> Callable[..., Any]:
        if self.store is None:
            raise self._open_error or StoreTimeout(f"{self.what} was never reached")
        return getattr(self.store, name)  # type: ignore[no-any-return]

    def _serve(self) -> None:
        while True:
            fn, box, done = self._calls.get()
            try:
                box["value"] = fn()
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller
                box["error"] = exc
            done.set()

    def _submit(self, fn: Callable[[], Any]) -> tuple[dict[str, Any], threading.Event]:
        box: dict[str, Any] = {}
        done = threading.Event()
        self._calls.put((fn, box, done))
        return box, done

    def call(self, name: str, *args: Any, timeout_s: float | None = None) -> Any:
        """``store.<name>(*args)``, or :class:`StoreTimeout` after ``timeout_s`` (default: the bound)."""
        if self.broken is not None:
            raise StoreTimeout(self.broken)
        bound = self.timeout_s if timeout_s is None else timeout_s
        box, done = self._submit(lambda: self._method(name)(*args))
        if not done.wait(bound):
            self.broken = f"{self.what} did not answer within {bound:.0f} s"
            raise StoreTimeout(self.broken)
        if "error" in box:
            exc = box["error"]
            if isinstance(exc, Exception) and not isinstance(exc, StoreError | KeyError | ValueError):
                first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
                raise StoreError(f"{self.what} failed ({type(exc).__name__}: {first})") from exc
            raise exc
        return box["value"]

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name not in _METHODS:
            raise AttributeError(name)
        return lambda *args: self.call(name, *args)
