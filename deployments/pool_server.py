"""A pool replica: Ray Serve LLM's `LLMServer`, which can also say what its vLLM engine holds.

The router cancels the streams it no longer wants (a first-k rollout's cut samples, a client that
left) and must be able to show that the engine really let them go, not only that its own ledger
forgot them. Ray Serve's metrics count the replica's ongoing calls, and vLLM's
`vllm:num_requests_running` reaches Prometheus only at Ray's metrics interval (seconds) and is not
refreshed once the engine goes idle. The engine's front end knows at once: `AsyncLLM` keeps a
state for every request it accepted until it finishes or is aborted (an abort removes it and
tells the engine core, which frees its slot and KV blocks before its next step).
"""

from __future__ import annotations

from ray import serve
from ray.serve.llm import LLMServer


class PoolServer(LLMServer):
    async def engine_requests(self, probe) -> dict:
        """The requests this replica's vLLM engine holds now, and which replica answers
        (router.serving.pool_client.PoolClient.engine_requests; `probe` carries the router's id
        for its replica router). None while the engine is not up."""
        # Ray's VLLMEngine keeps vLLM's AsyncLLM as `_engine_client`; no public accessor exists.
        client = getattr(self.engine, "_engine_client", None) if self.engine is not None else None
        return {"replica": serve.get_replica_context().replica_id.unique_id,
                "requests": None if client is None else client.get_num_unfinished_requests()}
