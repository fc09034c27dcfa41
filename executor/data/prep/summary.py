"""What ``data prep`` wrote: documents, tokens and a histogram of document lengths."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class PrepSummary:
    documents: int = 0
    skipped: int = 0  # empty documents (no text, or no tokens)
    tokens: int = 0
    chars: int = 0
    input_bytes: int = 0
    seconds: float = 0.0
    longest: int = 0
    # log2 bins of the document length in tokens: bins[k] counts lengths in [2^k, 2^(k+1))
    bins: list[int] = field(default_factory=list)

    def add(self, lengths: np.ndarray, chars: int, skipped: int, nbytes: int) -> None:
        """Count one tokenized batch (``lengths``: tokens per written document)."""
        self.documents += len(lengths)
        self.skipped += skipped
        self.tokens += int(lengths.sum())
        self.chars += chars
        self.input_bytes += nbytes
        if len(lengths):
            self.longest = max(self.longest, int(lengths.max()))
            counts = np.bincount(np.log2(lengths).astype(np.int64))
            if len(counts) > len(self.bins):
                self.bins += [0] * (len(counts) - len(self.bins))
            for k, c in enumerate(counts):
                self.bins[k] += int(c)

    def histogram(self) -> list[tuple[int, int, int]]:
        """(lowest, highest, documents) per non-empty log2 bin of document length in tokens."""
        return [(1 << k, (1 << (k + 1)) - 1, c) for k, c in enumerate(self.bins) if c]

    def lines(self) -> list[str]:
        """The summary as printable lines (with a text bar per histogram bin)."""
        mean = self.tokens / self.documents if self.documents else 0.0
        rate = self.tokens / self.seconds if self.seconds > 0 else 0.0
        out = [f"documents:  {self.documents:,}" + (f" ({self.skipped:,} empty skipped)" if self.skipped else ""),
               f"tokens:     {self.tokens:,} (mean {mean:,.1f} a document, longest {self.longest:,})",
               f"text:       {self.chars:,} characters, {self.chars / max(1, self.tokens):.2f} a token",
               f"time:       {self.seconds:.1f} s, {rate:,.0f} tokens/s",
               "document length (tokens):"]
        top = max((c for *_, c in self.histogram()), default=1)
        for lo, hi, c in self.histogram():
            out.append(f"  {lo:>9,}-{hi:<9,} {c:>10,}  {'#' * max(1, round(40 * c / top))}")
        return out
