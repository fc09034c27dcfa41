"""The training engine of one rank: stage module, schedule, gradient sync, clipping, AdamW.

One optimizer step (``train_step``) on rank ``r`` of pipeline ``p``, stage ``i``:

1. split the pipeline's rows into micro-batches (``Pipeline.micro_batch_sizes()``), run the
   pipeline's schedule (1F1B or GPipe); every micro-batch loss is ``Σ CE / global_tokens``;
2. SUM-reduce gradients across pipelines over finest-common slices (:mod:`executor.parallel.grad_sync`);
3. one all-reduce over the plan's ranks of ``[loss, ‖g‖²-part]``: the loss part comes from each
   pipeline's last-stage leader; the squared gradient norm counts every logical element exactly
   once — only pipeline 0 contributes (after the sync every pipeline holds the same gradient), its
   TP-sharded parameters from every TP rank and its replicated ones (norm scales) from the stage
   leader only;
4. clip by the global norm, set the scheduled LR, AdamW step.

Context parallelism (a stage with ``cp > 1``, :mod:`executor.parallel.context_parallel`): this
rank's micro-batches hold its two chunks of every sequence (:meth:`Engine.micro_batches`), the
boundaries exchange pieces (:mod:`executor.parallel.cp_p2p`), the CP slots' gradients are summed
in step 2 like pipelines' (:func:`planner.layout.build_topology`), every slot leader of a last
stage adds its part of the loss in step 3, and only CP slot 0 of pipeline 0 adds to the norm.

With ``plan.options.zero == 1`` and two gradient owners per parameter or more (several pipelines, or
CP slots: :func:`planner.state_layout.zero_sharded`), :mod:`executor.parallel.zero` replaces steps 2-4's
all-reduce and full AdamW: a reduce-scatter gives each slice owner its part of the gradient, the
norm adds up the parts, AdamW updates the owned parts only (1/k of the state) and the parts are
all-gathered back, overlapped with the next step's forward.

Both reductions run per flat bucket and start during the last micro-batch's backward, as soon as a
bucket's gradients are final (:mod:`executor.parallel.grad_sync`, which argues why the order of these
collectives cannot deadlock on NCCL).

The only host synchronisation is :class:`executor.parallel.host_sync.HostRead` of step 3's values: a
non-finite loss or gradient norm is caught there and never reaches the weights
(:mod:`executor.train.nonfinite`); on NCCL the watchdog looks there for ranks waiting on peers.
With a fused AdamW (the default on GPUs) and no ZeRO-1, step 4 is queued *before* the host waits,
the optimizer gated on the device by the same values (``found_inf``), so the device runs from the
last backward through clipping and AdamW without waiting for the host; the host waits only for the
copy of step 3's values, queued before step 4. Elsewhere (CPU's AdamW, ZeRO-1) the host decides
first and then launches step 4.

Precision: parameters, gradients, reduction and optimizer state are fp32 (the parameters *are* the
fp32 master weights). ``plan.options.dtype == "bf16"`` runs the forward/backward under
``torch.autocast`` on accelerators; on CPU it computes in fp32 and logs that once (fp16, which
would need loss scaling, is refused on accelerators).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from executor.model.gemm_check import ensure_right_products, linear_shapes
from executor.model.init import logical_init
from executor.model.llama import StageModule, check_supported
from executor.parallel.context_parallel import CPContext, split_sequence
from executor.parallel.cp_p2p import CPStageComm
from executor.parallel.gather import gather_logical
from executor.parallel.grad_sync import DEFAULT_BUCKET_NUMEL, GradSync
from executor.parallel.groups import ProcessGroups
from executor.parallel.host_sync import HostRead
from executor.parallel.p2p import StageComm
from executor.parallel.schedules import MicroBatch, check_plan_schedules, run_schedule
from executor.parallel.zero import ZeroOptimizer
from executor.train.nonfinite import should_skip
from executor.train.optim import OptimConfig, build_optimizer, clip_coefficient, for_device, lr_at, set_lr
from executor.train.trace import NO_TRACE, NullTrace, StepTrace
from planner.errors import SpecError
from planner.layout import Topology, stage_params
from planner.plan import Plan
from planner.state_layout import zero_sharded

log = logging.getLogger("hexiscale.executor")

_AUTOCAST = {"bf16": torch.bfloat16}


def compute_dtype(dtype: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of ``plan.options.dtype`` on ``device``; None: fp32 (also every dtype on
    CPU). fp16, which would need loss scaling, is refused on accelerators."""
    if dtype == "fp32" or device.type == "cpu":
        return None
    if dtype not in _AUTOCAST:
        raise SpecError("options.dtype", f"{dtype} compute needs loss scaling, which the executor does not do",
                        "use bf16 (same speed, no loss scaling) or fp32")
    return _AUTOCAST[dtype]


