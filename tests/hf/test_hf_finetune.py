"""Issue 18's loop: a tiny Hugging Face model made from a config is imported, fine-tuned 20 steps
under an asymmetric 4-rank plan, exported, and transformers loads it with our logits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from executor.state.checkpoint import read_logical
from executor.state.hf_convert import import_hf
from tests.hf.test_hf_convert import hf_logits, our_logits, tiny_hf
from tests.train.test_train_jobs import PLAN4, hexiscale, losses

transformers = pytest.importorskip("transformers")
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("hexiscale-jobs")]


def test_import_finetune_export(tmp_path: Path) -> None:
    original = tiny_hf(tmp_path / "hf")
    model = import_hf(tmp_path / "hf", tmp_path / "imported")
    plan = json.loads(PLAN4.read_text())  # pipelines (TP 1, 4 layers) and (TP 2 -> TP 1) on 4 ranks
    plan["model"] = model.to_dict()
    plan["options"]["dtype"] = "fp32"
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(plan))
    log = tmp_path / "m.jsonl"
    run = hexiscale("launch", str(plan_path), "--local", "--device", "cpu", "--",
                    "--resume", str(tmp_path / "imported"), "--steps", "20", "--lr", "1e-3", "--warmup", "2",
                    "--checkpoint-dir", str(tmp_path / "ck"), "--log-jsonl", str(log))
    assert run.returncode == 0, run.stdout + run.stderr
    got = losses(log)
    assert len(got) == 20 and got[-1] < got[0]  # it trained from the imported weights
    run = hexiscale("hf", "export", str(tmp_path / "ck"), "-o", str(tmp_path / "out"))  # the folder's latest
    assert run.returncode == 0, run.stderr
    back = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "out").eval()
    trained_model, stream = read_logical(tmp_path / "ck" / "step-000020")
    trained = dict(stream)
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(2))
    ours = our_logits(trained_model, trained, ids)
    torch.testing.assert_close(hf_logits(back, ids), ours, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(hf_logits(original, ids), ours, atol=1e-3)  # and they moved
