"""Readiness: whether the stack can serve a request now, the way vLLM's /health and Kubernetes
readiness probes mean it.

The router comes up long before the engines (their start takes minutes on a CPU), and a load
balancer that routes to it then holds requests until an engine is up. So the router is ready
only while every pool has a running replica and the predictor (if any) has one too, as Ray
Serve's controller reports them (`serve.status()`). The answer is cached for a moment: probes
may poll often, and each check is a call to the controller.
"""

from __future__ import annotations

import asyncio
import time

from ray import serve
from ray.serve.handle import DeploymentHandle


class Readiness:
    def __init__(self, handles: list[DeploymentHandle], ttl_s: float = 2.0):
        self._targets = [(h.app_name, h.deployment_name) for h in handles]
        self._ttl_s = ttl_s
        self._checked_at = float("-inf")
        self._running: dict[str, int] = {}

    async def running(self) -> dict[str, int]:
        """Running replicas per deployment the router depends on."""
        if time.monotonic() - self._checked_at > self._ttl_s:
            status = await asyncio.to_thread(serve.status)
            running = {}
            for app, deployment in self._targets:
                overview = status.applications.get(app)
                states = overview.deployments[deployment].replica_states if overview and deployment in \
                    overview.deployments else {}
                running[deployment] = int(states.get("RUNNING", 0))
            self._running, self._checked_at = running, time.monotonic()
        return self._running

    async def ready(self) -> bool:
        return all(n > 0 for n in (await self.running()).values())
