"""Training data: sample sources, the global batch of a step, and each pipeline's rows of it.

**The global batch** (contract, INTERFACES.md): step ``k`` draws samples ``[c_k, c_k + G)`` of an
endless, deterministic sample sequence (``G`` = global batch size, ``c_k`` the sample cursor, which
is ``k * G`` when the batch size never changed). It is a LongTensor ``[G, seq_len + 1]``; pipeline
``p`` takes rows ``[offset_p, offset_p + batch_size_p)``. The rows a rank needs are generated
directly (``samples(c_k + offset_p, batch_size_p)``), never the whole batch, and they are the same
whatever the plan, so any plan trains on the same tokens at the same step.

Sources:

* :class:`SyntheticSource` — sample ``i`` is a function of ``(seed, i)`` only: an arithmetic
  sequence ``t_j = (a + b*j) mod V`` with random start ``a`` and stride ``b in [1, 8]`` where 10 % of
  the positions are replaced by uniform noise. It is learnable (the loss falls from ``ln V``), so
  loss curves mean something, and needs no file.
* :class:`TokenFileSource` — ``seq_len + 1`` windows of a memory-mapped token file (see
  :mod:`executor.data.token_file`), visited in a seeded random order per epoch: epoch ``e`` is the
  permutation drawn from ``PCG64(seed, e)``; sample ``i`` is window ``perm_e[i mod n]`` with
  ``e = i // n``.

The data position (:class:`DataPosition`) is the sample cursor and the step; checkpoints store it
and resume restores it, also under a plan with another global batch size (the cursor counts
samples, not steps).
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from executor.data.token_file import check_token_file, open_tokens
from planner.errors import SpecError
from planner.plan import Plan


class SampleSource(Protocol):
    seq_len: int

    def samples(self, start: int, count: int) -> np.ndarray:
        """Samples ``[start, start + count)`` as int64 ``[count, seq_len + 1]``."""
        ...


@dataclass
class SyntheticSource:
    seq_len: int
    vocab_size: int
    seed: int = 0
    noise: float = 0.1

    def sample(self, i: int) -> np.ndarray:
        rng = np.random.Generator(np.random.PCG64([self.seed, i]))
        a = int(rng.integers(self.vocab_size))
        b = int(rng.integers(1, 9))
        toks = (a + b * np.arange(self.seq_len + 1, dtype=np.int64)) % self.vocab_size
        mask = rng.random(self.seq_len + 1) < self.noise
        toks[mask] = rng.integers(self.vocab_size, size=int(mask.sum()))
        return toks

    def samples(self, start: int, count: int) -> np.ndarray:
        return np.stack([self.sample(start + r) for r in range(count)]) if count else \
            np.zeros((0, self.seq_len + 1), dtype=np.int64)


class TokenFileSource:
    """Seeded-order windows of a token file (checked on open: see ``check_token_file``)."""

    def __init__(self, path: str | Path, *, seq_len: int, vocab_size: int, seed: int = 0, scan: bool = True):
        self.index = check_token_file(path, vocab_size=vocab_size, seq_len=seq_len, scan=scan)
        self.seq_len = seq_len
        self.seed = seed
        self.tokens = open_tokens(self.index)
        self.num_windows = self.index.num_samples(seq_len)
        self._epoch = -1
        self._perm = np.zeros(0, dtype=np.int64)

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            self._perm = np.random.Generator(np.random.PCG64([self.seed, epoch])).permutation(self.num_windows)
            self._epoch = epoch
        return self._perm

    def samples(self, start: int, count: int) -> np.ndarray:
        out = np.empty((count, self.seq_len + 1), dtype=np.int64)
        for r in range(count):
            epoch, j = divmod(start + r, self.num_windows)
            w = int(self._permutation(epoch)[j])
            out[r] = self.tokens[w * self.seq_len: w * self.seq_len + self.seq_len + 1]
        return out


def make_source(plan: Plan, *, data: str | None, seed: int, scan: bool = True) -> SampleSource:
    """The file source for ``data``, else the synthetic one (both sized by the plan's model)."""
    m = plan.model
    if data:
        return TokenFileSource(data, seq_len=m.seq_len, vocab_size=m.vocab_size, seed=seed, scan=scan)
    return SyntheticSource(seq_len=m.seq_len, vocab_size=m.vocab_size, seed=seed)


@dataclass(frozen=True)
class DataPosition:
    """Where training stands in the data: the next step and the next sample."""

    step: int = 0
    samples: int = 0

    def advance(self, global_batch_size: int) -> DataPosition:
        return DataPosition(self.step + 1, self.samples + global_batch_size)

    def to_dict(self) -> dict[str, int]:
        return {"step": self.step, "samples": self.samples}

    @classmethod
    def from_dict(cls, data: Any, file: str | None = None) -> DataPosition:
        if not isinstance(data, dict) or not all(isinstance(data.get(k), int) and not isinstance(data[k], bool)
                                                 and data[k] >= 0 for k in ("step", "samples")):
            raise SpecError("extra.data", f"expected {{'step': int, 'samples': int}}, got {data!r}",
                            "the checkpoint was not written by 'hexiscale train'", file)
        return cls(data["step"], data["samples"])


def pipeline_rows(plan: Plan, pipeline: int) -> tuple[int, int]:
    """(offset, count) of pipeline ``pipeline``'s rows in the global batch."""
    offset = sum(p.batch_size for p in plan.pipelines[:pipeline])
    return offset, plan.pipelines[pipeline].batch_size


def global_batch(source: SampleSource, position: DataPosition, global_batch_size: int) -> torch.Tensor:
    """The whole global batch at ``position`` (the single-process reference uses this)."""
    return torch.from_numpy(source.samples(position.samples, global_batch_size))


class BatchStream:
    """This rank's rows of every step's global batch, from ``position`` on.

    On CUDA a background thread builds the next batch in pinned memory while the current step
    runs, and the copy to the device is asynchronous; on CPU batches are built on demand.
    """

    def __init__(self, source: SampleSource, *, global_batch_size: int, rows: tuple[int, int],
                 position: DataPosition, device: torch.device, prefetch: int = 2):
        self.source = source
        self.global_batch_size = global_batch_size
        self.offset, self.count = rows
        self.position = position
        self.device = device
        self._cuda = device.type == "cuda"
        self._queue: queue.Queue[tuple[DataPosition, torch.Tensor] | BaseException] | None = None
        if self._cuda and prefetch > 0:
            self._queue = queue.Queue(maxsize=prefetch)
            threading.Thread(target=self._producer, args=(position,), daemon=True, name="data-prefetch").start()

    def _build(self, pos: DataPosition) -> torch.Tensor:
        batch = torch.from_numpy(self.source.samples(pos.samples + self.offset, self.count))
        return batch.pin_memory() if self._cuda else batch

    def _producer(self, pos: DataPosition) -> None:
        assert self._queue is not None
        try:
            while True:
                self._queue.put((pos, self._build(pos)))
                pos = pos.advance(self.global_batch_size)
        except BaseException as exc:  # surfaced in the training thread by next()
            self._queue.put(exc)

    def next(self) -> torch.Tensor:
        """The rows of the step at ``self.position``; advances the position."""
        if self._queue is not None:
            item = self._queue.get()
            if isinstance(item, BaseException):
                raise item
            pos, batch = item
            assert pos == self.position
        else:
            batch = self._build(self.position)
        self.position = self.position.advance(self.global_batch_size)
        return batch.to(self.device, non_blocking=self._cuda)
