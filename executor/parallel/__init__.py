"""Parallelism of one plan: process groups, stage-boundary p2p, tensor-parallel layers, gradient sync,
ZeRO-1 and the pipeline schedules' interpreter.
"""
