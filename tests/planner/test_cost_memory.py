"""Memory model: a hand-computed stage, parameter accounting, ZeRO-1, in-flight counts, OOM."""

from __future__ import annotations

import dataclasses

import pytest
from _cost_fixtures import MODEL, cluster, plan

from planner.cost import GIB, CostParams, estimate, in_flight, stage_memory, stage_params
from planner.cost.communicators import communicators
from planner.cost.memory import full_recompute_transient, head_activation_bytes, layer_activation_bytes
from planner.cost.params import DEFAULT_PARAMS
from planner.errors import PlanInfeasible
from planner.model import PRESETS

NO_OVERHEAD = CostParams(framework_gib=0.0, workspace_gib=0.0, fragmentation=0.0)


def test_middle_stage_by_hand() -> None:
    # h=1024, f=2816, 16 heads, kv=512; layer_params = 11,798,528 (2,048 of them norms)
    p = 4 * ((11_798_528 - 2048) / 2 + 2048)
    assert stage_params(MODEL, 4, 2, False, False) == p == 23_601_152
    kw = dict(layers=4, tp=2, first=False, last=False, micro_batch=2, in_flight=3, params=NO_OVERHEAD)
    mem = stage_memory(MODEL, dtype="bf16", recompute="none", **kw)  # type: ignore[arg-type]
    assert mem.weights == 4 * p and mem.gradients == 4 * p and mem.optimizer == 8 * p  # fp32 master params
    # per token per layer (e=2, r=4, t=2, K/V expanded to 1024):
    #   norms (fused: input and rstd) 2*(4*1024 + 4) = 8,200; casts 5*2*1024 = 10,240; MLP 4*2*2816/2 = 11,264;
    #   q,k,v 2*3*1024/2 = 3,072; attention output 2*1024/2 = 1,024; log-sum-exp 4*16/2 = 32 -> 33,832
    # plus per layer and micro-batch the bf16 RoPE tables for q and k: 4*512*64*2 = 262,144
    one = (11_798_528 - 2048) / 2 * 2  # one layer's bf16 weight copies (its matmul shard)
    out = 3 * 1024 * 1024 * 4  # the stage output kept for the backward, fp32
    rope = 262_144
    assert mem.activations == 3 * 4 * (1024 * 33_832 + rope) + out
    assert mem.weight_copies == 4 * one  # the engine's cast-once copies: one per stage, not per micro-batch
    assert mem.overhead == 0.0
    sel = stage_memory(MODEL, dtype="bf16", recompute="selective", **kw)  # type: ignore[arg-type]
    # q,k,v unexpanded 2*(1024 + 2*512)/2 = 2,048 instead of 3,072; no log-sum-exp
    assert sel.activations == 3 * 4 * (1024 * (33_832 - 3072 + 2048 - 32) + rope) + out
    full = stage_memory(MODEL, dtype="bf16", recompute="full", **kw)  # type: ignore[arg-type]
    # the layer inputs, and while one layer is recomputed its whole activations (its copies are the stage's)
    assert full.activations == 3 * 4 * 1024 * 4096 + 1024 * 33_832 + rope + out
    assert full.weight_copies == 4 * one
    zero = stage_memory(MODEL, dtype="bf16", recompute="none", zero_shards=4, **kw)  # type: ignore[arg-type]
    assert zero.optimizer == 2 * p
    fp32 = stage_memory(MODEL, dtype="fp32", recompute="none", **kw)  # type: ignore[arg-type]
    # e=4: no casts (2*4*1024 norm outputs instead of 5 casts), doubled q/k/v/MLP, no weight copies
    per = 8_200 + 2 * 4 * 1024 + 4 * 4 * 2816 / 2 + 4 * 3 * 1024 / 2 + 4 * 1024 / 2 + 32
    assert fp32.weights == 4 * p and fp32.optimizer == 8 * p
    assert fp32.activations == 3 * 4 * 1024 * per + out and fp32.weight_copies == 0
    over = stage_memory(MODEL, dtype="bf16", recompute="none", **{**kw, "params": CostParams(  # type: ignore[arg-type]
        framework_gib=1.0, workspace_gib=0.5, fragmentation=0.1)})
    assert over.overhead == pytest.approx(1.5 * GIB + 0.1 * mem.total)
    # measured bytes per layer (input included, weight casts not) replace the formula
    meas = stage_memory(MODEL, dtype="bf16", recompute="none", layer_activation=1e6, **kw)  # type: ignore[arg-type]
    assert meas.activations == 3 * 4 * 1e6 + out and meas.weight_copies == 4 * one


