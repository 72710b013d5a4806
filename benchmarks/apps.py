"""The application each side of a scenario runs on: this stack with the side's settings, or Ray
Serve LLM's stock app with the same engines.

All of a scenario's stack sides share one stack (the requests name their policy in the benchmark
headers), serving exactly the heads those policies read: a head served adds its features to every
prediction (ESTP's entropy and attention cost 1.55x the last token's prefill), so serving heads
nobody reads would tax the side under test.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from benchmarks.replay.stack import REPO
from benchmarks.scenarios import Rollout, Scenario, Side
from router.scheduling.policies import head_of
from router.serving.config import StackConfig

RUN_TIMEOUT_S = 3600  # the clients' timeout, and the run stacks' request bound (a slow machine's burst)


@dataclass(frozen=True)
class App:
    """What `RunningStack` starts: ray_config.yaml's args with `overrides`, or `application` instead."""

    name: str  # "stack" or "stock"
    overrides: dict | None = None
    application: dict | None = None


def _ray_config(path: str = "ray_config.yaml") -> dict:
    return yaml.safe_load((REPO / path).read_text())["applications"][0]


def default_policy(profile: str = "cpu") -> str:
    """What `serve run` serves by default: ray_config.yaml here, cluster/ray_config.gpu.yaml on GPU nodes."""
    path = {"cpu": "ray_config.yaml", "gpu": "cluster/ray_config.gpu.yaml"}[profile]
    return StackConfig.model_validate(_ray_config(path)["args"]).router.policy


def policy_of(side: Side) -> str:
    """The routing policy a stack side's requests are decided by."""
    return side.policy or default_policy()


def stack_app(scenario: Scenario, workdir: Path) -> App:
    """The one stack a scenario's stack sides share: benchmark headers, the request log, a request
    bound no run reaches, and the heads its sides read, no other. Its configured policy is
    ray_config's when a side sends none, else one that reads the first head (the others are named
    per request). A rollout batch with a history keeps each prompt's last n lengths in a file of
    the session's own."""
    sides = [s for s in scenario.sides if s.app == "stack"]
    heads = list(dict.fromkeys(h for s in sides for h in (s.heads or (head_of(policy_of(s)),)) if h))
    router = {"benchmark_headers": True, "request_log": str(request_log(workdir)), "request_timeout_s": RUN_TIMEOUT_S}
    if heads and all(s.policy is not None for s in sides):
        router["policy"] = next(policy_of(s) for s in sides if head_of(policy_of(s)) == heads[0])
    if isinstance(scenario.workload, Rollout) and scenario.workload.history:
        router["history"] = {"path": str(workdir / "length_history.json"), "lengths_per_prompt": scenario.workload.n}
    return App("stack", {"router": router, "predictor": {"extra_heads": heads[1:]}})


def request_log(workdir: Path) -> Path:
    return workdir / "requests.jsonl"


def stock_app() -> App:
    """Ray Serve LLM's own OpenAI app with the stack's engines (same model, engine settings, slots),
    its own ingress and Ray's default request router: no length prediction, no router queue."""
    from deployments.engine_pool import llm_config  # imports vLLM: only where an app is built

    app = _ray_config()
    config = StackConfig.model_validate(app["args"])
    pool = config.pools[0]
    fifo = config.router.model_copy(update={"shortest_first": False})  # the stock app sends no priority
    # Ours alone: the stock app has no engine-lifetime callback (deployments.engine_lifetime).
    llm = llm_config(config.model, pool, fifo).model_dump(mode="json", exclude_unset=True, exclude={"callback_config"})
    for ours in ("request_router_config", "max_queued_requests", "name"):  # Ray's own router, unbounded queue
        llm["deployment_config"].pop(ours, None)
    return App("stock", application={
        "name": "ray-serve-llm", "route_prefix": "/", "import_path": "ray.serve.llm:build_openai_app",
        "runtime_env": app.get("runtime_env", {}),
        # Ray counts logical CPUs: its ingress's default whole CPU would not fit beside the engines.
        "args": {"llm_configs": [llm], "ingress_deployment_config": {"ray_actor_options": {"num_cpus": 0.1}}}})

