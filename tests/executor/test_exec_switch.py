"""THE SWITCH ORACLE: after an in-process layout switch (executor.switch.state_move), training continues
exactly as a run that used the new plan from that step with the same state.

Every case trains the old plan for ``SPLIT`` steps, switches (devices leave, join, or both; the
pipeline count, TP and CP degrees and the ZeRO setting change: into and out of context-parallel stages,
ZeRO-1 over a lone pipeline's CP slots too), trains the new plan to ``STEPS``. Checks:

* right after the switch, every weight and every AdamW moment equals the old layout's (1e-6 rel.);
* the losses and, at the end, every weight and Adam moment equal those of the baseline — the new
  plan loaded from a checkpoint of the old one at ``SPLIT`` — to 1e-6 relative;
* every loss equals the dense single-process reference (the oracle's 1e-5).
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from exec_jobs import ORACLE_OPTIM, global_batches
from hypothesis import HealthCheck, given, settings
from switch_jobs import detach_world_job, retire_job, switch_oracle_job, worlds_left
from torch.testing import assert_close

from executor.state.state_pieces import narrow
from executor.switch.state_move import SWITCH_PARTS, SwitchStats
from planner.layout import logical_params
from planner.model import ModelSpec
from planner.plan import Plan, uses_cp
from planner.state_layout import MOMENTS, rank_states, state_tensor, zero_sharded
from planner.state_move_plan import ReshardPlan, reshard_plan
from tests.support.random_plans import TINY, TINY8, named_plan, plan_pairs
from tests.support.reference import ReferenceRun, reference_train

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("executor-pool")]
STEPS, SPLIT = 4, 2


def _plan(model: ModelSpec, pipes: list[tuple[int, list[tuple[Any, ...]]]], zero: int = 0) -> Plan:
    """Stages ``(devices, n_layers[, cp])`` (named_plan)."""
    return named_plan(model, pipes, zero=zero, micro=2)


CASES: dict[str, tuple[Plan, Plan]] = {
    # a:3 leaves: 4 -> 3 devices, TP 2 <-> 1, stage counts change, ZeRO-1 on both sides
    "leave-4-to-3-zero1": (_plan(TINY, [(3, [(["a:0", "a:1"], 4)]), (3, [(["a:2"], 2), (["a:3"], 2)])], zero=1),
                           _plan(TINY, [(2, [(["a:0"], 4)]), (4, [(["a:1", "a:2"], 4)])], zero=1)),
    # two devices of node b join: 1 -> 3 pipelines, ZeRO 0 -> 1
    "join-2-to-4-zero0-to-1": (_plan(TINY, [(6, [(["a:0"], 2), (["a:1"], 2)])]),
                               _plan(TINY, [(2, [(["a:1"], 4)]), (3, [(["b:0", "b:1"], 4)]), (1, [(["a:0"], 4)])],
                                     zero=1)),
    # the same five devices in another order: TP 4 -> TP 2, ZeRO 1 -> 0
    "same-devices-tp4-to-tp2-zero1-to-0": (
        _plan(TINY8, [(4, [(["a:0", "a:1", "a:2", "a:3"], 8)]), (2, [(["b:0"], 8)])], zero=1),
        _plan(TINY8, [(3, [(["b:0", "a:0"], 4), (["a:1"], 4)]), (3, [(["a:2", "a:3"], 8)])])),
    # disjoint device sets: everything moves (leavers and joiners in one switch world)
    "disjoint-2-to-3": (_plan(TINY, [(4, [(["a:0"], 1), (["a:1"], 3)])]),
                        _plan(TINY, [(1, [(["b:0"], 4)]), (3, [(["b:1", "b:2"], 4)])], zero=1)),
    # context parallelism (stages (devices, layers, cp)). Out of a lone pipeline whose every stage is
    # cp 2 (ZeRO-1 over the CP slots, state_layout.zero_sharded) into two pipelines without CP; a:3 leaves
    "leave-lone-cp2-cp2-zero1-to-no-cp": (
        _plan(TINY, [(6, [(["a:0", "a:1"], 2, 2), (["a:2", "a:3"], 2, 2)])], zero=1),
        _plan(TINY, [(2, [(["a:0"], 4)]), (4, [(["a:1", "a:2"], 4)])], zero=1)),
    # into it: two ZeRO-0 pipelines without CP -> the lone cp 2 / cp 2 pipeline under ZeRO-1; a:2 leaves,
    # b:0 and b:1 join
    "swap-no-cp-to-lone-cp2-cp2-zero1": (
        _plan(TINY, [(3, [(["a:0", "a:1"], 4)]), (3, [(["a:2"], 4)])]),
        _plan(TINY, [(6, [(["a:0", "a:1"], 2, 2), (["b:0", "b:1"], 2, 2)])], zero=1)),
    # CP into another CP mesh: cp 2 x tp 2 beside a tp-1 pipeline -> one cp 4 x tp 1 stage (slots reordered)
    "cp2xtp2-beside-tp1-to-lone-cp4-zero1": (
        _plan(TINY, [(4, [(["a:0", "a:1", "a:2", "a:3"], 4, 2)]), (2, [(["b:0"], 4)])], zero=1),
        _plan(TINY, [(6, [(["b:0", "a:1", "a:0", "b:1"], 4, 4)])], zero=1)),
    # a cp 1 stage after a cp 2 one (whole Adam state, no ZeRO) -> a cp 2 stage first beside a second pipeline
    "cp2-then-tp2-zero0-to-cp2-beside-tp1-zero1": (
        _plan(TINY, [(4, [(["a:0", "a:1"], 2, 2), (["a:2", "a:3"], 2)])]),
        _plan(TINY, [(2, [(["a:3", "a:2"], 3, 2), (["a:1"], 1)]), (2, [(["b:0"], 4)])], zero=1)),
}


@functools.cache
def _reference(model: ModelSpec, batch: int) -> tuple[list[torch.Tensor], ReferenceRun]:
    batches = global_batches(model, batch, STEPS, seed=batch + 7)
    return batches, reference_train(model, batches, optim=ORACLE_OPTIM)


def _assemble(model: ModelSpec, results: list[dict], key: str) -> dict[str, torch.Tensor]:
    """Logical state tensors rebuilt from every process's holdings under ``key`` (each covered)."""
    shapes = {state_tensor(k, i.name): i.shape for i in logical_params(model) for k in ("model", *MOMENTS)}
    out = {t: torch.full(s, float("nan")) for t, s in shapes.items()}
    for r in results:
        for tensor, chunk, values in r.get(key, []):
            out[tensor][tuple(slice(o, o + n) for o, n in zip(chunk.offsets, chunk.sizes))] = values
    for t, v in out.items():
        assert not v.isnan().any(), f"{key}: {t} is not fully held"
    return out


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], what: str, rtol: float = 1e-6) -> None:
    for t in a:
        assert_close(a[t], b[t], rtol=rtol, atol=0, msg=lambda m, t=t: f"{what} {t}: {m}")


