"""Discrete-event simulator of length-binned pools of continuous-batching replicas.

It routes with the router's own policy classes and spillover rule, on real predictions of the
committed predictor checkpoints, and times engine steps with a model calibrated on measured vLLM
runs, so a 1,000-replica cluster can be studied on a laptop: `python -m benchmarks.simulator`.
"""
