"""The step runner of one plan (:class:`executor.train.loop.StepRunner`): an
:class:`~executor.train.engine.Engine` on fixed-length batches of a :class:`~executor.data.stream.BatchStream`,
logged by a :class:`~executor.train.metrics.StepLogger`; checkpoints keep the data position (``data``).
"""

from __future__ import annotations

from typing import Any

import torch

from executor.data.stream import BatchStream, DataPosition, SampleSource, pipeline_rows
from executor.model import fast_path
from executor.parallel.groups import ProcessGroups
from executor.state import checkpoint
from executor.train.config import TrainConfig
from executor.train.engine import Engine, StepStats
from executor.train.metrics import StepLogger
from executor.train.optim import OptimConfig
from executor.train.tensorboard_sink import TensorBoardSink
from executor.train.trace import StepTrace
from planner.cluster import ClusterSpec
from planner.layout import Topology, build_topology
from planner.plan import Plan


def build_engine(plan: Plan, args: TrainConfig, *, device: torch.device, optim: OptimConfig, init: bool = True,
                 backend: str | None = None, engine: Engine | None = None) -> tuple[Engine, int]:
    """The plan's groups and engine on this rank, and how many blocks ``--compile`` (or the plan's
    ``options.compile``) compiled (every new engine's blocks are new modules; Dynamo reuses the code).
    ``engine``: this rank's engine of ``plan``, built before its groups (:func:`engine_without_groups`),
    which gets them instead of a new engine being built."""
    topology = engine.topology if engine is not None else build_topology(plan)
    groups = ProcessGroups.create(topology, backend)
    if engine is None:
        engine = Engine(plan, topology, groups, device=device, optim=optim, seed=args.run.seed, init=init,
                        on_nonfinite=args.faults.on_nonfinite)
    else:
        engine.attach(groups)
    compiled = fast_path.compile_blocks(engine.module) if args.layout.compile or plan.options.compile else 0
    return engine, compiled


def engine_without_groups(plan: Plan, args: TrainConfig, *, rank: int, device: torch.device, optim: OptimConfig,
                          topology: Topology | None = None) -> Engine:
    """Rank ``rank``'s engine of ``plan`` without initial values and without process groups (the
    elastic switch fills its state, then gives it its groups: :mod:`executor.switch.elastic_switch`);
    ``topology``: a strategy pool's home topology (:func:`executor.switch.hot_switch.switch_groups`)."""
    return Engine(plan, topology or build_topology(plan), None, rank=rank, device=device, optim=optim,
                  seed=args.run.seed, init=False, on_nonfinite=args.faults.on_nonfinite)


def resume(engine: Engine, path: str) -> DataPosition:
    """Load checkpoint ``path`` into ``engine``; the data position it was saved at."""
    extra = checkpoint.load(engine, path)
    if "data" in extra:
        return DataPosition.from_dict(extra["data"], path)
    return DataPosition(engine.step, engine.step * engine.plan.global_batch_size)


class PlanRunner:
    """One plan's steps on this rank (module docstring)."""

    def __init__(self, engine: Engine, args: TrainConfig, *, source: SampleSource, position: DataPosition,
                 cluster: ClusterSpec | None, tensorboard: TensorBoardSink | None = None,
                 trace: StepTrace | None = None):
        self.engine, self.plan, self.rank, self.trace = engine, engine.plan, engine.rank, trace
        plan, pipeline = engine.plan, engine.stage.pipeline
        self.start = engine.step
        self.stream = BatchStream(source, global_batch_size=plan.global_batch_size,
                                  rows=pipeline_rows(plan, pipeline), position=position, device=engine.device)
        leader = engine.stage.is_first and engine.tp_rank == 0 and engine.stage.cp_rank == 0  # one line a pipeline
        self.logger = StepLogger(plan, engine.rank, pipeline, leader=leader,
                                 device=engine.device, cluster=cluster, jsonl=args.metrics.log_jsonl,
                                 every=args.metrics.log_every,
                                 tensorboard=tensorboard if engine.rank == 0 else None)
        if trace is not None:
            engine.set_trace(trace)

    def train(self) -> StepStats:
        return self.engine.train_step(self.stream.next())

    def log(self, k: int, total: int, result: Any, seconds: float) -> None:
        self.logger.step(k, total, result, seconds)

    def position(self) -> tuple[int, int]:
        return self.stream.position.step, self.stream.position.samples

    def extra(self) -> dict[str, Any]:
        return {"data": self.stream.position.to_dict(), "plan_world_size": self.plan.world_size}

    def summary(self) -> None:
        self.logger.summary(self.start, self.plan.global_batch_size * self.plan.model.seq_len)
