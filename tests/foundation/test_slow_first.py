"""The suite's run order (tests/support/slow_first.py): modules with slow tests first, modules whole."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests import conftest as suite_conftest
from tests.support.slow_first import slow_modules_first


@dataclass(frozen=True)
class FakeItem:
    path: Path
    name: str
    slow: bool = False

    def get_closest_marker(self, name: str) -> object | None:
        return "slow" if name == "slow" and self.slow else None


def test_slow_modules_come_first_whole_and_in_path_order() -> None:
    a, b, c, d = (Path(f"{x}.py") for x in "abcd")
    items = [FakeItem(a, "a1"), FakeItem(b, "b1"), FakeItem(b, "b2", slow=True), FakeItem(c, "c1"),
             FakeItem(d, "d1", slow=True), FakeItem(d, "d2")]
    assert [i.name for i in slow_modules_first(items)] == ["b1", "b2", "d1", "d2", "a1", "c1"]


def test_the_suite_hook_reorders_what_pytest_collected() -> None:
    """tests/conftest.py applies the order to the collected items in place (pytest runs that list)."""
    fast, slow = FakeItem(Path("a.py"), "fast"), FakeItem(Path("b.py"), "slow", slow=True)
    items = [fast, slow]
    suite_conftest.pytest_collection_modifyitems(items)  # type: ignore[arg-type]
    assert items == [slow, fast]
