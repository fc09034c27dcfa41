"""Bytes of tensor storages alive on CPU while code runs, and their peak: a dispatch mode that
counts every storage an operator returns until that storage is freed (a weakref finalizer). CPU
has no allocator statistics; this is what tests measure working sets with.

A storage a gloo collective used can outlive the call: the worker thread marks the work done, the
caller goes on, and the worker drops its reference a little later, so its free lands after the
caller's next allocations and a peak holds it. Such frees run on that thread: ``foreign_frees``
counts them, so a test can tell a measurement the race touched from a clean one."""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch
import torch.nn.attention.bias as _bias
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten

_causal_lower_right = _bias.causal_lower_right


def _plain_causal_lower_right(*args: Any) -> Any:
    """``causal_lower_right`` outside the mode: a tensor subclass cannot wrap a tensor the mode saw."""
    with _disable_current_modes():
        return _causal_lower_right(*args)


class LiveStorage(TorchDispatchMode):
    """``live``: bytes of the storages made inside the mode and alive now; ``peak``: their most
    since the mode began or ``peak`` was last set."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()
        self.foreign_frees = 0
        self._thread = threading.get_ident()

    def __enter__(self) -> LiveStorage:
        _bias.causal_lower_right = _plain_causal_lower_right
        return super().__enter__()  # type: ignore[no-any-return]

    def __exit__(self, *exc: Any) -> None:
        _bias.causal_lower_right = _causal_lower_right
        super().__exit__(*exc)

    def _free(self, key: int, size: int) -> None:
        self._seen.discard(key)
        self.live -= size
        self.foreign_frees += threading.get_ident() != self._thread

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key and key not in self._seen:
                    self._seen.add(key)
                    self.live += storage.nbytes()
                    weakref.finalize(storage, self._free, key, storage.nbytes())
        self.peak = max(self.peak, self.live)
        return out
