"""``hexiscale train --trace`` and ``--tensorboard`` on a 6-rank asymmetric plan: measured events
that follow the schedule, scalars equal to the JSONL log, and the measured timeline drawn."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.timeline import read_trace
from tests.train.test_train_jobs import hexiscale, losses

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("hexiscale-jobs")]
ROOT = Path(__file__).resolve().parents[2]
PLAN6 = ROOT / "examples" / "plans" / "demo-cpu-6-tiny.json"  # TP 2 beside TP 1 -> 2 -> 1


def test_trace_and_tensorboard(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    trace, log, tb = tmp_path / "trace.json", tmp_path / "m.jsonl", tmp_path / "tb"
    run = hexiscale("launch", str(PLAN6), "--local", "--device", "cpu", "--", "--steps", "4", "--trace", str(trace),
                    "--log-jsonl", str(log), "--tensorboard", str(tb))
    assert run.returncode == 0, run.stdout + run.stderr
    plan, timelines = read_trace(trace)
    assert [t.title for t in timelines] == ["measured step 2", "measured step 3", "measured step 4"]
    for tl in timelines:
        assert len(tl.lanes) == 6
        for lane in tl.lanes:
            pipe = plan.pipelines[lane.pipeline]
            spans = sorted(lane.spans, key=lambda s: s.start)
            assert all(a.end <= b.start for a, b in zip(spans, spans[1:]))  # one rank does one thing at a time
            for kind in ("forward", "backward"):
                assert sorted(s.micro_batch for s in spans if s.kind == kind) == list(range(pipe.micro_batches))
            assert [s.kind for s in spans][-2:] == ["grad_sync", "optimizer"]
            assert (lane.busy("p2p") > 0) == (len(pipe.stages) > 1)
        # causality across ranks (one host, one clock: lanes line up): no rank of stage s+1 computes
        # the forward of micro-batch j before the first rank of stage s (its leader sends) finished it
        done: dict[tuple[int, int], float] = {}
        for ln in tl.lanes:
            for s in ln.spans:
                if ln.pipeline == 1 and s.kind == "forward":
                    done[ln.stage, s.micro_batch] = min(done.get((ln.stage, s.micro_batch), s.end), s.end)
        for ln in tl.lanes:
            for s in ln.spans:
                if ln.pipeline == 1 and s.kind == "forward" and ln.stage > 0:
                    assert s.start >= done[ln.stage - 1, s.micro_batch] - 1e-3, (ln.label, s)  # clocks agree to µs
    # TensorBoard holds the JSONL log's numbers
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == \
        [(i + 1, pytest.approx(v, rel=1e-6)) for i, v in enumerate(losses(log))]
    assert {"train/grad_norm", "train/lr", "train/tokens_per_s"} <= set(acc.Tags()["scalars"])
    run = hexiscale("show", str(trace), "--plot", str(tmp_path / "png"), "--step", "3")
    assert run.returncode == 0, run.stderr
    assert "measured step 3" in run.stdout and (tmp_path / "png" / "timeline-measured.png").stat().st_size > 10_000
    assert json.loads(trace.read_text())["plan"]["model"]["name"] == "tiny"
