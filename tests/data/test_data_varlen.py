"""Variable-length data: documents of a token file cut to the context, synthetic sequences, a step's
batch in tokens, the one-step-ahead layout stream, and ``hexiscale data lengths|packing``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from executor.data.doc_source import SyntheticDocs, TokenFileDocs, step_sequences
from executor.data.step_prefetch import LayoutStream
from executor.data.token_file import write_token_file
from hexiscale.cli.main import main as cli
from planner.errors import SpecError
from planner.varlen.histogram import load_histogram
from planner.varlen.seq_cost import PipelineCost, SeqCost
from planner.varlen.step_layout import StrategyCost
from planner.varlen.synthetic import PRESETS

ROOT = Path(__file__).resolve().parents[2]


def _corpus(tmp_path: Path) -> Path:
    docs = [np.arange(n) % 50 for n in (5, 1, 23, 10, 2)]
    write_token_file(tmp_path / "c", docs)
    return tmp_path / "c"


def test_token_file_documents_are_cut_to_the_context(tmp_path) -> None:
    docs = TokenFileDocs(_corpus(tmp_path), context=8, vocab_size=50, seed=3)
    # 5 -> [5 tokens]; 1 -> nothing; 23 -> 9 + 9 + 7 (chunks share one token); 10 -> 9 + 2; 2 -> 2
    assert sorted(docs.lengths()) == sorted([4, 8, 8, 6, 8, 1, 1])
    seen = sorted(tuple(docs.tokens(i)) for i in range(docs.num_sequences))
    assert (0, 1, 2, 3, 4, 5, 6, 7, 8) in seen and (8, 9, 10, 11, 12, 13, 14, 15, 16) in seen  # doc 23, chunks 1-2
    assert all(docs.length(i) == len(docs.tokens(i)) - 1 for i in range(2 * docs.num_sequences))
    again = TokenFileDocs(_corpus(tmp_path), context=8, vocab_size=50, seed=3)
    assert [again.length(i) for i in range(14)] == [docs.length(i) for i in range(14)]  # epochs are seeded
    with pytest.raises(SpecError, match="vocab_size"):
        TokenFileDocs(_corpus(tmp_path), context=8, vocab_size=10)


def test_synthetic_sequences_and_step_batches() -> None:
    hist = PRESETS["commoncrawl"].histogram(4096, 5000)
    src = SyntheticDocs(hist, 4096, 256, seed=1)
    assert [src.length(i) for i in range(20)] == [SyntheticDocs(hist, 4096, 256, seed=1).length(i) for i in range(20)]
    assert all(1 <= src.length(i) <= 4096 and len(src.tokens(i)) == src.length(i) + 1 for i in range(20))
    cursor, seen = 0, []
    for _ in range(5):
        idx, nxt = step_sequences(src, cursor, 8192)
        assert idx == list(range(cursor, nxt)) and (sum(src.length(i) for i in idx) <= 8192 or len(idx) == 1)
        seen += idx
        cursor = nxt
    assert seen == list(range(cursor))  # nothing dropped, nothing twice
    with pytest.raises(SpecError, match="step-tokens"):
        step_sequences(src, 0, 0)


def test_layout_stream_one_rank() -> None:
    hist = PRESETS["github"].histogram(2048, 5000)
    src = SyntheticDocs(hist, 2048, 256, seed=2)
    cost = StrategyCost("dp2", tuple(PipelineCost((SeqCost(1e-9, 1e-5, 1e-3),), 4096, float("inf")) for _ in range(2)))
    stream = LayoutStream(src, [cost], step_tokens=8192)
    for k in range(3):
        plan = stream.next()
        assert plan.step == k and plan.solve_s >= 0 and plan.wait_s >= 0
        got = sorted(i for ph in plan.layout.phases for p in ph.pipelines for mb in p for i in mb)
        assert got == list(range(len(plan.docs)))
        assert plan.docs.label_tokens == sum(len(plan.docs[j]) - 1 for j in range(len(plan.docs)))


def test_cli_data_lengths_and_packing(tmp_path, capsys) -> None:
    rng = np.random.Generator(np.random.PCG64(0))
    lens = PRESETS["github"].histogram(2048, 2000).sample(60, rng)
    write_token_file(tmp_path / "c", [rng.integers(0, 200, n + 1) for n in lens])
    assert cli(["data", "lengths", str(tmp_path / "c"), "--context", "2048", "-o", str(tmp_path / "h.json")]) == 0
    h = load_histogram(tmp_path / "h.json")
    assert h.sequences == 60 and h.context == 2048
    assert "60 sequences" in capsys.readouterr().out
    pool = ROOT / "tests" / "data" / "pool-tiny-h100x4.json"
    cluster = str(ROOT / "examples" / "clusters" / "h100x4.yaml")
    assert cli(["data", "packing", str(tmp_path / "c"), "--pool", str(pool), "--cluster", cluster,
                "--step-tokens", "4096", "--steps", "2", "-o", str(tmp_path / "p.json")]) == 0
    out = capsys.readouterr().out
    assert out.count("step ") >= 2 and "micro-batches" in out and "dispatch + packing took" in out
    written = json.loads((tmp_path / "p.json").read_text())
    assert written["format"] == "hexiscale.packing/1" and len(written["steps"]) == 2
    for st in written["steps"]:
        packed = sorted(j for ph in st["phases"] for pipe in ph["pipelines"] for mb in pipe for j in mb)
        assert packed == list(range(len(st["sequences"]))) and sum(st["lengths"]) <= 4096
    assert cli(["data", "packing", str(tmp_path / "c"), "--pool", str(pool), "--cluster", cluster,
                "--step-tokens", "100"]) == 1
    assert "fewer than the pool's context 2048" in capsys.readouterr().err
    assert cli(["data", "lengths", str(tmp_path / "c"), "--context", "0"]) == 1


def test_cli_plan_lengths_proposes_a_pool(tmp_path, capsys) -> None:
    out = tmp_path / "pool.json"
    code = cli(["plan", str(ROOT / "examples" / "clusters" / "h100x4.yaml"), "--model", "llama2-7b", "--seq-len",
                "16384", "--lengths", "synthetic:commoncrawl", "--step-tokens", "131072", "--time-limit", "4",
                "-o", str(out), "--explain"])
    assert code == 0
    text = capsys.readouterr().out
    assert "estimated step" in text and "hot switching" in text and "search log" in text
    assert "strategy pool:" in text and "home (master weights, optimizer)" in text
    assert json.loads(out.read_text())["format"] == "hexiscale.pool/1"
    assert cli(["plan", str(ROOT / "examples" / "clusters" / "h100x4.yaml"), "--model", "tiny"]) == 1
    assert cli(["plan", str(ROOT / "examples" / "clusters" / "h100x4.yaml"), "--model", "tiny",
                "--lengths", "synthetic:books", "--step-tokens", "64"]) == 1
