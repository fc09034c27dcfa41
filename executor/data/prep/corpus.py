"""Reading a corpus as batches of documents: text, JSONL (one field) or Parquet (one column).

* **text**: ``--text-docs line`` (every non-blank line is a document), ``paragraph`` (documents
  are separated by blank lines) or ``file`` (the whole file is one document).
* **JSONL** (``.jsonl``, ``.json``): one JSON object a line; the document is its ``--field``.
  Lines are parsed by the workers (:func:`parse_records`), errors name the file and line.
* **Parquet** (``.parquet``, needs ``pyarrow``): the ``--field`` column, read in record batches.

A batch carries about :data:`BATCH_BYTES` of text and its share of the input's bytes, which drives
the progress bar. Reading stays lazy: nothing but the batches in flight is in memory.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.errors import SpecError

FORMATS = ("auto", "text", "jsonl", "parquet")
TEXT_DOCS = ("line", "paragraph", "file")
BATCH_BYTES = 1 << 20
PARQUET_HINT = "pip install 'hexiscale[parquet]' (the pyarrow package)"


@dataclass(frozen=True)
class Batch:
    source: str  # file name, for errors
    first_line: int  # 1-based line of items[0] (JSONL), for errors
    kind: str  # "text": items are documents; "jsonl": items are JSON lines still to parse
    items: list[str]
    nbytes: int  # input bytes this batch accounts for (progress)


def expand_inputs(inputs: list[str]) -> list[Path]:
    """Files as given; a folder stands for every non-hidden file below it, in sorted order."""
    out: list[Path] = []
    for name in inputs:
        p = Path(name)
        if p.is_dir():
            out += sorted(f for f in p.rglob("*") if f.is_file() and not any(
                part.startswith(".") for part in f.relative_to(p).parts))
        elif p.is_file():
            out.append(p)
        else:
            raise SpecError("INPUT", f"{name} does not exist", "pass text, JSONL or Parquet files or folders")
    if not out:
        raise SpecError("INPUT", "no input files", "pass text, JSONL or Parquet files or folders")
    return out


def format_of(path: Path, fmt: str) -> str:
    if fmt != "auto":
        return fmt
    suffix = path.suffix.lower()
    return "jsonl" if suffix in (".jsonl", ".json") else "parquet" if suffix == ".parquet" else "text"


def _chunks(items: Iterator[tuple[int, str, int]], source: str, kind: str, limit: int) -> Iterator[Batch]:
    """Group (line, text, nbytes) items into batches of about ``limit`` bytes."""
    batch: list[str] = []
    first, size = 1, 0
    for line, text, nbytes in items:
        if not batch:
            first = line
        batch.append(text)
        size += nbytes
        if size >= limit:
            yield Batch(source, first, kind, batch, size)
            batch, size = [], 0
    if batch or size:
        yield Batch(source, first, kind, batch, size)


def _lines(path: Path) -> Iterator[tuple[int, str, int]]:
    try:
        with open(path, "rb") as f:
            for n, raw in enumerate(f, 1):
                yield n, raw.decode("utf-8"), len(raw)
    except UnicodeDecodeError as exc:
        raise SpecError("INPUT", f"line {n} is not UTF-8 ({exc.reason})", "pass UTF-8 text", str(path)) from None


def _paragraphs(path: Path) -> Iterator[tuple[int, str, int]]:
    para: list[str] = []
    start, size = 1, 0
    for n, line, nbytes in _lines(path):
        size += nbytes
        if line.strip():
            if not para:
                start = n
            para.append(line)
        elif para:
            yield start, "".join(para), size
            para, size = [], 0
    if para or size:
        yield start, "".join(para), size


def _text_items(path: Path, text_docs: str) -> Iterator[tuple[int, str, int]]:
    if text_docs == "file":
        data = path.read_bytes()
        try:
            yield 1, data.decode("utf-8"), len(data)
        except UnicodeDecodeError as exc:
            raise SpecError("INPUT", f"not UTF-8 ({exc.reason})", "pass UTF-8 text", str(path)) from None
    elif text_docs == "paragraph":
        yield from _paragraphs(path)
    else:
        yield from ((n, line.rstrip("\r\n"), b) for n, line, b in _lines(path))


def _parquet_batches(path: Path, field: str) -> Iterator[Batch]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise SpecError("--format", "reading Parquet needs the pyarrow package", PARQUET_HINT) from None
    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow's errors have no common base worth naming
        raise SpecError("INPUT", f"not a Parquet file: {str(exc)[:200]}", "pass .parquet files", str(path)) from None
    if field not in pf.schema_arrow.names:
        raise SpecError("--field", f"no column {field!r} (columns: {', '.join(pf.schema_arrow.names)})",
                        "pass --field with the text column", str(path))
    total_rows = max(1, pf.metadata.num_rows)
    size = path.stat().st_size
    row = 0
    for rb in pf.iter_batches(columns=[field], batch_size=4096):
        values = rb.column(0).to_pylist()
        bad = next((v for v in values if v is not None and not isinstance(v, str)), None)
        if bad is not None:
            raise SpecError("--field", f"column {field!r} holds {type(bad).__name__}, not text",
                            "pass --field with a string column", str(path))
        before = size * row // total_rows
        row += len(values)
        yield Batch(str(path), row - len(values) + 1, "text", [v or "" for v in values],
                    size * row // total_rows - before)


def read_batches(files: list[Path], *, fmt: str = "auto", text_docs: str = "line", field: str = "text",
                 batch_bytes: int = BATCH_BYTES) -> Iterator[Batch]:
    """Every document of ``files`` in order, in batches of about ``batch_bytes``."""
    for path in files:
        kind = format_of(path, fmt)
        if kind == "parquet":
            yield from _parquet_batches(path, field)
        elif kind == "jsonl":
            yield from _chunks(_lines(path), str(path), "jsonl", batch_bytes)
        else:
            yield from _chunks(_text_items(path, text_docs), str(path), "text", batch_bytes)


def parse_records(batch: Batch, field: str) -> list[str]:
    """The documents of a batch: JSON lines parsed and their ``field`` taken (blank lines skipped)."""
    if batch.kind != "jsonl":
        return batch.items
    docs = []
    for i, line in enumerate(batch.items):
        if not line.strip():
            continue
        where = f"{batch.source}:{batch.first_line + i}"
        try:
            obj: Any = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SpecError("INPUT", f"not a JSON line ({exc.msg})", "one JSON object a line", where) from None
        except (ValueError, RecursionError) as exc:  # a number of > 4,300 digits; nested too deep for the parser
            what = "nested too deep" if isinstance(exc, RecursionError) else "a number too long to read"
            raise SpecError("INPUT", f"not a readable JSON line ({what})", "one flat JSON object a line",
                            where) from None
        if not isinstance(obj, dict) or field not in obj:
            raise SpecError("--field", f"the record has no field {field!r}", "pass --field with the text field",
                            where)
        if not isinstance(obj[field], str):
            raise SpecError("--field", f"{field!r} holds {type(obj[field]).__name__}, not text",
                            "pass --field with a text field", where)
        docs.append(obj[field])
    return docs
