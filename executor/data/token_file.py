"""The token file format (``hexiscale.tokens/1``): a flat ``.bin`` of tokens plus an ``.idx`` index.

Files (``PATH`` is the common stem; ``PATH.bin`` / ``PATH.idx`` are accepted too)::

    PATH.bin   num_tokens little-endian uint16 or uint32 values, documents back to back
    PATH.idx   b"HXTOKIDX"                       8 bytes magic
               uint32 LE: n                      length of the JSON header in bytes
               n bytes of UTF-8 JSON header      {"format", "dtype", "num_tokens", "num_docs",
                                                  "max_token", "offsets_at"}
               zero padding to ``offsets_at``    (a multiple of 8)
               (num_docs + 1) uint64 LE          document boundaries: doc d is tokens
                                                  [offsets[d], offsets[d+1]); offsets[0] = 0,
                                                  offsets[-1] = num_tokens

The ``.bin`` is memory-mapped (numpy), so a file larger than RAM costs nothing to open. Training
samples are ``seq_len + 1`` token windows over the concatenated stream (documents are packed; a
window may cross a boundary, as in GPT-style pre-training): window ``i`` starts at token
``i * seq_len``, so ``num_samples = (num_tokens - 1) // seq_len``.

This module needs only numpy (the CLI's ``hexiscale data`` imports it without torch). Every
problem with a file is a ``SpecError`` naming the file and the field.
"""

from __future__ import annotations

import array
import json
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from planner.documents import check_regular_file
from planner.errors import SpecError
from planner.ranges import shown_int

TOKEN_FORMAT = "hexiscale.tokens/1"
MAGIC = b"HXTOKIDX"
TOKEN_DTYPES: dict[str, Any] = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
HEADER_KEYS = ("format", "dtype", "num_tokens", "num_docs", "max_token", "offsets_at")
MAX_TOKEN_ID = (1 << 32) - 1  # the largest id a uint32 token file holds
_SCAN_CHUNK = 1 << 24  # tokens per chunk when scanning a file for its largest id


def token_paths(path: str | Path) -> tuple[Path, Path]:
    """(``.bin``, ``.idx``) for a stem or for either file's name."""
    p = Path(path)
    stem = p.with_suffix("") if p.suffix in (".bin", ".idx") else p
    return Path(f"{stem}.bin"), Path(f"{stem}.idx")


