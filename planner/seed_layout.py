"""A seed user's launch line as typed: the layout flags of :mod:`planner.seed_flags` plus the seed
trainers' model and run flags, and what each becomes here.

    --model-size NAME      the model: the seed's sizes (llama-7b, llama-13b, llama-30b, llama-70b),
                           any preset, or a config.json (or use --model)
    --layer-num N          ... cut to its first N layers (the seed's way to try a small model)
    --accum-iter K         K iterations of the batch per optimizer step: each pipeline's batch and
                           micro-batch count are multiplied by K (same micro-batch size, one step)
    --run-iter N           N iterations: N // K optimizer steps (the seed steps every K iterations)
    --master_addr/_port    the rendezvous, when the environment does not set MASTER_ADDR/MASTER_PORT
    --current_device I     this process's GPU, when the environment does not set LOCAL_RANK

The loss differs in scale only: ours is the mean over the step's K·batch samples, the seed sums
its K iterations' means (K times ours; AdamW is scale-invariant up to eps and gradient clipping).
Without ``--cluster``, a layout whose ``--devices_id`` names node 0 only runs on this machine.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace
from typing import Any

from planner.cluster import load_cluster
from planner.errors import SpecError
from planner.hf_config import resolve_model
from planner.model import ModelSpec
from planner.plan import Plan, PlanOptions
from planner.seed_batch import PER_PIPELINE, add_total_batch_argument, check_total, total_given
from planner.seed_flags import plan_from_flags

LAYOUT_FLAGS = ("hetero_configs", "layer_partitions", "global_bsz_size", "chunks")
SEED_MODEL_SIZES = {"llama-7b": "llama2-7b", "llama-13b": "llama2-13b", "llama-30b": "llama-30b",
                    "llama-70b": "llama2-70b"}


def add_seed_flag_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The seed systems' flags (``hexiscale convert`` and ``hexiscale train``), in both spellings."""
    p.add_argument("--hetero_configs", "--hetero-configs", dest="hetero_configs",
                   help="TP degree per stage per pipeline, e.g. \"[[1, 2, 1], [2, 2]]\"")
    p.add_argument("--layer_partitions", "--layer-partitions", dest="layer_partitions",
                   help="layers per stage per pipeline, e.g. \"[[8, 16, 8], [16, 16]]\"")
    p.add_argument(PER_PIPELINE, "--global_bsz_size", "--global_batch_size", "--global-bsz-size",
                   dest="global_bsz_size", nargs="+", metavar="N",
                   help="samples per step of each pipeline (a short list pads with its last value)")
    add_total_batch_argument(p)
    p.add_argument("--pipeline-micro-batches", "--chunks", "--micro_batch_num", "--micro-batch-num", dest="chunks",
                   nargs="+", metavar="N", help="micro-batches per pipeline (a short list pads with its last value)")
    p.add_argument("--devices_id", "--devices-id", dest="devices_id",
                   help="node index of each GPU per stage per pipeline, e.g. \"[[[0], [0, 0]], [[1, 1]]]\"; "
                        "node 0 only and no --cluster: this machine")
    p.add_argument("--model-size", "--model_size", dest="model_size",
                   help=f"seed model size ({', '.join(SEED_MODEL_SIZES)}), a preset or a config.json")
    p.add_argument("--layer-num", "--layer_num", dest="layer_num", type=int, help="keep the model's first N layers")
    p.add_argument("--accum-iter", "--accum_iter", dest="accum_iter", type=int,
                   help="iterations per optimizer step: multiplies each pipeline's batch and micro-batches")
    p.add_argument("--run-iter", "--run_iter", dest="run_iter", type=int,
                   help="iterations to run: run-iter // accum-iter optimizer steps")
    p.add_argument("--master_addr", "--master-addr", dest="master_addr", help="rendezvous address (if the "
                   "environment has no MASTER_ADDR)")
    p.add_argument("--master_port", "--master-port", dest="master_port", type=int, help="rendezvous port")
    p.add_argument("--current_device", "--current-device", dest="current_device", type=int,
                   help="this process's GPU (if the environment has no LOCAL_RANK)")


def _positive(value: int | None, flag: str) -> None:
    if value is not None and value < 1:
        raise SpecError(flag, f"must be >= 1, got {value}", "pass a positive count")


