"""Documents users hand us are bounded before anything walks them (alias bombs, deep nesting, huge
numbers, FIFOs, oversized files) and strict (duplicate keys are errors with field and line)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hexiscale.cli.main import main
from planner.cluster import load_cluster
from planner.documents import MAX_YAML_BYTES, load_json_text, load_yaml_text
from planner.errors import SpecError
from planner.plan import load_plan
from tests.support.deadline import deadline
from tests.support.hostile_documents import ALIAS_BOMB

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_TEXT = (ROOT / "examples" / "clusters" / "demo-cpu-6.yaml").read_text()
PLAN_TEXT = (ROOT / "examples" / "plans" / "demo-cpu-6-tiny.json").read_text()


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with deadline(20, " ".join(argv)):
        assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_alias_bomb_is_refused_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert len(ALIAS_BOMB) < 400
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(ALIAS_BOMB)
    err = _fails(["validate", str(bomb)], capsys)
    assert "expands to more than" in err and "alias" in err and str(bomb) in err
    recursive = tmp_path / "loop.yaml"
    recursive.write_text("nodes: &n [*n]\n")
    assert "refers to a node that contains it" in _fails(["validate", str(recursive)], capsys)


def test_aliases_and_merge_keys_still_work(tmp_path: Path) -> None:
    cluster = tmp_path / "anchors.yaml"
    cluster.write_text("nodes:\n"
                       "  - {name: a, gpu: a100, gpus: 2, intra_link: &fast {kind: nvlink, bandwidth_GBps: 300}}\n"
                       "  - {name: b, gpu: a100, gpus: 2, intra_link: *fast}\n"
                       "  - {name: c, gpu: a100, gpus: 2, intra_link: {<<: *fast, bandwidth_GBps: 100}}\n"
                       "inter_node: {bandwidth_GBps: 1}\n")
    spec = load_cluster(cluster)
    assert [n.intra_link.bandwidth_GBps for n in spec.nodes] == [300, 300, 100]


@pytest.mark.parametrize(("text", "path", "line"), [
    ("nodes:\n  - {name: a, gpu: a100, gpus: 2, gpus: 8, intra_link: {bandwidth_GBps: 1}}\ninter_node: "
     "{bandwidth_GBps: 1}\n", "nodes[0].gpus", 2),
    ("nodes: []\ninter_node: {bandwidth_GBps: 1}\nnodes:\n  - {name: a}\n", "nodes", 3),
    ("name: x\nname: y\n", "name", 2),
])
def test_duplicate_yaml_keys_name_field_and_line(text: str, path: str, line: int) -> None:
    with pytest.raises(SpecError) as err:
        load_yaml_text(text, "c.yaml")
    assert (err.value.path, err.value.line, err.value.file) == (path, line, "c.yaml")
    assert "duplicate key" in err.value.message


def test_duplicate_keys_in_a_cluster_file_and_a_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "c.yaml"
    cluster.write_text(CLUSTER_TEXT.replace("gpus: 4,", "gpus: 4, gpus: 8,"))
    err = _fails(["validate", str(cluster)], capsys)
    assert f"{cluster}:6: nodes[1].gpus: duplicate key (first at line 6)" in err
    plan = tmp_path / "p.json"
    plan.write_text(PLAN_TEXT.replace('"global_batch_size": 8,', '"global_batch_size": 8, "global_batch_size": 9,'))
    assert "global_batch_size: duplicate key" in _fails(["validate", str(plan)], capsys)


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, "a: " + "[" * 70 + "]" * 70, "a: " + "9" * 5000,
                                  "{" * 100_000])
def test_deep_or_huge_yaml_is_one_error(text: str) -> None:
    with deadline(10), pytest.raises(SpecError) as err:
        load_yaml_text(text, "c.yaml")
    assert err.value.file == "c.yaml" and err.value.message


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, "[" * 70 + "]" * 70, "9" * 5000,
                                  '{"a": ' * 500 + "1" + "}" * 500])
def test_deep_or_huge_json_is_one_error(text: str) -> None:
    with deadline(10), pytest.raises(SpecError) as err:
        load_json_text(text, "p.json")
    assert err.value.file == "p.json" and err.value.message


def test_files_that_are_not_plain_text_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    assert "not a regular file" in _fails(["validate", str(fifo)], capsys)
    folder = tmp_path / "dir.json"
    folder.mkdir()
    assert "is a directory" in _fails(["validate", str(folder)], capsys)
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00nodes")
    assert "not UTF-8" in _fails(["validate", str(binary)], capsys)
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * MAX_YAML_BYTES)
    assert "larger than 2 MiB" in _fails(["validate", str(big)], capsys)
    with pytest.raises(SpecError, match="larger than"):
        load_cluster(big)
    with pytest.raises(SpecError, match="is a directory"):
        load_plan(folder)
