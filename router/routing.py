"""One routing decision and how it shows in the response (headers and the JSON extension).

Clients and benchmarks see what the router did with each request (pool, deciding policy,
prediction, spillover, fallback) without access to the server's logs or metrics.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Route:
    pool: str
    policy: str  # the policy that decided: the configured one, or the fallback
    prompt_tokens: int | None
    prediction: dict | None
    priority: int  # what vLLM schedules on inside the pool (lower first)
    spilled_from: str | None = None  # the saturated pool the policy chose
    fallback: str | None = None  # why the configured policy could not decide
    routing_ms: float = 0.0  # tokenizing, predicting and choosing: what routing adds to the latency

    def headers(self) -> dict[str, str]:
        headers = {"X-Pool": self.pool, "X-Routing-Policy": self.policy, "X-Routing-Ms": f"{self.routing_ms:.1f}"}
        if self.prediction is not None:
            headers["X-Predicted-Tokens"] = str(round(self.prediction["expected_tokens"]))
            headers["X-Length-Bin"] = self.prediction["bin"]
        if self.spilled_from is not None:
            headers["X-Spilled-From"] = self.spilled_from
        if self.fallback is not None:
            headers["X-Routing-Fallback"] = self.fallback
        return headers

    def extension(self) -> dict:
        """Extra top-level fields of a JSON response; OpenAI clients expose them as extras."""
        prediction = None if self.prediction is None else {**self.prediction, "prompt_tokens": self.prompt_tokens}
        routing = {"pool": self.pool, "policy": self.policy, "spilled_from": self.spilled_from,
                   "fallback": self.fallback, "priority": self.priority, "routing_ms": round(self.routing_ms, 1)}
        return {"length_prediction": prediction, "routing": routing}
