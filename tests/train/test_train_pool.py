"""``hexiscale launch POOL.json --local -- --step-tokens N --data TOKENS``: mixed-length training
with hot switching from the command line. Oracle: a pool whose home is TP 4 and whose sequences
run under DP 4 (working weights in, gradients out) gives the single-process dense model's losses
on the same steps of whole documents, and a run resumed from a checkpoint goes on with the
sequences and the loss of the uninterrupted run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from executor.data.doc_source import TokenFileDocs, step_sequences
from executor.data.token_file import write_token_file
from executor.train.config import TrainConfig
from executor.train.setup import optim_config
from planner.plan import plan_from_dict
from tests.support.reference import reference_train
from tests.train.test_train_jobs import ROOT, hexiscale

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("hexiscale-jobs")]
POOL = ROOT / "tests" / "data" / "pool-tiny-h100x4.json"  # dp4 (home), tp4; tiny-8l at a 2048 context
CLUSTER = ROOT / "examples" / "clusters" / "h100x4.yaml"
CONTEXT = 256


def _pool(tmp_path: Path, names: list[str], home: str) -> Path:
    data = json.loads(POOL.read_text())
    data["context"] = CONTEXT
    data["strategies"] = [s for n in names for s in data["strategies"] if s["name"] == n]
    data["home"] = names.index(home)
    for s in data["strategies"]:
        s["plan"]["model"]["seq_len"] = CONTEXT
        s["plan"]["options"]["dtype"] = "fp32"
    path = tmp_path / f"pool-{'-'.join(names)}.json"
    path.write_text(json.dumps(data))
    return path


def _train(tmp_path: Path, pool: Path, tag: str, *extra: str) -> list[dict]:
    log = tmp_path / f"{tag}.jsonl"
    run = hexiscale("launch", str(pool), "--local", "--device", "cpu", "--", "--cluster", str(CLUSTER),
                    "--step-tokens", "600", "--data", str(tmp_path / "corpus"), "--lr", "3e-3", "--warmup", "1",
                    "--log-jsonl", str(log), *extra)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "strategy pool of" in run.stdout
    return [json.loads(line) for line in log.read_text().splitlines()]


def _reference(tmp_path: Path, pool: Path, steps: int) -> tuple[list[int], list[float]]:
    """Tokens and losses of the dense single-process model on the CLI's steps (seed 0)."""
    docs = TokenFileDocs(tmp_path / "corpus", context=CONTEXT, vocab_size=256)
    batches, cursor = [], 0
    for _ in range(steps):
        idx, cursor = step_sequences(docs, cursor, 600)
        batches.append([torch.from_numpy(docs.tokens(i)) for i in idx])
    model = plan_from_dict(json.loads(pool.read_text())["strategies"][0]["plan"]).model
    ref = reference_train(model, batches, optim=optim_config(TrainConfig.flat(steps=steps, lr=3e-3, warmup=1)))
    return [sum(len(d) - 1 for d in b) for b in batches], ref.losses


def test_hot_switching_from_the_cli_equals_the_dense_model(tmp_path: Path) -> None:
    rng = np.random.Generator(np.random.PCG64(0))
    write_token_file(tmp_path / "corpus", [rng.integers(0, 256, int(n)) for n in rng.integers(2, 700, 40)])
    pool = _pool(tmp_path, ["dp4", "tp4"], home="tp4")
    hot = _train(tmp_path, pool, "hot", "--steps", "3", "--checkpoint-dir", str(tmp_path / "ck"), "--save-every", "2")
    tokens, losses = _reference(tmp_path, pool, 3)
    assert [r["tokens"] for r in hot] == tokens and all(t <= 600 for t in tokens)
    assert any("dp4" in r["phases"] for r in hot) and any(r["switch_s"] > 0 for r in hot)
    np.testing.assert_allclose([r["loss"] for r in hot], losses, rtol=1e-5)
    again = _train(tmp_path, pool, "again", "--steps", "3",
                   "--resume", str(tmp_path / "ck" / "step-000002"))
    assert [r["step"] for r in again] == [3] and again[0]["tokens"] == hot[2]["tokens"]
    np.testing.assert_allclose(again[0]["loss"], hot[2]["loss"], rtol=1e-5)