def test_the_autocast_path_before_cast_once_by_hand() -> None:
    """``CostParams.cast_once`` off prices the executor of runs recorded before 2026-11-27 01:25 UTC
    (benchmarks/fidelity/repredict.py): each micro-batch in flight saved its own weight casts, and a
    fully recomputed forward left autocast's cast cache of every matmul weight of the stage."""
    old = dataclasses.replace(NO_OVERHEAD, cast_once=False)
    kw = dict(layers=4, tp=2, first=False, last=False, micro_batch=2, in_flight=3, params=old)
    mem = stage_memory(MODEL, dtype="bf16", recompute="none", **kw)  # type: ignore[arg-type]
    one = (11_798_528 - 2048) / 2 * 2
    out, rope = 3 * 1024 * 1024 * 4, 262_144
    assert mem.activations == 3 * 4 * (1024 * 33_832 + rope + one) + out and mem.weight_copies == 0
    full = stage_memory(MODEL, dtype="bf16", recompute="full", **kw)  # type: ignore[arg-type]
    # the transient: the larger of a recomputed layer with its copies and the cache's 4 layers (larger here)
    assert 4 * one > 1024 * 33_832 + rope + one
    assert full.activations == 3 * 4 * 1024 * 4096 + 4 * one + out


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
    assert first.weights - mid.weights == 4 * 8192 * 1024
    # last: final norm (fused: input 4h + rstd 4), LM-head input cast 2h, fp32 softmax 4 per vocab
    # entry, target index and mask (9); and no stage output kept for a
    # next stage (4h)
    head = t * (4096 + 4 + 2048 + 8192 * 4 + 9) + t * 8192 * (2 + 8)  # + the loss's transient peak
    assert last.activations - mid.activations == head - t * 4096
    assert last.weight_copies - mid.weight_copies == 8192 * 1024 * 2  # the LM head's, once


@pytest.mark.parametrize("vocab", [8192, 2048])
def test_the_loss_and_a_recomputed_layer_are_not_transient_at_once(vocab: int) -> None:
    """The last stage's loss transient (forward and the head's backward) and a fully recomputed
    layer's (in its backward) come at different moments: the larger counts, whichever it is (the
    loss's ``V·(e + 8)`` a token at vocabulary 8192, the layer's ~49.7 KB a token at 2048)."""
    m = dataclasses.replace(MODEL, vocab_size=vocab)
    seq = m.seq_len
    kw = dict(layers=4, tp=1, first=False, last=True, micro_batch=1, dtype="bf16", recompute="full")

    def transient(params: CostParams) -> float:
        one, two = (stage_memory(m, in_flight=k, params=params, **kw).activations for k in (1, 2))  # type: ignore[arg-type]
        return one - (two - one)

    layer = full_recompute_transient(m, micro_batch=1, tp=1, dtype="bf16", layers=4, params=NO_OVERHEAD)
    loss = seq * m.vocab_size * (2 + 8)
    assert transient(NO_OVERHEAD) == pytest.approx(max(layer, loss))
    old = dataclasses.replace(NO_OVERHEAD, cast_once=False)  # autocast's cache ended the forward beside the loss
    layer_old = full_recompute_transient(m, micro_batch=1, tp=1, dtype="bf16", layers=4, params=old)
    assert transient(old) == pytest.approx(layer_old + loss)


def test_1f1b_holds_fewer_micro_batches_than_gpipe() -> None:
    c = cluster([("n", "fast", 4, 100.0)])
    stages = [(["n:0"], 2), (["n:1"], 2), (["n:2"], 2), (["n:3"], 2)]
    one = estimate(plan([(16, 8, stages)]), c)
    gp = estimate(plan([(16, 8, stages)], schedule="gpipe"), c)
    assert in_flight("1f1b", 4, 0, 8) == 4
    # 1F1B's first stage peaks holding 4 micro-batches with the gradients; GPipe's holds 8 before its
    # first backward, 7 with the gradients after it, whichever is larger
    a, g = one.memory["n:0"].activations / 4, one.memory["n:0"].gradients
    assert gp.memory["n:0"].activations == pytest.approx(8 * a if 8 * a > 7 * a + g else 7 * a)
    assert one.memory["n:1"].activations < one.memory["n:0"].activations


