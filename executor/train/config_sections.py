"""The sections of a ``hexiscale train`` config, each field declared once with its flag (no torch).

Each section is a small frozen dataclass whose fields carry their flag, help, type, choices,
range and mode refusals (:mod:`executor.train.config_option`); ``__post_init__`` checks them, plus the
few rules that tie two fields of one section (``--min-lr`` at most ``--lr``; the watchdog's
seconds against ``--heartbeat``). Rules across sections are :class:`~executor.train.config.TrainConfig`'s.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import ClassVar

from executor.train.config_option import Opt, Section, internal, ints, numbers, opt
from executor.train.nonfinite import POLICIES
from planner.errors import SpecError
from planner.model import RECOMPUTE_MODES
from planner.plan import DTYPES
from planner.ranges import check_number
from planner.seed_layout import SeedLayout, add_seed_flag_arguments

MAX_STEPS = 10**9
MAX_SEED = 2**63 - 1
MAX_SECONDS = 365 * 86400.0  # a year: anything longer is a typo (and overflows timedelta arithmetic)
DEVICES = ("auto", "cpu", "cuda")
ASSIGN = ("cost", "threshold")

LAYOUT = "layout (a plan file, or the seed-style flags with --cluster and --model)"
TRAINING = "training"
MIXED = "mixed-length data (--plan is a strategy pool; --data: documents cut to the context)"
OUTPUTS = "checkpoints and logs"
FAILURES = "failure handling"

# why a mode refuses a flag: what to do instead
_POOL_OPTIONS = "the pool's strategies carry their own options: plan the pool with them ('hexiscale plan --lengths')"
_ELASTIC_OPTIONS = ("every epoch's plan takes its options from the launch plan: set them in PLAN.json's options "
                    "before 'hexiscale launch --elastic'")
_OPTIONS = {"pool": _POOL_OPTIONS, "elastic": _ELASTIC_OPTIONS}
VARLEN_ONLY = ("it is for mixed-length data, and --plan is not a strategy pool: pass the pool of 'hexiscale plan "
           "--lengths ... -o POOL.json' as --plan")
_NOT_VARLEN = {"plan": VARLEN_ONLY, "elastic": VARLEN_ONLY}


def _add_seed_arguments(group: argparse._ArgumentGroup) -> None:
    """The seed-style flags (planner.seed_layout) and the model they need."""
    group.add_argument("--model", help="model preset or config.json (seed-style flags)")
    group.add_argument("--seq-len", type=int, dest="seq_len", help="sequence length (seed-style flags)")
    add_seed_flag_arguments(group)


@dataclass(frozen=True)
class LayoutSection(Section):
    """What is trained: a plan file or strategy pool, or the seed-style flags; and the plan options
    the flags replace (``None``: the plan's own; a plan file's are rewritten, executor.train.flag_modes)."""

    GROUP: ClassVar[str] = LAYOUT
    PLAN_OPTIONS: ClassVar[tuple[str, ...]] = ("recompute", "zero", "dtype", "compile")  # = PlanOptions fields

    plan: str | None = field(default=None, metadata=opt(
        "--plan", relaunch=False, help="plan file (JSON), or a strategy pool ('hexiscale plan --lengths -o'): "
        "mixed-length data with hot switching"))
    cluster: str | None = field(default=None, metadata=opt(
        "--cluster", path=True,
        help="cluster file: checks the plan's devices, gives MFU peaks; needed with seed-style flags and with a "
        "strategy pool"))
    recompute: str | None = field(default=None, metadata=opt(
        "--recompute", choices=RECOMPUTE_MODES, refuse=_OPTIONS,
        help="activation recomputation (default none; with a plan file: replaces its options.recompute)"))
    zero: int | None = field(default=None, metadata=opt(
        "--zero", type=int, choices=(0, 1), refuse=_OPTIONS,
        help="ZeRO stage (default 0; with a plan file: replaces its options.zero)"))
    dtype: str | None = field(default=None, metadata=opt(
        "--dtype", choices=DTYPES, refuse=_OPTIONS,
        help="compute dtype (default bf16; with a plan file: replaces its options.dtype)"))
    seed_layout: SeedLayout = field(default_factory=SeedLayout, metadata=internal(
        "the seed-style flags, in both spellings (planner.seed_layout)", cli=_add_seed_arguments,
        build=SeedLayout.from_args, every_mode=("run_iter",)))  # --run-iter // --accum-iter steps
    compile: bool = field(default=False, metadata=opt(
        "--compile", switch=True, group=TRAINING,
        refuse={"pool": "drop --compile (hot switching builds its working layouts per step), or train one plan of "
                        "the pool"},
        help="compile every transformer block (and a TP-1 last stage's loss) with torch.compile: CUDA only "
        "(a CPU run stays eager and says so); the first step compiles"))


@dataclass(frozen=True)
class RunSection(Section):
    """How long, from which seed, on which device."""

    GROUP: ClassVar[str] = TRAINING

    steps: int = field(default=10, metadata=opt(
        "--steps", type=int, unset=True,
        check=ints(1, MAX_STEPS, "pass the number of optimizer steps to reach, e.g. --steps 100"),
        help="train until this many optimizer steps are done (counting steps before a resume; default 10, or the "
        "seed's --run-iter // --accum-iter)"))
    stop_at: int | None = field(default=None, metadata=opt(
        "--stop-at", type=int, check=ints(1, MAX_STEPS, "pass the step to stop after, e.g. --stop-at 50"),
        help="stop (and save) after this step; the learning-rate schedule still spans --steps (a job run in "
        "parts, e.g. a restart)"))
    seed: int = field(default=0, metadata=opt(
        "--seed", type=int, check=ints(0, MAX_SEED, "pass a non-negative seed"), help="model init and data order seed"))
    device: str = field(default="auto", metadata=opt(
        "--device", choices=DEVICES, relaunch=False,
        help="auto: cuda:LOCAL_RANK when CUDA is available (NCCL), else CPU (gloo)"))

    @property
    def end(self) -> int:
        """The last step this run trains."""
        return self.steps if self.stop_at is None else min(self.steps, self.stop_at)


@dataclass(frozen=True)
class DataSection(Section):
    """The tokens: a token file, else synthetic ones."""

    GROUP: ClassVar[str] = TRAINING

    path: str | None = field(default=None, metadata=opt(
        "--data", path=True, help="token file (PATH, PATH.bin or PATH.idx; see 'hexiscale data')",
        alternative=Opt("--synthetic", switch=True, help="synthetic tokens (the default)")))


@dataclass(frozen=True)
class OptimSection(Section):
    """AdamW and its cosine learning-rate schedule (executor.train.setup.optim_config)."""

    GROUP: ClassVar[str] = TRAINING

    lr: float = field(default=3e-4, metadata=opt("--lr", type=float, check=numbers(0.0, above=True)))
    min_lr: float | None = field(default=None, metadata=opt(
        "--min-lr", type=float, help="final LR of the cosine (default lr/10)"))  # checked against lr below
    warmup: int | None = field(default=None, metadata=opt(
        "--warmup", type=int, check=ints(0, MAX_STEPS), help="warm-up steps (default min(100, steps/10))"))
    weight_decay: float = field(default=0.1, metadata=opt("--weight-decay", type=float, check=numbers(0.0)))
    clip: float = field(default=1.0, metadata=opt(
        "--clip", type=float, check=numbers(), help="max global gradient norm (<= 0: no clipping)"))

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.min_lr is not None:
            check_number("--min-lr", self.min_lr, 0.0, self.lr, hint="pass a value from 0 to --lr")


@dataclass(frozen=True)
class VarlenSection(Section):
    """Mixed-length data: ``--plan`` is a strategy pool (executor.train.pool_runner)."""

    GROUP: ClassVar[str] = MIXED

    step_tokens: int | None = field(default=None, metadata=opt(
        "--step-tokens", type=int, refuse=_NOT_VARLEN, check=ints(1, MAX_STEPS * 1024, "give a step's tokens"),
        help="tokens of a step's global batch"))
    lengths: str | None = field(default=None, metadata=opt(
        "--lengths", path=True, metavar="HISTOGRAM", refuse=_NOT_VARLEN,
        help="without --data: synthetic sequences with these lengths (hexiscale.lengths/1 file, or "
        "synthetic:commoncrawl|github)"))
    assign: str = field(default="cost", metadata=opt(
        "--assign", choices=ASSIGN, refuse=_NOT_VARLEN,
        help="sequences to strategies: by estimated cost, or by the strategies' length buckets"))


@dataclass(frozen=True)
class CheckpointSection(Section):
    """Where checkpoints go, how often, and which one to resume from."""

    GROUP: ClassVar[str] = OUTPUTS

    dir: str | None = field(default=None, metadata=opt(
        "--checkpoint-dir", path=True, help="write checkpoints here (DIR/step-NNNNNN, DIR/latest)"))
    save_every: int = field(default=0, metadata=opt(
        "--save-every", type=int, check=ints(0, MAX_STEPS, "pass a number of steps (0: save at the end)"),
        help="save every N steps (and at the end); 0: at the end"))
    async_save: bool = field(default=False, metadata=opt(
        "--async-save", switch=True, help="write checkpoints in the background while training goes on (completed "
        "at the next save or the end)"))
    resume: str | None = field(default=None, metadata=opt(
        "--resume", path=True,
        help="checkpoint directory, or a --checkpoint-dir (its latest checkpoint); any plan of the same model"))


_TRACE_REFUSE = {"pool": "trace one plan of the pool",
                 "elastic": "trace the plan without --elastic (an elastic job's layout changes between steps)"}


@dataclass(frozen=True)
class MetricsSection(Section):
    """What rank 0 logs and records: console, JSONL, TensorBoard, a timing trace."""

    GROUP: ClassVar[str] = OUTPUTS

    log_jsonl: str | None = field(default=None, metadata=opt(
        "--log-jsonl", path=True, help="rank 0 appends one JSON record per step here"))
    log_every: int = field(default=1, metadata=opt(
        "--log-every", type=int, check=ints(1, MAX_STEPS, "pass e.g. --log-every 10"), help="print every N steps"))
    tensorboard: str | None = field(default=None, metadata=opt(
        "--tensorboard", path=True, metavar="DIR",
        help="rank 0 also writes the per-step metrics as TensorBoard scalars to DIR (needs the tensorboard package)"))
    trace: str | None = field(default=None, metadata=opt(
        "--trace", path=True, metavar="FILE", refuse=_TRACE_REFUSE,
        help="record per-micro-batch events of a few steps on every rank; rank 0 writes them to FILE "
        "('hexiscale show FILE --plot DIR' draws them)"))
    trace_steps: int = field(default=3, metadata=opt(
        "--trace-steps", type=int, check=ints(1, MAX_STEPS, "pass e.g. --trace-steps 3"),
        refuse={"pool": "drop it with --trace", "elastic": "drop it with --trace"},
        help="steps --trace records, after the run's first"))


_SECONDS = numbers(0.0, MAX_SECONDS, above=True, unit=" seconds")


@dataclass(frozen=True)
class FaultsSection(Section):
    """Failure handling: the non-finite guard and the watchdog's clocks (a rank is declared dead
    only after several missed heartbeats; NCCL must not abort before the watchdog names a rank)."""

    GROUP: ClassVar[str] = FAILURES

    on_nonfinite: str = field(default="stop", metadata=opt(
        "--on-nonfinite", choices=POLICIES, group=TRAINING,
        help="a NaN/Inf loss or gradient norm: stop the job before the update (default), or skip the step "
        "(weights unchanged; 10 in a row stop the job)"))
    heartbeat: float = field(default=1.0, metadata=opt(
        "--heartbeat", type=float, check=_SECONDS, help="heartbeat interval, seconds"))
    dead_after: float = field(default=30.0, metadata=opt(
        "--dead-after", type=float, check=_SECONDS, help="a rank silent this long is dead; the job stops (seconds)"))
    hang_after: float = field(default=1800.0, metadata=opt(
        "--hang-after", type=float, check=_SECONDS,
        help="no step finished this long: the job is hung and stops (seconds)"))
    startup_timeout: float = field(default=600.0, metadata=opt(
        "--startup-timeout", type=float, check=_SECONDS,
        help="how long ranks wait for each other at start-up and pre-flight (seconds)"))
    pg_timeout: float | None = field(default=None, metadata=opt(
        "--pg-timeout", type=float, check=_SECONDS,
        help="process-group collective timeout, seconds (default: --hang-after + 300, so the watchdog names a "
        "stuck rank before NCCL aborts a waiting one)"))

    def __post_init__(self) -> None:
        super().__post_init__()
        for flag, secs in (("--dead-after", self.dead_after), ("--hang-after", self.hang_after)):
            if secs < 2 * self.heartbeat:
                raise SpecError(flag, f"{secs:g} s is less than two heartbeats (--heartbeat {self.heartbeat:g} s)",
                                f"raise {flag} or lower --heartbeat")
        if self.pg_timeout is not None and self.pg_timeout <= self.hang_after:
            raise SpecError("--pg-timeout", f"{self.pg_timeout:g} s is not longer than --hang-after "
                            f"{self.hang_after:g} s: NCCL would abort a rank that waits for a stuck peer before the "
                            "watchdog names the stuck one", "raise --pg-timeout or lower --hang-after")