def check_switch(pool, old: Plan, new: Plan, tmp_path, *, ref_rtol: float = 1e-5,  # type: ignore[no-untyped-def]
                 restart_rtol: float = 1e-6) -> list[dict]:
    """``ref_rtol``: losses vs the dense reference; ``restart_rtol``: the run after the switch vs the
    restart (the moved state itself must be equal to 1e-6 everywhere: it is copied, not computed)."""
    batches, ref = _reference(old.model, old.global_batch_size)
    res = pool.run(switch_oracle_job, old, new, batches, SPLIT, str(tmp_path / "at-split"), ORACLE_OPTIM)
    by_dev = {r["device"]: r for r in res}
    for d in old.devices:
        assert_close(by_dev[d]["old_losses"], ref.losses[:SPLIT], rtol=ref_rtol, atol=0, msg=f"old losses on {d}")
    for d in new.devices:
        r = by_dev[d]
        assert_close(r["new_losses"], ref.losses[SPLIT:], rtol=ref_rtol, atol=0, msg=f"losses after the switch on {d}")
        assert_close(r["new_losses"], r["restart_losses"], rtol=restart_rtol, atol=0, msg=f"switch vs restart on {d}")
    _same(_assemble(old.model, res, "old_state"), _assemble(old.model, res, "after_state"), "moved state")
    _same(_assemble(old.model, res, "final_state"), _assemble(old.model, res, "restart_state"), "final state",
          rtol=restart_rtol)
    return res