def test_oom_names_device_and_overflow() -> None:
    model = dataclasses.replace(PRESETS["llama-1.3b"], seq_len=2048)
    c = cluster([("n", "slow", 2, 50.0)], devices={"n:1": {"memory_gib": 16}})
    p = plan([(8, 8, [(["n:0"], 12), (["n:1"], 12)])], model=model)
    est = estimate(p, c)
    assert [o["device"] for o in est.oom] == ["n:1"]
    need = stage_memory(model, layers=12, tp=1, first=False, last=True, micro_batch=1, in_flight=1,
                        dtype="bf16", recompute="none").total_gib
    need += communicators(p)["n:1"] * DEFAULT_PARAMS.comm_gib  # the default group and the boundary's own
    assert communicators(p) == {"n:0": 2, "n:1": 2}
    assert est.oom[0]["need_gib"] == pytest.approx(need, abs=1e-3)
    assert est.oom[0]["over_gib"] == pytest.approx(need - 16, abs=1e-3)
    assert est.oom[0]["path"] == "pipelines[0].stages[1].devices[0]"
    assert est.memory_gib["n:0"] < 24  # the uncapped device fits
    with pytest.raises(PlanInfeasible, match=r"n:1 needs .* GiB but has 16\.00 GiB"):
        est.check_fits()
    # full recompute brings it under the cap
    assert estimate(plan([(8, 8, [(["n:0"], 12), (["n:1"], 12)])], model=model, recompute="full"), c).fits


def test_formulas_match_the_measured_profiles() -> None:
    """Every layer and head row of the committed measured profiles (executor/profiler on real GPUs),
    read through MeasuredProfile (the chain undone, the input in, the weight casts out), equals the
    memory formula to within 4 MiB a row: the CUDA caching allocator may hand out a cached block up
    to 1 MiB larger than asked (seen on TP-2 rows; TP-1 rows agree to about 1 KiB)."""
    from planner.catalog import default_catalog
    from planner.cost import MeasuredProfile, ProfileSet
    from planner.model import model_from_dict

    catalog = default_catalog()
    profiles = ProfileSet(catalog)
    checked = 0
    for entry in catalog.entries:
        meas = entry.measured or {}
        if entry.derived != "measured" or not meas.get("layer"):
            continue
        prof = profiles.get(entry.key)
        assert isinstance(prof, MeasuredProfile)
        model = model_from_dict(meas["model"])
        dtype = meas["dtype"]
        for kind in ("layer", "head"):
            for row in meas.get(kind, []):
                if "activation_bytes" not in row:
                    continue
                mb, s, tp, rc = row["micro_batch"], row["seq_len"], row["tp"], row.get("recompute", "none")
                m = dataclasses.replace(model, seq_len=max(model.seq_len, s))
                got = prof.activation_bytes(kind, m, mb, tp, dtype, rc, s)
                want = (layer_activation_bytes(m, mb, tp, dtype, rc, s, prof.params) if kind == "layer"
                        else head_activation_bytes(m, mb, tp, dtype, s, prof.params))
                assert got == pytest.approx(want, rel=0, abs=4 << 20), (entry.key, kind, row)
                checked += 1
    if not checked:
        pytest.skip("no measured profile committed")


def test_gradients_appear_at_the_first_backward() -> None:
    from planner.cost import held_with_grads

    assert held_with_grads("1f1b", 4, 0, 8) == 4  # a forward follows the first backward
    assert held_with_grads("1f1b", 4, 0, 4) == 3  # it does not: one micro-batch fewer
    assert held_with_grads("1f1b", 1, 0, 1) == 0
    assert held_with_grads("gpipe", 2, 1, 6) == 5
    kw = dict(layers=4, tp=1, first=False, last=False, micro_batch=2, dtype="bf16", params=NO_OVERHEAD)
    one = stage_memory(MODEL, in_flight=1, **kw)  # type: ignore[arg-type]
    g, a = one.gradients, one.activations
    # one micro-batch, no forward after the backward: the peak is max(A, G), not A + G
    alone = stage_memory(MODEL, in_flight=1, held_with_grads=0, **kw)  # type: ignore[arg-type]
    assert alone.total == pytest.approx(one.weights + one.weight_copies + one.optimizer + max(a, g))
    # several: max(w·A, (w-1)·A + G) with the breakdown of the moment that wins
    three = stage_memory(MODEL, in_flight=3, held_with_grads=2, **kw)  # type: ignore[arg-type]
    assert three.total == pytest.approx(one.weights + one.weight_copies + one.optimizer + max(3 * a, 2 * a + g))
    assert three.gradients in (0.0, g)
    steady = stage_memory(MODEL, in_flight=3, held_with_grads=3, **kw)  # type: ignore[arg-type]
    assert steady.total == pytest.approx(stage_memory(MODEL, in_flight=3, **kw).total)  # type: ignore[arg-type]


