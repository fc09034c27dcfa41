"""What one ``hexiscale train`` rank is asked to do: a typed, frozen, validated config (no torch).

The CLI builds it from its flags (``hexiscale.cli.train_args``); tests and programs may build it
directly. The layout is a plan file (``plan``) or the seed systems' flags (``seed_layout``), resolved
on the rank itself so that a bad plan is reported like every other pre-flight error.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.errors import SpecError
from planner.seed_layout import SeedLayout

DEVICES = ("auto", "cpu", "cuda")
ASSIGN = ("cost", "threshold")


@dataclass(frozen=True)
class TrainConfig:
    plan: str | None = None  # plan file (JSON), or a strategy pool (mixed-length data, hot switching); else seed_layout
    cluster: str | None = None  # cluster file: checks the plan's devices, gives MFU peaks
    seed_layout: SeedLayout = field(default_factory=SeedLayout)
    steps: int = 10  # train until this many optimizer steps are done (counting those before a resume)
    stop_at: int | None = None  # stop (and save) after this step; the schedule still spans ``steps``
    data: str | None = None  # token file; None: synthetic tokens
    seed: int = 0  # model init and data order
    lr: float = 3e-4
    min_lr: float | None = None  # None: lr / 10
    warmup: int | None = None  # None: min(100, steps / 10)
    weight_decay: float = 0.1
    clip: float = 1.0  # max global gradient norm (<= 0: no clipping)
    device: str = "auto"  # auto: cuda:LOCAL_RANK when CUDA is available (NCCL), else CPU (gloo)
    checkpoint_dir: str | None = None
    save_every: int = 0  # 0: only at the end
    async_save: bool = False  # write checkpoints in the background (executor.saving)
    resume: str | None = None  # a checkpoint, or a checkpoint_dir (its latest)
    log_jsonl: str | None = None
    log_every: int = 1
    tensorboard: str | None = None  # a folder: rank 0 writes TensorBoard scalars there too
    trace: str | None = None  # rank 0 writes measured per-micro-batch events here (executor.trace)
    trace_steps: int = 3  # how many steps --trace records (after the run's first)
    heartbeat: float = 1.0  # seconds between heartbeats
    dead_after: float = 30.0  # a rank silent this long is dead
    hang_after: float = 1800.0  # no step finished this long: the job is hung
    startup_timeout: float = 600.0
    pg_timeout: float | None = None  # None: hang_after + 300 (executor.train_setup.pg_timeout)
    # mixed-length data (plan = a strategy pool; executor.train_varlen)
    step_tokens: int | None = None  # tokens of a step's global batch
    lengths: str | None = None  # synthetic sequence lengths (hexiscale.lengths/1 file or synthetic:NAME) without data
    assign: str = "cost"  # sequences to strategies: by estimated cost, or by the strategies' length buckets

    @property
    def end(self) -> int:
        """The last step this run trains."""
        return self.steps if self.stop_at is None else min(self.steps, self.stop_at)

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise SpecError("--device", f"{self.device!r} is not one of {', '.join(DEVICES)}", "pass --device cpu")
        for flag, value in (("--steps", self.steps), ("--save-every", self.save_every), ("--stop-at", self.stop_at)):
            if value is not None and value < 0:
                raise SpecError(flag, f"must be >= 0, got {value}", "pass a count of steps")
        if self.step_tokens is not None and self.step_tokens < 1:
            raise SpecError("--step-tokens", f"must be >= 1, got {self.step_tokens}", "give a step's tokens")
        if self.assign not in ASSIGN:
            raise SpecError("--assign", f"{self.assign!r} is not one of {', '.join(ASSIGN)}", "pass --assign cost")
        if self.log_every < 1:
            raise SpecError("--log-every", f"must be >= 1, got {self.log_every}", "pass e.g. --log-every 10")
        if self.trace_steps < 1:
            raise SpecError("--trace-steps", f"must be >= 1, got {self.trace_steps}", "pass e.g. --trace-steps 3")
        for flag, secs in (("--heartbeat", self.heartbeat), ("--dead-after", self.dead_after),
                           ("--hang-after", self.hang_after), ("--startup-timeout", self.startup_timeout),
                           ("--pg-timeout", self.pg_timeout)):
            if secs is not None and not secs > 0:
                raise SpecError(flag, f"must be > 0 seconds, got {secs}", "pass a positive number of seconds")
