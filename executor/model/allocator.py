"""The CUDA caching allocator's setting for executor processes: expandable segments by default.

With the allocator's default segments, a pipeline stage at micro-batch 1 reserved 8.5-11.6 % above
what it allocated (up to 4.1 GiB of an H200 on a GPipe stage of llama-1.3b), single-stage plans
2.8-4 %. The likely cause: the allocator serves requests of 1-10 MiB, such as micro-batch 1's 8 MiB
activations, from shared 20 MiB segments. With ``expandable_segments:True`` the same 11 plans on
2x H200 (fidelity ``--gpus 2``, 2026-11-26) allocated the same bytes and reserved 0.2-1.2 % above
them. The memory model then errs only on the safe side: on a held-out 2-GPU host it was never
under, mean error 3.2 % (benchmarks/README.md, issue 19). On one H100, llama-1.3b trained at the
same speed either way (53.2-53.6 k tokens/s, runs interleaved).

A user's own ``PYTORCH_CUDA_ALLOC_CONF`` is kept. Torch reads the variable when the allocator first
allocates, so :func:`use_default` must run before a process's first CUDA allocation; processes
started afterwards (``executor.job.spawn``, launchers) inherit it.
"""

from __future__ import annotations

import os

ENV = "PYTORCH_CUDA_ALLOC_CONF"
DEFAULT = "expandable_segments:True"


def use_default() -> str:
    """Set the executor's allocator default unless the user chose one; the setting in force."""
    return os.environ.setdefault(ENV, DEFAULT)
