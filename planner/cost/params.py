"""Every tunable term of the cost model, in one frozen dataclass that calibration can fit.

There is no global fudge factor. Each field is a physical quantity with a unit, and each is used
in exactly the formulas named in its comment. Defaults are spec-level guesses for a modern NVIDIA
GPU with cuBLAS/cuDNN/NCCL; the profiler issue fits them to measurements
(``dataclasses.replace(DEFAULT_PARAMS, gemm_efficiency=0.71, ...)``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from planner.errors import SpecError

ALLREDUCE_ALGOS = ("ring", "tree", "best")


@dataclass(frozen=True)
class CostParams:
    # ------------------------------------------------------------------ compute (profile.py)
    # A GEMM with smallest dimension d reaches  gemm_efficiency * d / (d + gemm_half_dim)  of the
    # dtype's peak (tile/wave quantisation makes skinny GEMMs slow). Dimensionless / elements.
    gemm_efficiency: float = 0.80
    gemm_half_dim: float = 96.0
    # Fused (flash) attention reaches attention_efficiency * s / (s + attention_half_seq) of peak.
    attention_efficiency: float = 0.60
    attention_half_seq: float = 256.0
    # Flash-attention backward executes this many times the forward's FLOPs (it recomputes the
    # scores: 5 matmuls against 2 in the forward).
    attention_backward_flops_ratio: float = 2.5
    # attention_efficiency of a context-parallel rank's attention (0 = the same): flash pieces merged
    # by log-sum-exp, on cuDNN where it runs them (executor/parallel/cp_blockwise.py); measured by
    # `hexiscale calibrate` on CUDA (planner/calibration/cp_attention.py).
    cp_attention_efficiency: float = 0.0
    # Memory-bound kernels (norms, RoPE, SwiGLU, residual adds, optimizer) reach this fraction
    # of the catalog's memory bandwidth.
    memory_efficiency: float = 0.80
    # Fixed GPU-side cost of each kernel (launch latency + tail), seconds; every modelled op pays it.
    kernel_overhead_s: float = 4e-6
    # Host (CPU) time to issue one modelled kernel in eager PyTorch: from Python in the forward
    # (module calls, autocast dispatch), from the C++ autograd engine in the backward. A pass (one
    # layer's forward or backward, the embedding, the head) takes max(GPU time, kernels · host):
    # eager mode is either GPU- or CPU-bound. Defaults read off the committed H100 profile (torch
    # 2.11, planner/profiles/devices/h100-sxm-measured.json): a llama-1.3b layer takes >= ~1.7 ms forward
    # (50 modelled kernels) and >= ~1.7 ms backward (85 kernels) whatever the micro-batch.
    host_overhead_s: float = 3.5e-5
    host_overhead_backward_s: float = 2e-5
    # Host time torch.utils.checkpoint adds to one fully recomputed layer, per run of its forward
    # (the wrapper and its saved-tensor hooks: once in the forward, once more when the backward
    # re-runs it). On 4x H100 (torch 2.11, 2026-11-27) a llama-1.3b layer's forward took 0.7-0.85 ms
    # longer under full recompute than without it, at the same kernels (tests/data/calibration/h100x4-20261127).
    checkpoint_host_s: float = 0.0
    # A torch.compile'd transformer layer's time (forward + backward) over the eager one on this GPU
    # type: fewer kernels (fused elementwise ops) and no per-op Python launch cost. Measured by
    # ``hexiscale calibrate`` on CUDA (the same layer and point timed eager and compiled,
    # executor/profiler/calibrate.py); 0 = not measured: a plan with ``options.compile`` is then
    # priced as eager for time (its memory as compiled) and the estimate says so in its notes.
    compiled_layer_ratio: float = 0.0
    # The same ratio on the GPU's and the host's side apart, where calibrate timed both (host-free device
    # times, planner.cost.pass_times): compiling fuses kernels (GPU) and cuts most per-op launches (host)
    # by different factors, so a launch-bound eager layer speeds up more than a GPU-bound one. With both,
    # a compiled pass is max(GPU x device ratio, host x host ratio) of the eager pass's split; 0 = one ratio.
    compiled_device_ratio: float = 0.0
    compiled_host_ratio: float = 0.0
    # The plan's ``options.compile``: layer times are scaled by ``compiled_layer_ratio`` where it is
    # measured. A plan option, not a fitted term (set by ProfileSet.for_options, like the residual's).
    layers_compiled: bool = False

    # ------------------------------------------------------------------ communication (links.py)
    # Fraction of a link's nominal bandwidth a collective or p2p achieves (protocol overhead).
    link_efficiency: float = 0.85
    # All-reduce algorithm: ring, tree or the faster of the two per call (what NCCL tunes to).
    allreduce_algo: str = "best"
    # Host (CPU) time to issue one tensor-parallel collective as executor/parallel/tp_layers.py does it: the
    # autograd Function, c10d's all_reduce and ProcessGroupNCCL's enqueue (its stream waits and event
    # records), seconds per call; the local copy before it is one more kernel at host_overhead_s. It
    # loads the host, which a launch-bound pass already saturates (planner/cost/stage.py). Default:
    # the back-to-back small all-reduces of the committed H200 sweep (24-31 us per call, NCCL,
    # torch 2.11); ``hexiscale calibrate`` measures it on the host (executor/profiler/comm.py).
    collective_host_s: float = 2.5e-5
    # Use the hierarchical (intra-node reduce-scatter, inter-node all-reduce, intra-node
    # all-gather) all-reduce when a group spans several nodes with several devices each.
    hierarchical_allreduce: bool = True

    # ------------------------------------------------------------------ overlap (step.py)
    # Fraction of the cross-pipeline gradient sync that can run during the last micro-batch's
    # backward of the same stage (bucketed all-reduce started as buckets fill). 0..1. The
    # executor starts the buckets during the last backward, but on 4x H200 that backward slowed by
    # about what they take exposed (traced, planner/cost/step.py step 3), hence 0.
    dp_overlap: float = 0.0

    # ------------------------------------------------------------------ the executor's numerics
    # These are facts of the implementation being modelled (executor/model/llama.py, engine.py), not
    # fitted numbers: parameters are the fp32 master weights and the compute dtype comes from
    # torch.autocast. With fp32_residual the residual stream, RMSNorm, stage-boundary activations
    # and their gradients are fp32 (4 B) while matmul inputs/outputs are in the compute dtype.
    fp32_residual: bool = True
    # The plan's ``options.residual_dtype`` is the compute dtype: inside a stage the residual stream,
    # the RMSNorm inputs and the residual adds are ``e`` bytes; a stage's input and output stay as
    # ``fp32_residual`` says (executor/model/llama.py casts at the stage's ends). A plan option, not a
    # fitted term: :meth:`planner.cost.profile_set.ProfileSet.for_options` sets it from the plan.
    residual_in_compute_dtype: bool = False
    # Under autocast the stage keeps compute-dtype copies of its matmul weights: the engine's cast-once
    # copies, one per stage (planner.cost.memory.weight_copy_bytes), made once per step (cast_once).
    autocast_weight_copies: bool = True
    # The engine's cast-once weights (executor/model/cast_once.py, since 2026-11-27 01:25 UTC): the
    # copies are held once per stage and made once per step, in each stage's first forward
    # (planner.cost.ops.weight_copy_op, planner.cost.stage). False prices the autocast path that ran
    # before: every pass casts the weights (forward) and their gradients back (backward), each
    # micro-batch in flight saves its own casts, and a fully recomputed forward leaves autocast's
    # cast cache (what fidelity runs recorded before then measured; benchmarks/fidelity/repredict.py).
    cast_once: bool = True
    # Grouped-query attention expands K/V to the query heads before SDPA (no GQA kernel).
    expand_kv_heads: bool = True
    # F.rms_norm is one fused kernel on CUDA that saves its input and the per-token rstd; the CPU
    # composite also saves the fp32 normalised tensor (4 B an element). Measured on 1x H200, torch
    # 2.11 (benchmarks/executor/activation_memory.py, 2026-11-26): eager llama2-7b/llama3-8b layers
    # keep 8·h bytes a token less than the unfused count, the two norms' fp32 outputs. False
    # describes the CPU executor (the saved-tensor counts of the CPU tests).
    fused_rms_norm: bool = True

    # ------------------------------------------------------------------ memory (memory.py)
    # CUDA context, cuBLAS/cuDNN handles and kernels resident on every device, GiB.
    framework_gib: float = 0.9
    # Caching-allocator slack and workspaces (cuBLAS workspace, NCCL buffers), GiB per device.
    workspace_gib: float = 0.6
    # Device memory of one NCCL communicator a device belongs to (buffers outside PyTorch's allocator;
    # executor.parallel.groups creates and connects them all before the first step), GiB. Measured on 4 x H200
    # (NV18, torch 2.11, NCCL 2.28.9, 2026-11-26): 482-559 MiB per communicator over 6 ranks' sets
    # of 2-4 communicators (benchmarks/executor/hetero_e2e.py), mean 519 MiB.
    comm_gib: float = 0.52
    # Fraction of the tensors' bytes lost to allocator fragmentation (0 = none).
    fragmentation: float = 0.05

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "allreduce_algo":
                if value not in ALLREDUCE_ALGOS:
                    raise SpecError(f"cost.{f.name}", f"{value!r} is not one of {list(ALLREDUCE_ALGOS)}",
                                    "use ring, tree or best")
                continue
            if isinstance(f.default, bool):
                if not isinstance(value, bool):
                    raise SpecError(f"cost.{f.name}", f"expected true or false, got {value!r}", "write true or false")
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
                raise SpecError(f"cost.{f.name}", f"must be a finite non-negative number, got {value!r}",
                                "fix the value")
        for name in ("gemm_efficiency", "attention_efficiency", "memory_efficiency", "link_efficiency"):
            if not 0 < getattr(self, name) <= 1:
                raise SpecError(f"cost.{name}", f"must be in (0, 1], got {getattr(self, name)}",
                                "an efficiency is a fraction of the peak")
        for name in ("dp_overlap", "fragmentation"):
            if not 0 <= getattr(self, name) <= 1:
                raise SpecError(f"cost.{name}", f"must be in [0, 1], got {getattr(self, name)}", "use a fraction")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


DEFAULT_PARAMS = CostParams()
