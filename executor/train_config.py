"""What one ``hexiscale train`` rank is asked to do: a typed, frozen, validated config (no torch).

The CLI builds it from its flags (``hexiscale.cli.train_args``); tests and programs may build it
directly. The layout is a plan file (``plan``) or the seed systems' flags (``seed_layout``), resolved
on the rank itself so that a bad plan is reported like every other pre-flight error.

Every value is checked here, before any process group or step, and a bad one is a ``SpecError``
naming the flag: counts in range, numbers finite, seconds positive and consistent (a rank is
declared dead only after several missed heartbeats). What needs the file system or the
checkpoint (writable folders, ``--resume`` past ``--steps``) is checked in pre-flight.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from executor.nonfinite import POLICIES
from planner.errors import SpecError
from planner.model import RECOMPUTE_MODES
from planner.plan import DTYPES
from planner.ranges import check_int, check_number
from planner.seed_layout import SeedLayout

DEVICES = ("auto", "cpu", "cuda")
ASSIGN = ("cost", "threshold")
MAX_STEPS = 10**9
MAX_SEED = 2**63 - 1
MAX_SECONDS = 365 * 86400.0  # a year: anything longer is a typo (and overflows timedelta arithmetic)


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
    compile: bool = False  # torch.compile every block on CUDA (executor.fast_path.compile_blocks)
    # the plan's options, where given (None: the plan's own); a plan file's are rewritten (executor.flag_modes)
    recompute: str | None = None
    zero: int | None = None
    dtype: str | None = None
    resume: str | None = None  # a checkpoint, or a checkpoint_dir (its latest)
    log_jsonl: str | None = None
    log_every: int = 1
    tensorboard: str | None = None  # a folder: rank 0 writes TensorBoard scalars there too
    trace: str | None = None  # rank 0 writes measured per-micro-batch events here (executor.trace)
    trace_steps: int = 3  # how many steps --trace records (after the run's first)
    on_nonfinite: str = "stop"  # a NaN/Inf loss or gradient: stop the job, or skip the step
    heartbeat: float = 1.0  # seconds between heartbeats
    dead_after: float = 30.0  # a rank silent this long is dead
    hang_after: float = 1800.0  # no step finished this long: the job is hung
    startup_timeout: float = 600.0
    pg_timeout: float | None = None  # None: hang_after + 300 (executor.train_setup.pg_timeout)
    # mixed-length data (plan = a strategy pool; executor.pool_runner)
    step_tokens: int | None = None  # tokens of a step's global batch
    lengths: str | None = None  # synthetic sequence lengths (hexiscale.lengths/1 file or synthetic:NAME) without data
    assign: str = "cost"  # sequences to strategies: by estimated cost, or by the strategies' length buckets

    @property
    def end(self) -> int:
        """The last step this run trains."""
        return self.steps if self.stop_at is None else min(self.steps, self.stop_at)

    def __post_init__(self) -> None:
        choice_flags: tuple[tuple[str, object, tuple[object, ...]], ...] = (
            ("--device", self.device, DEVICES), ("--on-nonfinite", self.on_nonfinite, POLICIES),
            ("--assign", self.assign, ASSIGN), ("--recompute", self.recompute, (None, *RECOMPUTE_MODES)),
            ("--zero", self.zero, (None, 0, 1)), ("--dtype", self.dtype, (None, *DTYPES)))
        for flag, value, choices in choice_flags:
            if value not in choices:
                named = [str(c) for c in choices if c is not None]
                raise SpecError(flag, f"{value!r} is not one of {', '.join(named)}", f"pass {flag} {named[0]}")
        check_int("--steps", self.steps, 1, MAX_STEPS, "pass the number of optimizer steps to reach, e.g. --steps 100")
        if self.stop_at is not None:
            check_int("--stop-at", self.stop_at, 1, MAX_STEPS, "pass the step to stop after, e.g. --stop-at 50")
        check_int("--save-every", self.save_every, 0, MAX_STEPS, "pass a number of steps (0: save at the end)")
        check_int("--log-every", self.log_every, 1, MAX_STEPS, "pass e.g. --log-every 10")
        check_int("--trace-steps", self.trace_steps, 1, MAX_STEPS, "pass e.g. --trace-steps 3")
        if self.step_tokens is not None:
            check_int("--step-tokens", self.step_tokens, 1, MAX_STEPS * 1024, "give a step's tokens")
        check_int("--seed", self.seed, 0, MAX_SEED, "pass a non-negative seed")
        if self.warmup is not None:
            check_int("--warmup", self.warmup, 0, MAX_STEPS)
            if self.warmup > self.steps:  # the learning rate would never reach --lr (1e9: 3e-13 throughout)
                raise SpecError("--warmup", f"{self.warmup} warm-up steps, more than the run's --steps {self.steps}: "
                                "the learning rate would never reach --lr",
                                f"pass --warmup at most {self.steps} (default min(100, steps/10))")
        check_number("--lr", self.lr, 0.0, above=True)
        if self.min_lr is not None:
            check_number("--min-lr", self.min_lr, 0.0, self.lr, hint="pass a value from 0 to --lr")
        check_number("--weight-decay", self.weight_decay, 0.0)
        check_number("--clip", self.clip)
        for flag, secs in (("--heartbeat", self.heartbeat), ("--dead-after", self.dead_after),
                           ("--hang-after", self.hang_after), ("--startup-timeout", self.startup_timeout),
                           ("--pg-timeout", self.pg_timeout)):
            if secs is not None:
                check_number(flag, secs, 0.0, MAX_SECONDS, above=True, unit=" seconds")
        for flag, secs in (("--dead-after", self.dead_after), ("--hang-after", self.hang_after)):
            if secs < 2 * self.heartbeat:
                raise SpecError(flag, f"{secs:g} s is less than two heartbeats (--heartbeat {self.heartbeat:g} s)",
                                f"raise {flag} or lower --heartbeat")
        if self.pg_timeout is not None and self.pg_timeout <= self.hang_after:
            raise SpecError("--pg-timeout", f"{self.pg_timeout:g} s is not longer than --hang-after "
                            f"{self.hang_after:g} s: NCCL would abort a rank that waits for a stuck peer before the "
                            "watchdog names the stuck one", "raise --pg-timeout or lower --hang-after")
