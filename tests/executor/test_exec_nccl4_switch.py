"""The switch oracle on 4 NCCL ranks, one GPU each (skipped without 4 CUDA devices; ``make test-gpu``
runs it): the in-process switch of :mod:`executor.switch.state_move` — epoch worlds, batched
send/receive, the old plan's communicators and the default groups left retired and destroyed after
the first step (a detached default communicator alive beside the new one) — on the backend an
elastic job uses on GPUs, for a leave, a join, a disjoint move, a move out of and one into a
context-parallel layout, and random plan pairs on 4 devices (pipeline counts, TP and CP degrees and
ZeRO settings change).

Tolerances: the moved state is copied, so it must equal the old layout's to 1e-6 here too. The
losses are held to the dense CPU reference at the NCCL suite's 1e-4 (:mod:`test_exec_nccl4`:
CUDA kernels and NCCL's reduction order differ from the CPU's). The run after the switch against
the restart of the new plan: 1e-5 — same plan, same devices, same state, but CUDA's embedding
backward adds with atomics, whose order is not fixed from run to run.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from test_exec_switch import CASES, _plan, check_retired, check_switch, staged_bytes

from planner.plan import Plan
from planner.state_move_plan import reshard_plan
from tests.support.dist_testing import DistPool
from tests.support.random_plans import TINY, TINY8, UNIVERSE, plan_pairs

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 4,
                                 reason="needs 4 CUDA devices")]

FOUR = UNIVERSE[:4]  # pool rank p plays FOUR[p] on GPU p
REF_RTOL, RESTART_RTOL = 1e-4, 1e-5

CASES4: dict[str, tuple[Plan, Plan]] = {
    "leave-4-to-3-zero1": CASES["leave-4-to-3-zero1"],
    # 2 -> 4 devices: one 2-stage pipeline -> three pipelines (TP 2 in one), ZeRO 0 -> 1
    "join-2-to-4-zero0-to-1": (_plan(TINY, [(6, [(["a:0"], 2), (["a:1"], 2)])]),
                               _plan(TINY, [(2, [(["a:1"], 4)]), (3, [(["a:2", "a:3"], 4)]), (1, [(["a:0"], 4)])],
                                     zero=1)),
    # disjoint device sets: the two old devices leave, two new ones take everything (TP 1 -> 2)
    "disjoint-2-to-2-tp2": (_plan(TINY, [(4, [(["a:0"], 1), (["a:1"], 3)])]),
                            _plan(TINY, [(4, [(["a:2", "a:3"], 4)])])),
    # context parallelism: out of a lone cp 2 / cp 2 pipeline (ZeRO-1 over its CP slots), a:3 leaves
    "leave-lone-cp2-cp2-zero1-to-no-cp": CASES["leave-lone-cp2-cp2-zero1-to-no-cp"],
    # into one: a:2 and a:3 join a 2-stage pipeline, which becomes cp 2 x tp 2 (ZeRO 0 -> 1)
    "join-2-to-lone-cp2xtp2-zero1": (_plan(TINY, [(6, [(["a:0"], 2), (["a:1"], 2)])]),
                                     _plan(TINY, [(6, [(["a:2", "a:0", "a:3", "a:1"], 4, 2)])], zero=1)),
    # the elastic benchmark's leave: four TP-1 pipelines -> three, ZeRO-1 on both sides; the staying
    # ranks' weight buckets are adopted by the new engines, not copied (executor.switch.keep_local)
    "leave-dp4-to-dp3-zero1": (_plan(TINY, [(3, [([d], 4)]) for d in FOUR], zero=1),
                               _plan(TINY, [(4, [([d], 4)]) for d in FOUR[:3]], zero=1)),
    # and its join: three -> four (the staying ranks' weights adopted, their moments change range)
    "join-dp3-to-dp4-zero1": (_plan(TINY, [(4, [([d], 4)]) for d in FOUR[:3]], zero=1),
                              _plan(TINY, [(3, [([d], 4)]) for d in FOUR], zero=1)),
}
ADOPTS_WEIGHTS = {"leave-dp4-to-dp3-zero1", "join-dp3-to-dp4-zero1"}  # staying ranks keep every weight in place


@pytest.fixture(scope="module")
def nccl4() -> Iterator[DistPool]:
    pool = DistPool(4, timeout=300, backend="nccl", pg_timeout=120,
                    preload=("executor.switch.state_move", "switch_jobs"))
    yield pool
    pool.close()


def test_cases_fit_four_devices() -> None:
    for old, new in CASES4.values():
        assert set(old.devices) | set(new.devices) <= set(FOUR)


@pytest.mark.parametrize("name", list(CASES4))
def test_nccl4_switch_oracle(nccl4: DistPool, tmp_path, name: str) -> None:  # type: ignore[no-untyped-def]
    old, new = CASES4[name]
    res = check_switch(nccl4, old, new, tmp_path, ref_rtol=REF_RTOL, restart_rtol=RESTART_RTOL)
    stats = [r["stats"] for r in res if "stats" in r]
    assert sum(s["bytes_sent"] for s in stats) == sum(s["bytes_received"] for s in stats) > 0
    # pieces sent from and received into the engines' own tensors on NCCL; only strided ones staged
    rp = reshard_plan(old, new)
    assert {r["device"]: r["stats"]["packed_bytes"] for r in res if "stats" in r} == {
        d: staged_bytes(rp, d) for d in set(old.devices) | set(new.devices)}
    if name in ADOPTS_WEIGHTS:  # taken over in place by the new engine on the GPU too, not copied
        for r in (r for r in res if "stats" in r):
            kept = rp.local(r["device"]) if r["device"] in old.devices and r["device"] in new.devices else []
            weights = sum(p.nbytes for p in kept if p.tensor.startswith("model/"))
            assert weights <= r["stats"]["adopted_bytes"] <= sum(p.nbytes for p in kept), r["device"]
            assert weights > 0 or not kept, r["device"]
    check_retired(res, old, new)  # the old communicators and worlds: alive through the first step, then destroyed


@settings(max_examples=3, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow,
                                                                              HealthCheck.function_scoped_fixture])
@given(pair=plan_pairs(universe=FOUR, max_devices=4, models=(TINY, TINY8)))
def test_nccl4_switch_oracle_random_pairs(nccl4: DistPool, tmp_path_factory, pair: tuple[Plan, Plan]) -> None:  # type: ignore[no-untyped-def]
    res = check_switch(nccl4, *pair, tmp_path_factory.mktemp("switch"), ref_rtol=REF_RTOL, restart_rtol=RESTART_RTOL)
    check_retired(res, *pair)
