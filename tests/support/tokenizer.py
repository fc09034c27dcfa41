"""A byte-level BPE tokenizer trained here, on CPython's own standard-library source (no hub)."""

from __future__ import annotations

import json
from pathlib import Path

STDLIB = Path(json.__file__).resolve().parents[1]  # the folder of the standard library's .py files
EOS = "<|end|>"


def stdlib_texts(package: str) -> list[str]:
    """The source files of a standard-library package, one text each, in sorted order."""
    return [p.read_text(encoding="utf-8") for p in sorted((STDLIB / package).glob("*.py"))]


def train_bpe(folder: Path, vocab_size: int = 384) -> Path:
    """Train a byte-level BPE on the ``json`` and ``email`` packages' source; write ``folder`` as a
    Hugging Face tokenizer folder (tokenizer.json + tokenizer_config.json naming the EOS token)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(stdlib_texts("json") + stdlib_texts("email"), trainer=trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS}))
    return folder
