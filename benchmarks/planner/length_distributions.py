"""Sequence-length distributions of real corpora and of the synthetic long tail
(``python -m benchmarks.planner.length_distributions [--gensim-wheel PATH]``; needs ``tokenizers``).

The code corpus (CPython's standard library) and the web-like one (Wikipedia articles from the
gensim wheel), :mod:`benchmarks.planner.corpora`, are tokenized with one byte-level BPE of
``--vocab`` tokens trained here on both (``tokenizers``); documents are then cut to each context
(``planner.varlen.histogram.chunk_lengths``). Writes every histogram to
``planner/varlen/data/<corpus>-<K>k.json`` (``hexiscale.lengths/1``, package data: what
``hexiscale plan --lengths`` and ``benchmarks/executor/mixed_length.py`` read), the synthetic
presets beside them, and a summary JSON under ``benchmarks/results/``; prints the summary table.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from benchmarks.planner.common import write_result
from benchmarks.planner.corpora import gensim_wheel, stdlib_documents, wikipedia_documents
from planner.varlen.histogram import LengthHistogram
from planner.varlen.measured import measured_dir
from planner.varlen.synthetic import PRESETS

LENGTHS = measured_dir()


def train_bpe(docs: list[str], vocab: int):  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer=trainer)
    return tok


def summary_row(name: str, h: LengthHistogram, docs: int | None, tokens: int | None) -> dict[str, object]:
    return {"corpus": name, "context": h.context, "documents": docs, "doc_tokens": tokens, "sequences": h.sequences,
            "mean_seq": round(h.mean(), 1), "median_seq": h.quantile(0.5),
            "seq_share_below_4k": round(h.fraction_below(4096), 4),
            "seq_share_below_8k": round(h.fraction_below(8192), 4),
            "token_share_below_8k": round(h.token_fraction_below(8192), 4),
            "at_context": h.counts[-1] / h.sequences if h.context else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gensim-wheel", help="path of a gensim wheel (default: pip download into ~/.cache)")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--contexts", type=int, nargs="+", default=[16384, 32768])
    ap.add_argument("--out", type=Path, default=LENGTHS)
    args = ap.parse_args()
    t0 = time.perf_counter()
    code, code_src = stdlib_documents()
    web, web_src = wikipedia_documents(gensim_wheel(args.gensim_wheel))
    tok = train_bpe(code + web, args.vocab)
    t_train = time.perf_counter() - t0
    lengths = {name: [len(e.ids) for e in tok.encode_batch(docs)] for name, docs in (("code", code), ("web", web))}
    sources = {"code": code_src, "web": web_src}
    args.out.mkdir(parents=True, exist_ok=True)
    rows, files = [], []
    for ctx in args.contexts:
        for name, lens in lengths.items():
            h = LengthHistogram.from_lengths(lens, f"{name}-{ctx // 1024}k", context=ctx,
                                             source=f"{sources[name]}; byte-level BPE, {args.vocab} tokens")
            h.save(args.out / f"{h.name}.json")
            files.append(h.name)
            rows.append(summary_row(name, h, len(lens), int(np.sum(lens))))
        for preset in PRESETS.values():
            h = preset.histogram(ctx)
            h.save(args.out / f"{h.name}.json")
            files.append(h.name)
            rows.append(summary_row(preset.name + " (synthetic)", h, None, None))
    table = Table(title="sequence lengths (documents cut to the context)")
    for col in ("corpus", "context", "docs", "sequences", "mean", "median", "< 4K", "< 8K", "tokens in < 8K",
                "at context"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["corpus"]), f"{r['context']:,}", f"{r['documents']:,}" if r["documents"] else "-",
                      f"{r['sequences']:,}", f"{r['mean_seq']:,.0f}", f"{r['median_seq']:,}",
                      f"{r['seq_share_below_4k']:.1%}", f"{r['seq_share_below_8k']:.1%}",
                      f"{r['token_share_below_8k']:.1%}", f"{r['at_context']:.2%}")
    Console(width=140).print(table)
    path = write_result("length_distributions", {"vocab": args.vocab, "tokenizer_train_s": round(t_train, 1),
                                                 "sources": sources, "rows": rows, "histograms": files})
    print(f"wrote {path} and {len(files)} histograms under {args.out}")


if __name__ == "__main__":
    main()