def _found_nonfinite(stats: torch.Tensor) -> torch.Tensor:
    """1.0 where any of ``stats`` (``[loss, ‖g‖²]``) is NaN or infinite, else 0.0: a 0-dim float on
    ``stats``' device, what a fused optimizer's ``found_inf`` takes (no host synchronisation)."""
    return torch.isfinite(stats).all().logical_not().float()


def _gates_on_device(opt: torch.optim.Optimizer) -> bool:
    """Whether ``opt`` skips its update on the device given ``found_inf`` (torch's fused AdamW)."""
    return bool(opt.param_groups) and all(g.get("fused") for g in opt.param_groups)


@dataclass(frozen=True)
class StepStats:
    loss: float  # global mean token loss (identical on every rank)
    grad_norm: float  # global L2 norm of the logical gradient, before clipping
    lr: float
    tokens: int  # tokens of the global batch this step
    skipped: bool = False  # not finite and skipped (executor.train.nonfinite): nothing was applied


class Engine:
    """Rank ``groups.rank``'s training of ``plan``. Built with ``groups=None`` (and ``rank``) it
    holds the stage's module, parameters, gradient buckets and optimizer but no process group,
    and cannot train until :meth:`attach` gives it the plan's groups: the elastic switch builds
    the next plan's engine before that plan's world exists (:mod:`executor.switch.elastic_switch`)."""

    def __init__(self, plan: Plan, topology: Topology, groups: ProcessGroups | None, *, device: torch.device,
                 optim: OptimConfig = OptimConfig(), seed: int = 0, init: bool = True, on_nonfinite: str = "stop",
                 bucket_numel: int = DEFAULT_BUCKET_NUMEL, rank: int | None = None):
        check_supported(plan)
        check_plan_schedules(plan)
        if groups is not None:
            rank = groups.rank
        if rank is None:
            raise ValueError("an engine without groups needs its rank")
        if not 0 <= rank < topology.world_size:
            raise ValueError(f"rank {rank} is not part of the plan ({topology.world_size} ranks)")
        self.plan = plan
        self.topology = topology
        self._groups: ProcessGroups | None = None
        self._comm: StageComm | CPStageComm | None = None
        self.device = torch.device(device)
        optim = for_device(optim, self.device)
        self.optim_cfg = optim
        self.seed = seed
        self.on_nonfinite = on_nonfinite
        self.skipped_in_a_row = 0
        self._host_read = HostRead()  # step 3's values on their way to the host (one pinned buffer)
        self.rank = rank
        self.stage = topology.stage_of(self.rank)
        self.tp_rank = self.stage.ranks.index(self.rank)
        self.pipeline = plan.pipelines[self.stage.pipeline]
        self.step = 0
        model = plan.model
        self.autocast_dtype = self._compute_dtype(plan.options.dtype)
        if self.device.type == "cuda":  # cuBLAS can be wrong on partial GPUs (MPS shares): executor.model.gemm_check
            micro_tokens = (max(1, self.pipeline.batch_size // self.pipeline.micro_batches) * model.seq_len
                            // self.stage.cp)
            ensure_right_products(self.device, self.autocast_dtype or torch.float32,
                                  linear_shapes(model, self.stage.tp, first=self.stage.is_first,
                                                last=self.stage.is_last), (micro_tokens,))

        cp = CPContext(self.stage.cp, self.stage.cp_rank, None) if self.stage.cp > 1 else None
        self.module = StageModule(model, layers=self.stage.layers, first=self.stage.is_first,
                                  last=self.stage.is_last, tp=self.stage.tp, tp_rank=self.tp_rank,
                                  group=None, device=self.device, recompute=plan.options.recompute,
                                  residual=plan.options.residual_dtype, cp=cp, chunks=self.stage.chunks)
        infos = stage_params(model, self.stage.layers, self.stage.is_first, self.stage.is_last, self.stage.chunks)
        self.shard_dims = {p.name: p.shard_dim for p in infos}
        self._params: dict[str, torch.nn.Parameter] = dict(self.module.named_parameters())
        if list(self.params) != [p.name for p in infos]:
            raise RuntimeError("stage parameters do not match the logical layout: "
                               f"{list(self.params)} vs {[p.name for p in infos]}")
        if init:  # (init=False: the caller installs the state, e.g. a layout switch, executor.switch.state_move)
            self.module.load_logical(logical_init(model, seed, self.shard_dims), self.shard_dims)
        # ZeRO-1 (executor.parallel.zero): Adam state split across each slice's owners, one per pipeline
        # and CP slot, where every parameter has two owners or more (planner.state_layout.zero_sharded)
        # (bucket_numel: elements per flat gradient bucket; under ZeRO-1 the state layout's, see
        # planner.state_layout.rank_states, so change it only where no state moves between plans)
        self.zero = (ZeroOptimizer(topology, rank, self.params, optim, bucket_numel=bucket_numel)
                     if zero_sharded(plan) else None)
        self.optimizer = self.zero.optimizer if self.zero else build_optimizer(list(self.params.items()), optim)
        if self.zero is not None:  # the next forward waits for each bucket's weights just before use
            self.module.param_gate = self.zero.ready
        # one low-precision copy of each weight per step (executor.model.cast_once): made again after every
        # optimizer step, which changes the weights without bumping their version counters
        self.optimizer.register_step_post_hook(self.module.weights_changed)
        self.module.cast_once = True
        self.grad_sync = (self.zero.sync if self.zero is not None
                          else GradSync(topology, rank, self.params, bucket_numel=bucket_numel))
        self.trace: NullTrace | StepTrace = NO_TRACE
        # parameters whose squared gradient this rank adds to the global norm (no double counting;
        # after the sync every pipeline and CP slot holds the same gradient)
        counted = self.stage.pipeline == 0 and self.stage.cp_rank == 0
        self._norm_params = [p for n, p in self.params.items()
                             if counted and (self.shard_dims[n] is not None or self.tp_rank == 0)]
        if groups is not None:
            self.attach(groups)

    def attach(self, groups: ProcessGroups) -> None:
        """Give the engine the plan's process groups (once): the stage's TP and CP groups to its
        module, the sync groups to its gradient buckets (and ZeRO-1's broadcasts), the boundary
        groups to its p2p. Nothing built before this needs a group; nothing after it is rebuilt."""
        if self._groups is not None:
            raise RuntimeError(f"rank {self.rank}'s engine has its process groups already")
        if groups.rank != self.rank or groups.topology != self.topology:
            raise ValueError(f"the groups are rank {groups.rank}'s of another topology than this engine's "
                             f"(rank {self.rank})")
        self._groups = groups
        self.module.attach(groups.tp_group, groups.cp_group)
        (self.zero or self.grad_sync).attach(groups)
        leader = self.stage.leader
        pipe = self.topology.pipelines[self.stage.pipeline]
        leaders = tuple(g[0] for g in self.stage.stage_leaders)  # interleaved: every stage's (else ())
        self._comm = (
            CPStageComm(self.stage, self.rank, groups.tp_group, device=self.device, boundary=groups.boundary)
            if self.stage.uses_cp else
            StageComm(self.stage, self.rank, groups.tp_group, device=self.device,
                      prev_group=groups.boundary(self.stage.prev_leader, leader),
                      next_group=groups.boundary(leader, self.stage.next_leader), leaders=leaders,
                      wrap_group=groups.boundary(pipe[-1].leader, pipe[0].leader) if leaders else None))
        self._comm.trace = self.trace

    @property
    def groups(self) -> ProcessGroups:
        """The plan's process groups (:meth:`attach`)."""
        if self._groups is None:
            raise RuntimeError(f"rank {self.rank}'s engine has no process groups yet (attach them first)")
        return self._groups

    @property
    def comm(self) -> StageComm | CPStageComm:
        """This rank's p2p between stages (made by :meth:`attach`)."""
        if self._comm is None:
            raise RuntimeError(f"rank {self.rank}'s engine has no process groups yet (attach them first)")
        return self._comm

    def set_step(self, step: int) -> None:
        """The step count, in the engine and in every optimizer state (AdamW's bias correction):
        the elastic switch's state arrives in tensors the engine already holds
        (:class:`executor.state.state_pieces.NewState`), its step count last."""
        for st in self.optimizer.state.values():
            st["step"].fill_(float(step))
        self.step = step

    @property
    def params(self) -> dict[str, torch.nn.Parameter]:
        """This rank's parameters by name (local shards). Under ZeRO-1 the last step's weight
        all-gathers are waited for first, so whoever reads them sees the updated values."""
        self.drain()
        return self._params

    def drain(self) -> None:
        """Wait for every collective this engine left in flight: ZeRO-1's weight all-gathers, which a
        step launches for the next forward. Call it after the last step: a process that exits or
        closes its groups with them pending aborts (gloo: "terminate called without an active
        exception", seen in about half of the 3-rank CPU runs that ended without a checkpoint)."""
        zero = getattr(self, "zero", None)
        if zero is not None:
            zero.wait_all()

    def _compute_dtype(self, dtype: str) -> torch.dtype | None:
        if dtype != "fp32" and self.device.type == "cpu" and self.rank == 0:
            log.warning("plan options.dtype=%s on CPU: computing in fp32 instead", dtype)
        return compute_dtype(dtype, self.device)

    def _autocast(self) -> Callable[[], contextlib.AbstractContextManager]:
        if self.autocast_dtype is None:
            return contextlib.nullcontext
        dev, dt = self.device.type, self.autocast_dtype
        return lambda: torch.autocast(dev, dtype=dt)

    def set_trace(self, trace: NullTrace | StepTrace) -> None:
        """Record spans of the schedule, p2p, gradient sync and optimizer (:mod:`executor.train.trace`)."""
        self.trace = trace
        if self._comm is not None:
            self._comm.trace = trace

    # ------------------------------------------------------------------------------ training
    def micro_batches(self, tokens: torch.Tensor) -> list[MicroBatch]:
        """This pipeline's micro-batches; with ``cp > 1`` this rank's two chunks of every sequence
        (:mod:`executor.parallel.context_parallel`)."""
        out, row = [], 0
        cp, r = self.stage.cp, self.stage.cp_rank
        self._check_cp_split(tokens.shape[1] - 1, "sequences", "use sequence lengths that are multiples of")
        for size in self.pipeline.micro_batch_sizes():
            chunk = tokens[row:row + size]
            out.append(MicroBatch(inputs=split_sequence(chunk[:, :-1], cp, r),
                                  labels=split_sequence(chunk[:, 1:], cp, r)))
            row += size
        return out

    def _cp_packed(self, mb: MicroBatch) -> MicroBatch:
        cp, r = self.stage.cp, self.stage.cp_rank
        return MicroBatch(inputs=split_sequence(mb.inputs, cp, r), labels=split_sequence(mb.labels, cp, r),
                          docs=mb.docs)

    def _check_cp_split(self, tokens: int, what: str, fix: str) -> None:
        """Refuse rows that the pipeline's largest ``cp`` cannot cut into ``2·cp`` chunks, on EVERY
        rank of the pipeline alike (a cp-1 neighbour of a CP stage would otherwise wait for, or fail
        on, pieces that never come), naming the first stage of that cp."""
        cps = [s.cp for s in self.pipeline.stages]
        cp = max(cps)
        if cp > 1 and tokens % (2 * cp):
            field = f"pipelines[{self.stage.pipeline}].stages[{cps.index(cp)}].cp"
            raise SpecError(field, f"{what} of {tokens} tokens do not split into 2 x cp = {2 * cp} equal chunks",
                            f"{fix} {2 * cp} tokens")

    def train_step(self, tokens: torch.Tensor) -> StepStats:
        """One optimizer step on this pipeline's rows ``tokens [batch_size_p, seq_len + 1]``."""
        bs = self.pipeline.batch_size
        if tokens.dim() != 2 or tokens.shape[0] != bs or not 2 <= tokens.shape[1] <= self.plan.model.seq_len + 1:
            raise ValueError(f"pipeline {self.stage.pipeline} expects tokens [{bs}, <= {self.plan.model.seq_len + 1}]"
                             f", got {list(tokens.shape)}")
        seq = tokens.shape[1] - 1
        tokens = tokens.to(self.device, non_blocking=True)
        return self.train_micro_batches(self.micro_batches(tokens), self.plan.global_batch_size * seq)

    def train_micro_batches(self, micro: list[MicroBatch], global_tokens: int) -> StepStats:
        """One optimizer step on this pipeline's micro-batches (any shapes, packed ones included:
        every rank of the pipeline passes the same list); ``global_tokens`` counts the labels of
        the whole global batch, every pipeline's."""
        for mb in micro:
            if mb.docs is not None:
                self._check_cp_split(mb.inputs.shape[1], "packed rows", "pack rows of a multiple of")
        if self.stage.cp > 1:  # packed rows: this rank's chunks of each (unpacked ones: micro_batches)
            micro = [self._cp_packed(mb) if mb.docs is not None else mb for mb in micro]
        self.zero_grads()
        # each parameter's gradient is final after its len(micro)-th accumulation: from then on its
        # cross-pipeline reduction (all-reduce, or ZeRO-1's reduce-scatter) can run during the rest
        # of backward; the gradients accumulate in place in the flat buckets (GradSync.arm)
        if micro:
            self.grad_sync.arm(len(micro))
        loss = self.accumulate(micro, global_tokens)
        return self.apply_gradients(loss, global_tokens)

    def zero_grads(self) -> None:
        self.module.weights_changed()  # a new step (or a skipped one): cast-once copies are made again
        for p in self._params.values():
            p.grad = None

    def accumulate(self, micro: list[MicroBatch], global_tokens: int) -> torch.Tensor | None:
        """Forward and backward of ``micro`` through this pipeline, adding to the gradients; the
        summed loss ``Σ CE / global_tokens`` on the last stage (None elsewhere)."""
        return run_schedule(self.pipeline.schedule, module=self.module, comm=self.comm,
                            micro=micro, loss_scale=1.0 / global_tokens,
                            n_stages=len(self.pipeline.stages), autocast=self._autocast(), trace=self.trace)

    def apply_gradients(self, loss: torch.Tensor | None, global_tokens: int, *,
                        count_loss: bool | None = None) -> StepStats:
        """Steps 2-4 of the module docstring on the accumulated gradients: synchronise them across
        pipelines, global norm (and ``loss``, this rank's part of it, counted by the stage's TP
        leader unless ``count_loss`` says otherwise) over the plan, clip, AdamW."""
        for p in self.params.values():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        with self.trace.span("grad_sync"):
            stats = self._sync_grads(loss, count_loss)
        # the step's one device synchronisation: the NaN/Inf guard needs the values (executor.train.nonfinite;
        # every rank holds the same all-reduced values, so all decide alike). A fused AdamW is queued
        # first, gated on the device by the same values, so the device never waits for the host here.
        self._host_read.start(stats)
        lr = lr_at(self.step, self.optim_cfg)
        gated = self.zero is None and _gates_on_device(self.optimizer)
        if gated:
            self._update(stats, lr, found_inf=_found_nonfinite(stats))
        host = self._host_read.wait()
        if should_skip(host[0], host[1], step=self.step + 1, policy=self.on_nonfinite,
                       skipped_in_a_row=self.skipped_in_a_row):
            self.zero_grads()
            self.skipped_in_a_row += 1
            self.step += 1
            return StepStats(loss=host[0], grad_norm=float("nan"), lr=lr, tokens=global_tokens, skipped=True)
        self.skipped_in_a_row = 0
        if not gated:
            self._update(stats, lr)
        self.step += 1
        return StepStats(loss=host[0], grad_norm=host[1] ** 0.5, lr=lr, tokens=global_tokens)

    def _update(self, stats: torch.Tensor, lr: float, found_inf: torch.Tensor | None = None) -> None:
        """Step 4: clip by the global norm ``sqrt(stats[1])``, set ``lr``, AdamW. ``found_inf``
        (a fused AdamW only): 1.0 makes the optimizer leave weights, moments and step as they were."""
        with self.trace.span("optimizer"):
            coef = clip_coefficient(stats[1].sqrt(), self.optim_cfg.grad_clip)
            grads = self.zero.grads() if self.zero is not None else [p.grad for p in self.params.values()]
            torch._foreach_mul_(grads, coef)  # type: ignore[arg-type]
            set_lr(self.optimizer, lr)
            if found_inf is None:
                (self.zero or self.optimizer).step()
                return
            self.optimizer.found_inf = found_inf  # type: ignore[attr-defined]  # read by torch's fused step
            try:
                self.optimizer.step()
            finally:
                del self.optimizer.found_inf  # type: ignore[attr-defined]

    def _sync_grads(self, loss: torch.Tensor | None, count_loss: bool | None = None) -> torch.Tensor:
        """Steps 2-3 of the module docstring: gradients reduced across pipelines, then
        ``[loss, ‖g‖²]`` summed over the plan's ranks."""
        if self.zero is not None:  # ZeRO-1: each owner gets the summed gradient of its part only
            self.zero.reduce_grads()
        else:
            self.grad_sync.sync()
        stats = torch.zeros(2, dtype=torch.float32, device=self.device)
        if loss is not None and (self.tp_rank == 0 if count_loss is None else count_loss):
            stats[0] = loss.float()
        if self.zero is not None:  # every logical element's gradient lies in one rank's parts
            stats[1] = self.zero.grad_sq_norm()
        elif self._norm_params:
            norms = torch._foreach_norm([p.grad for p in self._norm_params])  # type: ignore[misc]
            stats[1] = torch.stack(norms).float().pow(2).sum()
        if self.topology.world_size > 1:
            dist.all_reduce(stats, group=self.groups.world)
        return stats

    # ------------------------------------------------------------------------------ state
    def logical_state_dict(self, to_all: bool = True) -> dict[str, torch.Tensor]:
        """Collective: full fp32 logical tensors (CPU). With ``to_all=False`` only global rank 0
        receives them (other ranks get an empty dict)."""
        local = {n: p.detach() for n, p in self.params.items()}
        return gather_logical(self.groups, local, to_all=to_all)

    def optimizer_moments(self) -> dict[str, dict[str, torch.Tensor]]:
        """This rank's AdamW moments per parameter name (zeros before the first step); under ZeRO-1
        a collective that all-gathers them from the owners' parts."""
        if self.zero is not None:
            return self.zero.full_moments()
        out: dict[str, dict[str, torch.Tensor]] = {"exp_avg": {}, "exp_avg_sq": {}}
        for n, p in self.params.items():
            st = self.optimizer.state.get(p, {})
            for key in out:
                out[key][n] = st[key] if key in st else torch.zeros_like(p)
        return out

    def set_optimizer_state(self, moments: dict[str, dict[str, torch.Tensor]], step: int, *,
                            copy: bool = True) -> None:
        """Install (sharded) AdamW moments and the step count; with ``copy=False`` (no ZeRO-1) the
        state *is* the given tensors (fp32 on the device, filled later by the elastic switch)."""
        if self.zero is not None:
            self.zero.load_moments(moments, step)
            self.step = step
            return
        for group in self.optimizer.param_groups:
            on_device = bool(group.get("fused") or group.get("capturable"))
            for p in group["params"]:
                name = self._name_of(p)
                st = {"step": torch.tensor(float(step), dtype=torch.float32,
                                           device=self.device if on_device else torch.device("cpu"))}
                for key in ("exp_avg", "exp_avg_sq"):
                    given = moments[key][name]
                    st[key] = given.to(self.device, torch.float32).clone() if copy else given
                self.optimizer.state[p] = st
        self.step = step

    def _name_of(self, p: torch.nn.Parameter) -> str:
        for n, q in self.params.items():
            if q is p:
                return n
        raise KeyError("parameter not in this stage")
