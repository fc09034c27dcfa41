"""An elastic job that trains a strategy pool (mixed-length data, hot switching) on long-tailed
lengths: h100:3 leaves after step 1 (the supervisor re-plans every strategy of the pool onto the
three devices left; the planner may leave more of them idle for this tiny model) and joins again
after step 2 (the trace gives the launch pool back), each change switching in process through the
one training loop. Oracle: the final weights and AdamW moments equal a checkpoint-restart chain
under the same pools at the same step boundaries: pool A to step 1, saved (the elastic job's own
checkpoint of step 1, written under pool A before its first switch); restart under pool B to step 2,
save; restart under pool C to the end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.support.checkpoint_state import training_state
from tests.train.test_train_jobs import hexiscale
from tests.train.test_train_pool import CLUSTER, _pool

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("hexiscale-jobs")]
TRAIN = ("--cluster", str(CLUSTER), "--step-tokens", "600", "--lengths", "synthetic:commoncrawl", "--lr", "3e-3",
         "--warmup", "1", "--steps", "3")


def _chain_link(tmp_path: Path, layout: str, tag: str, *extra: str) -> None:
    run = hexiscale("launch", layout, "--local", "--device", "cpu", "--", *TRAIN, "--checkpoint-dir",
                    str(tmp_path / tag), *extra)
    assert run.returncode == 0, run.stdout + run.stderr


def test_elastic_pool_leave_and_join_equals_a_restart_chain(tmp_path: Path) -> None:
    pool = _pool(tmp_path, ["dp4", "tp4"], home="tp4")
    trace = tmp_path / "trace.yaml"
    trace.write_text("phases:\n  - steps: 1\n  - steps: 1\n    devices: [h100:0, h100:1, h100:2]\n"
                     f"  - steps: 1\n    devices: [h100:0, h100:1, h100:2, h100:3]\n    plan: {pool.name}\n")
    events, steps = tmp_path / "events.jsonl", tmp_path / "steps.jsonl"
    run = hexiscale("launch", str(pool), "--local", "--device", "cpu", "--trace", str(trace), "--cluster",
                    str(CLUSTER), "--elastic-log", str(events), "--", *TRAIN[2:], "--checkpoint-dir",
                    str(tmp_path / "elastic"), "--save-every", "1", "--log-jsonl", str(steps))
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert "elastic, strategy pool of 2" in out and "[h100:3] handed its state over at step 1" in out
    switches = [e for e in map(json.loads, events.read_text().splitlines()) if e["event"] == "switch"]
    assert [(e["step"], "h100:3" in e["leave"], e["join"]) for e in switches][0] == (1, True, [])
    assert [(e["step"], e["leave"], "h100:3" in e["join"]) for e in switches][1] == (2, [], True)
    layouts = [json.loads(Path(e["layout_file"]).read_text()) for e in switches]
    assert all(d["format"] == "hexiscale.pool/1" and [s["name"] for s in d["strategies"]] == ["dp4", "tp4"]
               for d in layouts)
    records = [json.loads(line) for line in steps.read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3] and any(r["switch_s"] > 0 for r in records)

    a = tmp_path / "elastic" / "step-000001"  # pool A's, saved before the first switch
    _chain_link(tmp_path, switches[0]["layout_file"], "b", "--stop-at", "2", "--resume", str(a))
    _chain_link(tmp_path, switches[1]["layout_file"], "c", "--resume", str(tmp_path / "b"))  # pool A again
    got, want = training_state(tmp_path / "elastic" / "step-000003"), training_state(tmp_path / "c" / "step-000003")
    assert sorted(got) == sorted(want) and any(k.startswith("optim/exp_avg_sq/") for k in got)
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=1e-6, atol=1e-6, msg=key)
