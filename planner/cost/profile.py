"""Device compute profiles: how long one layer (and the embedding, the LM head, the optimizer
step) takes on one device type. Two sources behind one interface (:class:`DeviceProfile`):

* :class:`SpecProfile` — a roofline from the catalog's datasheet figures. Each op of
  :mod:`planner.cost.ops` takes::

      time(op) = kernels · kernel_overhead_s + max(flops / (peak · eff(op)), bytes / (bw · memory_efficiency))
      time(pass) = max(Σ time(op), Σ kernels · host)   eager PyTorch is GPU- or CPU-bound; host =
                   host_overhead_s (forward, Python) or host_overhead_backward_s (autograd engine);
                   a fully recomputed layer's forward adds checkpoint_host_s to the host side

  with ``peak = DeviceType.peak(dtype)``, ``bw`` the memory bandwidth and the efficiency curves
  (``CostParams``)::

      GEMM:       eff = gemm_efficiency · d / (d + gemm_half_dim)          d = smallest GEMM dim
      attention:  eff = attention_efficiency · s / (s + attention_half_seq) s = sequence length
      memory op:  no FLOP term (pure bandwidth)
      host op:    no GPU time; its ``kernels`` count on the host side only (cast-once's linears)

  Recompute adds to the backward what it repeats: ``full`` the layer forward up to the last
  tensor the backward needs (all but the w_down GEMM and the final residual add: the
  checkpoint's early stop), ``selective`` the attention core forward.
* :class:`planner.cost.measured.MeasuredProfile` — tables measured by the profiler, read from the
  catalog entry's ``measured`` section (format in that module), interpolated, falling back to the
  spec roofline where the table has no entry.

:class:`planner.cost.profile_set.ProfileSet` picks one of the two per device type.

Times are for ONE device at nominal speed; a per-device ``slowdown`` (cluster overrides) is
applied by the caller (``planner.cost.stage``), as is TP communication — except where a measured
profile timed the layer with its TP all-reduces (live TP rows): :meth:`DeviceProfile.layer_holds_collectives`
says so, and the stage model then adds the layers' all-reduces no second time.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace

from planner.catalog import DeviceType
from planner.cost.ops import (
    ATTN,
    DTYPE_BYTES,
    GEMM,
    HOST,
    NOT_RECOMPUTED,
    Numerics,
    Op,
    attention_core_forward,
    embedding_ops,
    head_ops,
    layer_backward_ops,
    layer_forward_ops,
    optimizer_bytes_per_param,
    weight_copy_op,
)
from planner.cost.params import DEFAULT_PARAMS, CostParams
from planner.errors import SpecError
from planner.model import RECOMPUTE_MODES, ModelSpec
from planner.plan import DTYPES


@dataclass(frozen=True)
class PassTime:
    """Forward and backward seconds of one micro-batch (backward includes any recompute)."""

    forward_s: float
    backward_s: float

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s


def _check(dtype: str, recompute: str, micro_batch: int, tp: int) -> None:
    if dtype not in DTYPES:
        raise SpecError("options.dtype", f"{dtype!r} is not one of {list(DTYPES)}", "use bf16, fp16 or fp32")
    if recompute not in RECOMPUTE_MODES:
        raise SpecError("options.recompute", f"{recompute!r} is not one of {list(RECOMPUTE_MODES)}",
                        "use none, selective or full")
    if micro_batch < 1 or tp < 1:
        raise SpecError("micro_batch" if micro_batch < 1 else "tp", "must be >= 1", "use a positive integer")


def exact_split(total: float, gpu: float, host: float) -> tuple[float, float]:
    """(GPU, host) shares of a pass priced ``total`` whose rows timed ``gpu`` and ``host`` apart: the
    larger side is the pass time, the other its own time (at most the total)."""
    return (min(gpu, total), total) if host >= gpu else (total, min(host, total))


class DeviceProfile(ABC):
    """Interface (and the spec roofline implementation's cache). Subclasses override ``_layer``,
    ``_embedding``, ``_head`` and may override ``optimizer_time``. Results are cached per
    argument tuple, so repeated calls from the planner's inner loops cost a dict lookup."""

    source = "abstract"

    def __init__(self, device: DeviceType, params: CostParams = DEFAULT_PARAMS):
        self.device = device
        self.params = params
        self._cache: dict[tuple[object, ...], PassTime] = {}
        self._split_cache: dict[tuple[object, ...], tuple[PassTime, PassTime]] = {}
        self._share_cache: dict[tuple[object, ...], float] = {}
        self._copy_cache: dict[tuple[object, ...], tuple[float, float]] = {}
        self.copies_per_step = params.cast_once  # weight_copy: the engine's cast-once copies are priced

    @property
    def key(self) -> str:
        return self.device.key

    @property
    def memory_gib(self) -> float:
        return self.device.memory_gib

    def peak_flops(self, dtype: str) -> float:
        """Peak FLOP/s of this device type for ``dtype`` (catalog figure)."""
        return self.device.peak(dtype) * 1e12

    # ----------------------------------------------------------------------- public, cached
    def layer_time(self, model: ModelSpec, micro_batch: int, tp: int = 1, dtype: str = "bf16",
                   recompute: str = "none", seq_len: int | None = None) -> PassTime:
        """One transformer layer, one micro-batch of ``micro_batch`` sequences, on a TP-``tp`` shard
        (compute only, TP all-reduces added by the stage model, unless :meth:`layer_holds_collectives`)."""
        key = ("layer", model, micro_batch, tp, dtype, recompute, seq_len)
        hit = self._cache.get(key)
        if hit is None:
            _check(dtype, recompute, micro_batch, tp)
            hit = self._layer(model, micro_batch, tp, dtype, recompute, seq_len or model.seq_len)
            if self.params.layers_compiled and self.params.compiled_layer_ratio > 0:  # options.compile
                hit = self._compiled_layer(hit, model, micro_batch, tp, dtype, recompute, seq_len or model.seq_len)
            self._cache[key] = hit
        return hit

    def _compiled_layer(self, eager: PassTime, model: ModelSpec, micro_batch: int, tp: int, dtype: str,
                        recompute: str, seq_len: int) -> PassTime:
        """``options.compile``'s layer from the eager one: each pass's GPU and host shares (the rows' own,
        as :meth:`pass_split` has them) scaled by their own measured ratios, else by the one ratio."""
        p = self.params
        rows = self._measured_split("layer", model, micro_batch, tp, dtype, recompute, seq_len) \
            if p.compiled_device_ratio > 0 and p.compiled_host_ratio > 0 else None
        if rows is None:
            return PassTime(eager.forward_s * p.compiled_layer_ratio, eager.backward_s * p.compiled_layer_ratio)
        gpu, host = rows

        def one(total: float, g: float, h: float) -> float:
            g, h = exact_split(total, g, h)
            return max(g * p.compiled_device_ratio, h * p.compiled_host_ratio)

        return PassTime(one(eager.forward_s, gpu.forward_s, host.forward_s),
                        one(eager.backward_s, gpu.backward_s, host.backward_s))

    def layer_holds_collectives(self, model: ModelSpec, micro_batch: int, tp: int = 1, dtype: str = "bf16",
                                seq_len: int | None = None) -> bool:
        """Whether :meth:`layer_time` already includes the layer's own TP all-reduces (2 in the
        forward, 2 in the backward: a layer measured live on ``tp`` ranks). The roofline never does."""
        return False

    def embedding_time(self, model: ModelSpec, micro_batch: int, tp: int = 1, dtype: str = "bf16",
                       seq_len: int | None = None) -> PassTime:
        key = ("embedding", model, micro_batch, tp, dtype, seq_len)
        hit = self._cache.get(key)
        if hit is None:
            _check(dtype, "none", micro_batch, tp)
            hit = self._cache[key] = self._embedding(model, micro_batch, tp, dtype, seq_len or model.seq_len)
        return hit

    def head_time(self, model: ModelSpec, micro_batch: int, tp: int = 1, dtype: str = "bf16",
                  seq_len: int | None = None) -> PassTime:
        """Final norm + LM head + cross-entropy loss."""
        key = ("head", model, micro_batch, tp, dtype, seq_len)
        hit = self._cache.get(key)
        if hit is None:
            _check(dtype, "none", micro_batch, tp)
            hit = self._cache[key] = self._head(model, micro_batch, tp, dtype, seq_len or model.seq_len)
        return hit

    def pass_split(self, kind: str, model: ModelSpec, micro_batch: int, tp: int = 1, dtype: str = "bf16",
                   recompute: str = "none", seq_len: int | None = None) -> tuple[PassTime, PassTime]:
        """(GPU, host) seconds of one ``kind`` pass ('layer', 'embedding', 'head'), consistent with the
        profile's own time ``T`` of that pass (``layer_time`` ...), which is ``max(GPU, host)``.

        Where the profile's rows hold the pass's device and host times apart (host-free rows,
        :mod:`planner.cost.measured` rule 9), the split is theirs: a row whose host time reaches its
        device time is launch-bound (host = T, GPU = its device time), else GPU = T, host = its host
        time. Otherwise it is inferred: the host time ``H`` is what eager PyTorch takes to issue the
        pass's kernels (the roofline's kernel counts times ``host_overhead_s`` in the forward and in
        recompute, which runs the forward again, ``host_overhead_backward_s`` in the backward). A pass with ``T > H`` is
        GPU-bound: GPU = T, host = H. Otherwise ``T`` is a launch-bound (host-bound) figure, not
        compute: host = T and the GPU's share is the roofline's GPU time, at most T. The stage model
        uses the split to add TP communication to the side it loads (:mod:`planner.cost.stage`) and to
        slow only the GPU side of a slowed device."""
        key = ("split", kind, model, micro_batch, tp, dtype, recompute, seq_len)
        hit = self._split_cache.get(key)
        if hit is not None:
            return hit
        if kind == "layer":
            t = self.layer_time(model, micro_batch, tp, dtype, recompute, seq_len)
        else:
            t = (self.embedding_time if kind == "embedding" else self.head_time)(model, micro_batch, tp, dtype, seq_len)
        s = seq_len or model.seq_len

        def inferred(total: float, gpu: float, host: float) -> tuple[float, float]:
            return (total, host) if total > host else (min(total, gpu), total)

        measured = self._measured_split(kind, model, micro_batch, tp, dtype, recompute, s)
        split = inferred if measured is None else exact_split  # the rows' own device and host times (host-free rows)
        gpu, host = measured or self.roofline_split(kind, model, micro_batch, tp, dtype, recompute, s)
        (gf, hf), (gb, hb) = split(t.forward_s, gpu.forward_s, host.forward_s), split(
            t.backward_s, gpu.backward_s, host.backward_s)
        hit = self._split_cache[key] = (PassTime(gf, gb), PassTime(hf, hb))
        return hit

    def roofline_split(self, kind: str, model: ModelSpec, micro_batch: int, tp: int, dtype: str, recompute: str,
                       seq_len: int) -> tuple[PassTime, PassTime]:
        """The roofline's (GPU, host) seconds of one ``kind`` pass, apart: GPU the ops' times (recompute
        repeats the forward's in the backward), host their kernels times ``host_overhead_s`` (forward,
        recompute) or ``host_overhead_backward_s`` (backward), plus ``checkpoint_host_s`` in both passes
        of a fully recomputed layer. The fit of host-free rows matches each to its own measured time
        (:func:`planner.calibration.fit.predict_compute`)."""
        num, p = self.numerics(dtype), self.params
        if kind == "layer":
            fwd = layer_forward_ops(model, micro_batch, seq_len, tp, num)
            bwd = layer_backward_ops(model, micro_batch, seq_len, tp, num, p.attention_backward_flops_ratio)
            again = ([op for op in fwd if op.name not in NOT_RECOMPUTED] if recompute == "full" else
                     [attention_core_forward(model, micro_batch, seq_len, tp, DTYPE_BYTES[dtype])]
                     if recompute == "selective" else [])
        else:
            fwd, bwd = (embedding_ops if kind == "embedding" else head_ops)(model, micro_batch, seq_len, tp, num)
            again = []

        def kernels(ops: list[Op]) -> int:
            return sum(op.kernels for op in ops)

        ck = p.checkpoint_host_s if kind == "layer" and recompute == "full" else 0.0
        host_f = kernels(fwd) * p.host_overhead_s + ck
        host_b = kernels(bwd) * p.host_overhead_backward_s + kernels(again) * p.host_overhead_s + (ck if again else 0.0)
        gpu_f = sum(self.op_time(op, dtype) for op in fwd)
        gpu_b = sum(self.op_time(op, dtype) for op in bwd + again)
        return PassTime(gpu_f, gpu_b), PassTime(host_f, host_b)

    def _measured_split(self, kind: str, model: ModelSpec, micro_batch: int, tp: int, dtype: str, recompute: str,
                        seq_len: int) -> tuple[PassTime, PassTime] | None:
        """(device, host) seconds of one pass where measured rows hold both (None: infer them)."""
        return None

    def weight_grad_share(self, model: ModelSpec, micro_batch: int, tp: int = 1, dtype: str = "bf16",
                          recompute: str = "none", seq_len: int | None = None) -> float:
        """Share of a layer's backward GPU time (its recompute included) that a split backward's W
        runs: the weight-gradient GEMMs and their accumulation (roofline). The rest (input-gradient
        GEMMs, the attention core, norms, element-wise work, recompute) is B's."""
        key = ("wshare", model, micro_batch, tp, dtype, recompute, seq_len)
        hit = self._share_cache.get(key)
        if hit is None:  # asked per stage and micro-batch size of every pipeline an estimate prices
            hit = self._share_cache[key] = self._weight_grad_share(model, micro_batch, tp, dtype, recompute, seq_len)
        return hit

    def _weight_grad_share(self, model: ModelSpec, micro_batch: int, tp: int, dtype: str, recompute: str,
                           seq_len: int | None) -> float:
        s, num = seq_len or model.seq_len, self.numerics(dtype)
        bwd = layer_backward_ops(model, micro_batch, s, tp, num, self.params.attention_backward_flops_ratio)
        fwd = layer_forward_ops(model, micro_batch, s, tp, num)
        again = ([op for op in fwd if op.name not in NOT_RECOMPUTED] if recompute == "full" else
                 [attention_core_forward(model, micro_batch, s, tp, DTYPE_BYTES[dtype])]
                 if recompute == "selective" else [])
        w = sum(self.op_time(op, dtype) for op in bwd if op.name.endswith(".wgrad") or op.name == "grad_accumulate")
        return w / sum(self.op_time(op, dtype) for op in bwd + again)

    def weight_copy(self, kind: str, model: ModelSpec, tp: int = 1, dtype: str = "bf16") -> tuple[float, float]:
        """(GPU, host) seconds of one ``kind``'s ('layer', 'head') cast-once weight copy, made once per
        step in that part's first forward (:func:`planner.cost.ops.weight_copy_op`); (0, 0) where the
        passes price the casts themselves (autocast's path: ``CostParams.cast_once`` off, or tables
        timed on it, :class:`planner.cost.measured.MeasuredProfile`) or there is none (fp32)."""
        key = ("copy", kind, model, tp, dtype)
        hit = self._copy_cache.get(key)
        if hit is None:
            op = weight_copy_op(kind, model, tp, replace(self.numerics(dtype), cast_once=self.copies_per_step))
            hit = (0.0, 0.0) if op is None else (self.op_time(op, dtype), op.kernels * self.params.host_overhead_s)
            self._copy_cache[key] = hit
        return hit

    def optimizer_time(self, num_params: float, num_tensors: int, dtype: str = "bf16") -> float:
        """AdamW step over ``num_params`` parameters in ``num_tensors`` tensors (memory-bound)."""
        p = self.params
        bw = self.device.memory_bandwidth_GBps * 1e9 * p.memory_efficiency
        return num_tensors * p.kernel_overhead_s + num_params * optimizer_bytes_per_param() / bw

    def activation_bytes(self, kind: str, model: ModelSpec, micro_batch: int, tp: int = 1, dtype: str = "bf16",
                         recompute: str = "none", seq_len: int | None = None) -> float | None:
        """Measured activation bytes per micro-batch of one layer (``kind='layer'``) or of the head
        (``'head'``); None where there is no measurement (the memory formula applies)."""
        return None

    def stage_activations(self, model: ModelSpec, micro_batch: int, tp: int, dtype: str, recompute: str, *,
                          last: bool, compile: bool = False,
                          seq_len: int | None = None) -> tuple[float | None, float | None]:
        """The measured ``(layer_activation, head_activation)`` that
        :func:`planner.cost.memory.stage_memory` takes for a stage, as the estimate and the search's
        memory check both use them (None: the formula). Measured layer rows are the eager path's,
        so compiled blocks without recompute keep the compiled formula (it equals the saved tensors
        a GPU counted, llama2-7b on H200: benchmarks/results/activation_memory_cuda_*.json)."""
        layer = None if compile and recompute == "none" else self.activation_bytes(
            "layer", model, micro_batch, tp, dtype, recompute, seq_len)
        head = self.activation_bytes("head", model, micro_batch, tp, dtype, seq_len=seq_len) if last else None
        return layer, head

    def numerics(self, dtype: str) -> Numerics:
        p = self.params
        return Numerics.from_params(dtype, p)

    # ----------------------------------------------------------------------- spec roofline
    def op_time(self, op: Op, dtype: str, attention_efficiency: float = 0.0) -> float:
        """Roofline seconds of ``op``; ``attention_efficiency`` (0: the params') for another attention kernel."""
        p = self.params
        bw = self.device.memory_bandwidth_GBps * 1e9 * p.memory_efficiency
        t_mem = op.bytes / bw
        if op.kind == HOST:
            return 0.0
        if op.kind == GEMM:
            eff = p.gemm_efficiency * op.dim / (op.dim + p.gemm_half_dim)
        elif op.kind == ATTN:
            eff = (attention_efficiency or p.attention_efficiency) * op.dim / (op.dim + p.attention_half_seq)
        else:
            return op.kernels * p.kernel_overhead_s + t_mem
        t_flop = op.flops / (self.peak_flops(dtype) * eff)
        return op.kernels * p.kernel_overhead_s + max(t_flop, t_mem)

    def attention_core_time(self, model: ModelSpec, micro_batch: int, tp: int, dtype: str, recompute: str,
                            seq_len: int, copies: float = 1.0, cp_kernel: bool = False) -> tuple[float, float]:
        """Roofline GPU seconds of one layer's attention core, (forward, backward), the backward with the
        forward again where ``recompute`` repeats it. A measured row carried to a longer sequence
        scales everything else by its level and adds this (:mod:`planner.cost.measured`, rule 3):
        the rows' level at short sequences is that of GEMMs and launches, not of the attention kernel."""
        one = attention_core_forward(model, micro_batch, seq_len, tp, DTYPE_BYTES[dtype])
        core = Op(one.name, ATTN, one.flops * copies, one.bytes * copies, seq_len)
        back = Op("attention.backward", ATTN, core.flops * self.params.attention_backward_flops_ratio,
                  2 * core.bytes, seq_len, kernels=2)
        eff = self.params.cp_attention_efficiency if cp_kernel else 0.0
        fwd, bwd = self.op_time(core, dtype, eff), self.op_time(back, dtype, eff)
        return fwd, bwd + (fwd if recompute in ("full", "selective") else 0.0)

    def ops_time(self, ops: list[Op], dtype: str, backward: bool = False, extra_host_s: float = 0.0) -> float:
        """One pass of ``ops``: max(GPU time, host time to issue them): ``host_overhead_s`` per
        kernel for a forward (Python), ``host_overhead_backward_s`` for a backward (autograd engine),
        plus ``extra_host_s`` of host work that launches no kernel (checkpoint's wrapper)."""
        gpu = sum(self.op_time(op, dtype) for op in ops)
        host = self.params.host_overhead_backward_s if backward else self.params.host_overhead_s
        return max(gpu, sum(op.kernels for op in ops) * host + extra_host_s)

    def explain_layer(self, model: ModelSpec, micro_batch: int, tp: int = 1, dtype: str = "bf16",
                      seq_len: int | None = None) -> list[tuple[str, str, float, float, float]]:
        """The spec roofline of one layer op by op: (name, kind, FLOPs, bytes, seconds), forward ops
        then backward ops (no recompute). For calibration: which term is off."""
        _check(dtype, "none", micro_batch, tp)
        s, num = seq_len or model.seq_len, self.numerics(dtype)
        ops = layer_forward_ops(model, micro_batch, s, tp, num) + layer_backward_ops(
            model, micro_batch, s, tp, num, self.params.attention_backward_flops_ratio)
        return [(op.name, op.kind, op.flops, op.bytes, self.op_time(op, dtype)) for op in ops]

    def _spec_layer(self, model: ModelSpec, micro_batch: int, tp: int, dtype: str, recompute: str,
                    seq_len: int) -> PassTime:
        num = self.numerics(dtype)
        ck = self.params.checkpoint_host_s if recompute == "full" else 0.0
        fwd = self.ops_time(layer_forward_ops(model, micro_batch, seq_len, tp, num), dtype, extra_host_s=ck)
        bwd = self.ops_time(layer_backward_ops(model, micro_batch, seq_len, tp, num,
                                               self.params.attention_backward_flops_ratio), dtype, backward=True)
        return PassTime(fwd, bwd + self._recompute_extra(model, micro_batch, tp, dtype, recompute, seq_len, fwd))

    def _recompute_extra(self, model: ModelSpec, micro_batch: int, tp: int, dtype: str, recompute: str,
                         seq_len: int, forward_s: float) -> float:
        if recompute == "full":
            return self.recompute_fraction(model, micro_batch, tp, dtype, seq_len) * forward_s
        if recompute == "selective":
            return self.ops_time([attention_core_forward(model, micro_batch, seq_len, tp, DTYPE_BYTES[dtype])], dtype)
        return 0.0

    def recompute_fraction(self, model: ModelSpec, micro_batch: int, tp: int, dtype: str, seq_len: int) -> float:
        """Share of a layer's forward time that full recompute repeats. PyTorch's non-reentrant
        checkpoint stops once the last tensor the backward needs is rebuilt, so the final w_down
        GEMM and residual add are not repeated (nor the w_down all-reduce; see stage.py)."""
        ops = layer_forward_ops(model, micro_batch, seq_len, tp, self.numerics(dtype))
        return self.ops_time([op for op in ops if op.name not in NOT_RECOMPUTED], dtype) / self.ops_time(ops, dtype)

    def _spec_embedding(self, model: ModelSpec, micro_batch: int, tp: int, dtype: str, seq_len: int) -> PassTime:
        fwd, bwd = embedding_ops(model, micro_batch, seq_len, tp, self.numerics(dtype))
        return PassTime(self.ops_time(fwd, dtype), self.ops_time(bwd, dtype, backward=True))

    def _spec_head(self, model: ModelSpec, micro_batch: int, tp: int, dtype: str, seq_len: int) -> PassTime:
        fwd, bwd = head_ops(model, micro_batch, seq_len, tp, self.numerics(dtype))
        return PassTime(self.ops_time(fwd, dtype), self.ops_time(bwd, dtype, backward=True))

    @abstractmethod
    def _layer(self, model: ModelSpec, micro_batch: int, tp: int, dtype: str, recompute: str,
               seq_len: int) -> PassTime:
        """Forward/backward time of one layer (the source's own data: roofline or measured table)."""

    @abstractmethod
    def _embedding(self, model: ModelSpec, micro_batch: int, tp: int, dtype: str, seq_len: int) -> PassTime:
        """Forward/backward time of the vocab-parallel embedding."""

    @abstractmethod
    def _head(self, model: ModelSpec, micro_batch: int, tp: int, dtype: str, seq_len: int) -> PassTime:
        """Forward/backward time of the final norm, LM head and loss."""


class SpecProfile(DeviceProfile):
    """Roofline from the datasheet (``derived: spec``)."""

    source = "spec"

    _layer = DeviceProfile._spec_layer
    _embedding = DeviceProfile._spec_embedding
    _head = DeviceProfile._spec_head
