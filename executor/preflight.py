"""Checks every rank runs before training, and how the ranks agree on their outcome.

Local checks (:func:`local_checks`): the device the plan gives this rank is visible (on GPU), its
step fits the rank's memory (:mod:`executor.preflight_memory`), the data file is present and valid
for the model (see :func:`executor.data_format.check_token_file`; global rank 0 also scans every
token), the output paths are writable (:mod:`executor.preflight_paths`), the checkpoint to resume
is complete, holds the same model and is not already past ``--steps``. World size and
plan/cluster mismatches are found earlier, identically on every rank, from the environment.

Agreement (:func:`agree`) goes through the TCPStore, not a collective, so it works before the
process group exists and whatever the backend: every rank publishes ``ok`` or its error, then waits
for all verdicts (bounded by ``timeout``). If any rank failed, every rank raises the same
``SpecError`` (the lowest failing rank's, with a count of the others), so the whole job exits 1 with
one clear message. A rank that never reports is named after the timeout.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from executor.checkpoint import read_meta
from executor.launch.env import RankEnv
from executor.preflight_memory import check_memory
from executor.preflight_paths import check_output_dir, check_output_file
from executor.train_config import TrainConfig
from planner.errors import SpecError
from planner.plan import Plan


@dataclass(frozen=True)
class ResumePoint:
    path: Path
    step: int


def find_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory itself, or the latest complete one under a ``--checkpoint-dir``."""
    p = Path(path)
    if (p / "meta.json").exists():
        return p
    if not p.is_dir():
        raise SpecError("--resume", f"{p} does not exist", "pass a checkpoint or a --checkpoint-dir")
    latest = p / "latest"
    if latest.exists() and (p / latest.read_text().strip() / "meta.json").exists():
        return p / latest.read_text().strip()
    done = sorted(d for d in p.glob("step-*") if (d / "meta.json").exists())
    if not done:
        raise SpecError("--resume", f"{p} holds no complete checkpoint (no */meta.json)",
                        "train with --checkpoint-dir first, or drop --resume")
    return done[-1]


def check_checkpoint(path: str | Path, plan: Plan) -> ResumePoint:
    ck = find_checkpoint(path)
    meta = read_meta(ck)
    want = plan.model.to_dict()
    got = meta.get("model") or {}
    if got != want:
        diff = sorted(k for k in set(want) | set(got) if got.get(k) != want.get(k))
        raise SpecError("--resume", f"{ck} holds model {got.get('name')!r}, the plan trains {want['name']!r} "
                        f"(they differ in {', '.join(diff)})", "resume with a plan of the same model")
    step = meta.get("step")
    if not isinstance(step, int) or step < 0:
        raise SpecError("--resume", f"{ck}/meta.json has no valid step", "the checkpoint is damaged")
    return ResumePoint(ck, step)


def pick_device(choice: str, renv: RankEnv, plan: Plan) -> torch.device:
    """``cuda:LOCAL_RANK`` or CPU; a missing GPU is a ``SpecError`` naming the plan's device."""
    use_cuda = choice == "cuda" or (choice == "auto" and torch.cuda.is_available())
    if not use_cuda:
        return torch.device("cpu")
    dev_name = plan.ranks()[renv.rank].device
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if renv.local_rank >= count:
        import os

        vis = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
        raise SpecError("device", f"the plan runs rank {renv.rank} on {dev_name}, but this process sees "
                        f"{count} GPU(s) and LOCAL_RANK={renv.local_rank} (CUDA_VISIBLE_DEVICES={vis})",
                        "launch with 'hexiscale launch', which maps each rank to its GPU")
    return torch.device("cuda", renv.local_rank)


def agree(store: Any, renv: RankEnv, error: SpecError | None, timeout_s: float) -> None:
    """Publish this rank's verdict, wait for everyone's; raise the job's error if any rank failed."""
    key = f"{renv.prefix}/preflight"
    verdict = {"ok": error is None, "msg": str(error) if error else "", "host": renv.host}
    store.set(f"{key}/{renv.rank}", json.dumps(verdict))
    keys = [f"{key}/{r}" for r in range(renv.world_size)]
    try:
        store.wait(keys, timedelta(seconds=timeout_s))
    except Exception:
        missing = [r for r, k in enumerate(keys) if not store.check([k])]
        raise SpecError("startup", f"rank(s) {missing[:8]} did not start within {timeout_s:.0f} s",
                        "start every node's command (same plan, same WORLD_SIZE), or raise "
                        "--startup-timeout") from None
    bad = []
    for r, k in enumerate(keys):
        v = json.loads(store.get(k))
        if not v["ok"]:
            bad.append((r, v))
    store.set(f"{key}-seen/{renv.rank}", "1")
    if bad:
        r, v = bad[0]
        more = f" (and {len(bad) - 1} more rank(s))" if len(bad) > 1 else ""
        raise SpecError("pre-flight", f"rank {r} (host {v['host']}): {v['msg']}{more}; nothing was trained")


def wait_all_seen(store: Any, renv: RankEnv, name: str, timeout_s: float) -> None:
    """Rank 0 hosting the store waits until every rank has read it (then may exit)."""
    keys = [f"{renv.prefix}/{name}/{r}" for r in range(renv.world_size)]
    try:
        store.wait(keys, timedelta(seconds=timeout_s))
    except Exception:
        pass


@dataclass
class Prepared:
    """What the local checks produce for training."""

    device: torch.device
    source: Any  # executor.data.SampleSource
    resume: ResumePoint | None


def local_checks(plan: Plan, renv: RankEnv, args: TrainConfig) -> Prepared:
    """This rank's checks (device, memory, data, output paths, checkpoint); the first problem is a
    ``SpecError``."""
    from executor.data import make_source

    dev = pick_device(args.device, renv, plan)
    check_memory(plan, renv.rank, dev)
    # Every rank checks the index and file size; only rank 0 reads the whole file for ids >= vocab_size
    # (the same file on every node: 56 full scans of a large corpus would cost minutes for nothing).
    source = make_source(plan, data=args.data, seed=args.seed, scan=renv.rank == 0)
    if args.checkpoint_dir:
        check_output_dir(args.checkpoint_dir, "--checkpoint-dir")
    if args.log_jsonl and renv.rank == 0:
        check_output_file(args.log_jsonl, "--log-jsonl")
    point = check_checkpoint(args.resume, plan) if args.resume else None
    if point is not None and point.step >= args.steps:
        raise SpecError("--steps", f"{args.steps}, but the checkpoint {point.path} is already at step {point.step}: "
                        "nothing to train", f"pass --steps above {point.step} (steps count from the first run)")
    return Prepared(dev, source, point)
