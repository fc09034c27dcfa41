"""Sequence-length histograms (``hexiscale.lengths/1`` JSON): what a corpus looks like to a planner.

A histogram counts *sequences* — documents cut to the context: a document of ``n`` tokens longer
than the context ``C`` becomes ``⌊n / C⌋`` sequences of ``C`` tokens plus its remainder (what a
data pipeline that never crosses documents feeds the model; :func:`chunk_lengths`). Bins are
half-open ``[edges[i], edges[i+1])``; the default edges are powers of 2^(1/4) (four bins per
octave) rounded to integers, so 1 .. 1M tokens take ~80 bins; with a context ``C`` the last bin is
``[C, C + 1)``: the sequences cut at the context, exactly.

File format::

    {"format": "hexiscale.lengths/1", "name": "...", "source": "...", "context": 16384,
     "edges": [1, 2, ...], "counts": [...]}      len(counts) == len(edges) - 1

Sampling (:meth:`LengthHistogram.sample`) draws a bin by its count, then a length log-uniformly
inside it, so a histogram stands in for its corpus in planning and benchmarks.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from planner.documents import load_json_file
from planner.errors import SpecError
from planner.fields import check_keys, expect_list, expect_mapping

LENGTHS_FORMAT = "hexiscale.lengths/1"


def default_edges(upto: int) -> tuple[int, ...]:
    """Bin edges 1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 13, 16, ... (four per octave) up to past ``upto``."""
    edges = [1]
    k = 1
    while edges[-1] <= upto:
        e = int(round(2 ** (k / 4)))
        if e > edges[-1]:
            edges.append(e)
        k += 1
    return tuple(edges)


def chunk_lengths(lengths: Iterable[int], context: int) -> list[int]:
    """Documents cut to sequences of at most ``context`` tokens (full chunks, then the remainder)."""
    if context < 1:
        raise SpecError("context", f"must be >= 1, got {context}", "give the model's sequence length")
    out: list[int] = []
    for n in lengths:
        if n < 1:
            continue
        full, rest = divmod(int(n), context)
        out.extend([context] * full)
        if rest:
            out.append(rest)
    return out


@dataclass(frozen=True)
class LengthHistogram:
    name: str
    edges: tuple[int, ...]
    counts: tuple[int, ...]
    context: int | None = None
    source: str = ""

    def __post_init__(self) -> None:
        if len(self.edges) < 2 or len(self.counts) != len(self.edges) - 1:
            raise SpecError("counts", f"{len(self.counts)} counts for {len(self.edges)} edges",
                            "a histogram has one count per bin: len(counts) == len(edges) - 1")
        if self.edges[0] < 1 or any(b <= a for a, b in zip(self.edges, self.edges[1:])):
            raise SpecError("edges", "must be increasing integers >= 1", "e.g. [1, 2, 4, 8]")
        if any(c < 0 for c in self.counts) or sum(self.counts) == 0:
            raise SpecError("counts", "must be >= 0 with at least one sequence", "count the corpus' sequences")

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_lengths(cls, lengths: Sequence[int], name: str, *, context: int | None = None, source: str = "",
                     edges: Sequence[int] | None = None) -> LengthHistogram:
        """The histogram of ``lengths`` (cut to ``context`` first when given)."""
        seqs = chunk_lengths(lengths, context) if context else [int(n) for n in lengths if n >= 1]
        if not seqs:
            raise SpecError("lengths", "no sequence of >= 1 token", "pass the corpus' document lengths")
        if edges is not None:
            e = tuple(edges)
        else:  # with a context, full-context sequences get a bin of their own: [C, C + 1)
            e = default_edges(max(seqs))
            if context:
                e = tuple(sorted({x for x in e if x < context} | {context, context + 1}))
        if max(seqs) >= e[-1]:
            raise SpecError("edges", f"the last edge {e[-1]} is not above the longest sequence {max(seqs)}",
                            "add a larger edge")
        idx = np.searchsorted(np.asarray(e), np.asarray(seqs), side="right") - 1
        counts = np.bincount(idx, minlength=len(e) - 1)[: len(e) - 1]
        return cls(name, e, tuple(int(c) for c in counts), context, source)

    # ------------------------------------------------------------------ statistics
    @property
    def sequences(self) -> int:
        return sum(self.counts)

    def _mids(self) -> np.ndarray:
        lo, hi = np.asarray(self.edges[:-1], float), np.asarray(self.edges[1:], float) - 1
        return np.sqrt(lo * np.maximum(hi, lo))

    def mean(self) -> float:
        """Mean sequence length (bin midpoints, geometric)."""
        c = np.asarray(self.counts, float)
        return float((c * self._mids()).sum() / c.sum())

    def fraction_below(self, length: int) -> float:
        """Share of sequences shorter than ``length`` (``length`` should be a bin edge to be exact)."""
        c = np.asarray(self.counts, float)
        return float(c[np.asarray(self.edges[:-1]) < length].sum() / c.sum())

    def token_fraction_below(self, length: int) -> float:
        """Share of *tokens* in sequences shorter than ``length``."""
        t = np.asarray(self.counts, float) * self._mids()
        return float(t[np.asarray(self.edges[:-1]) < length].sum() / t.sum())

    def quantile(self, q: float) -> int:
        """The upper edge of the bin where the cumulative share of sequences reaches ``q``."""
        cum = np.cumsum(self.counts) / self.sequences
        i = int(np.searchsorted(cum, q - 1e-12))
        return self.edges[min(i + 1, len(self.edges) - 1)] - 1

    def sample(self, n: int, rng: np.random.Generator, context: int | None = None) -> list[int]:
        """``n`` sequence lengths drawn from the histogram (log-uniform inside a bin), capped at
        ``context`` (default: the histogram's own)."""
        cap = context or self.context
        p = np.asarray(self.counts, float)
        bins = rng.choice(len(self.counts), size=n, p=p / p.sum())
        lo = np.asarray(self.edges[:-1], float)[bins]
        hi = np.asarray(self.edges[1:], float)[bins]
        out = np.floor(np.exp(rng.uniform(np.log(lo), np.log(hi)))).astype(int)
        out = np.clip(out, lo.astype(int), hi.astype(int) - 1)
        return [int(min(x, cap)) if cap else int(x) for x in out]

    # ------------------------------------------------------------------ files
    def to_dict(self) -> dict[str, Any]:
        return {"format": LENGTHS_FORMAT, "name": self.name, "source": self.source, "context": self.context,
                "edges": list(self.edges), "counts": list(self.counts)}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")


def histogram_from_dict(data: Any, file: str | None = None) -> LengthHistogram:
    try:
        data = expect_mapping(data, "")
        check_keys(data, "", ("format", "edges", "counts"), ("name", "source", "context"))
        if data["format"] != LENGTHS_FORMAT:
            raise SpecError("format", f"{data['format']!r} is not {LENGTHS_FORMAT!r}",
                            "write histograms with 'hexiscale data lengths'")
        edges = expect_list(data["edges"], "edges")
        counts = expect_list(data["counts"], "counts")
        for path, values in (("edges", edges), ("counts", counts)):
            for i, v in enumerate(values):
                if isinstance(v, bool) or not isinstance(v, int):
                    raise SpecError(f"{path}[{i}]", f"expected an integer, got {v!r}", "histograms count tokens")
        context = data.get("context")
        if context is not None and (isinstance(context, bool) or not isinstance(context, int) or context < 1):
            raise SpecError("context", f"expected a positive integer or null, got {context!r}", "fix the file")
        return LengthHistogram(str(data.get("name", "lengths")), tuple(edges), tuple(counts), context,
                               str(data.get("source", "")))
    except SpecError as exc:
        if file:
            raise exc.with_file(file) from None
        raise


def load_histogram(path: str | Path) -> LengthHistogram:
    return histogram_from_dict(load_json_file(path, "length histogram"), str(path))


def draw_step(hist: LengthHistogram, step_tokens: int, rng: np.random.Generator, context: int | None = None
              ) -> list[int]:
    """Sequence lengths of one step whose global batch is ``step_tokens`` tokens: sequences drawn
    from ``hist`` while they fit the budget (at least one), as the data loader fills a step
    (:func:`executor.data.doc_source.step_sequences`, which carries the sequence that does not fit over
    to the next step; a sampled step just leaves it out)."""
    out: list[int] = []
    total = 0
    while True:
        s = hist.sample(1, rng, context)[0]
        if out and total + s > step_tokens:
            return out
        out.append(s)
        total += s
        if total >= step_tokens:
            return out
