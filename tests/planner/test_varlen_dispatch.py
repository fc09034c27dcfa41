"""Per-sequence cost, packing, dispatch and step layouts over several strategies."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from planner.cluster import load_cluster
from planner.cost import ProfileSet, one_f_one_b_time, stage_memory
from planner.cost.memory import GIB
from planner.errors import SpecError
from planner.model import PRESETS
from planner.plan import Pipeline, Plan, PlanOptions, Stage
from planner.varlen.dispatch import dispatch
from planner.varlen.packing import pack
from planner.varlen.seq_cost import PipelineCost, SeqCost, fit_seq_cost, pipeline_costs
from planner.varlen.step_layout import StrategyCost, plan_step
from planner.varlen.synthetic import PRESETS as TAILS

H100X4 = Path(__file__).resolve().parents[2] / "examples" / "clusters" / "h100x4.yaml"


def _plan(model, pipes: list[list[tuple[list[int], int]]], recompute: str = "none") -> Plan:
    """Pipelines of stages ([device indices], layers) on node h100 of examples/clusters/h100x4.yaml."""
    out = []
    for stages in pipes:
        start, st = 0, []
        for devs, n in stages:
            st.append(Stage(tuple(f"h100:{d}" for d in devs), len(devs), (start, start + n)))
            start += n
        out.append(Pipeline(1, 1, tuple(st)))
    return Plan(model, len(out), tuple(out), PlanOptions(recompute=recompute))


def test_fit_recovers_an_exact_quadratic() -> None:
    s = [128, 512, 2048, 8192]
    fit = fit_seq_cost(s, [3e-9 * x * x + 2e-5 * x + 1e-3 for x in s])
    assert fit.a == pytest.approx(3e-9, rel=1e-6) and fit.b == pytest.approx(2e-5, rel=1e-6)
    assert fit.c == pytest.approx(1e-3, rel=1e-6) and fit.fit_error < 1e-9
    assert fit.micro_batch_s([100, 200]) == pytest.approx(3e-9 * 50_000 + 2e-5 * 300 + 1e-3)


def test_stage_costs_and_token_caps_of_a_real_plan() -> None:
    """llama2-7b at 16K on 4 H100s (measured profile, full recompute): the fit follows the cost model within 15 %;
    a TP 4 stage holding every layer costs less per token than the slowest stage of TP 2 + PP 2;
    the token cap is where the stage's memory meets the device's; equal micro-batches give the
    1F1B closed form."""
    cluster = load_cluster(H100X4)
    m = replace(PRESETS["llama2-7b"], seq_len=16384)
    [c4] = pipeline_costs(_plan(m, [[([0, 1, 2, 3], 32)]], "full"), cluster)
    [c22] = pipeline_costs(_plan(m, [[([0, 1], 16), ([2, 3], 16)]], "full"), cluster)
    for c in (c4, c22):
        assert all(st.a > 0 and st.b > 0 and st.fit_error < 0.15 for st in c.stages)
        assert 16384 <= c.token_cap < 10**7 and math.isinf(c.share_cap)
    assert c4.bottleneck().b < 2 * c22.bottleneck().b
    prof = ProfileSet(cluster.catalog)

    def need(tokens: int) -> float:
        return stage_memory(m, layers=32, tp=4, first=True, last=True, micro_batch=1, in_flight=1, dtype="bf16",
                            recompute="full", seq_len=tokens, params=prof.params).total + prof.params.comm_gib * GIB
    capacity = cluster.device("h100:0").memory_gib * GIB
    assert need(c4.token_cap) <= capacity < need(c4.token_cap + 64)
    [selective] = pipeline_costs(_plan(m, [[([0, 1, 2, 3], 32)]], "selective"), cluster)
    assert selective.token_cap < 16384 < c4.token_cap  # at 16K this model needs full recompute on TP 4
    f = [st.micro_batch_s([4096]) for st in c22.stages]
    assert c22.time([[4096]] * 5) == pytest.approx(one_f_one_b_time(f, [0.0] * len(f), 5))


def _two_stage(cap: int, c: float = 100.0) -> PipelineCost:
    return PipelineCost((SeqCost(0.0, 1.0, c), SeqCost(0.0, 1.0, c)), cap, math.inf)


def test_packing_ilp_beats_longest_processing_time_first() -> None:
    """Costs 3, 3, 2, 2, 2 into two micro-batches: LPT gives 7 + 5, the ILP 6 + 6 (a smaller
    largest micro-batch: a shorter fill and drain of the 2-stage pipeline)."""
    cost = _two_stage(cap=7)
    greedy = pack([3, 3, 2, 2, 2], cost, refine=False)
    best = pack([3, 3, 2, 2, 2], cost)
    assert len(greedy.micro_batches) == len(best.micro_batches) == 2
    assert max(sum([3, 3, 2, 2, 2][i] for i in mb) for mb in greedy.micro_batches) == 7
    assert best.refined and sorted(map(sorted, best.micro_batches)) == [[0, 1], [2, 3, 4]]
    assert best.time_s == pytest.approx(greedy.time_s - 1)


def test_packing_respects_the_cap_and_packs_everything_once() -> None:
    rng = np.random.Generator(np.random.PCG64(3))
    lengths = [int(x) for x in rng.integers(1, 3000, 60)]
    cost = PipelineCost((SeqCost(1e-9, 1e-5, 2e-3),) * 3, 4096, math.inf)
    pk = pack(lengths, cost)
    assert sorted(i for mb in pk.micro_batches for i in mb) == list(range(60))
    assert all(sum(lengths[i] for i in mb) <= 4096 for mb in pk.micro_batches)
    assert pk.time_s == pytest.approx(cost.time([[lengths[i] for i in mb] for mb in pk.micro_batches]))
    with pytest.raises(SpecError, match="token cap"):
        pack([5000], cost)
    # one stage: the packing's balance does not matter, only the micro-batch count (fewest)
    single = PipelineCost((SeqCost(0.0, 1e-5, 1e-3),), 4096, math.inf)
    assert len(pack(lengths, single).micro_batches) == math.ceil(sum(lengths) / 4096) or \
        all(sum(lengths[i] for i in mb) > 4096 - 3000 for mb in pack(lengths, single).micro_batches)


def test_dispatch_respects_caps_balances_and_is_deterministic() -> None:
    """One long-sequence pipeline (cap 20K, faster per token) next to two short-sequence ones (cap
    6K): sequences above 6K go to the long pipeline; the slowest pipeline is within 25 % of the
    fastest; the ILP-refined result is no worse than the greedy; the randomised greedy is seeded (the same
    input gives the same dispatch; the ILP under a wall-clock cap need not, so training computes a
    step's layout on one rank and broadcasts it)."""
    rng = np.random.Generator(np.random.PCG64(1))
    lengths = TAILS["commoncrawl"].sequences(80, 16384, rng)
    big = PipelineCost((SeqCost(1e-10, 1.2e-5, 0.01),), 20000, math.inf)
    small = PipelineCost((SeqCost(3e-10, 4e-5, 0.005), SeqCost(3e-10, 4e-5, 0.005)), 6000, math.inf)
    d = dispatch(lengths, [big, small, small], time_limit_s=1.0)
    flat = sorted(i for p in d.pipelines for mb in p for i in mb)
    assert flat == list(range(len(lengths)))
    for j, cap in enumerate((20000, 6000, 6000)):
        assert all(lengths[i] <= cap for mb in d.pipelines[j] for i in mb)
    assert any(s > 6000 for s in lengths)
    assert max(d.pipeline_s) <= 1.25 * min(d.pipeline_s)
    greedy = dispatch(lengths, [big, small, small], refine=False)
    assert d.time_s <= greedy.time_s * (1 + 1e-9)
    assert dispatch(lengths, [big, small, small], refine=False).pipelines == greedy.pipelines  # seeded
    with pytest.raises(SpecError, match="fits no pipeline"):
        dispatch([30000], [big, small])


def test_gpipe_share_cap_bounds_a_pipeline_step() -> None:
    g = PipelineCost((SeqCost(0.0, 1e-5, 1e-3),) * 2, 4000, 8000.0, "gpipe")
    f = PipelineCost((SeqCost(0.0, 1e-5, 1e-3),) * 2, 4000, math.inf)
    d = dispatch([3000] * 10, [g, f])
    assert sum(3000 for mb in d.pipelines[0] for _ in mb) <= 8000


def _strategies() -> list[StrategyCost]:
    """Three hand-made strategies of a 4-device host: DP (cheap per token, 4K cap), TP 2 x 2
    (8K), TP 4 (16K, dearer per token)."""
    dp = tuple(PipelineCost((SeqCost(4e-10, 4e-5, 2e-3),), 4096, math.inf) for _ in range(4))
    tp2 = tuple(PipelineCost((SeqCost(2.2e-10, 2.2e-5, 2e-3),), 8192, math.inf) for _ in range(2))
    tp4 = (PipelineCost((SeqCost(1.2e-10, 1.2e-5, 2e-3),), 16384, math.inf),)
    return [StrategyCost("dp4", dp, 0.0), StrategyCost("tp2x2", tp2, 0.02), StrategyCost("tp4", tp4, 0.02)]


def test_step_layout_hot_switching_never_worse_than_one_static_strategy() -> None:
    rng = np.random.Generator(np.random.PCG64(5))
    strategies = _strategies()
    for _ in range(3):
        lengths = TAILS["commoncrawl"].sequences(60, 16384, rng)
        hot = plan_step(lengths, strategies)
        covered = sorted(i for ph in hot.phases for p in ph.pipelines for mb in p for i in mb)
        assert covered == list(range(len(lengths)))
        for ph in hot.phases:
            cap = strategies[ph.strategy].max_len
            assert all(lengths[i] <= cap for i in ph.sequences)
        static = plan_step(lengths, [strategies[2]])
        assert hot.time_s <= static.time_s * (1 + 1e-9)
        hand = plan_step(lengths, strategies, assign="threshold")
        assert {ph.strategy for ph in hand.phases} <= {0, 1, 2}
        for ph in hand.phases:  # HotSPa's rule: the smallest bucket that holds the sequence
            lo = {0: 0, 1: 4096, 2: 8192}[ph.strategy]
            assert all(lo < lengths[i] for i in ph.sequences)


def test_uniform_lengths_use_one_strategy_without_switching() -> None:
    hot = plan_step([4096] * 32, _strategies())
    assert len(hot.phases) == 1 and hot.switch_s == 0.0
    with pytest.raises(SpecError, match="fits no strategy"):
        plan_step([20000], _strategies())
    with pytest.raises(SpecError, match="assign"):
        plan_step([10], _strategies(), assign="random")
