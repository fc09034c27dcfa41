"""Packed documents: positions restart per document, attention never crosses documents, and packed
masked training on asymmetric plans equals per-document training in one dense process."""

from __future__ import annotations

import pytest
import torch
from exec_jobs import ORACLE_OPTIM, TINY, TINY8, assemble_pipeline, global_docs, make_plan, train_packed
from torch.testing import assert_close

from executor.data.packed_batch import label_tokens, pack_documents, pack_micro_batches
from executor.data.packed_docs import DocSpans, packed_attention
from executor.model.llama import StageModule
from planner.layout import stage_params
from planner.plan import Plan
from tests.support.reference import reference_model, reference_train

W_ATOL = 2e-6  # as the oracle (tests/executor/test_exec_oracle.py)


def test_spans_positions_boundaries_and_mask() -> None:
    d = DocSpans((3, 1, 2))
    cpu = torch.device("cpu")
    assert d.total == 6 and d.max_len == 3
    assert d.positions(cpu).tolist() == [0, 1, 2, 0, 0, 1]
    assert d.cu_seqlens(cpu).tolist() == [0, 3, 4, 6]
    m = d.mask(cpu).int().tolist()
    assert m == [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0],
                 [0, 0, 0, 1, 0, 0], [0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 1, 1]]
    with pytest.raises(ValueError, match=">= 1 token"):
        DocSpans((2, 0))
    with pytest.raises(ValueError, match="at least one document"):
        pack_documents([])
    with pytest.raises(ValueError, match=">= 2 tokens"):
        pack_documents([torch.tensor([5])])


def test_mask_rows_are_the_rows_of_the_mask() -> None:
    """A context-parallel query chunk's rows (keys up to its end) equal those of the whole mask."""
    d = DocSpans((3, 1, 5, 3))
    cpu = torch.device("cpu")
    full = d.mask(cpu)
    for start, stop in ((0, 3), (3, 6), (6, 12), (9, 12)):
        assert torch.equal(d.mask_rows(start, stop, cpu), full[start:stop, :stop])


