"""``hexiscale train`` with a strategy pool as ``--plan``: the one-line errors of its flags, before
any process group (pre-flight)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from executor.data.doc_source import SyntheticDocs, TokenFileDocs
from executor.data.pool_source import doc_source
from executor.data.token_file import write_token_file
from executor.train.config import TrainConfig
from executor.train.setup import resolve_plan
from planner.errors import SpecError

ROOT = Path(__file__).resolve().parents[2]
POOL = ROOT / "tests" / "data" / "pool-tiny-h100x4.json"
CLUSTER = ROOT / "examples" / "clusters" / "h100x4.yaml"
PLAN = ROOT / "examples" / "plans" / "demo-cpu-4-tiny.json"


def _source(**kw):  # type: ignore[no-untyped-def]
    config = TrainConfig.flat(plan=str(POOL), cluster=str(CLUSTER), **kw)
    plan, cluster, pool = resolve_plan(config)
    assert pool is not None and plan == pool.home_plan and cluster is not None
    return doc_source(config, pool, scan=True)


def test_pool_sources_and_their_errors(tmp_path: Path) -> None:
    assert isinstance(_source(step_tokens=4096, lengths="synthetic:github"), SyntheticDocs)
    write_token_file(tmp_path / "c", [np.arange(n) % 200 for n in (30, 5000, 7)])
    docs = _source(step_tokens=4096, data=str(tmp_path / "c"))
    assert isinstance(docs, TokenFileDocs) and max(docs.lengths()) == 2048  # cut to the pool's context
    for kw, flag, words in (({}, "--step-tokens", "missing"), ({"step_tokens": 100}, "--step-tokens", "fewer"),
                            ({"step_tokens": 4096}, "--lengths", "missing"),
                            ({"step_tokens": 4096, "lengths": "synthetic:books"}, "", "books"),
                            ({"step_tokens": 4096, "lengths": "synthetic:github", "data": str(tmp_path / "c")},
                             "--lengths", "together with --data"),
                            ({"step_tokens": 4096, "lengths": "synthetic:github", "trace": "t.json"}, "--trace",
                             "not available")):
        with pytest.raises(SpecError, match=words) as err:
            _source(**kw)
        assert str(err.value).count("\n") == 0 and (not flag or err.value.path == flag)
    with pytest.raises(SpecError, match="--cluster: missing"):
        resolve_plan(TrainConfig.flat(plan=str(POOL), step_tokens=4096))
    with pytest.raises(SpecError, match="not a strategy pool"):
        resolve_plan(TrainConfig.flat(plan=str(PLAN), step_tokens=4096))
    with pytest.raises(SpecError, match="--assign"):
        TrainConfig.flat(plan=str(POOL), assign="random")


def test_a_pool_strategy_off_the_cluster_names_its_path(tmp_path: Path) -> None:
    data = json.loads(POOL.read_text())
    for st in data["strategies"]:
        st["plan"]["pipelines"][0]["stages"][0]["devices"][0] = "a100:0"
    for st in data["strategies"][1:]:
        st["plan"]["pipelines"][0]["stages"][0]["devices"] = ["a100:0", "h100:1", "h100:2", "h100:3"]
    path = tmp_path / "pool.json"
    path.write_text(json.dumps(data))
    with pytest.raises(SpecError, match=r"strategies\[0\]\.plan.*a100:0"):
        resolve_plan(TrainConfig.flat(plan=str(path), cluster=str(CLUSTER)))
