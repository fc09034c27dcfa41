"""Variable-length training data: sequences of their own lengths, and a step's global batch in tokens.

A *sequence* is a document cut to the context: ``n + 1`` tokens give ``n`` inputs and ``n``
labels, ``1 <= n <= context`` (:mod:`executor.data.packed_batch` packs them). Sources number their
sequences ``0, 1, 2, ...`` endlessly and deterministically, so every rank reads the same ones:

* :class:`TokenFileDocs` — the documents of a token file (:mod:`executor.data.token_file`, which keeps
  document boundaries), each cut into chunks of at most ``context + 1`` tokens (consecutive chunks
  share one token, so no label is lost; chunks of one token are dropped), visited in a seeded
  random order per epoch (``PCG64(seed, epoch)``, as :class:`executor.data.stream.TokenFileSource`).
* :class:`SyntheticDocs` — lengths drawn from a :class:`~planner.varlen.histogram.LengthHistogram`
  (seeded per sequence) with the synthetic tokens of :class:`executor.data.stream.SyntheticSource`.

This module needs only numpy (``hexiscale data lengths`` and ``packing`` use it without torch).

**The step's batch** (:func:`step_sequences`): from the cursor on, sequences are taken in order
while their tokens fit ``step_tokens`` (at least one); the first that does not fit opens the next
step — none is dropped or cut, and any plan trains on the same sequences at the same step.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from executor.data.token_file import check_token_file, open_tokens
from planner.errors import SpecError
from planner.varlen.histogram import LengthHistogram


class DocSource(Protocol):
    context: int

    def length(self, i: int) -> int:
        """Inputs of sequence ``i`` (its tokens minus one)."""
        ...

    def tokens(self, i: int) -> np.ndarray:
        """The ``length(i) + 1`` tokens of sequence ``i`` (int64)."""
        ...


class TokenFileDocs:
    """The documents of a token file cut to ``context`` (module docstring)."""

    def __init__(self, path: str | Path, *, context: int, vocab_size: int, seed: int = 0, scan: bool = True):
        index = check_token_file(path, vocab_size=vocab_size, seq_len=1, scan=scan)
        self.context = context
        self.seed = seed
        self.tokens_ = open_tokens(index)
        starts: list[int] = []
        ends: list[int] = []
        offs = index.doc_offsets.astype(np.int64)
        for a, b in zip(offs[:-1], offs[1:]):
            pos = int(a)
            while b - pos >= 2:
                starts.append(pos)
                ends.append(min(int(b), pos + context + 1))
                pos += context
        if not starts:
            raise SpecError("bin.documents", "no document has 2 tokens or more", "pack longer documents", str(path))
        self.starts = np.asarray(starts, dtype=np.int64)
        self.ends = np.asarray(ends, dtype=np.int64)
        self._epoch, self._perm = -1, np.zeros(0, dtype=np.int64)

    @property
    def num_sequences(self) -> int:
        return len(self.starts)

    def _chunk(self, i: int) -> int:
        epoch, j = divmod(i, self.num_sequences)
        if epoch != self._epoch:
            self._perm = np.random.Generator(np.random.PCG64([self.seed, epoch])).permutation(self.num_sequences)
            self._epoch = epoch
        return int(self._perm[j])

    def length(self, i: int) -> int:
        c = self._chunk(i)
        return int(self.ends[c] - self.starts[c]) - 1

    def tokens(self, i: int) -> np.ndarray:
        c = self._chunk(i)
        return np.asarray(self.tokens_[self.starts[c]:self.ends[c]], dtype=np.int64)

    def lengths(self) -> list[int]:
        """Every sequence's input length (for histograms)."""
        return [int(x) for x in self.ends - self.starts - 1]


@dataclass
class SyntheticDocs:
    """Sequences with lengths from ``hist`` (capped at ``context``) and synthetic tokens."""

    hist: LengthHistogram
    context: int
    vocab_size: int
    seed: int = 0

    def length(self, i: int) -> int:
        rng = np.random.Generator(np.random.PCG64([self.seed, 1, i]))
        return max(1, self.hist.sample(1, rng, self.context)[0])

    def tokens(self, i: int) -> np.ndarray:
        from executor.data.stream import SyntheticSource

        n = self.length(i)
        return SyntheticSource(seq_len=n, vocab_size=self.vocab_size, seed=self.seed).sample(i)


def step_sequences(source: DocSource, cursor: int, step_tokens: int) -> tuple[list[int], int]:
    """(sequence indices of the step from ``cursor``, the next cursor) — module docstring."""
    if step_tokens < 1:
        raise SpecError("--step-tokens", f"must be >= 1, got {step_tokens}", "give the tokens of a global batch")
    out: list[int] = []
    total = 0
    i = cursor
    while True:
        n = source.length(i)
        if out and total + n > step_tokens:
            return out, i
        out.append(i)
        total += n
        i += 1
        if total >= step_tokens:
            return out, i
