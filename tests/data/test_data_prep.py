"""``hexiscale data prep``: text, JSONL and Parquet through a locally trained BPE into token files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from executor.data.prep.corpus import expand_inputs, read_batches
from executor.data.prep.pipeline import prep
from executor.data.prep.tokenizer import load_tokenizer_spec
from executor.data.token_file import open_tokens, read_index
from hexiscale.cli.main import main as cli
from planner.errors import SpecError
from tests.support.tokenizer import EOS, stdlib_texts

DOCS = stdlib_texts("email")  # ~40 documents of a few hundred to ~100k characters
SMALL = 1 << 14  # bytes a batch


def documents(stem: Path) -> list[np.ndarray]:
    index = read_index(stem)
    tokens = open_tokens(index)
    return [np.asarray(tokens[a:b]) for a, b in zip(index.doc_offsets[:-1], index.doc_offsets[1:])]


def decoded(stem: Path, folder: Path) -> list[str]:
    spec = load_tokenizer_spec(folder)
    tok = spec.load()
    out = []
    for doc in documents(stem):
        assert doc[-1] == spec.eos_id  # every document ends with the folder's eos_token
        out.append(tok.decode(doc[:-1].tolist()))
    return out


def test_jsonl_round_trips_in_order_whatever_the_workers(tmp_path: Path, bpe_folder: Path) -> None:
    src = tmp_path / "corpus.jsonl"
    src.write_text("".join(json.dumps({"id": i, "body": d}) + "\n" for i, d in enumerate(DOCS)) + "\n")
    spec = load_tokenizer_spec(bpe_folder)
    batches = list(read_batches([src], field="body", batch_bytes=SMALL))
    assert len(batches) > 8  # several in flight at once, so the order of results matters
    one, _ = prep(iter(batches), tmp_path / "one", spec, field="body", workers=1)
    two, s2 = prep(iter(batches), tmp_path / "two", spec, field="body", workers=2)
    assert one.bin_path.read_bytes() == two.bin_path.read_bytes()
    assert np.array_equal(one.doc_offsets, two.doc_offsets)
    assert decoded(tmp_path / "two", bpe_folder) == DOCS  # byte-level BPE is lossless
    assert s2.documents == len(DOCS) == one.num_docs and s2.tokens == one.num_tokens
    assert sum(c for *_, c in s2.histogram()) == len(DOCS)
    lengths = np.diff(one.doc_offsets.astype(np.int64))
    for lo, hi, c in s2.histogram():
        assert c == int(((lengths >= lo) & (lengths <= hi)).sum())
    assert one.dtype == "uint16" and one.max_token < spec.vocab_size == 384


def test_text_modes(tmp_path: Path, bpe_folder: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("first line\n\nsecond line\nthird\n")
    (tmp_path / "in" / "b.txt").write_text("para one\nstill one\n\n\npara two\n")
    (tmp_path / "in" / ".hidden").write_text("never read\n")
    files = expand_inputs([str(tmp_path / "in")])
    assert [f.name for f in files] == ["a.txt", "b.txt"]
    spec = load_tokenizer_spec(bpe_folder)
    expect = {"line": ["first line", "second line", "third", "para one", "still one", "para two"],
              "paragraph": ["first line\n", "second line\nthird\n", "para one\nstill one\n", "para two\n"],
              "file": [(tmp_path / "in" / n).read_text() for n in ("a.txt", "b.txt")]}
    for mode, docs in expect.items():
        _, summary = prep(read_batches(files, text_docs=mode), tmp_path / mode, spec, workers=1)
        assert decoded(tmp_path / mode, bpe_folder) == docs, mode
    assert summary.input_bytes == sum(f.stat().st_size for f in files)
    # without the folder's eos_token: no end token; --eos none likewise
    bare = load_tokenizer_spec(bpe_folder / "tokenizer.json")
    assert bare.eos_id is None and load_tokenizer_spec(bpe_folder, eos="none").eos_id is None
    prep(read_batches(files), tmp_path / "bare", bare, workers=1)
    assert [len(d) for d in documents(tmp_path / "bare")] == [len(d) - 1 for d in documents(tmp_path / "line")]


def test_parquet_column(tmp_path: Path, bpe_folder: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": DOCS[:5] + [None, ""], "n": list(range(7))}), path)
    _, summary = prep(read_batches([path]), tmp_path / "pq", load_tokenizer_spec(bpe_folder), workers=2)
    assert decoded(tmp_path / "pq", bpe_folder) == DOCS[:5] and summary.skipped == 2
    assert summary.input_bytes == path.stat().st_size
    with pytest.raises(SpecError, match="column 'n' holds int"):
        list(read_batches([path], field="n"))
    with pytest.raises(SpecError, match="no column 'body'"):
        list(read_batches([path], field="body"))


def test_parquet_without_pyarrow_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow now fails as if absent
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    (tmp_path / "c.parquet").write_bytes(b"PAR1")
    with pytest.raises(SpecError, match=r"needs the pyarrow package.*hexiscale\[parquet\]"):
        list(read_batches([tmp_path / "c.parquet"]))


@pytest.mark.parametrize("lines, message", [
    (['{"text": "ok"}', '{"body": "x"}'], r"c.jsonl:2: --field: the record has no field 'text'"),
    (['{"text": "ok"}', "", "{not json"], r"c.jsonl:3: INPUT: not a JSON line"),
    (['{"text": 3}'], r"c.jsonl:1: --field: 'text' holds int"),
    (['{"text": "ok"}', '{"text": ' + "[" * 100_000 + "]" * 100_000 + "}"], r"c.jsonl:2: INPUT: .*nested too deep"),
    (['{"text": ' + "9" * 5000 + "}"], r"c.jsonl:1: INPUT: .*a number too long"),
])
def test_bad_jsonl_names_file_and_line(tmp_path: Path, bpe_folder: Path, lines: list[str], message: str) -> None:
    src = tmp_path / "c.jsonl"
    src.write_text("\n".join(lines) + "\n")
    for workers in (1, 2):
        with pytest.raises(SpecError, match=message):
            prep(read_batches([src]), tmp_path / "out", load_tokenizer_spec(bpe_folder), workers=workers)


def test_bad_tokenizers(tmp_path: Path, bpe_folder: Path) -> None:
    with pytest.raises(SpecError, match="has no tokenizer.json"):
        load_tokenizer_spec(tmp_path)
    (tmp_path / "t.json").write_text("{}")
    with pytest.raises(SpecError, match="cannot load"):
        load_tokenizer_spec(tmp_path / "t.json")
    deep = tmp_path / "deep"
    deep.mkdir()
    (deep / "tokenizer.json").write_text((bpe_folder / "tokenizer.json").read_text())
    for config, message in (("[" * 100_000 + "]" * 100_000, "nested more than"), ("[]", "not a JSON object")):
        (deep / "tokenizer_config.json").write_text(config)
        with pytest.raises(SpecError, match=message):
            load_tokenizer_spec(deep)
    with pytest.raises(SpecError, match="not a token"):
        load_tokenizer_spec(bpe_folder, eos="<eos>")
    assert load_tokenizer_spec(bpe_folder, eos=EOS).eos_id == load_tokenizer_spec(bpe_folder).eos_id


def test_cli_prep_prints_summary(tmp_path: Path, bpe_folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "c.txt"
    src.write_text("\n".join(d.replace("\n", " ") for d in DOCS[:6]) + "\n")
    assert cli(["data", "prep", str(src), "-o", str(tmp_path / "c"), "--tokenizer", str(bpe_folder),
                "--workers", "2", "--no-progress"]) == 0
    out = capsys.readouterr().out
    index = read_index(tmp_path / "c")
    assert index.num_docs == 6 and f"tokens:     {index.num_tokens:,}" in out and "documents:  6" in out
    assert "document length (tokens):" in out and "#" in out and f"end of document {EOS}" in out
    assert cli(["data", "prep", str(tmp_path / "none.txt"), "-o", str(tmp_path / "x"), "--tokenizer",
                str(bpe_folder)]) == 1
    assert "none.txt does not exist" in capsys.readouterr().err
