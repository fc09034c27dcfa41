"""Benchmarks: programs that print tables and write JSON under ``benchmarks/results/`` (never tests).
Families: :mod:`benchmarks.planner`, :mod:`benchmarks.fidelity`, :mod:`benchmarks.executor`; run
each as ``python -m benchmarks.<family>.<program>`` from the repository root."""