def test_state_bytes_by_layout() -> None:
    """The module docstring's table: fp32 weights, gradients and AdamW moments; with several
    pipelines the gradient buckets exist from the step's start; ZeRO-1 keeps 1/k of the moments
    and the reduce-scattered chunks (1/k of the gradients) until the update; a shard cut into
    several sync slices has its own gradient (and under ZeRO-1 its own weight) beside its slots."""
    from planner.cost import state_bytes

    p, x = 1000.0, 300.0
    one = state_bytes(p)
    assert (one.weights, one.gradients, one.early_gradients, one.optimizer, one.reduced) == (4 * p, 4 * p, 0, 8 * p, 0)
    assert one.end_of_backward == one.after_step == 16 * p
    dp = state_bytes(p, pipelines=4, partial=x)
    assert (dp.weights, dp.gradients, dp.early_gradients, dp.optimizer, dp.reduced) == (
        4 * p, 4 * p + 4 * x, 4 * p, 8 * p, 0)
    assert dp.after_step == 16 * p  # the buckets of cut shards are dropped after the all-reduce
    z = state_bytes(p, pipelines=4, zero_shards=4, partial=x)
    assert (z.weights, z.gradients, z.early_gradients, z.optimizer, z.reduced) == (
        4 * p + 4 * x, 4 * p + 4 * x, 4 * p, 2 * p, p)
    assert z.end_of_backward == 4 * p + 4 * x + 4 * p + 4 * x + 2 * p + p
    assert z.after_step == 4 * p + 4 * x + 2 * p  # the gradients and chunks are gone after the update
    assert state_bytes(p, zero_shards=4) == state_bytes(p, pipelines=4, zero_shards=4)  # k owners: k pipelines


def test_zero1_end_of_backward_beyond_the_schedule() -> None:
    """ZeRO-1's reduced chunks live at the end of the last backward, when the activations are freed:
    they add to the peak only where they outgrow the schedule's activations (``step_buffers``, the
    excess), and what the device reserves is what it needs (``required == total``). llama2-7b,
    half the layers on a last stage, 2 owners (the PP2 x DP2 plan of the old 24 % miss)."""
    from planner.cost import state_bytes

    big = PRESETS["llama2-7b"]
    kw = dict(layers=16, tp=1, first=False, last=True, micro_batch=1, in_flight=1, dtype="bf16",
              recompute="none", params=NO_OVERHEAD, held_with_grads=1)
    p = stage_params(big, 16, 1, False, True)
    plain = stage_memory(big, zero_shards=1, **kw)  # type: ignore[arg-type]
    zero = stage_memory(big, zero_shards=2, **kw)  # type: ignore[arg-type]
    assert plain.step_buffers == zero.step_buffers == 0.0  # 4P/2 = 6.3 GiB < one micro-batch's activations
    assert zero.total == pytest.approx(plain.total - 4 * p)  # Adam halved, nothing else on top
    assert (zero.weights, zero.gradients, zero.optimizer) == (4 * p, 4 * p, 4 * p)
    assert zero.required == zero.total and plain.required == plain.total
    # tiny fp32 micro-batches (no bf16 weight copies held): the end of the backward (weights,
    # gradients, Adam, chunks) is the peak
    short = stage_memory(big, zero_shards=2, **{**kw, "dtype": "fp32", "seq_len": 16})  # type: ignore[arg-type]
    end = state_bytes(p, zero_shards=2).end_of_backward
    assert short.step_buffers > 0
    assert short.total == pytest.approx(end)
    assert short.total - short.step_buffers == pytest.approx(
        short.weights + short.gradients + short.optimizer + short.activations)