@pytest.mark.parametrize("name", list(CASES))
def test_switch_oracle(dist_pool, tmp_path, name: str) -> None:
    old, new = CASES[name]
    res = check_switch(dist_pool, old, new, tmp_path)
    stats = {r["device"]: r["stats"] for r in res if "stats" in r}
    assert set(stats) == set(old.devices) | set(new.devices)
    sent = sum(s["bytes_sent"] for s in stats.values())
    assert sent == sum(s["bytes_received"] for s in stats.values()) > 0
    assert all(stats[d]["bytes_received"] == 0 for d in old.devices if d not in new.devices)
    assert all(r["warmed"] for r in res if r["device"] in new.devices and r["device"] not in old.devices)
    rp = reshard_plan(old, new)
    for d, s in stats.items():
        # the exchange moves exactly the reshard plan's bytes (the connecting messages count nowhere)
        assert (s["bytes_sent"], s["bytes_received"], s["local_bytes"]) == (
            rp.bytes_out(d), rp.bytes_in(d), sum(p.nbytes for p in rp.local(d))), d
        assert s["peers"] == [b if a == d else a for a, b in rp.pairs() if d in (a, b)], d
        # a piece is sent from and received into the engines' own tensors; only strided views are staged
        assert s["packed_bytes"] == staged_bytes(rp, d), d
        # connecting the pairs is communicator set-up, apart from the transfer
        sw = SwitchStats(**s)
        assert sw.comm_s == s["world_setup_s"] + s["connect_s"] and (s["connect_s"] > 0 or not s["peers"]), d
        assert s["transfer_s"] == pytest.approx(s["local_s"] + s["pack_s"] + s["exchange_s"] + s["unpack_s"]), d
        # every interval of the call is in one part (waits for peers included, apart): nothing unaccounted
        assert sum(s[k] for k in SWITCH_PARTS) + sw.comm_s == pytest.approx(s["total_s"], rel=1e-9), d
        assert s["total_s"] > 0 and min(s[k] for k in SWITCH_PARTS) >= 0, d
    assert any(r["old_groups"] for r in res)  # each case has groups to retire
    check_retired(res, old, new)


def staged_bytes(rp: ReshardPlan, device: str) -> int:
    """Bytes of ``device``'s pieces that the exchange stages through a buffer (pure: the views on the
    meta device): those whose view in the sender's old or the receiver's new holdings is strided."""
    old, new = (next((s for s in rank_states(p) if s.device == device), None) for p in (rp.old, rp.new))

    def strided(held: Any, slot: int, piece: Any) -> bool:
        h = held.holdings[slot]
        return not narrow(torch.empty(h.chunk.sizes, device="meta"), h.chunk, piece.chunk).is_contiguous()

    out = sum(p.nbytes for (a, _), ps in rp.messages.items() if a == device for p in ps if strided(old, p.src_slot, p))
    return out + sum(p.nbytes for (_, b), ps in rp.messages.items() if b == device for p in ps
                     if strided(new, p.dst_slot, p))


