"""The tests' handle on a real stack; it lives with the benchmarks, which start one too."""

from benchmarks.replay.stack import REPO, RunningStack, vllm_processes

__all__ = ["REPO", "RunningStack", "vllm_processes"]
