"""Which ``hexiscale train`` flag each mode honours: the one table (no torch).

The modes are what the one training loop (:mod:`executor.train_loop`) runs: ``plan`` (a plan file,
or the seed-style flags that make one; :mod:`executor.plan_runner`), ``pool`` (a strategy pool as
``--plan``; :mod:`executor.pool_runner`), ``elastic`` (a plan under an elastic supervisor;
:mod:`executor.elastic_train`) and ``elastic_pool`` (a strategy pool under one: it refuses what a
pool refuses and what an elastic job refuses, but takes the mixed-length flags). A flag not in
a mode's ``refuse`` is honoured there; where a mode cannot honour a flag that was given, training
stops before its first step with one line naming the flag, the mode and what to do instead
(:func:`check_flags`). A flag counts as given when its value differs from the config's default (a
default is what every mode does anyway).

The plan-option flags (``--recompute``, ``--zero``, ``--dtype``, ``--compile``) are the plan's
``options``: with a plan file they rewrite them (:func:`apply_option_flags`, checked as the plan's
own options are), and rank 0 says which ones they replaced.

``tests/train/test_flag_modes.py`` walks every flag of the parser through every mode: a new flag
needs a row here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from planner.errors import SpecError
from planner.plan import Plan

MODES = ("plan", "pool", "elastic", "elastic_pool")
MODE_WORDS = {"plan": "a plan", "pool": "a strategy pool (--plan POOL.json, hot switching)",
              "elastic": "an elastic job", "elastic_pool": "an elastic job on a strategy pool"}
OPTION_FLAGS = {"recompute": "--recompute", "zero": "--zero", "dtype": "--dtype", "compile": "--compile"}

_POOL_OPTIONS = "the pool's strategies carry their own options: plan the pool with them ('hexiscale plan --lengths')"
_ELASTIC_OPTIONS = ("every epoch's plan takes its options from the launch plan: set them in PLAN.json's options "
                    "before 'hexiscale launch --elastic'")
_VARLEN = ("it is for mixed-length data, and --plan is not a strategy pool: pass the pool of 'hexiscale plan "
           "--lengths ... -o POOL.json' as --plan")
_SEED = "use either --plan or the seed-style flags"


@dataclass(frozen=True)
class Flag:
    """One flag: where its value lives and the modes that refuse it (mode -> what to do instead;
    ``elastic_pool`` follows from ``pool`` and ``elastic``, module docstring)."""

    flag: str
    attr: str | None  # the TrainConfig field (dotted into seed_layout); None: read by the CLI before the config
    refuse: dict[str, str] = field(default_factory=dict)
    seed: bool = False  # a seed-style layout flag: makes the plan without --plan, refused with it

    def __post_init__(self) -> None:
        why = self.refuse.get("pool") or (self.refuse.get("elastic") if self.refuse.get("elastic") != _VARLEN
                                          else None)
        if why is not None and "elastic_pool" not in self.refuse:
            self.refuse["elastic_pool"] = why


def _seed(dest: str, flag: str) -> Flag:
    return Flag(flag, f"seed_layout.{dest}", {m: _SEED for m in MODES}, seed=True)


# argparse dest -> its row
FLAGS: dict[str, Flag] = {
    "plan": Flag("--plan", "plan"),
    "cluster": Flag("--cluster", "cluster"),
    # seed-style layout (the layout itself without --plan; every mode has --plan)
    **{d: _seed(d, f) for d, f in (
        ("model", "--model"), ("seq_len", "--seq-len"), ("hetero_configs", "--hetero_configs"),
        ("layer_partitions", "--layer_partitions"), ("global_bsz_size", "--global_bsz_size"),
        ("chunks", "--chunks"), ("devices_id", "--devices_id"), ("model_size", "--model-size"),
        ("layer_num", "--layer-num"), ("accum_iter", "--accum-iter"))},
    "run_iter": Flag("--run-iter", "seed_layout.run_iter"),  # --run-iter // --accum-iter steps: every mode
    # rendezvous fallbacks, set in the environment by the CLI where the launcher set nothing
    "master_addr": Flag("--master_addr", None),
    "master_port": Flag("--master_port", None),
    "current_device": Flag("--current_device", None),
    # the plan's options
    "recompute": Flag("--recompute", "recompute", {"pool": _POOL_OPTIONS, "elastic": _ELASTIC_OPTIONS}),
    "zero": Flag("--zero", "zero", {"pool": _POOL_OPTIONS, "elastic": _ELASTIC_OPTIONS}),
    "dtype": Flag("--dtype", "dtype", {"pool": _POOL_OPTIONS, "elastic": _ELASTIC_OPTIONS}),
    "compile": Flag("--compile", "compile", {"pool": "drop --compile (hot switching builds its working layouts "
                                                     "per step), or train one plan of the pool"}),
    # training
    "steps": Flag("--steps", "steps"),
    "stop_at": Flag("--stop-at", "stop_at"),
    "data": Flag("--data", "data"),
    "synthetic": Flag("--synthetic", None),  # the default: no --data
    "seed": Flag("--seed", "seed"),
    "lr": Flag("--lr", "lr"),
    "min_lr": Flag("--min-lr", "min_lr"),
    "warmup": Flag("--warmup", "warmup"),
    "weight_decay": Flag("--weight-decay", "weight_decay"),
    "clip": Flag("--clip", "clip"),
    "device": Flag("--device", "device"),
    "on_nonfinite": Flag("--on-nonfinite", "on_nonfinite"),
    # mixed-length data
    "step_tokens": Flag("--step-tokens", "step_tokens", {"plan": _VARLEN, "elastic": _VARLEN}),
    "lengths": Flag("--lengths", "lengths", {"plan": _VARLEN, "elastic": _VARLEN}),
    "assign": Flag("--assign", "assign", {"plan": _VARLEN, "elastic": _VARLEN}),
    # checkpoints and logs
    "checkpoint_dir": Flag("--checkpoint-dir", "checkpoint_dir"),
    "save_every": Flag("--save-every", "save_every"),
    "async_save": Flag("--async-save", "async_save"),
    "resume": Flag("--resume", "resume"),
    "log_jsonl": Flag("--log-jsonl", "log_jsonl"),
    "log_every": Flag("--log-every", "log_every"),
    "tensorboard": Flag("--tensorboard", "tensorboard"),
    "trace": Flag("--trace", "trace", {"pool": "trace one plan of the pool",
                                       "elastic": "trace the plan without --elastic (an elastic job's layout "
                                                  "changes between steps)"}),
    "trace_steps": Flag("--trace-steps", "trace_steps", {"pool": "drop it with --trace",
                                                         "elastic": "drop it with --trace"}),
    # failure handling
    "heartbeat": Flag("--heartbeat", "heartbeat"),
    "dead_after": Flag("--dead-after", "dead_after"),
    "hang_after": Flag("--hang-after", "hang_after"),
    "startup_timeout": Flag("--startup-timeout", "startup_timeout"),
    "pg_timeout": Flag("--pg-timeout", "pg_timeout"),
}


def value_of(config: Any, dotted: str) -> Any:
    for name in dotted.split("."):
        config = getattr(config, name)
    return config


def _default_of(config: Any, dotted: str) -> Any:
    *head, last = dotted.split(".")
    owner = value_of(config, ".".join(head)) if head else config
    return next(f for f in fields(owner) if f.name == last).default


def given(config: Any, row: Flag) -> bool:
    """The flag was given (its value is not the config's default)."""
    return row.attr is not None and value_of(config, row.attr) != _default_of(config, row.attr)


def check_flags(config: Any, mode: str, *, seed_only: bool = False) -> None:
    """Refuse (``SpecError``, one line) the first given flag ``mode`` cannot honour (module
    docstring); ``seed_only``: the seed-style flags only (given with ``--plan``)."""
    for row in FLAGS.values():
        if row.seed and not config.plan or seed_only and not row.seed:
            continue  # the seed-style flags are the layout here
        if mode in row.refuse and given(config, row):
            what = "given together with --plan" if row.seed else f"not available with {MODE_WORDS[mode]}"
            raise SpecError(row.flag, what, row.refuse[mode])


def apply_option_flags(plan: Plan, config: Any) -> tuple[Plan, str | None]:
    """``plan`` with the given plan-option flags in its options, checked as a plan's options are,
    and a line saying which options they replaced (None: nothing changed)."""
    new = {name: value_of(config, name) for name in OPTION_FLAGS
           if given(config, FLAGS[name]) and value_of(config, name) != getattr(plan.options, name)}
    if not new:
        return plan, None
    named = ", ".join(OPTION_FLAGS[n] for n in new)
    try:
        out = replace(plan, options=replace(plan.options, **new))  # checked as a loaded plan is (Plan.__post_init__)
    except SpecError as exc:
        raise SpecError(named, f"the plan's options with {'this flag' if len(new) == 1 else 'these flags'} are not "
                        f"valid: {exc}", "change the flag or the plan") from None
    changed = [f"options.{n} {getattr(plan.options, n)} -> {v}" for n, v in new.items()]
    return out, f"{named} replaced the plan's {', '.join(changed)}"
