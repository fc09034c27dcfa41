"""Checks every rank runs before training, and how the ranks agree on their outcome.

Local checks (:func:`local_checks`): the device the plan gives this rank is visible (on GPU), its
step fits the rank's memory (:mod:`executor.train.preflight_memory`), the data file is present and valid
for the model (see :func:`executor.data.token_file.check_token_file`; global rank 0 also scans every
token), the output paths are writable (:mod:`executor.train.preflight_paths`; a ``--checkpoint-dir`` holds
no ``step-N`` folder that is not ours), and rank 0 can write
TensorBoard files if asked to. Then the checkpoint to resume is chosen and verified by all ranks
together (:mod:`executor.state.resume`). World size and plan/cluster mismatches are found earlier,
identically on every rank, from the environment.

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
from typing import Any

import torch

from executor.data.doc_source import DocSource
from executor.data.pool_source import doc_source
from executor.job.env import RankEnv
from executor.model.llama import check_supported
from executor.parallel.schedules import check_plan_schedules
from executor.state.checkpoint_verify import check_checkpoint_dir
from executor.train.config import TrainConfig
from executor.train.preflight_memory import check_memory
from executor.train.preflight_paths import check_output_dir, check_output_file
from executor.train.tensorboard_sink import summary_writer_class
from planner.errors import SpecError
from planner.plan import Plan
from planner.varlen.pool import StrategyPool


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


def exchange(store: Any, renv: RankEnv, name: str, error: SpecError | None,
             timeout_s: float) -> list[tuple[int, dict[str, Any]]]:
    """Publish this rank's verdict under ``name``, wait for everyone's; the failed ranks' verdicts
    (``{"msg", "host"}``, in rank order). Every rank returns only after reading all verdicts, and
    rank 0 hosting the store waits until every rank has read them (it may exit right after)."""
    key = f"{renv.prefix}/{name}"
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
    bad = [(r, v) for r, v in enumerate(json.loads(store.get(k)) for k in keys) if not v["ok"]]
    store.set(f"{key}-seen/{renv.rank}", "1")
    if renv.rank == 0 and not renv.store_hosted:
        wait_all_seen(store, renv, f"{name}-seen", timeout_s)
    return bad


def agree(store: Any, renv: RankEnv, error: SpecError | None, timeout_s: float) -> None:
    """Publish this rank's pre-flight verdict, wait for everyone's; raise the job's error if any
    rank failed (the lowest failing rank's, with a count of the others)."""
    bad = exchange(store, renv, "preflight", error, timeout_s)
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
    source: Any  # executor.data.stream.SampleSource
    resume: Any = None  # executor.state.resume.ResumePoint, once chosen by all ranks together


def rank_checks(plan: Plan, renv: RankEnv, args: TrainConfig, pool: StrategyPool | None,
                ) -> tuple[Prepared | None, DocSource | None, SpecError | None]:
    """This rank's :func:`local_checks` and, for a pool, its sequences (rank 0 scans a token file):
    a bad input is returned, not raised, so the ranks agree on it before any of them stops."""
    try:
        prep = local_checks(plan, renv, args, pool=pool is not None)
        return prep, (doc_source(args, pool, scan=renv.rank == 0) if pool is not None else None), None
    except SpecError as exc:
        return None, None, exc


def local_checks(plan: Plan, renv: RankEnv, args: TrainConfig, *, pool: bool = False) -> Prepared:
    """This rank's checks (device, memory, data, output paths, and on rank 0 the TensorBoard package
    when a ``--tensorboard`` folder is asked for); the first problem is a ``SpecError``. The
    checkpoint to resume is chosen after these pass (:mod:`executor.state.resume`). ``pool``: the plan is
    a strategy pool's home plan and ``--data`` holds documents (read by :mod:`executor.train.pool_runner`)."""
    from executor.data.stream import make_source

    check_supported(plan)
    check_plan_schedules(plan)
    if args.metrics.tensorboard and renv.rank == 0:
        summary_writer_class()
    dev = pick_device(args.run.device, renv, plan)
    check_memory(plan, renv.rank, dev)
    # Every rank checks the index and file size; only rank 0 reads the whole file for ids >= vocab_size
    # (the same file on every node: 56 full scans of a large corpus would cost minutes for nothing).
    source = make_source(plan, data=None if pool else args.data.path, seed=args.run.seed, scan=renv.rank == 0)
    if args.checkpoint.dir:
        check_output_dir(args.checkpoint.dir, "--checkpoint-dir")
        check_checkpoint_dir(args.checkpoint.dir)
    if args.metrics.log_jsonl and renv.rank == 0:
        check_output_file(args.metrics.log_jsonl, "--log-jsonl")
    return Prepared(dev, source)
