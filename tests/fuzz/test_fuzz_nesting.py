"""Every file a user hands a command, nested 100,000 levels deep (Python's JSON parser recurses, so
``json.loads`` raises ``RecursionError``; YAML's composer recurses too): one error line saying the
document is nested too deep, through each command that reads such a file — never a traceback."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from planner.catalog import _cached
from tests.support.cli_run import run_cli

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = str(ROOT / "examples" / "clusters" / "demo-cpu-6.yaml")
PLAN = str(ROOT / "examples" / "plans" / "demo-cpu-6-tiny.json")
LEVELS = 100_000
DEEP_LIST = "[" * LEVELS + "]" * LEVELS


def _deep_value(head: str) -> str:
    """A JSON object whose first field holds a list nested ``LEVELS`` deep (past the format check)."""
    return "{" + head + '"x": ' + DEEP_LIST + "}"


def _file(folder: Path, name: str, text: str) -> str:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


# reader -> (folder -> argv); each writes its deep document under the folder ($HEXISCALE_HOME too)
CASES: dict[str, Callable[[Path], list[str]]] = {
    "lengths": lambda d: ["plan", CLUSTER, "--model", "tiny", "--global-batch", "8", "--step-tokens", "4096",
                          "--lengths", _file(d, "l.json", _deep_value('"format": "hexiscale.lengths/1", '))],
    "plan": lambda d: ["validate", _file(d, "p.json", DEEP_LIST), "--cluster", CLUSTER],
    "pool (train)": lambda d: ["train", "--plan", _file(d, "pool.json", _deep_value('"format": "hexiscale.pool/1", '))],
    "pool (data packing)": lambda d: ["data", "packing", str(d / "none"), "--cluster", CLUSTER, "--step-tokens",
                                      "64", "--pool", _file(d, "pool.json", DEEP_LIST)],
    "trace": lambda d: ["show", _file(d, "t.json", _deep_value('"format": "hexiscale.trace/1", '))],
    "cluster": lambda d: ["validate", _file(d, "c.yaml", DEEP_LIST)],
    "cluster in a block style": lambda d: ["validate", _file(d, "c.yaml", "".join(
        " " * i + "- \n" for i in range(0, 2 * 2000, 2)))],
    "add-node": lambda d: ["whatif", PLAN, "--cluster", CLUSTER, "--add-node", _file(d, "n.yaml", DEEP_LIST)],
    "params": lambda d: ["estimate", PLAN, "--cluster", CLUSTER, "--params", _file(d, "params.json", DEEP_LIST)],
    "device profile": lambda d: ["devices"] if _file(d, "devices/x.json", DEEP_LIST) else [],
    "hf config": lambda d: ["convert", "--from-flags", "--cluster", CLUSTER, "--model",
                            _file(d, "model/config.json", DEEP_LIST), "--hetero_configs", "[[2], [1, 2, 1]]",
                            "--layer_partitions", "[[4], [1, 2, 1]]", "--global_bsz_size", "5", "3",
                            "--chunks", "2", "3"],
}


@pytest.mark.parametrize("reader", sorted(CASES))
def test_a_deeply_nested_file_is_one_error_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  reader: str) -> None:
    monkeypatch.setenv("HEXISCALE_HOME", str(tmp_path))
    monkeypatch.setenv("WORLD_SIZE", "999")  # a plan train accepted would stop at the world size check
    _cached.cache_clear()
    try:
        outcome = run_cli(CASES[reader](tmp_path))
    finally:
        _cached.cache_clear()
    assert outcome.code == 1 and "nested" in outcome.error, outcome.err
