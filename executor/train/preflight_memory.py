"""Pre-flight: a plan whose step cannot fit this rank's memory is refused before any step runs.

Without this check an absurd ``batch_size`` (or micro-batch, or sequence length) passes pre-flight
and then either runs out of memory minutes later or never finishes its step. The estimate is the
cost model's own (:func:`planner.cost.memory.stage_memory`: weights, gradients, Adam state,
activations of the micro-batches in flight under the pipeline's schedule) plus this pipeline's
token rows on the host. It is compared with what the rank can have: its GPU's total memory, or on
CPU the host's physical memory shared by the ``LOCAL_WORLD_SIZE`` ranks on it. Only clear misses
are refused (more than ``MARGIN`` times the capacity), so the check never blocks a plan that the
planner's estimate (a few per cent off) would fit; tight fits are the planner's business.
"""

from __future__ import annotations

import os

import torch

from planner.cost.gradsync import stage_owners
from planner.cost.memory import GIB, stage_memory
from planner.cost.partial_params import partial_params
from planner.cost.schedule import held_with_grads, in_flight, split_backward_held
from planner.errors import SpecError
from planner.plan import Plan
from planner.state_layout import zero_sharded

MARGIN = 1.5


def host_memory_bytes() -> float:
    """Physical memory of this host (0 where the OS does not say)."""
    try:
        return float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 0.0


def rank_need_bytes(plan: Plan, rank: int, *, cpu: bool) -> tuple[float, float]:
    """(bytes this rank needs at its peak, of which activations and token rows)."""
    info = plan.ranks()[rank]
    pipe = plan.pipelines[info.pipeline]
    st, si, n = pipe.stages[info.stage], info.stage, len(pipe.stages)
    dtype = "fp32" if cpu else plan.options.dtype  # CPU computes in fp32 (executor.train.engine)
    zero = stage_owners(plan)[info.pipeline][si] if zero_sharded(plan) else 1  # as the engine shards
    mem = stage_memory(plan.model, layers=st.num_layers, tp=st.tp, first=si == 0, last=si == n - 1,
                       micro_batch=max(pipe.micro_batch_sizes()),
                       in_flight=in_flight(pipe.schedule, n, si, pipe.micro_batches, pipe.chunks), dtype=dtype,
                       recompute=plan.options.recompute, zero_shards=zero,
                       held_with_grads=held_with_grads(pipe.schedule, n, si, pipe.micro_batches, pipe.chunks),
                       held=split_backward_held(pipe.schedule, n, si, pipe.micro_batches, pipe.chunks),
                       pipelines=len(plan.pipelines), partial=partial_params(plan, info.pipeline, si),
                       compile=plan.options.compile and not cpu,  # a CPU run stays eager
                       seq_len=plan.model.seq_len // st.cp)  # a CP rank holds 1/cp of every sequence
    rows = pipe.batch_size * (plan.model.seq_len + 1) * 8.0  # the pipeline's int64 token rows
    tensors = mem.required - (mem.overhead if cpu else 0.0)  # the overhead terms are GPU runtime figures
    return tensors + rows, mem.activations + rows


def check_memory(plan: Plan, rank: int, device: torch.device) -> None:
    """A ``SpecError`` naming the field to change when this rank's step clearly cannot fit."""
    cpu = device.type != "cuda"
    if cpu:
        local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
        have, what = host_memory_bytes() / local, f"this host ({local} rank(s) on it) per rank"
    else:
        have, what = float(torch.cuda.get_device_properties(device).total_memory), f"GPU {device}"
    need, acts = rank_need_bytes(plan, rank, cpu=cpu)
    if not have or need <= MARGIN * have:
        return
    info = plan.ranks()[rank]
    pipe = plan.pipelines[info.pipeline]
    pp = f"pipelines[{info.pipeline}]"
    if acts >= need / 2:
        raise SpecError(f"{pp}.batch_size", f"{pipe.batch_size} samples of {plan.model.seq_len} tokens in "
                        f"{pipe.micro_batches} micro-batches need about {need / GIB:,.1f} GiB on rank {rank}; "
                        f"{what} has {have / GIB:,.1f} GiB", "lower batch_size, raise micro_batches or use "
                        "recompute (hexiscale estimate shows the memory of every device)")
    raise SpecError(f"{pp}.stages[{info.stage}]", f"the stage's weights and optimizer state need about "
                    f"{need / GIB:,.1f} GiB on rank {rank}; {what} has {have / GIB:,.1f} GiB",
                    "spread the layers over more stages or devices (hexiscale plan)")
