"""``hexiscale data prep`` -> ``hexiscale launch ... -- --data``: real tokenized text trains under
an asymmetric plan, and a model whose vocabulary is too small for the tokenizer is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.tokenizer import stdlib_texts, train_bpe
from tests.train.test_train_jobs import PLAN4, SEED_FLAGS, hexiscale, losses

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("hexiscale-jobs")]


def test_prep_then_train(tmp_path: Path) -> None:
    pytest.importorskip("tokenizers")
    folder = train_bpe(tmp_path / "bpe", vocab_size=384)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in stdlib_texts("email")))
    run = hexiscale("data", "prep", str(corpus), "-o", str(tmp_path / "tokens"), "--tokenizer", str(folder),
                    "--workers", "2", "--no-progress")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "documents:  " in run.stdout and "document length (tokens):" in run.stdout
    plan = json.loads(PLAN4.read_text())  # pipelines (TP 1, 4 layers) and (TP 2 -> TP 1): 4 ranks
    plan["model"].update(name="tiny-bpe384", vocab_size=384)
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(plan))
    log = tmp_path / "m.jsonl"
    run = hexiscale("launch", str(plan_path), "--local", "--device", "cpu", "--", "--steps", "6", "--data",
                    str(tmp_path / "tokens"), "--log-jsonl", str(log), "--lr", "3e-3", "--warmup", "1")
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"data {tmp_path / 'tokens'}" in run.stdout
    got = losses(log)
    assert len(got) == 6 and got[-1] < got[0] - 0.2  # starts near ln(384) = 5.95 and learns the text
    # the preset tiny model has 256 tokens: pre-flight refuses the file before any step
    run = hexiscale("train", *SEED_FLAGS, "--steps", "1", "--data", str(tmp_path / "tokens"),
                    env={"WORLD_SIZE": "1"})
    assert run.returncode == 1 and "vocab_size=256" in run.stderr, run.stderr
