"""Token file format round trip, bad files, and the deterministic global batch."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from executor.data.stream import (
    BatchStream,
    DataPosition,
    SyntheticSource,
    TokenFileSource,
    global_batch,
    make_source,
    pipeline_rows,
)
from executor.data.token_file import check_token_file, read_index, token_paths, write_token_file
from hexiscale.cli.main import main as cli
from planner.errors import SpecError
from planner.plan import load_plan

ROOT = Path(__file__).resolve().parents[2]
PLAN6 = ROOT / "examples" / "plans" / "demo-cpu-6-tiny.json"


def test_round_trip_docs_and_dtypes(tmp_path: Path) -> None:
    docs = [[1, 2, 3], [70000, 5], [6]]
    idx = write_token_file(tmp_path / "a", docs)
    assert idx.dtype == "uint32" and idx.num_tokens == 6 and idx.num_docs == 3 and idx.max_token == 70000
    assert list(idx.doc_offsets) == [0, 3, 5, 6]
    again = read_index(tmp_path / "a.idx")
    assert again.dtype == "uint32" and list(again.doc_offsets) == [0, 3, 5, 6]
    flat = np.fromfile(tmp_path / "a.bin", dtype="<u4")
    assert flat.tolist() == [1, 2, 3, 70000, 5, 6]
    small = write_token_file(tmp_path / "b.bin", np.arange(100))
    assert small.dtype == "uint16" and small.num_docs == 1
    assert (tmp_path / "b.bin").stat().st_size == 200
    with pytest.raises(SpecError, match="does not fit uint16"):
        write_token_file(tmp_path / "c", [70000], "uint16")


def test_file_source_windows_and_seeded_order(tmp_path: Path) -> None:
    write_token_file(tmp_path / "t", np.arange(41) % 50)  # 41 tokens, seq_len 8 -> 5 windows
    src = TokenFileSource(tmp_path / "t", seq_len=8, vocab_size=50, seed=3)
    assert src.num_windows == 5
    epoch0 = src.samples(0, 5)
    starts = sorted(int(row[0]) for row in epoch0)
    assert starts == [0, 8, 16, 24, 32]  # every window exactly once per epoch
    for row in epoch0:
        assert row.tolist() == list(range(int(row[0]), int(row[0]) + 9))
    assert np.array_equal(src.samples(2, 4), np.concatenate([epoch0[2:], src.samples(5, 1)]))
    other = TokenFileSource(tmp_path / "t", seq_len=8, vocab_size=50, seed=3)
    assert np.array_equal(other.samples(0, 12), src.samples(0, 12))  # same seed, same order
    reseeded = TokenFileSource(tmp_path / "t", seq_len=8, vocab_size=50, seed=4)
    assert not np.array_equal(reseeded.samples(0, 15), src.samples(0, 15))


def _corrupt(idx_path: Path, **changes: object) -> None:
    raw = idx_path.read_bytes()
    (n,) = struct.unpack("<I", raw[8:12])
    header = json.loads(raw[12:12 + n])
    header.update(changes)
    blob = json.dumps(header).encode()
    assert len(blob) <= n, "test keeps the header length"
    idx_path.write_bytes(raw[:12] + blob.ljust(n) + raw[12 + n:])


@pytest.mark.parametrize("damage, field", [
    ("missing", ""), ("magic", "idx.magic"), ("dtype", "idx.dtype"), ("size", "bin.size"),
    ("vocab", "idx.max_token"), ("short", "bin.num_tokens"), ("lying_header", "bin.tokens"),
    ("truncated", "idx.num_docs"),
])
def test_bad_files_name_file_and_field(tmp_path: Path, damage: str, field: str) -> None:
    stem = tmp_path / "d"
    write_token_file(stem, [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [11, 12]])
    bin_path, idx_path = token_paths(stem)
    seq_len, vocab = 4, 64
    if damage == "missing":
        idx_path.unlink()
    elif damage == "magic":
        idx_path.write_bytes(b"NOTANIDX" + idx_path.read_bytes()[8:])
    elif damage == "dtype":
        _corrupt(idx_path, dtype="int8")
    elif damage == "size":
        bin_path.write_bytes(bin_path.read_bytes()[:-2])
    elif damage == "vocab":
        vocab = 12
    elif damage == "short":
        seq_len = 12
    elif damage == "lying_header":
        bin_path.write_bytes(np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 99], dtype="<u2").tobytes())
    elif damage == "truncated":
        idx_path.write_bytes(idx_path.read_bytes()[:-8])
    with pytest.raises(SpecError) as info:
        check_token_file(stem, vocab_size=vocab, seq_len=seq_len)
    err = info.value
    assert err.path == field
    assert err.file is not None and err.file.startswith(str(stem))


def test_synthetic_is_a_function_of_seed_and_sample() -> None:
    a = SyntheticSource(seq_len=16, vocab_size=256, seed=1)
    b = SyntheticSource(seq_len=16, vocab_size=256, seed=1)
    assert np.array_equal(a.samples(10, 4), np.stack([b.sample(i) for i in range(10, 14)]))
    assert not np.array_equal(a.samples(0, 4), SyntheticSource(16, 256, seed=2).samples(0, 4))
    s = a.samples(0, 64)
    assert s.shape == (64, 17) and s.min() >= 0 and s.max() < 256
    # mostly an arithmetic sequence: the next token is predictable from the two before it
    d = (s[:, 2:] - 2 * s[:, 1:-1] + s[:, :-2]) % 256
    assert (d == 0).mean() > 0.6


def test_pipelines_take_their_rows_whatever_the_plan() -> None:
    plan = load_plan(PLAN6)  # pipelines of batch 5 and 3
    src = make_source(plan, data=None, seed=7)
    pos = DataPosition(step=2, samples=16)
    whole = global_batch(src, pos, plan.global_batch_size)
    assert whole.shape == (8, plan.model.seq_len + 1) and whole.dtype == torch.int64
    parts = []
    for p in range(len(plan.pipelines)):
        rows = pipeline_rows(plan, p)
        stream = BatchStream(src, global_batch_size=8, rows=rows, position=pos, device=torch.device("cpu"))
        parts.append(stream.next())
        assert stream.position == DataPosition(3, 24)
    assert pipeline_rows(plan, 1) == (5, 3)
    torch.testing.assert_close(torch.cat(parts), whole)
    # one pipeline of batch 8 (another plan) sees the same global batch at the same position
    single = BatchStream(src, global_batch_size=8, rows=(0, 8), position=pos, device=torch.device("cpu"))
    torch.testing.assert_close(single.next(), whole)


def test_position_round_trip_and_validation() -> None:
    pos = DataPosition(3, 24)
    assert DataPosition.from_dict(pos.to_dict()) == pos
    with pytest.raises(SpecError, match="extra.data"):
        DataPosition.from_dict({"step": -1, "samples": 0})


def test_cli_pack_and_info(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = tmp_path / "toks.txt"
    text.write_text("1 2 3 4 5 6\n7,8,9\n")
    assert cli(["data", "pack", str(text), "-o", str(tmp_path / "p")]) == 0
    assert cli(["data", "info", str(tmp_path / "p"), "--vocab-size", "10", "--seq-len", "4"]) == 0
    out = capsys.readouterr().out
    assert "tokens:     9" in out and "documents:  2" in out and "samples:    2" in out
    assert cli(["data", "info", str(tmp_path / "p"), "--vocab-size", "9", "--seq-len", "4"]) == 1
    assert "vocab_size=9" in capsys.readouterr().err
    np.save(tmp_path / "arr.npy", np.arange(12, dtype=np.int32).reshape(3, 4))
    assert cli(["data", "pack", str(tmp_path / "arr.npy"), "-o", str(tmp_path / "q"), "--dtype", "uint32"]) == 0
    q = read_index(tmp_path / "q")
    assert q.dtype == "uint32" and q.num_docs == 3 and q.num_tokens == 12
    bad = tmp_path / "bad.txt"
    bad.write_text("1 2 x\n")
    assert cli(["data", "pack", str(bad), "-o", str(tmp_path / "r")]) == 1
