"""The sequences a strategy pool trains on (checked in pre-flight like a token file).

``--data`` gives the documents of a token file cut to the pool's context
(:class:`~executor.data.doc_source.TokenFileDocs`), else ``--lengths`` gives synthetic sequences of a
length histogram (:class:`~executor.data.doc_source.SyntheticDocs`); ``--step-tokens`` must hold one
full-length sequence.
"""

from __future__ import annotations

from executor.data.doc_source import DocSource, SyntheticDocs, TokenFileDocs
from executor.train.config import TrainConfig
from planner.errors import SpecError
from planner.varlen.pool import StrategyPool


def doc_source(args: TrainConfig, pool: StrategyPool, *, scan: bool) -> DocSource:
    """The sequences training reads (module docstring); a ``SpecError`` on bad input."""
    if args.varlen.step_tokens is None:
        raise SpecError("--step-tokens", "missing", "give the tokens of a step's global batch, e.g. "
                        f"--step-tokens {4 * pool.context}")
    if args.varlen.step_tokens < pool.context:
        raise SpecError("--step-tokens", f"{args.varlen.step_tokens} is fewer than the pool's context {pool.context}",
                        "give a global batch that holds at least one full-length sequence")
    model = pool.model
    if args.data.path:
        if args.varlen.lengths:
            raise SpecError("--lengths", "given together with --data", "the token file's documents have lengths")
        return TokenFileDocs(args.data.path, context=pool.context, vocab_size=model.vocab_size, seed=args.run.seed,
                             scan=scan)
    if not args.varlen.lengths:
        raise SpecError("--lengths", "missing", "pass --data TOKENS, or synthetic lengths: --lengths HISTOGRAM.json "
                        "or --lengths synthetic:commoncrawl")
    from planner.varlen.histogram import load_histogram
    from planner.varlen.synthetic import preset

    lengths = args.varlen.lengths
    hist = preset(lengths.split(":", 1)[1]).histogram(pool.context) if lengths.startswith("synthetic:") \
        else load_histogram(args.varlen.lengths)
    return SyntheticDocs(hist, pool.context, model.vocab_size, seed=args.run.seed)
