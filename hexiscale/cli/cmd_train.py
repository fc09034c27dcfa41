"""``hexiscale train``: train a plan, one process per device (run it under torchrun or
``hexiscale launch``; a lone process is rank 0 of 1). torch is imported only when it runs."""

from __future__ import annotations

import argparse
import os

from hexiscale.cli.train_args import add_train_arguments, train_config


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("train", help="train a plan (one process per device; see 'hexiscale launch')",
                       description="Train a plan (or seed-style flags) under torchrun or 'hexiscale launch'. "
                       "Exit codes: 0 ok, 1 user error, 3 rank failure, 4 out of memory.")
    add_train_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = train_config(args)
    import torch

    from executor.train import run_training

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    return run_training(config)
