"""Cluster files through the command line (``validate``, ``show``, ``launch --dry-run``): edited text,
mutated structure, aliases and duplicate keys end in exit 0 or one error line, never a traceback or a
hang; every out-of-range number is refused naming its field path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from planner.documents import load_yaml_text
from tests.support.cli_run import names, run_cli
from tests.support.fuzz_settings import fuzz
from tests.support.fuzz_strategies import mutated, text_edits

ROOT = Path(__file__).resolve().parents[2]
TEXTS = {name: (ROOT / "examples" / "clusters" / f"{name}.yaml").read_text()
         for name in ("demo-cpu-6", "seed-uneven-nodes")}
DEMO = load_yaml_text(TEXTS["demo-cpu-6"], "demo")
PLAN = str(ROOT / "examples" / "plans" / "demo-cpu-6-tiny.json")
FUZZ = fuzz(1500)

# field -> (values outside its range); every one must be refused with the field's path named
OUT_OF_RANGE: dict[tuple[Any, ...], list[Any]] = {
    ("nodes", 0, "gpus"): [0, -1, 65, 10**30, 2.5, True, "2"],
    ("nodes", 1, "intra_link", "bandwidth_GBps"): [0, -3, 1e-9, 1e7, float("inf"), float("nan"), 10**400, "x"],
    ("nodes", 1, "intra_link", "latency_us"): [-1, 1e10, float("inf"), float("nan")],
    ("inter_node", "bandwidth_GBps"): [0, 2e6, float("-inf")],
    ("devices", "r4090:3", "memory_gib"): [0, -16, 1e7, float("nan")],
    ("devices", "r4090:3", "slowdown"): [0, 0.5, 0.999, 2e6, float("inf")],
    ("name",): ["lab\x00", "a\x1b[2Jb", "x\ny", "x" * 201],
    ("links",): [[{"between": ["a100", "r4090"], "link": {"bandwidth_GBps": 1}},
                  {"between": ["r4090", "a100"], "link": {"bandwidth_GBps": 2}}]],
}


def _write(tmp: Path, name: str, text: str) -> str:
    path = tmp / name
    path.write_text(text)
    return str(path)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("clusters")


@FUZZ
@given(name=st.sampled_from(sorted(TEXTS)), data=st.data())
def test_edited_cluster_text(folder: Path, name: str, data: st.DataObject) -> None:
    text = data.draw(text_edits(TEXTS[name]))
    path = _write(folder, "c.yaml", text)
    command = data.draw(st.sampled_from([["validate", path], ["show", path]]))
    run_cli(command)


@FUZZ
@given(doc=mutated(DEMO), as_yaml=st.booleans(), command=st.sampled_from(["validate", "show", "launch"]))
def test_mutated_cluster_structure(folder: Path, doc: Any, as_yaml: bool, command: str) -> None:
    try:
        text = yaml.safe_dump(doc) if as_yaml else json.dumps(doc)  # JSON is YAML too
    except (ValueError, OverflowError):
        return  # a value neither format can write (e.g. a huge float)
    path = _write(folder, "c.yaml", text)
    run_cli({"validate": ["validate", path], "show": ["show", path],
             "launch": ["launch", PLAN, "--cluster", path, "--dry-run"]}[command])


@pytest.mark.parametrize("field", list(OUT_OF_RANGE), ids=lambda f: ".".join(map(str, f)))
def test_out_of_range_cluster_fields_are_refused(tmp_path: Path, field: tuple[Any, ...]) -> None:
    for i, value in enumerate(OUT_OF_RANGE[field]):
        doc = json.loads(json.dumps(DEMO))
        parent = doc
        for key in field[:-1]:
            parent = parent[key]
        parent[field[-1]] = value
        path = _write(tmp_path, f"c{i}.yaml", yaml.safe_dump(doc))
        outcome = run_cli(["validate", path])
        want = "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in field).lstrip(".")
        assert outcome.code == 1 and names(outcome, want), (value, outcome.err)


@FUZZ
@given(levels=st.integers(1, 14), width=st.integers(1, 14), merge=st.booleans(), where=st.sampled_from(
    ["top", "nodes", "devices"]))
def test_alias_structures_end_at_once(folder: Path, levels: int, width: int, merge: bool, where: str) -> None:
    """Anchors of anchors (``width`` aliases per level, ``levels`` deep: up to 14**14 values once
    expanded), as lists or merge keys, anywhere in a cluster file: refused or read within the case's
    bound, never expanded."""
    lines = ["a0: &a0 {x: 1}" if merge else "a0: &a0 [1, 2]"]
    for i in range(1, levels + 1):
        refs = ", ".join([f"*a{i - 1}"] * width)
        lines.append(f"a{i}: &a{i} {{<<: [{refs}], y: {i}}}" if merge else f"a{i}: &a{i} [{refs}]")
    body = "\n".join(lines) + "\n"
    last = f"*a{levels}"
    text = {"top": f"{body}nodes: {last}\n",
            "nodes": f"{TEXTS['demo-cpu-6']}\nextra:\n" + "".join(f"  {ln}\n" for ln in lines),
            "devices": f"{body}{TEXTS['demo-cpu-6']}\ndevices: {{'a100:0': {last}}}\n"}[where]
    outcome = run_cli(["validate", _write(folder, "alias.yaml", text)])
    assert outcome.code == 1, outcome.out
