"""Strategy pools: the file format, sub-clusters, and proposing a pool with the planner's search."""

from __future__ import annotations

import functools
import json
from dataclasses import replace
from pathlib import Path

import pytest

from planner.cluster import load_cluster
from planner.errors import SpecError
from planner.model import PRESETS
from planner.plan import Pipeline, Plan, Stage
from planner.validate import validate
from planner.varlen.pool import Strategy, StrategyPool, load_pool, pool_from_dict, strategy_costs, switch_estimate
from planner.varlen.propose import Proposal, propose_pool, sub_cluster
from planner.varlen.synthetic import PRESETS as TAILS

ROOT = Path(__file__).resolve().parents[2]
H100X4 = ROOT / "examples" / "clusters" / "h100x4.yaml"
SEED32 = ROOT / "examples" / "clusters" / "seed-32gpu-4types.yaml"


@functools.cache
def _proposal() -> Proposal:
    m = replace(PRESETS["llama2-7b"], seq_len=16384)
    return propose_pool(load_cluster(H100X4), m, TAILS["commoncrawl"].histogram(16384, 20_000), 131072,
                        time_limit_s=4.0)


def test_proposed_pool_is_valid_and_no_slower_than_static() -> None:
    """llama2-7b at 16K on 4 H100s: a plan per bucket (TP/PP where long sequences need memory),
    asymmetric plans (a long-sequence part next to short-sequence replicas), every kept plan valid
    on the cluster; hot switching's estimate is no slower than the best static strategy."""
    p = _proposal()
    cluster = load_cluster(H100X4)
    assert any(line.startswith("bucket <= 16384") for line in p.log)
    assert any(line.startswith("asymmetric:") for line in p.log)
    for s in p.pool.strategies:
        validate(s.plan, cluster)
        assert s.plan.model.seq_len == 16384
    est = p.estimate
    assert est["hot_switching_s"] <= est["static_s"] * (1 + 1e-6)
    assert est["hand_buckets_s"] > 0 and est["solve_s"] >= 0
    assert p.pool.strategies[p.pool.home].name in {s.name for s in p.pool.strategies}


def test_pool_file_round_trip_and_errors(tmp_path) -> None:
    pool = _proposal().pool
    pool.save(tmp_path / "pool.json")
    back = load_pool(tmp_path / "pool.json")
    assert back == pool and back.home == pool.home
    data = pool.to_dict()
    other = json.loads(json.dumps(data))
    other["strategies"].append({"name": data["strategies"][0]["name"], "plan": data["strategies"][0]["plan"]})
    with pytest.raises(SpecError, match="duplicate strategy name"):
        pool_from_dict(other)
    bad_home = {**data, "home": 7}
    with pytest.raises(SpecError, match="home"):
        pool_from_dict(bad_home)
    with pytest.raises(SpecError, match=r"strategies\[0\].plan"):
        pool_from_dict({**data, "strategies": [{"name": "x", "plan": {"format": "nope"}}]})
    (tmp_path / "bad.json").write_text(json.dumps({**data, "format": "hexiscale.pool/0"}))
    with pytest.raises(SpecError) as err:
        load_pool(tmp_path / "bad.json")
    assert "bad.json" in str(err.value)


def test_pool_plans_must_share_devices_and_model() -> None:
    base = _proposal().pool.strategies[0].plan
    fewer = replace(base, pipelines=(Pipeline(1, 1, (Stage(("h100:0",), 1, (0, 32)),)),), global_batch_size=1)
    with pytest.raises(SpecError, match="same devices"):
        StrategyPool(16384, (Strategy("a", base), Strategy("b", fewer)))
    with pytest.raises(SpecError, match="seq_len"):
        StrategyPool(32768, (Strategy("a", base),))


def test_switch_estimate_and_strategy_costs() -> None:
    pool = _proposal().pool
    cluster = load_cluster(H100X4)
    costs = strategy_costs(pool, cluster)
    assert costs[pool.home].switch_s == 0.0
    for k, c in enumerate(costs):
        assert c.max_len >= 2048 and (k == pool.home or c.switch_s == switch_estimate(pool.strategies[k].plan, cluster))
    # llama2-7b on two TP-1 replicas: each device moves 6 B x 6.7e9 over 450 GB/s NVLink (~0.09 s)
    dp2 = Plan(pool.model, 2, tuple(Pipeline(1, 1, (Stage((f"h100:{i}",), 1, (0, 32)),)) for i in range(2)))
    assert switch_estimate(dp2, cluster) == pytest.approx(6 * pool.model.param_count() / 450e9, rel=0.01)
    one = Plan(pool.model, 1, (Pipeline(1, 1, (Stage(("h100:0",), 1, (0, 32)),)),))
    assert switch_estimate(one, cluster) == 0.0  # one device: nothing to move between devices


def test_sub_cluster_renumbers_devices_and_keeps_links() -> None:
    cluster = load_cluster(SEED32)
    devs = [d.id for d in cluster.devices]
    pick = devs[3:5] + devs[-2:]
    sub, back = sub_cluster(cluster, pick)
    assert sorted(back.values()) == sorted(pick) and sub.num_devices == 4
    for new, old in back.items():
        assert sub.device(new).gpu == cluster.device(old).gpu
        assert sub.device(new).memory_gib == cluster.device(old).memory_gib
    a, b = list(back)[0], list(back)[-1]
    assert sub.link(a, b) == cluster.link(back[a], back[b])
