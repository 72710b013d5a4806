"""The stack's config (ray_config's `args`): defaults, derived capacities, the typed plan, rejected combinations."""

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from router.api.app import Router
from deployments.app import router_options
from deployments.engine_pool import engine_env, llm_config
from predictor.head import LengthBins
from router.scheduling.pools import Pools
from router.serving.config import DEFAULT_CHECKPOINTS, PoolSpec, RoutingPlan, StackConfig, build_scheduler
from tests import MODEL_DIR

REPO = Path(__file__).resolve().parent.parent
THREE = [{"name": "short"}, {"name": "medium"}, {"name": "long"}]


def _default_args() -> dict:
    return yaml.safe_load((REPO / "ray_config.yaml").read_text())["applications"][0]["args"]


def test_default_config_is_one_pool_behind_the_shortest_first_queue():
    config = StackConfig.model_validate(_default_args())
    assert [p.name for p in config.pools] == ["default"] and config.pools[0].saturation() == 32
    assert config.router.policy == "early_work" and config.router.fallback_policy == "ray_default"
    assert config.router.queue.max_overtake_s == 300 and config.predictor.predict == "waiting"
    assert config.predictor.checkpoint_path("last_work") == DEFAULT_CHECKPOINTS / "last_ens5" / "head"
    assert config.predictor.checkpoint_path("estp_work") == DEFAULT_CHECKPOINTS / "estp" / "head"
    assert config.predictor.checkpoint_path("egtp_work") == DEFAULT_CHECKPOINTS / "egtp" / "head"
    assert config.predictor.checkpoint_path("estp") == DEFAULT_CHECKPOINTS / "estp" / "head"
    assert config.predictor.checkpoint_path("egtp") == DEFAULT_CHECKPOINTS / "egtp" / "head"
    assert config.predictor.checkpoint_path("round_robin") == DEFAULT_CHECKPOINTS / "last_ens5" / "head"
    assert not config.router.benchmark_headers
    assert config.predictor.heads("estp_work", False) == {"estp": DEFAULT_CHECKPOINTS / "estp" / "head"}
    # Benchmark headers: every head one prefill can serve (the early exit reads another layer).
    assert list(config.predictor.heads("round_robin", True)) == ["last", "egtp", "estp"]
    assert list(config.predictor.heads("egtp", True)) == ["egtp", "estp", "last"]
    assert list(config.predictor.heads("early_work", True)) == ["early"]
    # A run names the heads its policies read: only their features are computed.
    narrowed = config.predictor.model_copy(update={"extra_heads": ["estp"]})
    assert list(narrowed.heads("egtp", True)) == ["egtp", "estp"]
    assert list(narrowed.heads("estp", True)) == ["estp"]


def test_ray_serves_own_queue_in_front_of_the_router_is_bounded_and_says_when_to_retry():
    config = StackConfig.model_validate(_default_args())
    deployment = Router.options(**router_options(config))._deployment_config
    assert deployment.max_ongoing_requests > config.router.max_pending_requests  # the router answers first
    assert 0 < deployment.max_queued_requests <= 256
    assert deployment.backpressure_config.status_code == 503 and deployment.backpressure_config.retry_after_s > 0


def test_default_checkpoints_exist_for_both_predicted_policies():
    for method in ("estp", "egtp", "last_ens5"):
        assert (DEFAULT_CHECKPOINTS / method / "head.safetensors").exists()
        assert (DEFAULT_CHECKPOINTS / method / "head.json").exists()


def test_capacity_from_ongoing_requests_and_replicas():
    assert PoolSpec(name="a", deployment={"max_ongoing_requests": 8, "num_replicas": 2}).saturation() == 16
    scaled = {"max_ongoing_requests": 4, "autoscaling_config": {"min_replicas": 1, "max_replicas": 3}}
    assert PoolSpec(name="a", deployment=scaled).saturation() == 12
    assert PoolSpec(name="a", deployment={"max_ongoing_requests": 4}, capacity=2).saturation() == 2
    assert PoolSpec(name="a").saturation() is None


