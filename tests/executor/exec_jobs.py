"""Jobs that run on every rank of a :class:`tests.support.dist_testing.DistPool` (importable by the
spawned workers), and plan helpers shared by the executor tests."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from executor.parallel.grad_sync import DEFAULT_BUCKET_NUMEL
from executor.parallel.groups import ProcessGroups
from executor.train.engine import Engine
from executor.train.optim import OptimConfig
from planner.interleave import interleaved
from planner.layout import build_topology
from planner.model import PRESETS, ModelSpec
from planner.plan import Pipeline, Plan, PlanOptions, Stage
from planner.schedules import schedule_named

TINY = PRESETS["tiny"]
TINY8 = PRESETS["tiny-8l"]
ORACLE_OPTIM = OptimConfig(lr=1e-3, min_lr=1e-4, warmup_steps=2, total_steps=6, grad_clip=0.5, eps=1e-6,
                           weight_decay=0.1)


def make_plan(model: ModelSpec, pipes: list[tuple[int, int, str, list[tuple[int, ...]]]],
              dtype: str = "fp32") -> Plan:
    """A plan from ``[(batch_size, micro_batches, schedule, [(tp, n_layers[, cp]), ...]), ...]``
    with synthetic device ids ``d:0, d:1, ...`` (the executor needs no cluster). A schedule of several
    layer chunks per stage (interleaved) cuts each stage's layers into them (planner.interleave)."""
    dev = 0
    pipelines = []
    for bs, mb, sched, stages in pipes:
        out, start = [], 0
        for tp, n, *cps in stages:
            cp = cps[0] if cps else 1
            out.append(Stage(tuple(f"d:{dev + i}" for i in range(tp * cp)), tp, (start, start + n), cp))
            dev += tp * cp
            start += n
        chunks = schedule_named(sched).chunks
        pipe = Pipeline(bs, mb, tuple(out), sched if chunks == 1 else "1f1b")
        pipelines.append(pipe if chunks == 1 else interleaved(pipe, chunks, sched, f"pipelines[{len(pipelines)}]"))
    return Plan(model, sum(p[0] for p in pipes), tuple(pipelines), PlanOptions(dtype=dtype))


def global_batches(model: ModelSpec, batch: int, steps: int, seed: int = 1234, seq: int | None = None
                   ) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    s = (seq or model.seq_len) + 1
    return [torch.randint(0, model.vocab_size, (batch, s), generator=gen) for _ in range(steps)]


def pipeline_rows(plan: Plan, pipeline: int, tokens: torch.Tensor) -> torch.Tensor:
    off = sum(p.batch_size for p in plan.pipelines[:pipeline])
    return tokens[off:off + plan.pipelines[pipeline].batch_size]


def pool_engine(plan: Plan, device: torch.device | None = None, late_groups: bool = False,
                **kw: Any) -> Engine | None:
    """This pool rank's engine of ``plan``; every pool rank creates the plan's groups (collective),
    and a rank beyond the plan's size closes them again and gets None. With ``late_groups`` the
    engine is built without groups, which are created and attached after it (as an elastic switch does)."""
    topo = build_topology(plan)
    rank = dist.get_rank()
    early = (Engine(plan, topo, None, rank=rank, device=device or torch.device("cpu"), **kw)
             if late_groups and rank < topo.world_size else None)
    groups = ProcessGroups.create(topo)
    if rank >= topo.world_size:
        groups.close()
        return None
    if early is not None:
        early.attach(groups)
        return early
    return Engine(plan, topo, groups, device=device or torch.device("cpu"), **kw)


