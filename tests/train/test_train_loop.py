"""The one training loop (executor.train.loop) with stand-in runners, no process group: the order
of steps, logs, retire points and switches, --stop-at, and a device that leaves (fast, pure)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from executor.train.config import TrainConfig
from executor.train.loop import run_loop


@dataclass
class _Engine:
    step: int = 0
    drained: int = 0

    def drain(self) -> None:
        self.drained += 1


@dataclass
class _Runner:
    name: str
    events: list[str]
    engine: _Engine = field(default_factory=_Engine)
    plan: Any = None
    rank: int = 0
    trace: Any = None

    def train(self) -> int:
        self.engine.step += 1
        return self.engine.step

    def log(self, k: int, total: int, result: Any, seconds: float) -> None:
        self.events.append(f"{self.name}:step {k + 1}/{total}")

    def position(self) -> tuple[int, int]:
        return self.engine.step, 10 * self.engine.step

    def extra(self) -> dict[str, Any]:
        return {}

    def summary(self) -> None:
        self.events.append(f"{self.name}:summary")


class _Watchdog:
    def __init__(self, events: list[str]):
        self.events = events

    def begin_step(self, step: int) -> None:
        pass


@dataclass
class _Boundary:
    """Switches after the steps in ``at``, to a runner named after the step (None: leaves)."""

    events: list[str]
    at: dict[int, str | None]
    wd: Any = None

    def after_step(self, runner: Any, step: int) -> None:
        self.events.append(f"{runner.name}:after {step}")

    def due(self, runner: Any, step: int) -> bool:
        return step in self.at

    def switch(self, runner: Any) -> Any:
        step, offset = runner.position()
        name = self.at[step]
        self.events.append(f"switch at {step} (offset {offset}) -> {name}")
        if name is None:
            return None
        return _Runner(name, self.events, _Engine(step))


def test_a_switch_hands_the_loop_a_new_runner_at_the_same_position() -> None:
    events: list[str] = []
    boundary = _Boundary(events, {1: "b", 2: "c"}, _Watchdog(events))
    run_loop(TrainConfig.flat(steps=4, stop_at=3), _Runner("a", events), wd=_Watchdog(events), fault=None,  # type: ignore[arg-type]
             boundary=boundary)
    assert events == ["a:step 1/4", "a:after 1", "switch at 1 (offset 10) -> b",
                      "b:step 2/4", "b:after 2", "switch at 2 (offset 20) -> c",
                      "c:step 3/4", "c:after 3", "c:summary"]  # --stop-at 3: no switch check after the last step


def test_a_leaving_device_stops_without_a_summary() -> None:
    events: list[str] = []
    run_loop(TrainConfig.flat(steps=4), _Runner("a", events), wd=_Watchdog(events), fault=None,  # type: ignore[arg-type]
             boundary=_Boundary(events, {2: None}, _Watchdog(events)))
    assert events == ["a:step 1/4", "a:after 1", "a:step 2/4", "a:after 2", "switch at 2 (offset 20) -> None"]


def test_without_a_boundary_the_loop_resumes_at_the_engines_step() -> None:
    events: list[str] = []
    runner = _Runner("a", events, _Engine(step=2))
    run_loop(TrainConfig.flat(steps=4), runner, wd=_Watchdog(events), fault=None)  # type: ignore[arg-type]
    assert events == ["a:step 3/4", "a:step 4/4", "a:summary"] and runner.engine.drained == 1
