"""``hexiscale calibrate``: measure this host in a few minutes (the model's layer at the planner's
points, two more widths, ceilings, the link sweep) and write a measured profile and a calibration
under ``$HEXISCALE_HOME`` (default ``~/.hexiscale``) that ``plan``, ``estimate`` and ``whatif``
then use by default (:mod:`executor.profiler.calibrate`, :mod:`planner.calibration.local`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from hexiscale.cli.calibrate_rows import row_lines
from hexiscale.cli.calibrate_shares import check_shares, env_share, run_shares
from hexiscale.cli.cmd_profile import MAX_COMM_RANKS
from hexiscale.cli.output import print_warning
from planner.calibration.holdout import DEFAULT_MAX_MEAN
from planner.errors import SpecError
from planner.hf_config import resolve_model
from planner.ranges import check_int, check_number


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("calibrate", help="measure this host (minutes) and calibrate the cost model for it")
    p.add_argument("--model", default="llama-1.3b", help="model preset or config.json whose layer is timed "
                   "(default llama-1.3b)")
    p.add_argument("--seq-len", type=int, dest="seq_len", help="sequence length (default: the model's)")
    p.add_argument("--home", help="where to write (default $HEXISCALE_HOME, else ~/.hexiscale)")
    p.add_argument("--cpu", action="store_true", help="tiny shapes on the CPU (tests/CI)")
    p.add_argument("--comm-ranks", type=int, dest="comm_ranks", help="ranks for the link sweep "
                   "(default: every local GPU; CPU: 0)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--max-held-out-error", type=float, dest="max_held_out", default=DEFAULT_MAX_MEAN * 100,
                   metavar="PCT", help="install the fit only if it predicts the timings it was not fitted to "
                   f"(5-fold cross-validation) within this mean error, in percent (default {DEFAULT_MAX_MEAN * 100:g})")
    p.add_argument("--force", action="store_true", help="install the fit even above --max-held-out-error")
    p.add_argument("--sm-percent", action="append", dest="sm_percent", metavar="P[,Q...]",
                   help="calibrate MPS shares of the GPU, each in a child process limited to P %% of the SMs "
                   "(repeatable or a comma list, e.g. 50,100); writes <type>-mps<P>-measured, which a cluster's "
                   "gpu: <type>-mps<P> is planned with (100: the whole GPU's entry). Starts the MPS daemon "
                   "(nvidia-cuda-mps-control -d) for the run")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from planner.calibration.local import calibration_home

    if args.comm_ranks is not None:
        check_int("--comm-ranks", args.comm_ranks, 0, MAX_COMM_RANKS, "pass 0 to skip the link sweep")
    check_number("--max-held-out-error", args.max_held_out, 0.0, 1e4, above=True, unit=" %")
    model = resolve_model("tiny" if args.cpu and args.model == "llama-1.3b" else args.model, args.seq_len)
    home = Path(args.home) if args.home else calibration_home()
    shares = check_shares(args)
    if shares:  # one child per share: the share is fixed when a process creates its CUDA context
        import subprocess

        return run_shares(args, home, shares, subprocess.run)
    env_share(args.cpu)
    from executor.model.devices import cuda_device_count
    from executor.profiler.calibrate import run_calibrate

    if not args.cpu and cuda_device_count() == 0:
        raise SpecError("--cpu", "no CUDA device is visible", "run on a GPU host, or pass --cpu for the CPU rehearsal")
    comm = args.comm_ranks if args.comm_ranks is not None else (0 if args.cpu else cuda_device_count())
    summary = run_calibrate(model, home, cpu=args.cpu, comm_world=comm if comm >= 2 else 0, progress=not args.quiet,
                            max_held_out=args.max_held_out / 100, force=args.force)
    comp = summary["fits"]["compute"]
    print(f"calibrated {summary['key']} on {summary['provenance']['gpu_name']} in {summary['seconds']:.0f} s "
          f"(host {summary['provenance']['host_fingerprint']})")
    for line in row_lines(summary):
        print(line)
    basis = " (device and host times apart)" if comp.get("basis") == "device+host" else ""
    print(f"compute terms fitted to {comp['observations']} timings{basis} (model {model.name} + widths "
          f"{', '.join(comp['widths']) or '-'}): mean error {comp['error_before']['mean_abs_rel'] * 100:.1f} % -> "
          f"{comp['error_after']['mean_abs_rel'] * 100:.1f} %, worst {comp['error_after']['max_abs_rel'] * 100:.1f} %")
    for side, err in (comp.get("by_side") or {}).items():
        print(f"  {side} times: mean error {err['mean_abs_rel'] * 100:.1f} %, worst {err['max_abs_rel'] * 100:.1f} %")
    held = comp["held_out"]
    print(f"held out ({held['folds']}-fold: fitted without them): mean error {held['mean_abs_rel'] * 100:.1f} %, "
          f"worst {held['max_abs_rel'] * 100:.1f} %")
    if "link" in summary["fits"]:
        link = summary["fits"]["link"]
        print(f"links: {link['measured_bandwidth_GBps']:.0f} GB/s measured, efficiency {link['link_efficiency']:.2f} "
              f"of {link['nominal_GBps']:.0f} GB/s nominal")
    if "packed" in summary["fits"]:
        pk = summary["fits"]["packed"]
        print(f"packed rows: {pk['rows']} timed; the varlen cost a*sum(s^2) + b*sum(s) + c + d*documents fits them "
              f"within {pk['fit_error'] * 100:.1f} % (held out: mean {pk.get('held_out_mean', 0.0) * 100:.1f} %, worst "
              f"{pk.get('held_out', 0.0) * 100:.1f} %), "
              f"{pk.get('d', 0.0) * 1e6:.0f} us a document per layer")
    if "compile" in summary["fits"]:
        comp = summary["fits"]["compile"]
        sides = f"; GPU {comp['device_ratio']:.3f} x, host {comp['host_ratio']:.3f} x" if "host_ratio" in comp else ""
        print(f"compiled layers: {comp['ratio']:.3f} x their eager time{sides} (priced for plans with options.compile)")
    if summary["live_tps"]:
        print(f"TP layers timed live (with their all-reduces) at tp {', '.join(map(str, summary['live_tps']))}: "
              f"the cost model prices those TP degrees from them")
    live_fit = summary["fits"].get("collective_host", {}).get("live_rows")
    if live_fit:  # planner.calibration.collective
        print(f"TP all-reduce inside a pass: {summary['fits']['collective_host']['fitted_s'] * 1e3:.2f} ms (fitted to "
              f"the live rows: TP layers off them priced within {live_fit['error_after']['mean_abs_rel'] * 100:.1f} % "
              f"mean, {live_fit['error_before']['mean_abs_rel'] * 100:.1f} % with the issue time alone)")
    if summary["refused"]:
        raise SpecError("--max-held-out-error", f"{summary['refused']}: nothing installed",
                        "pass --force to install this fit anyway, or calibrate with another --model")
    if summary["forced"]:
        print(f"installed despite the held-out error (--force; limit {args.max_held_out:g} %)")
    packed = summary["fits"].get("packed", {})
    if packed.get("forced"):
        print(f"packed terms installed despite their held-out error (--force; limit {args.max_held_out:g} %)")
    if summary["packed_left_out"]:  # the rest installs: one line, on stderr (planner.calibration.packed)
        print_warning(f"--max-held-out-error: {summary['packed_left_out']}: packed terms left out, mixed-length "
                      "steps priced from the layer table as without packed rows; pass --force to install them, "
                      "or re-run calibrate on an idle host")
    print(f"wrote {summary['profile']} and {summary['calibration']}; plan, estimate and whatif use them from now on")
    return 0
