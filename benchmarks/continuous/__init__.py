"""Length predictions under continuous batching: where a shortest-first queue pays, and where it must do no harm.

`python -m benchmarks.continuous` (see __main__) writes benchmarks/results/continuous.{json,md,png}:
the simulator at 10-1,000 replicas (simulated.py) and the real stack on this machine (real.py),
side by side with Ray's default, the paper's length pools, the true-length oracle and the
prompt-only ceiling.
"""