@dataclass(frozen=True)
class SeedLayout:
    """Seed-style flags as typed on a command line (parsed only by :meth:`plan`), with the model
    they need and the plan options they imply."""

    hetero_configs: str | None = None
    layer_partitions: str | None = None
    global_bsz_size: tuple[str, ...] | None = None
    chunks: tuple[str, ...] | None = None
    devices_id: str | None = None
    model: str | None = None
    seq_len: int | None = None
    options: PlanOptions = field(default_factory=PlanOptions)
    model_size: str | None = None
    layer_num: int | None = None
    accum_iter: int | None = None
    run_iter: int | None = None
    total: tuple[str, int] | None = None  # --global-batch-size as typed (planner.seed_batch)

    def __post_init__(self) -> None:
        for flag, value in (("--layer-num", self.layer_num), ("--accum-iter", self.accum_iter),
                            ("--run-iter", self.run_iter)):
            _positive(value, flag)
        if self.model and self.model_size:
            raise SpecError("--model-size", "given together with --model", "name the model once")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SeedLayout:
        """The flags of :func:`add_seed_flag_arguments` (plus model, seq_len and the plan options)."""
        def strings(v: Any) -> tuple[str, ...] | None:
            return None if v is None else tuple(v) if isinstance(v, list | tuple) else (v,)

        return cls(hetero_configs=args.hetero_configs, layer_partitions=args.layer_partitions,
                   global_bsz_size=strings(args.global_bsz_size), chunks=strings(args.chunks),
                   devices_id=args.devices_id, model=args.model, seq_len=args.seq_len,
                   options=PlanOptions(**{k: getattr(args, k) for k in ("recompute", "zero", "dtype")
                                          if getattr(args, k, None) is not None}),
                   model_size=args.model_size, layer_num=args.layer_num, accum_iter=args.accum_iter,
                   run_iter=args.run_iter, total=total_given(args))

    def given(self) -> list[str]:
        """The layout flags that were given (empty: the seed flags are not in use)."""
        return [f for f in LAYOUT_FLAGS if getattr(self, f) is not None
                or f == "global_bsz_size" and self.total is not None]

    @property
    def accum(self) -> int:
        return self.accum_iter or 1

    def steps(self) -> int | None:
        """Optimizer steps of ``--run-iter`` (None without it)."""
        if self.run_iter is None:
            return None
        if self.run_iter < self.accum:
            raise SpecError("--run-iter", f"{self.run_iter} iterations are fewer than --accum-iter {self.accum}: "
                            "no optimizer step", "run at least accum-iter iterations")
        return self.run_iter // self.accum

    def resolve_model(self) -> ModelSpec:
        """``--model``, or ``--model-size`` (a seed size, preset or config) cut to ``--layer-num``."""
        name = self.model or self.model_size
        if not name:
            raise SpecError("--model", "missing", "seed-style flags need --model-size NAME (or --model NAME)")
        model = resolve_model(SEED_MODEL_SIZES.get(name, name), self.seq_len)
        if self.layer_num is not None and self.layer_num != model.num_layers:
            model = replace(model, name=f"{model.name}-L{self.layer_num}", num_layers=self.layer_num)
        return model

    def plan(self, cluster: str | None) -> Plan:
        """The plan these flags describe, on the cluster file ``cluster`` or (None) this machine."""
        missing = [f for f in LAYOUT_FLAGS if f not in self.given()]
        if missing:
            raise SpecError(f"--{missing[0]}", "missing", "seed-style flags need --hetero_configs, "
                            "--layer_partitions, --global_bsz_size and --chunks")
        plan = plan_from_flags(
            model=self.resolve_model(), cluster=load_cluster(cluster) if cluster else None,
            hetero_configs=self.hetero_configs, layer_partitions=self.layer_partitions,
            global_bsz_size=list(self.global_bsz_size or ((str(self.total[1]),) if self.total else ())),
            chunks=list(self.chunks or ()),
            devices_id=self.devices_id, options=self.options, accum_iter=self.accum,
        )
        check_total(plan, self.total)
        return plan

    def notes(self) -> list[str]:
        """How the seed's model and run flags map here, one line each (for the user to read)."""
        out = []
        if self.model_size in SEED_MODEL_SIZES:
            out.append(f"--model-size {self.model_size}: the {SEED_MODEL_SIZES[self.model_size]} preset")
        if self.layer_num is not None:
            out.append(f"--layer-num {self.layer_num}: the model's first {self.layer_num} layers")
        if self.accum_iter is not None:
            out.append(f"--accum-iter {self.accum}: one optimizer step per {self.accum} iterations, i.e. each "
                       f"pipeline's batch and micro-batch count x {self.accum} (loss: the step's mean)")
        if self.run_iter is not None:
            out.append(f"--run-iter {self.run_iter}: {self.steps()} optimizer steps")
        return out
