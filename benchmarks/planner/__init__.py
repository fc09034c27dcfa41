"""Planner speed and plan quality (no torch): solve time vs cluster size, optimality, baselines."""
