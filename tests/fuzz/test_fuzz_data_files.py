"""Token files through ``hexiscale data info`` and token lists through ``hexiscale data pack``:
damaged headers, wrong sizes, random bytes, out-of-range ids, odd arrays end in exit 0 or one
error line naming the field, never a traceback or a hang; ids that do not fit are refused."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from executor.data.token_file import MAGIC, write_token_file
from tests.support.cli_run import names, run_cli
from tests.support.fuzz_settings import fuzz
from tests.support.fuzz_strategies import mutated

FUZZ = fuzz(700)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tokens")


def _good(folder: Path) -> tuple[dict[str, Any], bytes, bytes]:
    write_token_file(folder / "good", [list(range(40)), list(range(7, 30))])
    raw = (folder / "good.idx").read_bytes()
    (n,) = struct.unpack("<I", raw[8:12])
    return json.loads(raw[12:12 + n]), raw, (folder / "good.bin").read_bytes()


HEADER = {"format": "hexiscale.tokens/1", "dtype": "uint16", "num_tokens": 63, "num_docs": 2, "max_token": 39,
          "offsets_at": 112}


@FUZZ
@given(header=mutated(HEADER), tail_cut=st.integers(0, 24), bin_extra=st.integers(-8, 8),
       check=st.booleans())
def test_damaged_token_index(folder: Path, header: Any, tail_cut: int, bin_extra: int, check: bool) -> None:
    good, raw, data = _good(folder)
    try:
        blob = json.dumps(header).encode()
    except (ValueError, OverflowError):
        return
    offsets = raw[good["offsets_at"]:]
    idx = MAGIC + struct.pack("<I", len(blob)) + blob
    idx += b"\0" * (-len(idx) % 8) + offsets[:len(offsets) - tail_cut]
    (folder / "t.idx").write_bytes(idx)
    (folder / "t.bin").write_bytes(data[:max(0, len(data) + bin_extra)] + b"\1" * max(0, bin_extra))
    run_cli(["data", "info", str(folder / "t")] + (["--vocab-size", "256", "--seq-len", "8"] if check else []))


@FUZZ
@given(idx=st.binary(max_size=200), data=st.binary(max_size=64))
def test_random_bytes_as_token_files(folder: Path, idx: bytes, data: bytes) -> None:
    (folder / "r.idx").write_bytes(MAGIC + idx if idx[:1] == b"\0" else idx)
    (folder / "r.bin").write_bytes(data)
    run_cli(["data", "info", str(folder / "r"), "--vocab-size", "100", "--seq-len", "4"])


token = st.one_of(st.integers(0, 70), st.integers(-(10**30), 10**30),
                  st.sampled_from([2**32 - 1, 2**32, 2**64, -1, 10**400]))
line = st.one_of(st.lists(token, max_size=6).map(lambda ts: " ".join(map(str, ts))), st.text(max_size=12))


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


@FUZZ
@given(lines=st.lists(line, max_size=5), sep=st.sampled_from([" ", ",", ", "]))
def test_token_text_lists(folder: Path, lines: list[str], sep: str) -> None:
    src = folder / "tokens.txt"
    src.write_text("\n".join(ln.replace(" ", sep) for ln in lines))
    outcome = run_cli(["data", "pack", str(src), "-o", str(folder / "packed")])
    rows = [[_int(x) for x in ln.split()] for ln in lines]
    if any(None not in row and any(not 0 <= t < 2**32 for t in row) for row in rows if row):
        assert outcome.code == 1 and names(outcome, "line"), outcome.err


arrays = st.one_of(
    st.lists(st.integers(-5, 2**40), max_size=8).map(lambda v: np.array(v, dtype=np.int64)),
    st.lists(st.floats(allow_nan=True), max_size=5).map(np.array),
    st.integers(0, 3).map(lambda d: np.zeros((2,) * d, dtype=np.uint64) + np.uint64(2**63)),
    st.sampled_from([np.array([b"ab"]), np.array([True, False]), np.zeros((0, 3), dtype=np.int32),
                     np.arange(6, dtype=np.uint32).reshape(2, 3)]),
)


@FUZZ
@given(array=arrays)
def test_token_arrays(folder: Path, array: np.ndarray) -> None:
    src = folder / "tokens.npy"
    np.save(src, array)
    run_cli(["data", "pack", str(src), "-o", str(folder / "packed-npy")])