def test_packed_attention_equals_attention_per_document() -> None:
    gen = torch.Generator().manual_seed(0)
    lens = (5, 1, 7, 3)
    t, hq, hkv, d = sum(lens), 4, 2, 8
    q, k, v = (torch.randn(1, h, t, d, generator=gen) for h in (hq, hkv, hkv))
    out = packed_attention(q, k, v, DocSpans(lens))
    start = 0
    for n in lens:
        sl = slice(start, start + n)
        kk, vv = (x[:, :, sl].repeat_interleave(hq // hkv, dim=1) for x in (k, v))
        want = torch.nn.functional.scaled_dot_product_attention(q[:, :, sl], kk, vv, is_causal=True)
        assert_close(out[:, :, sl], want, rtol=1e-5, atol=1e-6)
        start += n


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_stage_forward_backward_packed_equals_each_document_alone(recompute: str) -> None:
    """The whole model on one packed row equals the dense reference run on each document alone,
    loss and every gradient (positions restart, no attention across documents)."""
    m = TINY
    docs = global_docs(m, 1, 5, seed=7)[0]
    ref = reference_model(m, seed=0)
    ref.loss(docs).backward()
    names = [p.name for p in stage_params(m, (0, m.num_layers), True, True)]
    stage = StageModule(m, layers=(0, m.num_layers), first=True, last=True, tp=1, tp_rank=0, group=None,
                        recompute=recompute)
    stage.load_logical(dict(ref.state_dict()), dict.fromkeys(names))
    mb = pack_documents(docs)
    assert mb.inputs.shape == (1, label_tokens(docs)) and mb.docs is not None
    loss = stage.loss(stage(mb.inputs, mb.docs), mb.labels).sum() / label_tokens(docs)
    loss.backward()
    want = dict(ref.named_parameters())
    assert_close(loss, ref.loss(docs).detach(), rtol=1e-5, atol=0)
    for name, p in stage.named_parameters():
        assert_close(p.grad, want[name].grad, rtol=1e-4, atol=1e-7, msg=lambda s, n=name: f"{n}: {s}")


def _round_robin_layout(docs: list[torch.Tensor], pipes: int, cap: int) -> list[list[list[int]]]:
    """Documents dealt to pipelines in turn, each pipeline's packed first-fit under ``cap`` tokens
    (a fixed, simple assignment: the dispatcher's own tests live with the planner)."""
    out: list[list[list[int]]] = [[] for _ in range(pipes)]
    for i, d in enumerate(docs):
        mbs = out[i % pipes]
        n = len(d) - 1
        for g in mbs:
            if sum(len(docs[j]) - 1 for j in g) + n <= cap:
                g.append(i)
                break
        else:
            mbs.append([i])
    return out


def _selective(plan: Plan) -> Plan:
    from dataclasses import replace

    return replace(plan, options=replace(plan.options, recompute="selective"))


# (id, plan, documents per step, token cap): TP/PP mixes, 1F1B and GPipe, recompute; one step has
# fewer documents than pipelines (an idle pipeline) in the three-pipeline case.
CASES: dict[str, tuple[Plan, list[int], int]] = {
    "tp2-pp2-1f1b-vs-tp1-gpipe": (make_plan(TINY, [(2, 1, "1f1b", [(2, 2), (1, 2)]), (1, 1, "gpipe", [(1, 4)])]),
                                  [7, 5, 9], 48),
    "tp4-1-vs-pp2-vs-tp1-selective": (
        _selective(make_plan(TINY8, [(1, 1, "1f1b", [(4, 5), (1, 3)]), (1, 1, "gpipe", [(1, 3), (1, 5)]),
                                     (1, 1, "1f1b", [(1, 8)])])), [12, 2, 6], 36),
}


@pytest.mark.slow
@pytest.mark.xdist_group("executor-pool")
@pytest.mark.parametrize("name", list(CASES))
def test_packed_oracle(dist_pool, name: str) -> None:
    plan, counts, cap = CASES[name]
    steps = [global_docs(plan.model, 1, n, seed=100 + k)[0] for k, n in enumerate(counts)]
    layouts = [_round_robin_layout(docs, len(plan.pipelines), cap) for docs in steps]
    assert any(len(lay[p]) > len(plan.pipelines[p].stages) for lay in layouts for p in range(len(plan.pipelines)))
    assert any(sum(len(g) > 1 for g in lay[p]) for lay in layouts for p in range(len(plan.pipelines)))
    ref = reference_train(plan.model, steps, optim=ORACLE_OPTIM)
    results = dist_pool.run(train_packed, plan, steps, layouts)
    n = plan.world_size
    for rank, r in enumerate(results[:n]):
        assert_close(r["losses"], ref.losses, rtol=1e-5, atol=0, msg=f"losses on rank {rank}")
        assert_close(r["norms"], ref.grad_norms, rtol=1e-5, atol=0, msg=f"grad norms on rank {rank}")
    assert min(ref.grad_norms) > ORACLE_OPTIM.grad_clip  # clipping active
    for name_, want in ref.state.items():
        assert_close(results[0]["state"][name_], want, rtol=1e-5, atol=W_ATOL, msg=lambda s, x=name_: f"{x}: {s}")
    for p in range(len(plan.pipelines)):
        rebuilt = assemble_pipeline(plan, results[:n], p)
        for name_, want in ref.state.items():
            assert_close(rebuilt[name_], want, rtol=1e-5, atol=W_ATOL, msg=lambda s, x=name_, p=p: f"p{p} {x}: {s}")


def test_pack_micro_batches_groups() -> None:
    docs = global_docs(TINY, 1, 4, seed=3)[0]
    mbs = pack_micro_batches(docs, [[2, 0], [], [3]])
    assert len(mbs) == 2
    assert mbs[0].docs is not None and mbs[0].docs.lengths == (len(docs[2]) - 1, len(docs[0]) - 1)
    assert torch.equal(mbs[0].labels[0], torch.cat([docs[2][1:], docs[0][1:]]))
