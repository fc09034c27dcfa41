"""Importing the rank side (the CLI, the training entry, the engine, CP attention) does not import the
compiler stack: ``torch._dynamo`` is ~1.3 s of import, and only a process that compiles should pay it
there. (A training rank still imports it when it builds its optimizer: ``torch.optim.Optimizer``'s
``add_param_group`` is wrapped by torch's own ``_disable_dynamo``, which imports it on first call.)"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.imports import ROOT

RANK_MODULES = ("hexiscale.cli.main", "executor.train.entry", "executor.switch.elastic", "executor.train.engine",
                "executor.parallel.context_parallel", "executor.model.llama")


def test_importing_the_rank_modules_imports_no_compiler() -> None:
    code = (f"import sys\nfor m in {RANK_MODULES!r}:\n    __import__(m)\n"
            "print(sorted(k for k in sys.modules if k == 'torch._dynamo' or k.startswith('torch._inductor')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_compiling_blocks_makes_cp_attention_a_graph_break() -> None:
    code = ("import torch\nfrom executor.parallel import context_parallel as cp\n"
            "from executor.model.fast_path import compile_blocks\n"
            "class S(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        self.layers = torch.nn.ModuleDict({'0': torch.nn.Linear(2, 2)})\n"
            "before = cp._attention is cp._cp_attention\n"
            "compile_blocks(S(), force=True, backend='aot_eager')\n"
            "print(before, cp._attention is not cp._cp_attention, cp._packed_attention is not cp._cp_packed_attention)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["True", "True", "True"], out


def test_a_module_imported_after_the_first_compile_is_kept_eager_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from executor.model import fast_path

    monkeypatch.setattr(fast_path, "_KEEP_EAGER", [])
    monkeypatch.setattr(fast_path, "_compiling", [])
    calls: list[str] = []
    fast_path.keep_eager_when_compiling(lambda: calls.append("before"))
    assert calls == []  # nothing compiled yet: registered for later
    monkeypatch.setattr(fast_path, "_compiling", [True])
    fast_path.keep_eager_when_compiling(lambda: calls.append("after"))
    assert calls == ["after"]
