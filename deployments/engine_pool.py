"""One pool = one Ray Serve LLM deployment of vLLM (`LLMServer`), scaled on its own.

Every pool serves the same weights; pools differ only in which requests the router sends them,
which is what makes them length-homogeneous.
"""

from __future__ import annotations

import os

from ray.serve.llm import LLMConfig, build_llm_deployment

from deployments.engine_lifetime import EngineLifetime
from deployments.pool_server import PoolServer
from predictor.model_files import resolve_model_source
from router.serving.config import ModelSpec, PoolSpec, RouterSpec

# vLLM's engine process inherits these from the replica; they keep the engine off any model hub.
_ENGINE_ENV_DEFAULTS = {"HF_HUB_OFFLINE": "1"}
# On CPU, vLLM binds its OpenMP threads itself: the default ("auto") reserves a core and pins
# every engine to the same remaining one, so several pools on one machine would all compute on
# core 0. Unbound, one thread each, the OS spreads the engines over all cores. 1 GiB of KV cache
# per engine (~23k tokens of SmolLM2) keeps several pools within memory.
_CPU_ENGINE_ENV_DEFAULTS = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
}
# How long a stopped replica may finish its requests. Ray Serve stops the router first and the
# pools after it, and `serve run` gives up on the whole shutdown after 30 s and kills the cluster
# (ray/serve/_private/client.py, `shutdown`): router + pool drains must fit in it, so that Ctrl-C
# ends the stack through Serve's own shutdown (deployments.app.ROUTER_DRAIN_S).
POOL_DRAIN_S = 10
# A node group's resource is a label, not a capacity: each replica asks for a sliver of it, so a
# node of the group takes as many replicas as its CPUs/GPUs allow.
NODE_GROUP_SHARE = 0.001


def engine_env(model: ModelSpec) -> dict[str, str]:
    """Defaults, then the application's environment (ray_config's runtime_env), then `engine_env`."""
    defaults = {**_ENGINE_ENV_DEFAULTS, **(_CPU_ENGINE_ENV_DEFAULTS if model.accelerator == "cpu" else {})}
    return {**{k: os.environ.get(k, v) for k, v in defaults.items()}, **model.engine_env}


def engine_bundle(model: ModelSpec, pool: PoolSpec) -> dict[str, float]:
    """The engine's placement-group bundle; Serve adds the replica actor's own resources to it.

    The replica actor is scheduled into this first bundle and the engine runs in the replica's
    placement group, so pinning the bundle to the pool's node group puts both on that node.
    """
    bundle = {"CPU": model.engine_cpus}
    if model.engine_gpus:
        bundle["GPU"] = model.engine_gpus
    if pool.node_group:
        bundle[pool.node_group] = NODE_GROUP_SHARE
    return bundle


def llm_config(model: ModelSpec, pool: PoolSpec, router: RouterSpec) -> LLMConfig:
    engine_kwargs = {"max_model_len": model.max_model_len, **model.engine_kwargs}
    if router.shortest_first:  # requests carry `priority` = predicted tokens: shortest first
        engine_kwargs["scheduling_policy"] = "priority"
    env = engine_env(model)
    deployment = {"name": pool.name, **pool.deployment}
    # The replica actor itself only relays requests to its engine process: a sliver of a CPU.
    deployment.setdefault("ray_actor_options", {}).setdefault("num_cpus", 0.05)
    # The router holds waiting requests itself (at most the pool's slots in flight); Ray's own
    # queue in front of the replicas only absorbs what several router replicas over-admit.
    deployment.setdefault("max_queued_requests", 2 * deployment.get("max_ongoing_requests", 16))
    deployment.setdefault("graceful_shutdown_timeout_s", POOL_DRAIN_S)
    # The scheduling core's replica choice, reporting where each request went (router.serving.replica_router).
    deployment["request_router_config"] = {
        "request_router_class": "router.serving.replica_router:LedgerRequestRouter",
        "request_router_kwargs": {"pool": pool.name, "choice": router.replica_choice},
    }
    return LLMConfig(
        model_loading_config={
            "model_id": model.id,
            "model_source": resolve_model_source(model.source),
        },
        accelerator_config={"kind": model.accelerator},
        engine_kwargs=engine_kwargs,
        placement_group_config={"bundles": [engine_bundle(model, pool)]},
        deployment_config=deployment,
        runtime_env={"env_vars": env},
        # The engine processes end with their replica, however it ends (deployments.engine_lifetime).
        callback_config={"callback_class": EngineLifetime},
    )


def build_pool(model: ModelSpec, pool: PoolSpec, router: RouterSpec):
    return build_llm_deployment(llm_config(model, pool, router), name_prefix="pool-", deployment_cls=PoolServer)
