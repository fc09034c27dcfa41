"""Micro-batches of whole documents packed into one row (see :mod:`executor.data.packed_docs`).

A document is a 1-D array of ``n >= 2`` token ids; it contributes ``n - 1`` inputs
(``doc[:-1]``) and as many labels (``doc[1:]``). A packed micro-batch concatenates the inputs and
the labels of its documents into ``[1, T]`` tensors, ``T = Σ (n_d - 1)``, and carries the
:class:`~executor.data.packed_docs.DocSpans` that keep attention and positions inside each document.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from executor.data.packed_docs import DocSpans
from executor.parallel.schedules import MicroBatch

Doc = np.ndarray | torch.Tensor


def _as_tensor(doc: Doc) -> torch.Tensor:
    t = torch.as_tensor(doc, dtype=torch.long)
    if t.dim() != 1 or t.numel() < 2:
        raise ValueError(f"a document is a 1-D sequence of >= 2 tokens, got shape {list(t.shape)}")
    return t


def label_tokens(docs: Sequence[Doc]) -> int:
    """Labels (predicted tokens) of ``docs``: ``Σ (n_d - 1)``, what the loss is averaged over."""
    return sum(len(d) - 1 for d in docs)


def pack_documents(docs: Sequence[Doc], device: torch.device | None = None) -> MicroBatch:
    """One packed micro-batch of ``docs`` (in this order)."""
    if not docs:
        raise ValueError("a packed micro-batch needs at least one document")
    ts = [_as_tensor(d) for d in docs]
    inputs = torch.cat([t[:-1] for t in ts])[None]
    labels = torch.cat([t[1:] for t in ts])[None]
    if device is not None:  # from pinned memory on a GPU: a copy from pageable memory waits for the stream
        if torch.device(device).type == "cuda":  # (every kernel queued), and the host lost its lead there
            inputs, labels = inputs.pin_memory(), labels.pin_memory()
        inputs, labels = inputs.to(device, non_blocking=True), labels.to(device, non_blocking=True)
    return MicroBatch(inputs=inputs, labels=labels, docs=DocSpans(tuple(len(t) - 1 for t in ts)))


def pack_micro_batches(docs: Sequence[Doc], groups: Sequence[Sequence[int]],
                       device: torch.device | None = None) -> list[MicroBatch]:
    """The micro-batches of one pipeline: ``groups[j]`` lists the indices (into ``docs``) of the
    documents packed into micro-batch ``j``."""
    return [pack_documents([docs[i] for i in g], device) for g in groups if g]
