"""``hexiscale calibrate --sm-percent P[,Q...]``: calibrate this host's GPU as MPS shares, one child
process per share.

The share is fixed when a process creates its CUDA context, so each share is measured by a child
``hexiscale calibrate`` started with ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=P`` under the MPS daemon
(:mod:`hexiscale.launch.mps`); the child reads its share back from the variable and writes the share's
measured entry and calibration, ``<type>-mps<P>-measured`` (100: the whole GPU's,
:func:`executor.profiler.calibrate.measured_key`), which a cluster's ``gpu: <type>-mps<P>`` is then
planned and priced with. The parent creates no CUDA context (it would not be a client of the daemon).
"""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import nullcontext
from pathlib import Path

from hexiscale.launch.mps import SHARE_VAR, Runner, mps_available, mps_daemon
from planner.errors import SpecError
from planner.ranges import shown

FIX = "pass whole percentages of the SMs from 1 to 100, e.g. --sm-percent 50 or --sm-percent 50,100"


def parse_shares(items: list[str]) -> list[int]:
    """``--sm-percent`` values (repeated and/or comma lists) -> the shares in order, each once."""
    out: list[int] = []
    for item in items:
        for part in item.split(","):
            text = part.strip()
            if not (text.isascii() and text.isdigit() and len(text) <= 3 and 1 <= int(text) <= 100):
                raise SpecError("--sm-percent", f"{shown(text)} is not a share of the SMs in percent", FIX)
            if int(text) not in out:
                out.append(int(text))
    return out


def check_shares(args: argparse.Namespace) -> list[int]:
    """The shares to calibrate (none: the whole GPU in this process, as without the flag)."""
    if not args.sm_percent:
        return []
    if args.cpu:
        raise SpecError("--sm-percent", "a CPU calibration has no SMs to share",
                        "drop --sm-percent, or drop --cpu and calibrate on a GPU host")
    shares = parse_shares(args.sm_percent)
    if any(s < 100 for s in shares) and not mps_available():
        raise SpecError("--sm-percent", "SM shares need the CUDA MPS daemon and nvidia-cuda-mps-control is not "
                        "on PATH", "install the NVIDIA driver's MPS tools, or calibrate without --sm-percent")
    return shares


def env_share(cpu: bool) -> float | None:
    """The share this process runs under (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``: a child's, or the
    user's), checked; None on the CPU or without the variable."""
    text = os.environ.get(SHARE_VAR)
    if cpu or text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 100:
        raise SpecError(SHARE_VAR, f"{text!r} is not a share of the SMs in percent",
                        "set it from 1 to 100 or unset it, or use calibrate --sm-percent")
    return value


def child_command(args: argparse.Namespace, home: Path, share: int) -> tuple[list[str], dict[str, str]]:
    """The command and environment of the child that measures ``share`` (the parent's flags, its home)."""
    cmd = [sys.executable, "-m", "hexiscale", "calibrate", "--model", args.model, "--home", str(home.resolve()),
           "--max-held-out-error", f"{args.max_held_out:g}"]
    if args.seq_len is not None:
        cmd += ["--seq-len", str(args.seq_len)]
    if args.comm_ranks is not None:
        cmd += ["--comm-ranks", str(args.comm_ranks)]
    cmd += [flag for flag, on in (("--quiet", args.quiet), ("--force", args.force)) if on]
    env = {**os.environ, SHARE_VAR: str(share)}
    return cmd, env


def run_shares(args: argparse.Namespace, home: Path, shares: list[int], run: Runner) -> int:
    """Each share in its own child, in order, under the MPS daemon; stops at the first that fails (it
    printed why) and returns its exit status."""
    with mps_daemon(run) if any(s < 100 for s in shares) else nullcontext():
        for share in shares:
            print(f"calibrating the {share} % SM share in a child process ({SHARE_VAR}={share})", flush=True)
            cmd, env = child_command(args, home, share)
            code = int(run(cmd, env=env).returncode)
            if code != 0:
                return code
    return 0
