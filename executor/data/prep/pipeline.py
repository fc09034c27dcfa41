"""Tokenizing batches in worker processes and writing the token file in input order.

The main process reads batches (:mod:`.corpus`) and keeps at most ``2 × workers`` of them in
flight; each worker parses its batch (JSONL), tokenizes it with ``encode_batch`` (one thread per
worker, so ``workers`` processes use ``workers`` cores) and returns one flat array plus the
document lengths. Results are written in submission order, so the output does not depend on the
number of workers. ``workers=1`` runs in-process.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from executor.data.prep.corpus import Batch, parse_records
from executor.data.prep.summary import PrepSummary
from executor.data.prep.tokenizer import TokenizerSpec
from executor.data.token_file import TokenIndex, TokenWriter, dtype_for
from planner.errors import SpecError


@dataclass(frozen=True)
class Tokenized:
    tokens: np.ndarray  # uint32, the batch's documents back to back
    lengths: np.ndarray  # int64, tokens per document (no zeros)
    chars: int
    skipped: int
    nbytes: int


_worker: dict[str, Any] = {}  # per worker process: the tokenizer and its settings


def _init_worker(spec: TokenizerSpec, field: str) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per worker; the pool is the parallelism
    _worker.update(tokenizer=spec.load(), spec=spec, field=field)


def _tokenize(batch: Batch) -> Tokenized | SpecError:
    """One batch in a worker (a SpecError is returned, not raised: it crosses the process boundary)."""
    try:
        docs = parse_records(batch, _worker["field"])
    except SpecError as exc:
        return exc
    spec: TokenizerSpec = _worker["spec"]
    texts = [d for d in docs if d]
    ids = [e.ids for e in _worker["tokenizer"].encode_batch(texts, add_special_tokens=spec.special_tokens)]
    if spec.eos_id is not None:
        ids = [x + [spec.eos_id] for x in ids]
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    flat = np.fromiter((t for x in ids for t in x), dtype=np.uint32, count=int(lengths.sum()))
    kept = lengths > 0
    return Tokenized(flat, lengths[kept], sum(len(d) for d in texts), len(docs) - int(kept.sum()), batch.nbytes)


def _results(batches: Iterable[Batch], spec: TokenizerSpec, field: str, workers: int
             ) -> Iterable[Tokenized | SpecError]:
    if workers == 1:
        _init_worker(spec, field)
        yield from map(_tokenize, batches)
        return
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=(spec, field)) as pool:
        window: deque[Future[Tokenized | SpecError]] = deque()
        for batch in batches:
            window.append(pool.submit(_tokenize, batch))
            if len(window) >= 2 * workers:
                yield window.popleft().result()
        while window:
            yield window.popleft().result()


def prep(batches: Iterable[Batch], output: str | Path, spec: TokenizerSpec, *, field: str = "text",
         workers: int = 1, progress: Callable[[int], None] | None = None) -> tuple[TokenIndex, PrepSummary]:
    """Tokenize every batch into the token file ``output`` (``.bin`` + ``.idx``)."""
    if workers < 1:
        raise SpecError("--workers", f"must be >= 1, got {workers}", "pass a number of processes")
    summary = PrepSummary()
    writer = TokenWriter(output, dtype_for(spec.vocab_size - 1))
    t0 = time.perf_counter()
    for res in _results(batches, spec, field, workers):
        if isinstance(res, SpecError):
            raise res
        writer.add_docs(res.tokens, res.lengths)
        summary.add(res.lengths, res.chars, res.skipped, res.nbytes)
        if progress is not None:
            progress(res.nbytes)
    summary.seconds = time.perf_counter() - t0
    if summary.documents == 0:
        raise SpecError("INPUT", f"no documents with text ({summary.skipped} empty)",
                        "check --format, --field and --text-docs")
    return writer.close(), summary
