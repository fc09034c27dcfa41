"""The refinement: exact layer split (vs brute force and the analytic 2-stage optimum) and the
batch split (ILP vs bisection, per-pipeline batch sizes follow speed)."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from planner.search.batch_split import PipeType, allocate_batch, waterfill
from planner.search.layer_split import StageCost, split_layers

BIG = 1e18


def brute_force(stages: list[StageCost], L: int, m: int) -> float | None:
    best = None
    for cut in itertools.combinations(range(1, L), len(stages) - 1):
        bounds = (0, *cut, L)
        counts = [bounds[i + 1] - bounds[i] for i in range(len(stages))]
        if any(n > st.max_layers() for n, st in zip(counts, stages)):
            continue
        times = [st.time(n) for st, n in zip(stages, counts)]
        value = (m - 1) * max(times) + sum(times)
        best = value if best is None else min(best, value)
    return best


def test_split_matches_brute_force() -> None:
    rng = random.Random(7)
    for _ in range(400):
        S = rng.randint(1, 4)
        L = rng.randint(S, 12)
        m = rng.randint(1, 9)
        stages = [StageCost(rng.choice([1.0, 2.0, rng.uniform(0.5, 3)]), rng.choice([0.0, 1.0, rng.uniform(0, 3)]),
                            rng.uniform(1, 2), rng.uniform(0, 3), rng.uniform(5, 20)) for _ in range(S)]
        got = split_layers(stages, L, m)
        want = brute_force(stages, L, m)
        assert (got is None) == (want is None)
        if got is not None:
            assert sum(got.counts) == L and min(got.counts) >= 1
            assert got.pipeline_time(m) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("a1,e1,a2,e2,L,m", [(1.0, 0.0, 3.0, 0.0, 32, 8), (1.0, 2.0, 3.0, 5.0, 32, 16),
                                             (0.7, 0.3, 1.1, 0.9, 40, 64), (2.0, 0.0, 1.0, 4.0, 24, 4)])
def test_two_stage_split_is_the_analytic_optimum(a1: float, e1: float, a2: float, e2: float, L: int, m: int) -> None:
    """Two stages with per-layer times a1, a2 (speeds 1/a): the slower of the two paces the steady
    state, so the optimum is at the crossing a1·n + e1 = a2·(L-n) + e2, rounded down or up."""
    stages = [StageCost(a1, e1, 1.0, 0.0, BIG), StageCost(a2, e2, 1.0, 0.0, BIG)]
    cross = (a2 * L + e2 - e1) / (a1 + a2)

    def total(n: int) -> float:
        t = [a1 * n + e1, a2 * (L - n) + e2]
        return (m - 1) * max(t) + sum(t)

    options = [n for n in {math.floor(cross), math.ceil(cross)} if 1 <= n <= L - 1]
    best_n = min(options, key=lambda n: (total(n), n))
    got = split_layers(stages, L, m)
    assert got is not None
    assert total(got.counts[0]) == pytest.approx(total(best_n))
    assert got.counts[0] in options
    if a1 == 1.0 and e1 == 0.0 and a2 == 3.0 and e2 == 0.0:
        assert got.counts == (24, 8)  # three times faster gets three times the layers


def test_memory_caps_the_split() -> None:
    fast_small = StageCost(1.0, 0.0, 1.0, 0.0, 20.0)  # holds at most 20 layers
    slow = StageCost(3.0, 0.0, 1.0, 0.0, BIG)
    got = split_layers([fast_small, slow], 32, 8)
    assert got is not None and got.counts == (20, 12)
    assert split_layers([StageCost(1, 0, 1, 0, 10), StageCost(1, 0, 1, 0, 10)], 32, 4) is None
    assert split_layers([StageCost(1, 0, 1, 0, 10)] * 3, 2, 4) is None  # more stages than layers


def test_ilp_and_bisection_agree() -> None:
    rng = random.Random(3)
    for _ in range(120):
        types = [PipeType(rng.randint(1, 4), rng.uniform(0.01, 0.2), rng.uniform(0.05, 1), rng.uniform(0, 0.05),
                          rng.choice([1 << 20, rng.randint(1, 6)])) for _ in range(rng.randint(1, 4))]
        B, mu = rng.randint(1, 80), rng.choice([1, 2, 4])
        ilp = allocate_batch(types, B, mu)
        fill = waterfill(types, B, mu)
        assert (ilp is None) == (fill is None)
        if ilp is None or fill is None:
            continue
        for split in (ilp, fill):
            assert sum(t.count * q + r for t, q, r in zip(types, split.base, split.extra)) == B
            for q, r, m in zip(split.base, split.extra, split.micro_batches):
                if q + r:
                    assert m * mu >= q + (1 if r else 0)  # micro-batches of at most mu samples
        assert fill.time_s == pytest.approx(ilp.time_s, rel=1e-6)


def test_batch_follows_pipeline_speed() -> None:
    """A pipeline three times faster per micro-batch takes about three times the samples (a bit more:
    its warm-up is shorter too)."""
    fast, slow = PipeType(1, 0.1, 0.4), PipeType(1, 0.3, 1.2)
    split = allocate_batch([fast, slow], 64, 1)
    assert split is not None
    b_fast, b_slow = split.base[0] + split.extra[0], split.base[1] + split.extra[1]
    assert b_fast + b_slow == 64
    assert 2.5 < b_fast / b_slow < 4.0
    equal = max(fast.time(32), slow.time(32))
    assert split.time_s < 0.7 * equal
