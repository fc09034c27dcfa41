"""Synthetic long-tailed sequence lengths fitted to published figures.

Document lengths are log-normal, ``ln n ~ N(μ, σ²)``, then cut to the context like a real data
pipeline does (:func:`planner.varlen.histogram.chunk_lengths`: a document longer than the context
gives full-context sequences plus its remainder — the spike at the context length seen in real
corpora). Two figures fix ``(μ, σ)``: the median document ``m`` (``μ = ln m``) and the share ``q``
of documents shorter than ``x`` (``σ = (ln x − μ) / Φ⁻¹(q)``).

Presets (:data:`PRESETS`), at the context they are quoted for:

* ``commoncrawl``: about 97 % of sequences under 8K tokens at a 32K context (HotSPa's analysis of
  CommonCrawl); the median of 1K tokens is our assumption (web pages of a few hundred words).
* ``github``: a heavier tail for source files (our assumption, between the web set and books:
  median 2K, 85 % under 8K at 32K), for a code-like contrast when no real histogram is at hand.

The real histograms of the CPython standard library (code) and Wikipedia articles (web-like) are
measured by ``benchmarks/planner/length_distributions.py``; these presets stand in for corpora we
cannot ship.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtri

from planner.errors import SpecError
from planner.varlen.histogram import LengthHistogram, chunk_lengths


@dataclass(frozen=True)
class LongTail:
    name: str
    median: float  # median document length (tokens)
    share: float  # share of documents shorter than `below`
    below: float
    quoted_context: int  # the context the figure was quoted at
    note: str = ""

    def __post_init__(self) -> None:
        if not 0.5 < self.share < 1:
            raise SpecError("share", f"must lie in (0.5, 1), got {self.share}", "a long tail has most mass below")
        if not 1 <= self.median < self.below:
            raise SpecError("median", f"needs 1 <= median < below, got {self.median}, {self.below}", "fix the figures")

    @property
    def mu(self) -> float:
        return math.log(self.median)

    @property
    def sigma(self) -> float:
        return (math.log(self.below) - self.mu) / float(ndtri(self.share))

    def documents(self, n: int, rng: np.random.Generator) -> list[int]:
        """``n`` document lengths (tokens, >= 2)."""
        return [max(2, int(x)) for x in np.exp(rng.normal(self.mu, self.sigma, size=n))]

    def sequences(self, n_docs: int, context: int, rng: np.random.Generator) -> list[int]:
        """The sequences of ``n_docs`` documents cut to ``context``."""
        return chunk_lengths(self.documents(n_docs, rng), context)

    def histogram(self, context: int, n_docs: int = 200_000, seed: int = 0) -> LengthHistogram:
        """The sequence-length histogram at ``context`` (a fixed sample: deterministic per seed)."""
        rng = np.random.Generator(np.random.PCG64(seed))
        return LengthHistogram.from_lengths(
            self.documents(n_docs, rng), f"{self.name}-{context // 1024}k", context=context,
            source=f"synthetic log-normal (median {self.median:g}, {self.share:.0%} under {self.below:g}); {self.note}")


PRESETS: dict[str, LongTail] = {t.name: t for t in (
    LongTail("commoncrawl", 1024, 0.97, 8192, 32768, "97 % under 8K at 32K as HotSPa reports; median assumed"),
    LongTail("github", 2048, 0.85, 8192, 32768, "assumed: a heavier tail than web text"),
)}


def preset(name: str) -> LongTail:
    if name not in PRESETS:
        raise SpecError("--synthetic", f"unknown length preset {name!r}", f"one of {', '.join(PRESETS)}")
    return PRESETS[name]