def train_plans(plans: list[Plan], batches: list[list[torch.Tensor]], optim: OptimConfig = ORACLE_OPTIM,
                seed: int = 0, accelerator: bool = False, chunked_loss: bool = False,
                bucket_numel: int = DEFAULT_BUCKET_NUMEL,
                compile_backend: str | None = None, late_groups: bool = False) -> list[dict[str, Any] | None]:
    """On every rank: train each plan on its batches; per plan, the losses/norms seen by this rank
    and (on rank 0) the gathered logical weights. Ranks beyond a plan's size idle. With
    ``accelerator`` each rank runs on its current CUDA device (NCCL checks); ``chunked_loss``: the
    last stages' cross-entropy in row chunks (executor.model.chunked_loss); ``bucket_numel``: the
    gradient buckets' size (small: many buckets, launched one by one during the backward);
    ``compile_backend``: the stages' blocks compiled with that torch.compile backend (also on CPU);
    ``late_groups``: each engine built before its groups exist (:func:`pool_engine`)."""
    rank = dist.get_rank()
    device = torch.device("cuda", torch.cuda.current_device()) if accelerator else torch.device("cpu")
    out: list[dict[str, Any] | None] = []
    for plan, steps in zip(plans, batches):
        eng = pool_engine(plan, device, late_groups, optim=optim, seed=seed, bucket_numel=bucket_numel)
        if eng is None:
            out.append(None)
            continue
        groups = eng.groups
        eng.module.chunked_loss = chunked_loss
        if compile_backend is not None:
            from executor.model.fast_path import compile_blocks

            compile_blocks(eng.module, force=True, backend=compile_backend)
        stats = [eng.train_step(pipeline_rows(plan, eng.stage.pipeline, t)) for t in steps]
        state = eng.logical_state_dict(to_all=False)
        out.append({"losses": [s.loss for s in stats], "norms": [s.grad_norm for s in stats],
                    "lrs": [s.lr for s in stats], "tokens": [s.tokens for s in stats],
                    "state": state if rank == 0 else None,
                    "shards": {n: p.detach().cpu().clone() for n, p in eng.params.items()},
                    "pipeline": eng.stage.pipeline, "tp": eng.stage.tp, "tp_rank": eng.tp_rank})
        del eng
        groups.close()  # each plan's communicators go before the next plan's (GPU memory)
    return out


