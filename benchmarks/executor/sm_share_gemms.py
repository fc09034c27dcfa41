"""Which matrix products of a model's stage come back wrong on this GPU, per BLAS setting: the study
behind :mod:`executor.model.gemm_check` (issue 29: on an H100 given 55-85 % of its SMs through MPS,
cuBLAS 13.1 left output tiles unwritten).

Each setting runs the stage's products (forward, input and weight gradient of every linear shape, at
the check's token counts) into NaN-poisoned outputs and counts the ones Freivalds' test rejects
(:func:`executor.model.gemm_check.failing_products`). Settings: ``default`` (the library's choice),
``cublaslt`` (torch's cuBLASLt path), ``carveN`` (cuBLASLt with an SM carve-out of N, i.e. the
SM-count target the device's SMs minus N). Run it under a share::

    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=75 python -m benchmarks.executor.sm_share_gemms \\
        --settings default,cublaslt,carve32

The share's SM count is what the process sees (``multi_processor_count``). Prints a table and writes
``sm_share_gemms_<share>_<date>.json`` (device, versions, date) under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from benchmarks.executor.run_meta import run_versions


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-1.3b")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--settings", default="default,cublaslt,carve32")
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args(argv)

    import torch

    from executor.model.gemm_check import EXTRA_TOKENS, failing_products, linear_shapes
    from planner.hf_config import resolve_model

    if not torch.cuda.is_available():
        print("sm_share_gemms: needs a CUDA GPU")
        return 2
    dev = torch.device("cuda", 0)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    shapes = linear_shapes(resolve_model(args.model), args.tp, first=True, last=True)
    total = len(shapes) * len(EXTRA_TOKENS) * 3
    rows = []
    for setting in args.settings.split(","):
        torch.backends.cuda.preferred_blas_library("default" if setting == "default" else "cublaslt")
        torch._C._set_sm_carveout_experimental(int(setting[5:]) if setting.startswith("carve") else None)
        bad = failing_products(dev, torch.bfloat16, shapes, EXTRA_TOKENS)
        rows.append({"setting": setting, "wrong": len(bad), "of": total, "first": bad[:4]})
        print(f"{setting:>12}  {len(bad):3d} of {total} products wrong  {' '.join(bad[:3])}", flush=True)
    share = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "100")
    record = {**run_versions(gpu=True), "share_percent": share, "sms": sms, "model": args.model, "tp": args.tp,
              "rows": rows}
    out = Path(args.out) / f"sm_share_gemms_{share}_{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
