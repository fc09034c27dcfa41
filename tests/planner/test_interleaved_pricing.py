"""The cost model prices what the executor runs for interleaved 1F1B: the registry's op order, and
one whole activation send per op that sends (planner.schedules.comm.op_peers, which the executor's
rounds use) — the last stage's sends back to the first between chunks included."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from planner.cluster import load_cluster
from planner.cost import estimate
from planner.interleave import interleaved
from planner.plan import load_plan
from planner.schedules import schedule_named
from planner.schedules.comm import op_peers

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "examples" / "plans" / "seed-32gpu-4types-llama2-7b.json"
CLUSTER = ROOT / "examples" / "clusters" / "seed-32gpu-4types.yaml"


def test_every_sending_op_carries_one_send() -> None:
    plan = load_plan(SEED)
    plan = replace(plan, pipelines=tuple(interleaved(p) for p in plan.pipelines))
    est = estimate(plan, load_cluster(CLUSTER), timeline=True)
    assert est.timeline is not None
    sched = schedule_named("interleaved-1f1b")
    for lane in est.timeline.lanes:
        pipe = plan.pipelines[lane.pipeline]
        n = len(pipe.stages)
        ops = sched.ops(n, lane.stage, pipe.micro_batches)
        sending = [op for op in ops if op_peers(op, n, lane.stage, sched.chunks).send is not None]
        p2p = [s for s in lane.spans if s.kind == "p2p"]
        assert len(p2p) == len(sending), (lane.label, len(p2p), len(sending))
        if lane.stage == n - 1:  # forwards of chunk 0 go back to the first stage
            assert any(op.kind == "F" for op in sending)
        se = est.pipelines[lane.pipeline].stages[lane.stage]
        assert lane.busy("p2p") == pytest.approx(se.pp_comm_s, rel=1e-9)


def test_each_chunk_is_priced_by_its_own_layers_embedding_and_head() -> None:
    """A chunk's ops take its part of the stage's compute: by layer count on the middle stages, the
    embedding added to the first stage's chunk 0 and the LM head to the last stage's last chunk
    (pipeline 2 of the seed plan: chunks of 5+4, 5+4, 4+3 and 4+3 layers)."""
    from planner.timeline_ops import op_times

    plan = load_plan(SEED)
    plan = replace(plan, pipelines=tuple(interleaved(p) for p in plan.pipelines))
    est = estimate(plan, load_cluster(CLUSTER), timeline=True)
    assert est.timeline is not None
    sched = schedule_named("interleaved-1f1b")
    sizes = [[b - a for a, b in st.chunks] for st in plan.pipelines[2].stages]
    assert sizes == [[5, 4], [5, 4], [4, 3], [4, 3]]
    ratio = []  # per stage: forward of micro-batch 0, chunk 0 over chunk 1
    for lane in (ln for ln in est.timeline.lanes if ln.pipeline == 2):
        ops = sched.ops(4, lane.stage, plan.pipelines[2].micro_batches, 2)
        f = {t.op.chunk: t.seconds for t in op_times(lane, ops) if t.op.kind == "F" and t.op.micro_batch == 0}
        ratio.append(f[0] / f[1])
    assert ratio[1] == pytest.approx(5 / 4) and ratio[2] == pytest.approx(4 / 3)
    assert ratio[0] > 5 / 4 * 1.01 and ratio[3] < 4 / 3 / 1.01, ratio
