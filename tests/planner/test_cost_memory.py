"""Memory model: a hand-computed stage, parameter accounting, ZeRO-1, in-flight counts, OOM."""

from __future__ import annotations

import pytest
from _cost_fixtures import MODEL, cluster, plan

from planner.cost import GIB, CostParams, estimate, in_flight, stage_memory, stage_params
from planner.errors import PlanInfeasible
from planner.model import PRESETS

NO_OVERHEAD = CostParams(framework_gib=0.0, workspace_gib=0.0, fragmentation=0.0)


def test_middle_stage_by_hand() -> None:
    # h=1024, f=2816, heads=16, kv=512; layer_params = 11,798,528 (2,048 of them norms)
    p = 4 * ((11_798_528 - 2048) / 2 + 2048)
    assert stage_params(MODEL, 4, 2, False, False) == p == 23_601_152
    mem = stage_memory(MODEL, layers=4, tp=2, first=False, last=False, micro_batch=2, in_flight=3,
                       dtype="bf16", recompute="none", params=NO_OVERHEAD)
    assert mem.weights == 2 * p and mem.gradients == 4 * p and mem.optimizer == 12 * p
    # per token per layer: 2*(4*1024 + 2048/2 + 3*2816/2) + 8 + 2*1024/2 + 4*16/2 = 19,752 bytes
    assert mem.activations == 3 * 4 * 1024 * 19_752
    assert mem.overhead == 0.0
    sel = stage_memory(MODEL, layers=4, tp=2, first=False, last=False, micro_batch=2, in_flight=3,
                       dtype="bf16", recompute="selective", params=NO_OVERHEAD)
    assert sel.activations == 3 * 4 * 1024 * (19_752 - 1024 - 32)
    full = stage_memory(MODEL, layers=4, tp=2, first=False, last=False, micro_batch=2, in_flight=3,
                        dtype="bf16", recompute="full", params=NO_OVERHEAD)
    assert full.activations == 3 * 4 * 1024 * 2048 + 1024 * 19_752
    zero = stage_memory(MODEL, layers=4, tp=2, first=False, last=False, micro_batch=2, in_flight=3,
                        dtype="bf16", recompute="none", zero_shards=4, params=NO_OVERHEAD)
    assert zero.optimizer == 3 * p
    fp32 = stage_memory(MODEL, layers=4, tp=2, first=False, last=False, micro_batch=2, in_flight=3,
                        dtype="fp32", recompute="none", params=NO_OVERHEAD)
    assert fp32.weights == 4 * p and fp32.optimizer == 8 * p  # no separate master copy
    over = stage_memory(MODEL, layers=4, tp=2, first=False, last=False, micro_batch=2, in_flight=3,
                        dtype="bf16", recompute="none", params=CostParams(framework_gib=1.0, workspace_gib=0.5,
                                                                          fragmentation=0.1))
    assert over.overhead == pytest.approx(1.5 * GIB + 0.1 * (mem.total))


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_every_parameter_counted_once(tp: int) -> None:
    first = stage_params(MODEL, 3, tp, True, False)
    mid = stage_params(MODEL, 2, tp, False, False)
    last = stage_params(MODEL, 3, tp, False, True)
    h = MODEL.hidden_size
    replicated = 8 * 2 * h + h  # norms of 8 layers + final norm
    assert tp * (first + mid + last) - (tp - 1) * replicated == pytest.approx(MODEL.param_count())


def test_first_and_last_stage_extras() -> None:
    kw = dict(layers=2, tp=1, micro_batch=1, in_flight=1, params=NO_OVERHEAD)
    mid = stage_memory(MODEL, first=False, last=False, **kw)  # type: ignore[arg-type]
    first = stage_memory(MODEL, first=True, last=False, **kw)  # type: ignore[arg-type]
    last = stage_memory(MODEL, first=False, last=True, **kw)  # type: ignore[arg-type]
    t = MODEL.seq_len
    assert first.activations - mid.activations == t * 8
    assert last.activations - mid.activations == t * (2 * 1024 * 2 + 8192 * (2 + 4))
    assert first.weights - mid.weights == 2 * 8192 * 1024


def test_1f1b_holds_fewer_micro_batches_than_gpipe() -> None:
    c = cluster([("n", "fast", 4, 100.0)])
    stages = [(["n:0"], 2), (["n:1"], 2), (["n:2"], 2), (["n:3"], 2)]
    one = estimate(plan([(16, 8, stages)]), c)
    gp = estimate(plan([(16, 8, stages)], schedule="gpipe"), c)
    assert in_flight("1f1b", 4, 0, 8) == 4
    assert one.memory["n:0"].activations * 2 == pytest.approx(gp.memory["n:0"].activations)
    assert one.memory["n:1"].activations < one.memory["n:0"].activations


def test_oom_names_device_and_overflow() -> None:
    model = PRESETS["llama-1.3b"]
    c = cluster([("n", "slow", 2, 50.0)], devices={"n:1": {"memory_gib": 16}})
    p = plan([(8, 8, [(["n:0"], 12), (["n:1"], 12)])], model=model)
    est = estimate(p, c)
    assert [o["device"] for o in est.oom] == ["n:1"]
    need = stage_memory(model, layers=12, tp=1, first=False, last=True, micro_batch=1, in_flight=1,
                        dtype="bf16", recompute="none").total_gib
    assert est.oom[0]["need_gib"] == pytest.approx(need, abs=1e-3)
    assert est.oom[0]["over_gib"] == pytest.approx(need - 16, abs=1e-3)
    assert est.oom[0]["path"] == "pipelines[0].stages[1].devices[0]"
    assert est.memory_gib["n:0"] < 24  # the uncapped device fits
    with pytest.raises(PlanInfeasible, match=r"n:1 needs .* GiB but has 16\.00 GiB"):
        est.check_fits()
    # full recompute brings it under the cap
    assert estimate(plan([(8, 8, [(["n:0"], 12), (["n:1"], 12)])], model=model, recompute="full"), c).fits
