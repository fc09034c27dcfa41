"""Plan files through every command that reads one (``validate``, ``show``, ``estimate``,
``whatif``, ``convert --to-flags``, ``launch --dry-run``, ``train``): edited JSON text and mutated
structure end in exit 0 or one error line, never a traceback or a hang; every out-of-range number
is refused naming its field path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.cli_run import names, run_cli
from tests.support.fuzz_settings import fuzz
from tests.support.fuzz_strategies import mutated, text_edits

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = str(ROOT / "examples" / "clusters" / "demo-cpu-6.yaml")
PLAN_TEXT = (ROOT / "examples" / "plans" / "demo-cpu-6-tiny.json").read_text()
PLAN = json.loads(PLAN_TEXT)
FUZZ = fuzz(1000)
COMMANDS = {
    "validate": ["validate", "P", "--cluster", CLUSTER], "show": ["show", "P", "--cluster", CLUSTER],
    "estimate": ["estimate", "P", "--cluster", CLUSTER], "whatif": ["whatif", "P", "--cluster", CLUSTER,
                                                                    "--inter-bw", "1"],
    "convert": ["convert", "--to-flags", "P", "--cluster", CLUSTER],
    "launch": ["launch", "P", "--cluster", CLUSTER, "--dry-run"], "train": ["train", "--plan", "P"],
}
OUT_OF_RANGE: dict[tuple[Any, ...], list[Any]] = {
    ("global_batch_size",): [0, -8, 1 << 25, 10**30, 8.0, True],
    ("pipelines", 0, "batch_size"): [0, -1, 10**30, None],
    ("pipelines", 0, "micro_batches"): [0, -2, 6, 10**6, "2"],
    ("pipelines", 1, "stages", 0, "tp"): [0, -1, 2, 10**9],
    ("pipelines", 1, "stages", 1, "layers"): [[1, 1], [1, 2, 3], [-1, 3], [1, 10**30], [1, 3.0]],
    ("model", "num_layers"): [0, -4, 10**5, 10**30],
    ("model", "hidden_size"): [0, 1 << 21, 63],
    ("model", "vocab_size"): [0, 1 << 25],
    ("model", "seq_len"): [0, -1, 1 << 25, 10**400],
    ("model", "rope_theta"): [0, -1.0, float("inf"), float("nan")],
    ("options", "zero"): [2, -1, 10**9],
    ("options", "compile"): [1, 0, "true", None, [True]],
    ("model", "name"): ["ti\x00ny", "a\x1b[2Jb", "x\ny", "x" * 201, 3],
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("plans")


def _run(folder: Path, text: str, command: str) -> Any:
    path = folder / "p.json"
    path.write_text(text)
    return run_cli([str(path) if a == "P" else a for a in COMMANDS[command]])


@FUZZ
@given(text=text_edits(PLAN_TEXT, span=12), command=st.sampled_from(sorted(COMMANDS)))
def test_edited_plan_text(folder: Path, monkeypatch: pytest.MonkeyPatch, text: str, command: str) -> None:
    monkeypatch.setenv("WORLD_SIZE", "999")  # a plan train accepts stops at the world size check
    _run(folder, text, command)


@fuzz(2500)
@given(doc=mutated(PLAN), command=st.sampled_from(sorted(COMMANDS)))
def test_mutated_plan_structure(folder: Path, monkeypatch: pytest.MonkeyPatch, doc: Any, command: str) -> None:
    monkeypatch.setenv("WORLD_SIZE", "999")
    try:
        text = json.dumps(doc)
    except (ValueError, OverflowError):
        return
    _run(folder, text, command)


@pytest.mark.parametrize("field", list(OUT_OF_RANGE), ids=lambda f: ".".join(map(str, f)))
def test_out_of_range_plan_fields_are_refused(folder: Path, field: tuple[Any, ...]) -> None:
    for value in OUT_OF_RANGE[field]:
        doc = json.loads(PLAN_TEXT)
        parent = doc
        for key in field[:-1]:
            parent = parent[key]
        parent[field[-1]] = value
        outcome = _run(folder, json.dumps(doc), "validate")
        want = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in field).lstrip(".")
        assert outcome.code == 1 and names(outcome, want), (value, outcome.err)
