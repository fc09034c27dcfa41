"""The elastic protocol between the supervisor, the ranks and ``hexiscale elastic`` commands: keys
of the job's TCPStore (the supervisor hosts it, so it outlives every rank).

**Requests** (``hexiscale/<run id>/elastic/``, the command's namespace, stable across restarts):
``request/count`` (a counter), ``request/<n>`` = ``{"leave": [...], "join": [...]}``, and
``request/<n>/status``, the supervisor's answer (``ok: ...`` or ``error: ...``, final).

**Epochs** (``<attempt prefix>/elastic/``; epoch 0 is the launch plan, each switch starts the next):

* ``plan/<e>`` — ``{"old_plan", "plan"}``: the running layout and epoch ``e``'s (JSON: a plan, or a
  strategy pool by its ``format``), written before its joining processes start; every rank (a
  joiner too) plans its state move from it while the joiners start, ahead of the go
  (:meth:`Channel.planned`; the go's layouts are compared with it);
* ``ready/<e>/<device>`` — a joining process passed its local checks (``ok``) or not (its error);
* ``epoch/<e>`` — the go: ``{"old_plan", "plan", "leave", "join"}``, once every joiner is ready;
* ``at/<e>`` — the step after which epoch ``e`` starts, written once (``compare_set``): by the
  supervisor ahead of time (a trace's phase boundary), else by rank 0 as ``k + 1`` when it first
  sees ``epoch/<e>`` after step ``k``;
* ``state/<e>`` — ``{"step", "samples"}``, the data position at the switch (old rank 0), for the
  joiners (``samples``: a plan's samples read, a pool's next sequence); ``done/<e>`` — the new
  rank 0's report of the switch.

**Why every rank switches after the same step.** Each rank checks ``at/<e>`` after every step
(one store round trip). Rank 0 writes ``at/<e> = k + 1`` *before* it enters step ``k + 1``; no rank
can finish step ``k + 1`` before rank 0 enters it (the step's all-reduce needs every rank; on NCCL
the host waits for the device at the end of the step), so every rank's check after step ``k + 1``
sees the key, and no rank can have passed ``k + 1`` already. A rank that reaches ``at/<e>`` before
``epoch/<e>`` exists (a trace boundary whose re-plan or joiners are late) waits for it.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

from planner.errors import SpecError
from planner.varlen.layout_doc import Layout, home_plan, layout_from_dict, layout_to_dict


def request_prefix(run_id: str) -> str:
    return f"hexiscale/{run_id}/elastic"


class Channel:
    """The epoch keys of one job attempt (``prefix`` = the attempt's store prefix)."""

    def __init__(self, store: Any, prefix: str):
        self.store = store
        self.prefix = f"{prefix}/elastic"

    def _k(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def _get_json(self, name: str) -> Any:
        return json.loads(self.store.get(self._k(name)))

    def _wait(self, name: str, timeout_s: float) -> None:
        self.store.wait([self._k(name)], timedelta(seconds=timeout_s))

    # ------------------------------------------------------------------ supervisor
    def publish_plan(self, e: int, old: Layout, new: Layout) -> None:
        """Epoch ``e``'s layout ``new`` and the running one, ``old`` (before the joiners start)."""
        self.store.set(self._k(f"plan/{e}"), json.dumps({"old_plan": layout_to_dict(old), "plan": layout_to_dict(new)}))

    def publish_epoch(self, e: int, old: Layout, new: Layout) -> None:
        """The go of epoch ``e``; ``old`` and ``new`` are plans or strategy pools (their ``format``)."""
        old_devices, new_devices = home_plan(old).devices, home_plan(new).devices
        leave = [d for d in old_devices if d not in set(new_devices)]
        join = [d for d in new_devices if d not in set(old_devices)]
        self.store.set(self._k(f"epoch/{e}"), json.dumps({"old_plan": layout_to_dict(old),
                                                          "plan": layout_to_dict(new), "leave": leave, "join": join}))

    def schedule(self, e: int, after_step: int) -> int:
        """Ask for epoch ``e`` to start after ``after_step``; returns the step that holds."""
        return int(self.store.compare_set(self._k(f"at/{e}"), "", str(after_step)).decode())

    def readiness(self, e: int, devices: list[str]) -> dict[str, str]:
        """The joiners' answers so far (device -> ``ok`` or error)."""
        keys = {d: self._k(f"ready/{e}/{d}") for d in devices}
        return {d: self.store.get(k).decode() for d, k in keys.items() if self.store.check([k])}

    def forget_ready(self, e: int, devices: list[str]) -> None:
        """Drop the joiners' answers of a change that did not happen (the next one reuses ``e``)."""
        for d in devices:
            self.store.delete_key(self._k(f"ready/{e}/{d}"))
        self.store.delete_key(self._k(f"plan/{e}"))

    def done(self, e: int) -> dict[str, Any] | None:
        return self._get_json(f"done/{e}") if self.store.check([self._k(f"done/{e}")]) else None

    # ------------------------------------------------------------------ ranks
    def switch_due(self, e: int, step: int, *, rank0: bool) -> bool:
        """After step ``step`` (1-based count of steps done): does epoch ``e`` start now?"""
        if rank0 and self.store.check([self._k(f"epoch/{e}")]):
            self.schedule(e, step + 1)
        if not self.store.check([self._k(f"at/{e}")]):
            return False
        at = int(self.store.get(self._k(f"at/{e}")).decode())
        if at < step:
            raise RuntimeError(f"epoch {e} was due after step {at}, this rank is past it (step {step})")
        return at == step

    def published(self, e: int) -> bool:
        """Has the go of epoch ``e`` been given (its plans can be read without waiting)?"""
        return bool(self.store.check([self._k(f"epoch/{e}")]))

    def planned(self, e: int) -> str | None:
        """Epoch ``e``'s ``plan/<e>`` as written (parse it with :func:`layouts`), None if not
        (yet) planned: the change may still fail before its go (its joiners not ready)."""
        key = self._k(f"plan/{e}")
        return self.store.get(key).decode() if self.store.check([key]) else None

    def wait_planned(self, e: int, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for ``plan/<e>`` (written before the go, which needs it)."""
        try:
            self._wait(f"plan/{e}", timeout_s)
        except Exception:
            raise SpecError("elastic", f"epoch {e} was not planned within {timeout_s:.0f} s",
                            "the supervisor could not re-plan for the new devices") from None

    def epoch(self, e: int, timeout_s: float) -> tuple[Layout, Layout]:
        """(old layout, new layout) of epoch ``e`` (plans or pools), waiting up to ``timeout_s`` for the go."""
        try:
            if not self.published(e):
                self._wait(f"epoch/{e}", timeout_s)
        except Exception:
            raise SpecError("elastic", f"epoch {e} was not published within {timeout_s:.0f} s",
                            "the supervisor could not re-plan or start the joining devices") from None
        rec = self._get_json(f"epoch/{e}")
        return layout_from_dict(rec["old_plan"]), layout_from_dict(rec["plan"])

    def set_state(self, e: int, step: int, samples: int) -> None:
        self.store.set(self._k(f"state/{e}"), json.dumps({"step": step, "samples": samples}))

    def state(self, e: int, timeout_s: float) -> tuple[int, int]:
        self._wait(f"state/{e}", timeout_s)
        rec = self._get_json(f"state/{e}")
        return int(rec["step"]), int(rec["samples"])

    def ready(self, e: int, device: str, error: str | None) -> None:
        self.store.set(self._k(f"ready/{e}/{device}"), "ok" if error is None else error)

    def report(self, e: int, report: dict[str, Any]) -> None:
        self.store.set(self._k(f"done/{e}"), json.dumps(report))


def layouts(text: str) -> tuple[Layout, Layout]:
    """(old layout, new layout) of a ``plan/<e>`` record (:meth:`Channel.planned`)."""
    rec = json.loads(text)
    return layout_from_dict(rec["old_plan"]), layout_from_dict(rec["plan"])


def wait_for(predicate: Any, timeout_s: float, poll_s: float = 0.05) -> Any:
    """Poll ``predicate()`` until it returns something truthy (returned) or ``timeout_s`` passes (None)."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = predicate()
        if got or time.monotonic() > deadline:
            return got or None
        time.sleep(poll_s)
