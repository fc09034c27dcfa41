"""The batch-split ILP (:func:`planner.search.batch_split.ilp_split`), solved by HiGHS through
highspy: hand-worked optima, a brute-force enumeration on tiny instances, no optimum -> None, and
no pulp anywhere (pulp 4 dropped ``LpStatus``; the planner crashed on Python 3.12)."""

from __future__ import annotations

import itertools
import math
import random
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from planner.search.batch_split import PipeType, allocate_batch, ilp_split

ROOT = Path(__file__).resolve().parents[2]


def brute_force(types: Sequence[PipeType], B: int, mu: int) -> float | None:
    """Every way to give ``B`` samples to the types; a type's pipelines share its samples as evenly
    as possible and run the fewest micro-batches of at most ``mu`` samples."""
    best = None
    for cut in itertools.combinations(range(B + len(types) - 1), len(types) - 1):
        bounds = (-1, *cut, B + len(types) - 1)
        shares = [bounds[i + 1] - bounds[i] - 1 for i in range(len(types))]
        times = []
        for t, s in zip(types, shares):
            if s == 0:
                continue
            m = math.ceil(math.ceil(s / t.count) / mu)
            if m > t.max_micro_batches:
                break
            times.append(t.time(m))
        else:
            best = max(times) if best is None else min(best, max(times))
    return best


def test_two_identical_pipelines_split_evenly() -> None:
    split = ilp_split([PipeType(2, 1.0, 4.0)], 8, 1)
    assert split is not None
    assert (split.base, split.extra, split.micro_batches) == ((4,), (0,), (4,))
    assert split.time_s == 7.0  # 3 micro-batches behind the bottleneck after the first one's 4 s


def test_memory_cap_moves_samples_to_the_slower_type() -> None:
    """Uncapped, the fast type takes 3 or 4 of 5 samples (step 4 s); held to 2 micro-batches it takes
    2 and the slow one 3: 2·2 + 2 = 6 s."""
    fast, slow = PipeType(1, 1.0, 1.0), PipeType(1, 2.0, 2.0)
    free = ilp_split([fast, slow], 5, 1)
    assert free is not None and free.time_s == 4.0
    capped = ilp_split([PipeType(1, 1.0, 1.0, max_micro_batches=2), slow], 5, 1)
    assert capped is not None
    assert (capped.base, capped.micro_batches, capped.time_s) == ((2, 3), (2, 3), 6.0)


def test_ilp_matches_brute_force_on_tiny_instances() -> None:
    rng = random.Random(11)
    for _ in range(60):
        types = [PipeType(rng.randint(1, 3), rng.choice([0.5, 1.0, rng.uniform(0.1, 2)]), rng.uniform(0.5, 4),
                          rng.choice([0.0, rng.uniform(0, 1)]), rng.choice([1 << 20, rng.randint(1, 4)]))
                 for _ in range(rng.randint(1, 3))]
        B, mu = rng.randint(1, 12), rng.choice([1, 2, 3])
        want = brute_force(types, B, mu)
        got = ilp_split(types, B, mu)
        assert (got is None) == (want is None), (types, B, mu)
        if got is not None:
            assert sum(t.count * q + r for t, q, r in zip(types, got.base, got.extra)) == B
            assert got.time_s == pytest.approx(want, rel=1e-6), (types, B, mu)


def test_no_optimum_gives_none_and_the_fallback_says_so_too() -> None:
    """Infeasible (one pipeline, one micro-batch of one sample, 5 samples): HiGHS reports it, the ILP
    gives None, and allocate_batch's greedy fallback finds nothing either."""
    types = [PipeType(1, 1.0, 1.0, max_micro_batches=1)]
    assert ilp_split(types, 5, 1) is None
    assert allocate_batch(types, 5, 1) is None


def test_planner_runs_without_pulp() -> None:
    """With pulp unimportable (as good as pulp 4 for the old code), the planner imports and the ILP
    solves; highspy is the only solver package."""
    code = ("import sys; sys.modules['pulp'] = None\n"
            "import planner.search.planner\n"
            "from planner.search.batch_split import PipeType, ilp_split\n"
            "print(ilp_split([PipeType(2, 1.0, 4.0)], 8, 1).time_s)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "7.0"
