"""``benchmarks/executor/group_teardown.py --cpu-smoke``: the GPU program's whole path on 4 gloo
ranks (groups of 2 and 4 created, connected, used and destroyed; the table and the JSON). It
measures nothing that matters on GPUs."""

from __future__ import annotations

import json

import pytest

from benchmarks.executor.group_teardown import main

pytestmark = [pytest.mark.slow]


def test_smoke_times_every_group(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["--cpu-smoke", "--out", str(tmp_path)]) == 0
    [path] = tmp_path.glob("group_teardown_cpu_smoke_*.json")
    res = json.loads(path.read_text())
    assert [(r["kind"], r["mib"] >= 1) for r in res["rows"]] == [("pair", False), ("pair", True), ("all", False),
                                                                   ("all", True)]
    for r in res["rows"]:
        assert len(r["per_rank"]) == 4
        for rank in r["per_rank"]:
            assert len(rank["create_s"]) == len(rank["destroy_s"]) == len(rank["traffic_s"]) == 2
            assert all(t > 0 for k in ("create_s", "destroy_s", "traffic_s") for t in rank[k])
    assert res["date"] and res["torch"] and res["device"] == "cpu (gloo)"
    assert "| 4 ranks | 1 MiB |" in capsys.readouterr().out


def test_bad_flags_are_one_line(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["--cpu-smoke", "--groups", "0"]) == 2
    assert "--groups must be >= 1" in capsys.readouterr().err