@pytest.mark.parametrize(
    "router,predictor,fragment",
    [
        ({"policy": "oracle", "input_edges": [1, 2]}, {}, "benchmark_headers"),
        ({"policy": "estp", "input_edges": [1, 2]}, None, "needs the predictor"),
        ({"input_edges": [1]}, {}, "needs 2 edges"),
        ({"output_edges": [1, 2, 3], "input_edges": [1, 2]}, {}, "needs 2 edges"),
        ({"policy": "round_robin", "fallback_policy": "input_length"}, {}, "needs router.input_edges"),
        ({"policy": "round_robin", "fallback_policy": "round_robin"}, None, "output_edges must be set"),
        ({"fallback_policy": "estp", "input_edges": [1, 2]}, {}, "fallback_policy"),
    ],
)
def test_inconsistent_routing_configs_fail_fast(router, predictor, fragment):
    with pytest.raises(ValidationError, match=fragment):
        StackConfig.model_validate({"pools": THREE, "router": router, "predictor": predictor})


def test_cpu_engines_share_the_cores_and_priority_scheduling_is_switchable(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    config = StackConfig.model_validate({"model": {"engine_env": {"VLLM_CPU_KVCACHE_SPACE": "3"}}})
    env = engine_env(config.model)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind" and env["OMP_NUM_THREADS"] == "1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "3"
    gpu = StackConfig.model_validate({"model": {"accelerator": "gpu"}})
    assert "VLLM_CPU_OMP_THREADS_BIND" not in engine_env(gpu.model)

    pool = config.pools[0]
    with_priority = llm_config(config.model, pool, config.router)
    assert with_priority.engine_kwargs["scheduling_policy"] == "priority"
    fifo = config.router.model_copy(update={"shortest_first": False})
    assert "scheduling_policy" not in llm_config(config.model, pool, fifo).engine_kwargs
    router = with_priority.deployment_config["request_router_config"]
    assert router["request_router_class"] == "router.serving.replica_router:LedgerRequestRouter"
    assert router["request_router_kwargs"] == {"pool": "default", "choice": "least_inflight"}


@pytest.mark.parametrize("policy", ["estp", "egtp", "last"])
def test_checkpoints_load_for_the_serving_model_and_give_three_pools(policy):
    from deployments.app import _checkpoint_meta

    config = StackConfig.model_validate(_default_args())
    meta = _checkpoint_meta(config.predictor.checkpoint_path(policy), str(MODEL_DIR))
    assert meta.pooling.method == policy and meta.training_data_version.startswith("smollm2-135m-instruct@")
    edges = Pools.from_quantiles(["short", "medium", "long"], meta.bins).edges
    assert 0 < edges[0] < edges[1] < meta.bins.max_tokens


def test_the_plan_and_the_scheduler_come_from_the_config():
    """The router and the simulator build their scheduling core through this one builder."""
    bins = LengthBins(edges=[0, 50, 100, 200, 400, 1024], centres=[25, 75, 150, 300, 700], max_tokens=1024)
    config = StackConfig.model_validate({**_default_args(), "pools": THREE, "router": {
        **_default_args()["router"], "input_edges": [50, 100]}})
    plan = RoutingPlan.of(config, str(MODEL_DIR), {"last": bins}, "last")
    assert plan.pools.names == ("short", "medium", "long") and plan.pools.edges == pytest.approx((83.0, 267.0), abs=1)
    assert plan.prior_tokens == pytest.approx(bins.training_quantile(0.5))
    scheduler = build_scheduler(config, plan, [config.router.policy])
    assert scheduler.ranking.prior_tokens == plan.prior_tokens
    assert {name: q.slots for name, q in scheduler.queues.items()} == dict.fromkeys(("short", "medium", "long"), None)
    assert scheduler.queues["short"].order.max_overtake_s == 300


def test_an_early_exit_head_cannot_learn_online():
    """The learner fits final-layer heads; serving its head to a layer-4 estimator would fail at
    every swap, so the combination is refused when the config loads."""
    args = _default_args()
    args["router"] = {**args.get("router", {}), "policy": "early_work"}
    assert StackConfig.model_validate(args).predictor.heads("early_work", False) == {
        "early": DEFAULT_CHECKPOINTS / "early4_ens5" / "head"}
    args["predictor"] = {**args["predictor"], "online": {}}
    with pytest.raises(ValueError, match="final-layer"):
        StackConfig.model_validate(args)
