"""Profiler: measures what the executor runs, on the local device(s).

* :mod:`executor.profiler.timing`  — device-synchronised timers (CUDA events / host clock), median of repeats.
* :mod:`executor.profiler.compute` — forward/backward of the executor's own ``Block`` on a TP-``t`` shard
  (one GPU simulates a shard by its shapes), embedding, final norm + LM head + loss, AdamW step, GEMM and copy
  ceilings, and the activation / peak memory of one micro-batch.
* :mod:`executor.profiler.live_tp` — the layer on ``t`` ranks with its real TP all-reduces (live TP rows,
  ``"collectives": true``), the slowest rank's figure: what a host-bound TP stage costs.
* :mod:`executor.profiler.comm`    — p2p and all-reduce time over message sizes between ranks
  (``torch.distributed``), fitted to ``latency + bytes / bandwidth``.
* :mod:`executor.profiler.store`   — the output file (a device-catalog entry whose ``measured`` section holds
  the tables), resumable: points already in the file are skipped.
* :mod:`executor.profiler.runner`  — the grid of points, the progress bar, and the run itself.
"""