@dataclass(frozen=True)
class TokenIndex:
    """The parsed ``.idx`` of a token file."""

    bin_path: Path
    idx_path: Path
    dtype: str
    num_tokens: int
    max_token: int
    doc_offsets: np.ndarray  # uint64 [num_docs + 1]

    @property
    def num_docs(self) -> int:
        return len(self.doc_offsets) - 1

    def num_samples(self, seq_len: int) -> int:
        """Windows of ``seq_len + 1`` tokens with stride ``seq_len``."""
        return max(0, (self.num_tokens - 1) // seq_len)


def _as_docs(tokens_or_docs: Any) -> list[np.ndarray]:
    """One flat sequence (ints / 1-D array) is one document; a list of sequences is several."""
    if isinstance(tokens_or_docs, np.ndarray):
        if tokens_or_docs.ndim == 1:
            return [tokens_or_docs]
        if tokens_or_docs.ndim == 2:
            return [row for row in tokens_or_docs]
        raise SpecError("tokens", f"expected a 1-D or 2-D array, got {tokens_or_docs.ndim}-D", "flatten it")
    items = list(tokens_or_docs)
    if items and all(isinstance(x, int | np.integer) and not isinstance(x, bool) for x in items):
        return [np.asarray(items, dtype=np.int64)]
    return [np.asarray(list(doc), dtype=np.int64) for doc in items]


class TokenWriter:
    """Streams documents into ``PATH.bin`` and writes ``PATH.idx`` on :meth:`close` (the index last,
    so a file without one is unfinished). ``dtype`` is fixed up front (uint16 or uint32)."""

    def __init__(self, path: str | Path, dtype: str):
        if dtype not in TOKEN_DTYPES:
            raise SpecError("dtype", f"{dtype!r} is not one of uint16, uint32, auto", "choose a token width")
        self.dtype = dtype
        self.bin_path, self.idx_path = token_paths(path)
        self.bin_path.parent.mkdir(parents=True, exist_ok=True)
        self.idx_path.unlink(missing_ok=True)
        self._bin = open(self.bin_path, "wb")
        self._offsets = array.array("Q", [0])  # 8 bytes a document, however many
        self.max_token = -1

    def add(self, doc: np.ndarray) -> None:
        """Append one document (a 1-D array of token ids)."""
        self.add_docs(doc, [len(doc)])

    def add_docs(self, tokens: np.ndarray, lengths: Sequence[int] | np.ndarray) -> None:
        """Append documents stored back to back in ``tokens`` (``lengths``: tokens of each)."""
        if len(tokens):
            lo, hi = int(tokens.min()), int(tokens.max())
            if lo < 0:
                raise SpecError("tokens", f"token id {lo} is negative", "token ids are 0 .. vocab_size-1")
            if hi > np.iinfo(TOKEN_DTYPES[self.dtype]).max:
                raise SpecError("dtype", f"token id {hi} does not fit {self.dtype}", "use uint32")
            self.max_token = max(self.max_token, hi)
        self._bin.write(np.ascontiguousarray(tokens, dtype=TOKEN_DTYPES[self.dtype]).tobytes())
        self._offsets.extend((self._offsets[-1] + np.cumsum(lengths, dtype=np.int64)).tolist())

    def close(self) -> TokenIndex:
        self._bin.close()
        if self._offsets[-1] == 0:
            raise SpecError("tokens", "no tokens to write", "pass at least one non-empty document")
        offsets = np.frombuffer(self._offsets, dtype=np.uint64).astype("<u8")
        header = {"format": TOKEN_FORMAT, "dtype": self.dtype, "num_tokens": int(offsets[-1]),
                  "num_docs": len(offsets) - 1, "max_token": self.max_token, "offsets_at": 10**9}
        # offsets_at depends on the header's own length: fix the width of the number first.
        width = len(json.dumps(header).encode())
        header["offsets_at"] = offsets_at = (len(MAGIC) + 4 + width + 7) // 8 * 8
        blob = json.dumps(header).encode().ljust(width)
        with open(self.idx_path, "wb") as f:
            f.write(MAGIC + struct.pack("<I", len(blob)) + blob)
            f.write(b"\0" * (offsets_at - len(MAGIC) - 4 - len(blob)))
            f.write(offsets.tobytes())
        return read_index(self.bin_path)


def dtype_for(largest_id: int) -> str:
    """The smallest token width that holds ids up to ``largest_id``."""
    return "uint16" if largest_id < 1 << 16 else "uint32"


def write_token_file(path: str | Path, tokens_or_docs: Iterable[Any] | np.ndarray, dtype: str = "auto") -> TokenIndex:
    """Write ``PATH.bin`` and ``PATH.idx``; ``dtype`` is uint16, uint32 or auto (smallest that fits).

    ``tokens_or_docs`` is a flat token list (one document) or a list of documents.
    """
    docs = _as_docs(tokens_or_docs)
    if not docs or sum(len(d) for d in docs) == 0:
        raise SpecError("tokens", "no tokens to write", "pass at least one non-empty document")
    writer = TokenWriter(path, dtype_for(max(int(d.max()) for d in docs if len(d))) if dtype == "auto" else dtype)
    for d in docs:
        writer.add(d)
    return writer.close()


def _int_field(header: dict[str, Any], key: str, file: str, minimum: int = 0) -> int:
    value = header[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SpecError(f"idx.{key}", f"expected an integer >= {minimum}, got {value!r}",
                        "the index is damaged: rewrite it with 'hexiscale data pack'", file)
    return value


def read_index(path: str | Path) -> TokenIndex:
    """Parse and check the ``.idx`` (and the ``.bin`` size) of a token file."""
    bin_path, idx_path = token_paths(path)
    for p, what in ((idx_path, "token index"), (bin_path, "token")):
        if not p.exists():
            raise SpecError("", "no such file", "write token files with 'hexiscale data pack'", str(p))
        check_regular_file(p, what)
    f_idx = str(idx_path)
    raw = idx_path.read_bytes()
    if raw[:8] != MAGIC or len(raw) < 12:
        raise SpecError("idx.magic", f"not a HexiScale token index (starts with {raw[:8]!r})",
                        "write token files with 'hexiscale data pack'", f_idx)
    (n,) = struct.unpack("<I", raw[8:12])
    try:
        header = json.loads(raw[12:12 + n].decode())
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # bad JSON, too deep, a huge integer
        raise SpecError("idx.header", f"header is not valid JSON ({exc})", "rewrite the index", f_idx) from None
    if not isinstance(header, dict):
        raise SpecError("idx.header", "header is not a JSON object", "rewrite the index", f_idx)
    for key in HEADER_KEYS:
        if key not in header:
            raise SpecError(f"idx.{key}", "missing from the header", "rewrite the index", f_idx)
    unknown = sorted(set(header) - set(HEADER_KEYS))
    if unknown:
        raise SpecError(f"idx.{unknown[0]}", "unknown header field", f"this HexiScale reads {TOKEN_FORMAT}", f_idx)
    if header["format"] != TOKEN_FORMAT:
        raise SpecError("idx.format", f"unsupported format {header['format']!r}", f"expected {TOKEN_FORMAT!r}", f_idx)
    if not isinstance(header["dtype"], str) or header["dtype"] not in TOKEN_DTYPES:
        raise SpecError("idx.dtype", f"{header['dtype']!r} is not uint16 or uint32", "rewrite the index", f_idx)
    num_tokens = _int_field(header, "num_tokens", f_idx)
    num_docs = _int_field(header, "num_docs", f_idx)
    max_token = _int_field(header, "max_token", f_idx)
    offsets_at = _int_field(header, "offsets_at", f_idx, minimum=12 + n)
    end = offsets_at + 8 * (num_docs + 1)
    if len(raw) != end:
        raise SpecError("idx.num_docs", f"the index holds {len(raw)} bytes, {num_docs} documents need {end}",
                        "the index is truncated or damaged: rewrite it", f_idx)
    offsets = np.frombuffer(raw, dtype="<u8", count=num_docs + 1, offset=offsets_at)
    if offsets[0] != 0 or int(offsets[-1]) != num_tokens or np.any(np.diff(offsets.astype(np.int64)) < 0):
        raise SpecError("idx.offsets", "document boundaries are not increasing from 0 to num_tokens",
                        "rewrite the index", f_idx)
    itemsize = TOKEN_DTYPES[header["dtype"]].itemsize
    size = bin_path.stat().st_size
    if size != num_tokens * itemsize:
        raise SpecError("bin.size", f"{size} bytes, but the index says {num_tokens} {header['dtype']} tokens "
                        f"({num_tokens * itemsize} bytes)", "the .bin and .idx do not belong together",
                        str(bin_path))
    return TokenIndex(bin_path, idx_path, header["dtype"], num_tokens, max_token, offsets)


def open_tokens(index: TokenIndex) -> np.ndarray:
    """The ``.bin`` as a read-only memory map."""
    if index.num_tokens == 0:
        return np.zeros(0, dtype=TOKEN_DTYPES[index.dtype])
    return np.memmap(index.bin_path, dtype=TOKEN_DTYPES[index.dtype], mode="r", shape=(index.num_tokens,))


def scan_max_token(index: TokenIndex) -> int:
    """The largest token id actually stored (a chunked pass over the memory map)."""
    tokens = open_tokens(index)
    best = -1
    for start in range(0, len(tokens), _SCAN_CHUNK):
        best = max(best, int(tokens[start:start + _SCAN_CHUNK].max()))
    return best


def check_token_file(path: str | Path, *, vocab_size: int, seq_len: int, scan: bool = True) -> TokenIndex:
    """Everything training needs from a file, or a ``SpecError``: a valid index, ids below
    ``vocab_size`` (the header's claim and, with ``scan``, the stored tokens), one full sample."""
    index = read_index(path)
    f_bin = str(index.bin_path)
    if index.max_token >= vocab_size:
        raise SpecError("idx.max_token", f"token id {index.max_token} >= vocab_size={vocab_size}",
                        "tokenize with the model's vocabulary or pick a model with a larger vocab_size",
                        str(index.idx_path))
    if scan and index.num_tokens:
        actual = scan_max_token(index)
        if actual >= vocab_size:
            raise SpecError("bin.tokens", f"holds token id {actual} >= vocab_size={vocab_size}",
                            "the file does not match its index or the model's vocabulary", f_bin)
        if actual > index.max_token:
            raise SpecError("idx.max_token", f"says {index.max_token}, the file holds {actual}",
                            "rewrite the index", str(index.idx_path))
    if index.num_samples(seq_len) < 1:
        raise SpecError("bin.num_tokens", f"{index.num_tokens} tokens are too few for one sample of "
                        f"seq_len + 1 = {seq_len + 1} tokens", "use a longer file or a shorter seq_len", f_bin)
    return index


def read_text_tokens(path: str | Path) -> list[list[int]]:
    """Documents from a text file of whitespace- or comma-separated integers, one document a line."""
    p = Path(path)
    check_regular_file(p, "token list")
    try:
        lines = p.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError("", f"cannot read token list: {exc}", "pass a text or .npy file", str(p)) from None
    docs: list[list[int]] = []
    for ln, line in enumerate(lines, 1):
        parts = line.replace(",", " ").split()
        if not parts:
            continue
        try:
            doc = [int(x) for x in parts]
        except ValueError:
            raise SpecError(f"line {ln}", f"not a list of integers: {line[:60]!r}",
                            "one document per line, token ids separated by spaces", str(p)) from None
        bad = next((t for t in doc if not 0 <= t <= MAX_TOKEN_ID), None)
        if bad is not None:
            raise SpecError(f"line {ln}", f"token id {shown_int(bad)} is out of range",
                            f"token ids are 0 .. {MAX_TOKEN_ID}", str(p))
        docs.append(doc)
    return docs


def load_token_list(path: str | Path) -> Sequence[Any]:
    """A ``.npy`` array (1-D: one document; 2-D: one document per row) or a text token list."""
    p = Path(path)
    if p.suffix == ".npy":
        check_regular_file(p, "token array")
        try:
            arr = np.load(p, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise SpecError("", f"cannot read .npy: {exc}", "pass a 1-D or 2-D integer array", str(p)) from None
        if arr.dtype.kind not in "iu":
            raise SpecError("", f"array dtype {arr.dtype} is not an integer type", "store token ids", str(p))
        if arr.size and not (0 <= int(arr.min()) and int(arr.max()) <= MAX_TOKEN_ID):
            bad = int(arr.min()) if int(arr.min()) < 0 else int(arr.max())
            raise SpecError("", f"token id {bad} is out of range", f"token ids are 0 .. {MAX_TOKEN_ID}", str(p))
        return _as_docs(arr)
    return read_text_tokens(p)
