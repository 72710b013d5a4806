"""API keys: off unless keys are configured, and never configured in ray_config.yaml.

Keys come from the router process's environment, the way vLLM's `--api-key` reads
VLLM_API_KEY: `LENGTHSERVE_API_KEYS` (comma-separated) or `LENGTHSERVE_API_KEY_FILE` (one key a
line). A config file is committed and shared; a secret is not. Clients send
`Authorization: Bearer <key>` (what every OpenAI client does with `api_key`); a missing or wrong
key gets 401 in OpenAI's format, from a middleware that runs before the body is read: a caller
without a key learns nothing about what a valid body looks like. /health stays open unless
`router.auth.protect_health`, so load balancers and Kubernetes probes need no secret.

The benchmark headers (X-Routing-Policy, X-True-Output-Tokens, X-Target-Pool, X-Predict,
X-Fixed-Output-Tokens) steer routing: a client that may send them could claim its requests are
0 tokens long and jump every queue. So they need a key of their own, `X-Benchmark-Key`, from
`LENGTHSERVE_BENCHMARK_KEYS` or `LENGTHSERVE_BENCHMARK_KEY_FILE`; with
`router.benchmark_headers: true` and no such key the router refuses to start.
"""

from __future__ import annotations

import hmac
import os
from dataclasses import dataclass
from pathlib import Path

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from router.api.errors import error_response
from router.serving.errors import APIError

API_KEYS, API_KEY_FILE = "LENGTHSERVE_API_KEYS", "LENGTHSERVE_API_KEY_FILE"
BENCHMARK_KEYS, BENCHMARK_KEY_FILE = "LENGTHSERVE_BENCHMARK_KEYS", "LENGTHSERVE_BENCHMARK_KEY_FILE"
BENCHMARK_KEY_HEADER = "x-benchmark-key"


def _read(env, keys_var: str, file_var: str) -> frozenset[str]:
    keys = [k.strip() for k in env.get(keys_var, "").split(",")]
    if env.get(file_var):
        keys += [line.strip() for line in Path(env[file_var]).read_text().splitlines()]
    return frozenset(k for k in keys if k)


def _known(given: str | None, keys: frozenset[str]) -> bool:
    """Constant-time membership: a timing side channel must not reveal a key's prefix."""
    found = False
    for key in keys:
        found |= hmac.compare_digest((given or "").encode(), key.encode())
    return found


@dataclass(frozen=True)
class Keys:
    api: frozenset[str]
    benchmark: frozenset[str]

    @classmethod
    def from_env(cls, env=None) -> "Keys":
        env = os.environ if env is None else env
        return cls(_read(env, API_KEYS, API_KEY_FILE), _read(env, BENCHMARK_KEYS, BENCHMARK_KEY_FILE))

    def check(self, headers) -> None:
        """Raise 401 unless API keys are off or the request carries one of them."""
        if not self.api:
            return
        scheme, _, token = (headers.get("authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not _known(token.strip(), self.api):
            raise APIError(401, "Invalid or missing API key: send 'Authorization: Bearer <key>'.",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    def check_benchmark(self, headers) -> None:
        """Raise 401 unless the request carries a benchmark key (it sent benchmark headers)."""
        if not _known(headers.get(BENCHMARK_KEY_HEADER), self.benchmark):
            raise APIError(401, "Benchmark headers need a benchmark key (X-Benchmark-Key).",
                           code="invalid_benchmark_key")


class AuthMiddleware:
    """ASGI middleware: every path but the open ones needs an API key, checked before the body."""

    def __init__(self, app: ASGIApp, keys: Keys, open_paths: frozenset[str]):
        self.app, self.keys, self.open_paths = app, keys, open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "").removeprefix(scope.get("root_path", "")) or "/"
        if scope["type"] == "http" and path not in self.open_paths:
            try:
                self.keys.check(Headers(scope=scope))
            except APIError as e:
                return await error_response(e)(scope, receive, send)
        await self.app(scope, receive, send)
