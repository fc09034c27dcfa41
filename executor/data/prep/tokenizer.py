"""Loading a ``tokenizers`` tokenizer: a ``tokenizer.json`` or a Hugging Face tokenizer folder.

A folder must hold ``tokenizer.json`` (the fast-tokenizer file); its ``tokenizer_config.json``, when
present, names the end-of-document token (``eos_token``) that ``--eos auto`` appends to every
document, so that packed documents stay apart in the token stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.documents import load_json_file
from planner.errors import SpecError

INSTALL_HINT = "pip install 'hexiscale[data]' (the tokenizers package)"


def import_tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError:
        raise SpecError("--tokenizer", "tokenizing needs the tokenizers package", INSTALL_HINT) from None
    return tokenizers


@dataclass(frozen=True)
class TokenizerSpec:
    """What every worker needs to rebuild the same tokenizer (picklable)."""

    file: Path  # tokenizer.json
    vocab_size: int  # with added tokens: ids are below this
    eos_id: int | None  # appended after every document
    eos: str | None
    special_tokens: bool  # apply the tokenizer's post-processor (e.g. a BOS token)

    def load(self) -> Any:
        return import_tokenizers().Tokenizer.from_file(str(self.file))


def _config_eos(folder: Path) -> str | None:
    cfg = folder / "tokenizer_config.json"
    if not cfg.exists():
        return None
    try:
        data = load_json_file(cfg, "tokenizer config")
    except SpecError as exc:
        raise SpecError("--tokenizer", f"cannot read {cfg}: {exc.message}", "fix or remove tokenizer_config.json"
                        ) from None
    if not isinstance(data, dict):
        raise SpecError("--tokenizer", f"{cfg} is not a JSON object", "fix or remove tokenizer_config.json")
    eos = data.get("eos_token")
    if isinstance(eos, dict):  # AddedToken serialised as {"content": "</s>", ...}
        eos = eos.get("content")
    return eos if isinstance(eos, str) and eos else None


def load_tokenizer_spec(path: str | Path, *, eos: str = "auto", special_tokens: bool = True) -> TokenizerSpec:
    """``path``: a tokenizer.json or a folder holding one. ``eos``: ``auto`` (the folder's
    ``eos_token``, if any), ``none``, or a token string."""
    p = Path(path)
    file = p / "tokenizer.json" if p.is_dir() else p
    if not file.exists():
        what = "has no tokenizer.json" if p.is_dir() else "does not exist"
        raise SpecError("--tokenizer", f"{p} {what}", "pass a tokenizer.json or a Hugging Face tokenizer folder "
                        "(a folder with only tokenizer.model: save it with transformers to get tokenizer.json)")
    try:
        tok = import_tokenizers().Tokenizer.from_file(str(file))
    except Exception as exc:  # noqa: BLE001 - the Rust side raises plain Exceptions
        raise SpecError("--tokenizer", f"cannot load {file}: {str(exc).splitlines()[0][:200]}",
                        "pass a tokenizer.json written by the tokenizers library") from None
    token = (_config_eos(p) if p.is_dir() else None) if eos == "auto" else None if eos == "none" else eos
    eos_id = None
    if token is not None:
        eos_id = tok.token_to_id(token)
        if eos_id is None:
            raise SpecError("--eos", f"{token!r} is not a token of {file}", "pass a token of the vocabulary or none")
    return TokenizerSpec(file=file, vocab_size=tok.get_vocab_size(with_added_tokens=True), eos_id=eos_id,
                         eos=token, special_tokens=special_tokens)