def global_docs(model: ModelSpec, steps: int, docs_per_step: int, seed: int = 4321, min_len: int = 2
                ) -> list[list[torch.Tensor]]:
    """Per step, ``docs_per_step`` documents of random lengths in ``[min_len, seq_len + 1]`` tokens."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        lens = torch.randint(min_len, model.seq_len + 2, (docs_per_step,), generator=gen).tolist()
        out.append([torch.randint(0, model.vocab_size, (n,), generator=gen) for n in lens])
    return out


def train_packed(plan: Plan, steps: list[list[torch.Tensor]], layouts: list[list[list[list[int]]]],
                 optim: OptimConfig = ORACLE_OPTIM, seed: int = 0, accelerator: bool = False) -> dict[str, Any] | None:
    """On every rank: train ``plan`` on packed documents; ``layouts[k][p]`` lists pipeline ``p``'s
    micro-batches of step ``k``, each a list of indices into ``steps[k]`` (``accelerator``: on each
    rank's current CUDA device)."""
    from executor.data.packed_batch import label_tokens, pack_micro_batches

    rank = dist.get_rank()
    device = torch.device("cuda", torch.cuda.current_device()) if accelerator else torch.device("cpu")
    eng = pool_engine(plan, device, optim=optim, seed=seed)
    if eng is None:
        return None
    groups = eng.groups
    stats = []
    for docs, layout in zip(steps, layouts):
        micro = pack_micro_batches(docs, layout[eng.stage.pipeline], device)
        stats.append(eng.train_micro_batches(micro, label_tokens(docs)))
    state = eng.logical_state_dict(to_all=False)
    out = {"losses": [s.loss for s in stats], "norms": [s.grad_norm for s in stats], "lrs": [s.lr for s in stats],
           "state": state if rank == 0 else None,
           "shards": {n: p.detach().cpu().clone() for n, p in eng.params.items()}}
    del eng
    groups.close()
    return out


def assemble_pipeline(plan: Plan, results: list[dict[str, Any] | None], pipeline: int) -> dict[str, torch.Tensor]:
    """Logical tensors of ``pipeline`` rebuilt from the per-rank shards returned by :func:`train_plans`."""
    from planner.layout import logical_params

    topo = build_topology(plan)
    out = {}
    for info in logical_params(plan.model):
        st = topo.holder(pipeline, info.name)
        parts = [results[r]["shards"][info.name] for r in st.ranks]  # type: ignore[index]
        out[info.name] = parts[0] if info.shard_dim is None else torch.cat(parts, dim=info.shard_dim)
    return out


# ------------------------------------------------------------------------------ TP layer equivalence


def _shard(t: torch.Tensor, dim: int, n: int, r: int) -> torch.Tensor:
    return t.chunk(n, dim=dim)[r].contiguous()


def tp_layers_job(n: int) -> int:
    """Each TP layer on ``n`` ranks vs its dense twin, forward and backward (asserts inside; returns
    the number of checks done on this rank)."""
    import torch.nn.functional as F
    from torch.testing import assert_close

    from executor.model.chunked_loss import chunked_vocab_cross_entropy
    from executor.model.llama import MLP, Attention, rope_tables
    from executor.parallel.tp_layers import (
        ColumnParallelLinear,
        RowParallelLinear,
        VocabParallelEmbedding,
        vocab_parallel_cross_entropy,
    )
    from tests.support.reference import _MLP, _Attn

    rank = dist.get_rank()
    group = dist.new_group(list(range(n)))
    if rank >= n:
        return 0
    m = TINY8
    h, f, v = m.hidden_size, m.ffn_hidden_size, m.vocab_size
    gen = torch.Generator().manual_seed(7)
    rnd = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731 - same draws on every rank
    done = 0

    def close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
        nonlocal done
        # atol relative to the tensor's scale: unit-variance data sums ~100 terms per element
        atol = 1e-6 * max(1.0, float(b.abs().max()))
        assert_close(a, b, rtol=1e-5, atol=atol, msg=lambda s: f"tp={n} rank={rank} {what}: {s}")
        done += 1

    # column-parallel linear
    x, w, dy = rnd(2, 5, h), rnd(f, h), rnd(2, 5, f)
    xd = x.clone().requires_grad_()
    wd = w.clone().requires_grad_()
    F.linear(xd, wd).backward(dy)
    col = ColumnParallelLinear(h, f, tp=n, group=group)
    col.weight.data.copy_(_shard(w, 0, n, rank))
    xp = x.clone().requires_grad_()
    y = col(xp)
    close(y, _shard(F.linear(x, w), -1, n, rank), "column fwd")
    y.backward(_shard(dy, -1, n, rank))
    close(xp.grad, xd.grad, "column dx")
    close(col.weight.grad, _shard(wd.grad, 0, n, rank), "column dW")

    # row-parallel linear
    x, w, dy = rnd(2, 5, f), rnd(h, f), rnd(2, 5, h)
    xd, wd = x.clone().requires_grad_(), w.clone().requires_grad_()
    yd = F.linear(xd, wd)
    yd.backward(dy)
    row = RowParallelLinear(f, h, tp=n, group=group)
    row.weight.data.copy_(_shard(w, 1, n, rank))
    xp = _shard(x, -1, n, rank).requires_grad_()
    y = row(xp)
    close(y, yd.detach(), "row fwd")
    y.backward(dy)
    close(xp.grad, _shard(xd.grad, -1, n, rank), "row dx")
    close(row.weight.grad, _shard(wd.grad, 1, n, rank), "row dW")

    # vocab-parallel embedding
    ids, w, dy = torch.randint(0, v, (3, 7), generator=gen), rnd(v, h), rnd(3, 7, h)
    wd = w.clone().requires_grad_()
    yd = F.embedding(ids, wd)
    yd.backward(dy)
    emb = VocabParallelEmbedding(v, h, tp=n, tp_rank=rank, group=group)
    emb.weight.data.copy_(_shard(w, 0, n, rank))
    y = emb(ids)
    close(y, yd.detach(), "embedding fwd")
    y.backward(dy)
    close(emb.weight.grad, _shard(wd.grad, 0, n, rank), "embedding dW")

    # vocab-parallel cross-entropy (from sharded logits)
    logits, labels, g = rnd(3, 7, v) * 3, torch.randint(0, v, (3, 7), generator=gen), rnd(3, 7)
    ld = logits.clone().requires_grad_()
    ce = F.cross_entropy(ld.reshape(-1, v), labels.reshape(-1), reduction="none").view(3, 7)
    ce.backward(g)
    lp = _shard(logits, -1, n, rank).requires_grad_()
    loss = vocab_parallel_cross_entropy(lp, labels, vocab_start=rank * (v // n), group=group)
    close(loss, ce.detach(), "cross-entropy fwd")
    loss.backward(g)
    close(lp.grad, _shard(ld.grad, -1, n, rank), "cross-entropy dlogits")
    lc = _shard(logits, -1, n, rank).requires_grad_()  # in chunks of 4 rows (21 rows: a ragged last one)
    loss = chunked_vocab_cross_entropy(lc, labels, vocab_start=rank * (v // n), group=group, rows=4)
    close(loss, ce.detach(), "chunked cross-entropy fwd")
    loss.backward(g)
    close(lc.grad, _shard(ld.grad, -1, n, rank), "chunked cross-entropy dlogits")

    # attention block (GQA + RoPE + causal SDPA) and SwiGLU MLP vs the dense reference's blocks
    cos, sin = rope_tables(m.seq_len, m.head_dim, m.rope_theta)
    dense_attn, dense_mlp = _Attn(m), _MLP(m)
    for p in list(dense_attn.parameters()) + list(dense_mlp.parameters()):
        p.data.copy_(rnd(*p.shape) * 0.1)
    attn = Attention(m, tp=n, group=group, recompute="none", device=None)
    mlp = MLP(m, tp=n, group=group, device=None)
    for mod, dense in ((attn, dense_attn), (mlp, dense_mlp)):
        for (name, p), (dname, dp) in zip(mod.named_parameters(), dense.named_parameters()):
            assert name == dname
            dim = 1 if name.startswith(("wo", "w_down")) else 0
            p.data.copy_(_shard(dp.data, dim, n, rank))
        x, dy = rnd(2, 9, h), rnd(2, 9, h)
        xd = x.clone().requires_grad_()
        yd = dense(xd, cos, sin) if mod is attn else dense(xd)
        yd.backward(dy)
        xp = x.clone().requires_grad_()
        y = mod(xp, cos, sin) if mod is attn else mod(xp)
        close(y, yd.detach(), f"{type(mod).__name__} fwd")
        y.backward(dy)
        close(xp.grad, xd.grad, f"{type(mod).__name__} dx")
        for (name, p), (_, dp) in zip(mod.named_parameters(), dense.named_parameters()):
            dim = 1 if name.startswith(("wo", "w_down")) else 0
            close(p.grad, _shard(dp.grad, dim, n, rank), f"{type(mod).__name__} d{name}")
    return done


# ------------------------------------------------------------------------------ checkpoints


def checkpoint_job(plan_x: Plan, plan_y: Plan, other_model_plan: Plan, batches: list[torch.Tensor], split: int,
                   path: str, accelerator: bool = False) -> dict[str, Any] | None:
    """Train ``plan_x`` for ``split`` steps and save; build ``plan_y`` from a *different* seed, load,
    train the remaining steps. Also try loading the checkpoint under another model."""
    from pathlib import Path

    from executor.state.checkpoint import load, read_meta, save
    from planner.errors import SpecError

    rank = dist.get_rank()
    device = torch.device("cuda", torch.cuda.current_device()) if accelerator else torch.device("cpu")
    ck = Path(path)
    out: dict[str, Any] = {"losses_x": [], "losses_y": []}
    topo = build_topology(plan_x)
    groups = ProcessGroups.create(topo)
    if rank < topo.world_size:
        eng = Engine(plan_x, topo, groups, device=device, optim=ORACLE_OPTIM, seed=0)
        for t in batches[:split]:
            out["losses_x"].append(eng.train_step(pipeline_rows(plan_x, eng.stage.pipeline, t)).loss)
        save(eng, ck, {"data_position": split, "note": "x"})
    dist.barrier()
    out["meta"] = read_meta(ck)
    topo = build_topology(plan_y)
    groups = ProcessGroups.create(topo)
    if rank < topo.world_size:
        eng = Engine(plan_y, topo, groups, device=device, optim=ORACLE_OPTIM, seed=99)
        out["extra"] = load(eng, ck)
        out["step_after_load"] = eng.step
        for t in batches[split:]:
            out["losses_y"].append(eng.train_step(pipeline_rows(plan_y, eng.stage.pipeline, t)).loss)
        out["state"] = eng.logical_state_dict(to_all=True)
    topo = build_topology(other_model_plan)
    groups = ProcessGroups.create(topo)
    if rank < topo.world_size:
        eng = Engine(other_model_plan, topo, groups, device=device, optim=ORACLE_OPTIM)
        try:
            load(eng, ck)
            out["other_model_error"] = None
        except SpecError as exc:
            out["other_model_error"] = str(exc)
    return out


def engine_errors_job() -> dict[str, str] | None:
    """Misuse gets clear errors: a plan larger than the world, tokens of the wrong shape."""
    rank = dist.get_rank()
    out: dict[str, str] = {}
    too_big = make_plan(TINY, [(9, 1, "1f1b", [(1, 4)])] * 9)
    try:
        ProcessGroups.create(build_topology(too_big))
    except RuntimeError as exc:
        out["world"] = str(exc)
    plan = make_plan(TINY, [(2, 1, "1f1b", [(1, 2), (1, 2)])])
    topo = build_topology(plan)
    groups = ProcessGroups.create(topo)
    if rank >= topo.world_size:
        try:
            Engine(plan, topo, groups, device=torch.device("cpu"))
        except ValueError as exc:
            out["outside"] = str(exc)
        return out
    eng = Engine(plan, topo, groups, device=torch.device("cpu"))
    for shape in [(3, 33), (2, 34), (2,)]:
        try:
            eng.train_step(torch.zeros(shape, dtype=torch.long))
        except ValueError as exc:
            out[str(shape)] = str(exc)
    return out


def train_hot_switch(plans: list[Plan], home: int, steps: list[list[torch.Tensor]], layouts: list[Any],
                     optim: OptimConfig = ORACLE_OPTIM, seed: int = 0, accelerator: bool = False,
                     wire_bf16: bool = False) -> dict[str, Any] | None:
    """On every rank: hot-switching steps over a pool (``layouts[k]``: step k's StepLayout); the
    losses, norms, transfer counts and (rank 0) the gathered home weights. ``accelerator``: on this
    rank's GPU (NCCL pools); ``wire_bf16``: working weights travel in bf16."""
    from executor.switch.hot_switch import HotSwitchEngine, switch_groups

    rank = dist.get_rank()
    groups = switch_groups(plans, home)
    out: dict[str, Any] | None = None
    device = torch.device("cuda", torch.cuda.current_device()) if accelerator else torch.device("cpu")
    if rank < plans[home].world_size:
        eng = HotSwitchEngine(plans, home, groups, device=device, optim=optim, seed=seed,
                              wire_dtype=torch.bfloat16 if wire_bf16 else None)
        stats = [eng.train_step(docs, lay, timed=True) for docs, lay in zip(steps, layouts)]
        state = eng.home.logical_state_dict(to_all=False)
        out = {"losses": [s.step.loss for s in stats], "norms": [s.step.grad_norm for s in stats],
               "sent": [s.sent_elements for s in stats], "switch_s": [s.switch_s for s in stats],
               "phases": [len(s.phase_s) for s in stats], "state": state if rank == 0 else None,
               "released": all(p.numel() == 0 for w in eng.layouts.values() for p in w.params.values())}
        del eng
    groups.close()
    return out


def split_share_job(plan: Plan) -> list[tuple[tuple[int, ...], int, float]]:
    """This rank's groups of ``plan`` on NCCL: (ranks, the communicator's ``split_share``, the sum
    of an all-reduce of ones on it) for every group it is in besides the default one."""
    groups = ProcessGroups.create(build_topology(plan))
    device = groups.device()
    out = []
    for _, ranks, g in groups.order:
        if groups.rank not in ranks or g is dist.group.WORLD:
            continue
        x = torch.ones(1, device=device)
        dist.all_reduce(x, group=g)
        out.append((ranks, int(g._get_backend(device).options.config.split_share), float(x.item())))
    groups.close()
    return out
