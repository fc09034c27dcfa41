"""Test helpers that are not part of the runtime: the rank pool and the single-process reference."""
