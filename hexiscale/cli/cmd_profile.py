"""``hexiscale profile``: measure this machine's GPU(s) with the executor's own modules and write a
measured device profile (a catalog entry) under ``planner/profiles/devices/``. torch is reached only through
executor modules inside ``run``."""

from __future__ import annotations

import argparse
from pathlib import Path

from hexiscale.cli.flag_names import add_output, add_renamed, typed
from hexiscale.cli.writing import check_writable, writing
from planner.errors import SpecError
from planner.hf_config import resolve_model
from planner.model import MODEL_LIMITS
from planner.names import check_name
from planner.ranges import check_int, check_number


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("profile", help="measure layer, optimizer and link times on the local GPU(s)")
    p.add_argument("--model", required=True, help="model preset or config.json whose layer is profiled")
    p.add_argument("--seq-len", type=int, dest="seq_len", help="override the model's sequence length")
    p.add_argument("--layers", type=int, help="override the model's layer count (only its name changes)")
    add_output(p, "profile file to write (default planner/profiles/devices/<key>.json; "
                   "CPU mode: ./cpu-profile.json)", "--out")
    p.add_argument("--key", help="catalog key of the measured device type (default: the -o file's stem)")
    p.add_argument("--base", help="catalog key of the unthrottled device type (default: detected from the GPU name)")
    p.add_argument("--cpu", action="store_true", help="tiny shapes on the CPU (tests/CI)")
    p.add_argument("--sm-percent", type=float, dest="sm_percent",
                   help="MPS SM share to run under and record (sets CUDA_MPS_ACTIVE_THREAD_PERCENTAGE unless set; "
                        "needs the MPS daemon: nvidia-cuda-mps-control -d)")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), help="compute dtype (default bf16; CPU fp32)")
    sizes = p.add_argument("--micro-batch-sizes", dest="micro_batches",
                           help="comma list of samples per micro-batch, e.g. 1,2,4")
    add_renamed(p, "--micro-batches", sizes)  # elsewhere (plans, train) micro-batches is a count
    p.add_argument("--seq-lens", dest="seq_lens", help="comma list of sequence lengths")
    p.add_argument("--tp", help="comma list of TP degrees whose shard shapes are profiled")
    p.add_argument("--repeats", type=int, help="timed repeats per point (median kept)")
    p.add_argument("--layer-chain", type=int, dest="layer_chain",
                   help="layers timed back to back per measurement (default 4 on GPU, 1 on CPU)")
    p.add_argument("--comm-ranks", type=int, dest="comm_ranks", default=None,
                   help="ranks for the p2p/all-reduce sweep (default: all local GPUs; CPU: 0)")
    p.add_argument("--no-resume", action="store_true", help="overwrite the output instead of resuming it")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


# upper bounds of what one profiling run may ask for (beyond them it would run out of memory or time)
LIST_LIMITS = {"micro_batches": 4096, "seq_lens": MODEL_LIMITS["seq_len"], "tp": 64}  # by dest
MAX_COMM_RANKS = 64


def _ints(args: argparse.Namespace, dest: str, flag: str) -> list[int] | None:
    """The comma list of flag ``flag`` (dest ``dest``), each value checked."""
    text = getattr(args, dest)
    flag = typed(args, dest, flag)
    if text is None:
        return None
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpecError(flag, f"{text!r} is not a comma list of integers", "write e.g. 1,2,4") from None
    if not values:
        raise SpecError(flag, "needs positive integers", "write e.g. 1,2,4")
    for v in values:
        check_int(flag, v, 1, LIST_LIMITS[dest], "write e.g. 1,2,4")
    return values


def check_flags(args: argparse.Namespace) -> None:
    """Every numeric flag in range, and the catalog key a plain name (it names the default output
    file: ``--key ../../x`` must not write outside the catalog), before anything is measured."""
    if args.key is not None:
        check_name(args.key, "--key", "catalog key")
    if args.layers is not None:
        check_int("--layers", args.layers, 1, MODEL_LIMITS["num_layers"])
    if args.repeats is not None:
        check_int("--repeats", args.repeats, 1, 10_000)
    if args.layer_chain is not None:
        check_int("--layer-chain", args.layer_chain, 1, 1_000)
    if args.comm_ranks is not None:
        check_int("--comm-ranks", args.comm_ranks, 0, MAX_COMM_RANKS, "pass 0 to skip the link sweep")
    if args.sm_percent is not None:
        check_number("--sm-percent", args.sm_percent, 0.0, 100.0, above=True, hint="pass e.g. 60")
    for dest, flag in (("micro_batches", "--micro-batch-sizes"), ("seq_lens", "--seq-lens"), ("tp", "--tp")):
        _ints(args, dest, flag)


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    check_flags(args)
    model = resolve_model(args.model, args.seq_len)
    if args.layers:
        model = replace(model, num_layers=args.layers)

    if args.sm_percent is not None and not args.cpu and args.sm_percent < 100:
        # MPS reads the share when this process creates its CUDA context (after this line); it only takes
        # effect when the MPS control daemon runs (nvidia-cuda-mps-control -d)
        import os

        os.environ.setdefault("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", str(int(args.sm_percent)))

    from executor.model.devices import cuda_device_count
    from executor.profiler.runner import default_config, run_profile
    from hexiscale.cli.output import console

    comm = args.comm_ranks if args.comm_ranks is not None else (0 if args.cpu else cuda_device_count())
    cfg = default_config(model, cpu=args.cpu, sm_percent=args.sm_percent, comm_world=comm if comm >= 2 else 0)
    if args.dtype:
        cfg.dtype = args.dtype
    cfg.micro_batches = _ints(args, "micro_batches", "--micro-batch-sizes") or cfg.micro_batches
    cfg.seq_lens = _ints(args, "seq_lens", "--seq-lens") or cfg.seq_lens
    cfg.tps = _ints(args, "tp", "--tp") or cfg.tps
    if args.repeats:
        cfg.repeats = args.repeats
    if args.layer_chain:
        cfg.layer_chain = args.layer_chain
    if args.output:
        out = Path(args.output)
    elif args.cpu:
        out = Path("cpu-profile.json")
    else:
        from planner.catalog import profiles_dir

        out = profiles_dir() / "devices" / f"{args.key or 'local-measured'}.json"
    check_writable(out, typed(args, "output", "-o"))  # before minutes of measuring
    with writing(typed(args, "output", "-o"), out):
        pf = run_profile(cfg, out, key=args.key, base=args.base, resume=not args.no_resume, progress=not args.quiet)
    from rich.table import Table

    table = Table(title=f"{pf.entry['key']}: layer forward/backward (ms, device and the host's issue time)")
    for col in ("micro_batch", "seq_len", "tp", "recompute", "forward", "fwd host", "backward", "bwd host"):
        table.add_column(col, justify="right")
    times = ("forward_s", "forward_host_s", "backward_s", "backward_host_s")
    for row in pf.measured.get("layer", []):
        table.add_row(str(row["micro_batch"]), str(row["seq_len"]), str(row["tp"]), row["recompute"],
                      *(f"{row[k] * 1e3:.3f}" if k in row else "-" for k in times))
    console.print(table)
    console.print(f"wrote {out}")
    return 0