def check_retired(res: list[dict], old: Plan, new: Plan) -> None:
    """The old plan's groups and the default groups the switch left (the old world, the switch
    world) outlive the switch and the new plan's first step (retired: alive, no longer torch's, a
    world whose members all stayed still works), then are destroyed on every process that held
    them — staying, joining or leaving — with their time reported (``retire_s``); torch then lists
    exactly the new plan's groups."""
    by_dev = {r["device"]: r for r in res}
    rp = reshard_plan(old, new)
    for d in set(old.devices) | set(new.devices):
        r = by_dev[d]
        worlds = worlds_left(rp, d)
        # what d retired, in order: the old plan's groups (one set), then each world it left
        counts = [len(old.devices)] * (d in old.devices) + [len(w) for w in worlds]
        assert r["old_groups_left"] == 0, d  # destroyed and freed: no leak
        assert r["stats"]["retire_s"] > 0 or not counts, d  # every holder met the others and destroyed its groups
        if d not in new.devices:  # a leaving process released everything inside the switch
            assert r["retired_after_retire_point"] == [], d
            continue
        held = [r["old_groups"]] * (d in old.devices) + [1] * len(worlds)
        assert r["retired_after_first_step"] == [{"count": c, "pending": True, "held": h, "listed_by_torch": 0}
                                                 for c, h in zip(counts, held)], d
        assert r["sums_on_retired_worlds"] == [float(len(w)) for w in worlds if set(w) <= set(new.devices)], d
        assert r["retired_after_retire_point"] == [{"count": c, "pending": False, "held": 0, "listed_by_torch": 0}
                                                   for c in counts], d
        assert r["retired_left"] == 0, d
        assert r["registry_is_the_new_plans"], d


@settings(max_examples=3, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow,
                                                                              HealthCheck.function_scoped_fixture])
@given(pair=plan_pairs(models=(TINY, TINY8)))
def test_switch_oracle_random_pairs(dist_pool, tmp_path_factory, pair: tuple[Plan, Plan]) -> None:
    res = check_switch(dist_pool, *pair, tmp_path_factory.mktemp("switch"))
    check_retired(res, *pair)


def test_cases_cover_the_matrix() -> None:
    pairs = list(CASES.values())
    assert any(len(a.pipelines) != len(b.pipelines) for a, b in pairs)
    assert any({s.tp for p in a.pipelines for s in p.stages} != {s.tp for p in b.pipelines for s in p.stages}
               for a, b in pairs)
    assert {(a.options.zero, b.options.zero) for a, b in pairs} >= {(0, 1), (1, 0), (1, 1)}
    assert any(set(b.devices) < set(a.devices) for a, b in pairs)  # pure leave
    assert any(set(a.devices) < set(b.devices) for a, b in pairs)  # pure join
    assert any(not set(a.devices) & set(b.devices) for a, b in pairs)
    # pieces sent as they are, and strided ones staged through a buffer (a TP shard's columns)
    staged = [staged_bytes(reshard_plan(a, b), d) for a, b in pairs for d in set(a.devices) | set(b.devices)]
    assert 0 in staged and any(staged)
    # context parallelism: out of CP, into CP, CP to another CP mesh; ZeRO-1 over a lone pipeline's CP slots
    assert {(uses_cp(a), uses_cp(b)) for a, b in pairs} >= {(True, False), (False, True), (True, True)}
    lone_cp = [p for a, b in pairs for p in (a, b) if uses_cp(p) and len(p.pipelines) == 1]
    assert any(zero_sharded(p) for p in lone_cp)


def test_cases_retire_worlds() -> None:
    """Among the cases, a world whose members all stay is retired (its detached group is used after
    the switch: check_retired), and a joiner holds a retired switch world (a join and a leave in one
    switch)."""
    all_stay = joiner_holds = False
    for old, new in CASES.values():
        rp = reshard_plan(old, new)
        for d in set(old.devices) | set(new.devices):
            worlds = worlds_left(rp, d)
            all_stay |= any(set(w) <= set(new.devices) for w in worlds)
            joiner_holds |= d not in old.devices and bool(worlds)
    assert all_stay and joiner_holds


def test_detached_world_leaves_torch_to_a_new_one(dist_pool) -> None:  # type: ignore[no-untyped-def]
    res = dist_pool.run(detach_world_job)
    n = float(len(res))
    for r in res:
        assert r == {"detached": [(True, False), (False, True)], "initialized": False, "group_count": 0,
                     "sums": [n] * 4, "alive_after_release": 0}


def test_retired_group_outlives_its_world_then_is_destroyed(dist_pool) -> None:  # type: ignore[no-untyped-def]
    res = dist_pool.run(retire_job)
    n = len(res)
    for r in res:
        assert r == {"torch_knows": False, "sum_after_world_change": float(n), "retire_s": r["retire_s"],
                     "alive_after_release": 0}
        assert r["retire_s"] > 0
