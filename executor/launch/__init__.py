"""Launching a plan: per-node command lines and scripts (pure), the local supervisor, rank
environment and failure handling (heartbeats, exit codes). See ``hexiscale launch --help``."""
