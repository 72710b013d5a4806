"""One pool = one Ray Serve LLM deployment of vLLM (`LLMServer`), scaled on its own.

Every pool serves the same weights; pools differ only in which requests the router sends them,
which is what makes them length-homogeneous.
"""

from __future__ import annotations

import os

from ray.serve.llm import LLMConfig, build_llm_deployment

from deployments.config import ModelSpec, PoolSpec
from deployments.model_files import resolve_model_source

# vLLM's engine process inherits these from the replica; they bound CPU memory and keep the
# engine off any model hub.
_ENGINE_ENV_DEFAULTS = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "2"}


def llm_config(model: ModelSpec, pool: PoolSpec) -> LLMConfig:
    engine_kwargs = {"max_model_len": model.max_model_len, **model.engine_kwargs}
    worker = {"CPU": model.engine_cpus}
    if model.engine_gpus:
        worker["GPU"] = model.engine_gpus
    env = {k: os.environ.get(k, v) for k, v in _ENGINE_ENV_DEFAULTS.items()}
    deployment = {"name": pool.name, **pool.deployment}
    # The replica actor itself only relays requests to its engine process: a sliver of a CPU.
    deployment.setdefault("ray_actor_options", {}).setdefault("num_cpus", 0.05)
    return LLMConfig(
        model_loading_config={
            "model_id": model.id,
            "model_source": resolve_model_source(model.source),
        },
        accelerator_config={"kind": model.accelerator},
        engine_kwargs=engine_kwargs,
        placement_group_config={"bundles": [worker]},
        deployment_config=deployment,
        runtime_env={"env_vars": env},
    )


def build_pool(model: ModelSpec, pool: PoolSpec):
    return build_llm_deployment(llm_config(model, pool), name_prefix="pool-")
