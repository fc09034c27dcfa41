"""``hexiscale data prep|pack|info|lengths|packing``: write and inspect token files (``hexiscale.tokens/1``);
``lengths`` and ``packing`` show a variable-length corpus as mixed-length training sees it
(:mod:`hexiscale.cli.data_varlen`).

    hexiscale data prep INPUT... -o OUT --tokenizer TOK [--format auto|text|jsonl|parquet]
                        [--field text] [--text-docs line|paragraph|file] [--eos auto|none|TOKEN]
                        [--no-special-tokens] [--workers N] [--no-progress]
        Tokenize text, JSONL (a field) or Parquet (a column) files, or folders of them, with a
        tokenizers tokenizer.json or a Hugging Face tokenizer folder, in N processes; prints a
        summary (documents, tokens, a histogram of document lengths).

    hexiscale data pack INPUT -o OUT [--dtype auto|uint16|uint32]
        INPUT: a text file (one document a line, token ids separated by spaces or commas) or a
        .npy integer array (1-D: one document, 2-D: one document a row). Writes OUT.bin + OUT.idx.
    hexiscale data info PATH [--vocab-size V] [--seq-len S] [--no-scan]
        The header, document and sample counts; with --vocab-size/--seq-len, the same checks
        training runs before it starts.
"""

from __future__ import annotations

import argparse
import os

from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from executor.data.prep.corpus import FORMATS, TEXT_DOCS
from hexiscale.cli import data_varlen
from hexiscale.cli.flag_names import add_renamed
from hexiscale.cli.output import console, err_console
from hexiscale.cli.writing import writing
from planner.model import MODEL_LIMITS
from planner.ranges import check_int


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("data", help="tokenize a corpus or pack token lists into a token file, or inspect one")
    dsub = p.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    pr = dsub.add_parser("prep", help="tokenize text/JSONL/Parquet files into OUT.bin + OUT.idx")
    pr.add_argument("inputs", nargs="+", metavar="INPUT", help="files, or folders (every file below them)")
    pr.add_argument("-o", "--output", required=True, help="output stem (writes OUT.bin and OUT.idx)")
    pr.add_argument("--tokenizer", required=True, help="tokenizer.json, or a Hugging Face tokenizer folder")
    pr.add_argument("--format", default="auto", choices=FORMATS,
                    help="auto: by suffix (.jsonl/.json: JSONL, .parquet: Parquet, else text)")
    pr.add_argument("--field", default="text", help="JSONL field / Parquet column holding the text")
    pr.add_argument("--text-docs", default="line", choices=TEXT_DOCS,
                    help="text files: a document per line, per blank-line-separated paragraph, or per file")
    pr.add_argument("--eos", default="auto", help="token appended to every document: auto (the tokenizer "
                    "folder's eos_token, if any), none, or a token")
    pr.add_argument("--no-special-tokens", action="store_true",
                    help="do not apply the tokenizer's post-processor (e.g. its BOS token)")
    pr.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="tokenizing processes")
    pr.add_argument("--no-progress", action="store_true", help="no progress bar")
    pr.set_defaults(func=run_prep)
    pk = dsub.add_parser("pack", help="write OUT.bin + OUT.idx from a text or .npy token list")
    pk.add_argument("input", help="text file (one document a line) or .npy array of token ids")
    pk.add_argument("-o", "--output", required=True, help="output stem (writes OUT.bin and OUT.idx)")
    ids = pk.add_argument("--token-dtype", dest="dtype", default="auto", choices=("auto", "uint16", "uint32"),
                          help="the token ids' integer type (auto: uint16 when every id fits)")
    add_renamed(pk, "--dtype", ids)  # elsewhere --dtype is the compute or weights' float type
    pk.set_defaults(func=run)
    inf = dsub.add_parser("info", help="describe and check a token file")
    inf.add_argument("path", help="token file stem, or its .bin/.idx")
    inf.add_argument("--vocab-size", type=int, help="check every id is below this")
    inf.add_argument("--seq-len", type=int, help="count samples of seq_len + 1 tokens")
    inf.add_argument("--no-scan", action="store_true", help="trust the header's max_token (skip reading the .bin)")
    inf.set_defaults(func=run)
    data_varlen.register(dsub)


def run(args: argparse.Namespace) -> int:
    from executor.data.token_file import (
        check_token_file,
        load_token_list,
        read_index,
        scan_max_token,
        token_paths,
        write_token_file,
    )

    if args.data_command == "info":
        if args.vocab_size is not None:
            check_int("--vocab-size", args.vocab_size, 1, MODEL_LIMITS["vocab_size"], "pass the model's vocab_size")
        if args.seq_len is not None:
            check_int("--seq-len", args.seq_len, 1, MODEL_LIMITS["seq_len"], "pass the model's seq_len")
    if args.data_command == "pack":
        tokens = load_token_list(args.input)
        with writing("-o", *token_paths(args.output)):
            index = write_token_file(args.output, tokens, args.dtype)
        console.print(f"wrote {index.bin_path} and {index.idx_path}: {index.num_tokens} {index.dtype} tokens, "
                      f"{index.num_docs} documents, max id {index.max_token}", highlight=False)
        return 0
    if args.vocab_size is not None and args.seq_len is not None:
        index = check_token_file(args.path, vocab_size=args.vocab_size, seq_len=args.seq_len, scan=not args.no_scan)
    else:
        index = read_index(args.path)
    lines = [f"file:       {index.bin_path} (+ {index.idx_path.name})",
             f"dtype:      {index.dtype}", f"tokens:     {index.num_tokens}", f"documents:  {index.num_docs}",
             f"max id:     {index.max_token} (header)"]
    if not args.no_scan and index.num_tokens:
        lines.append(f"max id:     {scan_max_token(index)} (scanned)")
    if args.seq_len:
        lines.append(f"samples:    {index.num_samples(args.seq_len)} of {args.seq_len + 1} tokens")
    if args.vocab_size is not None and args.seq_len is not None:
        lines.append(f"check:      OK for vocab_size={args.vocab_size}, seq_len={args.seq_len}")
    console.print("\n".join(lines), highlight=False)
    return 0


def run_prep(args: argparse.Namespace) -> int:
    from executor.data.prep.corpus import expand_inputs, read_batches
    from executor.data.prep.pipeline import prep
    from executor.data.prep.tokenizer import load_tokenizer_spec

    spec = load_tokenizer_spec(args.tokenizer, eos=args.eos, special_tokens=not args.no_special_tokens)
    files = expand_inputs(args.inputs)
    batches = read_batches(files, fmt=args.format, text_docs=args.text_docs, field=args.field)
    console.print(f"tokenizing {len(files)} file(s) with {spec.file} (vocabulary {spec.vocab_size:,}, "
                  f"end of document {spec.eos or 'none'}) in {args.workers} process(es)", highlight=False)
    with Progress(TextColumn("tokenizing"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                  TimeRemainingColumn(), console=err_console, disable=args.no_progress, transient=True) as bar:
        task = bar.add_task("prep", total=sum(f.stat().st_size for f in files))
        index, summary = prep(batches, args.output, spec, field=args.field, workers=args.workers,
                              progress=lambda n: bar.advance(task, n))
    console.print(f"wrote {index.bin_path} and {index.idx_path}: {index.dtype}, max id {index.max_token}",
                  highlight=False)
    console.print("\n".join(summary.lines()), highlight=False)
    return 0
