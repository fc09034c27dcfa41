from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.tokenizer import train_bpe


@pytest.fixture(scope="session")
def bpe_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE (384 tokens, EOS ``<|end|>``) trained on standard-library source."""
    pytest.importorskip("tokenizers")
    return train_bpe(tmp_path_factory.mktemp("tok") / "bpe")
