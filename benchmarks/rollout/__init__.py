"""Rollout mode measured: makespan, padding, tail time, throughput and imbalance of a batch.

`python -m benchmarks.rollout sim|real|report` writes benchmarks/results/rollout.{json,md,png}.
"""