def test_several_pipelines_allocate_gradients_at_the_start() -> None:
    """With several pipelines the flat gradient buckets are bound before the first forward
    (executor.parallel.grad_sync.GradSync.arm): the peak is in_flight·A + G even where one pipeline's
    autograd gradients would only come after the activations of a micro-batch are freed."""
    kw = dict(layers=4, tp=1, first=False, last=False, micro_batch=2, dtype="bf16", params=NO_OVERHEAD)
    one = stage_memory(MODEL, in_flight=1, held_with_grads=0, **kw)  # type: ignore[arg-type]
    two = stage_memory(MODEL, in_flight=1, held_with_grads=0, pipelines=2, **kw)  # type: ignore[arg-type]
    a = stage_memory(MODEL, in_flight=1, **kw).activations  # type: ignore[arg-type]
    g = 4 * stage_params(MODEL, 4, 1, False, False)
    assert one.total == pytest.approx(one.weights + one.weight_copies + one.optimizer + max(a, g))
    assert two.total == pytest.approx(two.weights + two.weight_copies + two.optimizer + a + g)
    assert two.gradients == g


def test_zero1_state_in_the_estimate() -> None:
    """Every device of a ZeRO-1 plan carries the state of its layout in the estimate. Pipeline 0
    runs TP 1 where pipeline 1 runs TP 2: the finest common layout cuts every TP-sharded shard of
    pipeline 0 in two slices, so those devices keep their own weights and gradients beside the
    slots; pipeline 1's shards are whole."""
    from planner.cost import partial_params, state_bytes

    n = MODEL.num_layers
    pl = plan([(4, 4, [(["n:0"], n // 2), (["n:1"], n - n // 2)]), (4, 4, [(["n:2", "n:3"], n)])], zero=1)
    est = estimate(pl, cluster([("n", "fast", 4, 100.0)]))
    sharded = MODEL.num_layers * (MODEL.layer_params() - 2 * MODEL.hidden_size)
    vh = MODEL.vocab_size * MODEL.hidden_size
    assert partial_params(pl, 0, 0) == sharded / 2 + vh  # the embedding is cut too
    assert partial_params(pl, 0, 1) == sharded / 2 + vh  # and the LM head
    assert partial_params(pl, 1, 0) == 0.0
    for pi, pipe in enumerate(pl.pipelines):
        for si, st in enumerate(pipe.stages):
            p = stage_params(pl.model, st.num_layers, st.tp, si == 0, si == len(pipe.stages) - 1)
            want = state_bytes(p, pipelines=2, zero_shards=2, partial=partial_params(pl, pi, si))
            for d in st.devices:
                mem = est.memory[d]
                assert (mem.weights, mem.optimizer) == (want.weights, want.optimizer)
                assert mem.gradients in (want.gradients, want.early_gradients)
                assert mem.total == mem.required


@pytest.mark.parametrize("tps", [(1, 2), (2, 4), (4, 2, 1), (3, 1), (2, 2)])
def test_partial_params_match_the_layout(tps: tuple[int, ...]) -> None:
    """:func:`planner.cost.partial_params.partial_params` (arithmetic on the plan) equals the elements of a
    rank's local views that are not whole in :func:`planner.flat_buckets.flat_parts`, the buckets the
    executor allocates."""
    from planner.cost import partial_params
    from planner.flat_buckets import flat_parts
    from planner.layout import build_topology
    from planner.model import ModelSpec

    model = ModelSpec("m12", num_layers=4, hidden_size=96, ffn_hidden_size=192, num_heads=12, num_kv_heads=12,
                      vocab_size=384, seq_len=64)
    # pipeline i: one stage at TP tps[i], or two stages (TP tps[i], then 1) where i is odd
    pipes = [(1, 1, [([f"p{i}:{d}" for d in range(t)], 4)] if i % 2 == 0 else
              [([f"p{i}:{d}" for d in range(t)], 1), ([f"p{i}:x"], 3)]) for i, t in enumerate(tps)]
    pl = plan(pipes, model=model)
    topo = build_topology(pl)
    for pi, pipe in enumerate(topo.pipelines):
        for si, st in enumerate(pipe):
            cut = sum(v.numel for part in flat_parts(topo, st.leader) for v in part.views if not v.whole)
            assert partial_params(pl, pi, si) == cut, (pi, si)


def test_zero_bucket_matches_the_executor() -> None:
    pytest.importorskip("torch")  # the executor's side; the planner's tests also run without torch
    from executor.parallel.grad_sync import DEFAULT_BUCKET_NUMEL
    from planner.cost.memory import ZERO_BUCKET_NUMEL

    assert ZERO_BUCKET_NUMEL == DEFAULT_BUCKET_NUMEL
