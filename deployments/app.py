"""`serve run ray_config.yaml` enters here: config -> vLLM pools -> router ingress."""

from __future__ import annotations

from ray.serve import Application

from deployments.config import StackConfig
from deployments.engine_pool import build_pool
from router.ingress import Router


def build_app(args: dict) -> Application:
    config = StackConfig.model_validate(args or {})
    pools = {pool.name: build_pool(config.model, pool) for pool in config.pools}
    return Router.options(**config.router.deployment).bind(pools=pools, config=config.model_dump())
