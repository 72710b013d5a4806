"""`serve run ray_config.yaml` enters here: config -> predictor + vLLM pools -> router ingress.

The edge where the YAML's `args` become typed objects (router.serving.config.StackConfig) and the
predictor's checkpoints become a typed routing plan (router.serving.config.RoutingPlan); everything the
deployments receive past this point is one of them.
"""

from __future__ import annotations

from pathlib import Path

from ray.serve import Application
from ray.serve.config import BackpressureConfig

from router.api.app import Router
from deployments.engine_pool import build_pool
from deployments.learner_deployment import LengthLearner
from deployments.predictor_deployment import LengthPredictor
from predictor.checkpoint import CheckpointMeta, load_checkpoint
from predictor.model_files import model_weights_hash, resolve_model_source
from predictor.online import online_bins
from predictor.online.learner import RECIPE
from predictor.pooling import PoolingConfig
from router.scheduling.policies import DEFAULT_HEAD, head_of
from router.serving.config import REPO_ROOT, PredictorSpec, RoutingPlan, StackConfig


def _checkpoint_meta(path: Path, model_path: str) -> CheckpointMeta:
    """Load the head at build time: a wrong path or base model fails `serve run` at once."""
    try:
        _, meta = load_checkpoint(path, expected_base_model_hash=model_weights_hash(model_path))
    except FileNotFoundError:
        raise FileNotFoundError(
            f"no predictor checkpoint at {path}; train one with "
            f"`python -m predictor.train --dataset <dataset> --out {path}`"
        ) from None
    return meta


def _build_learner(config: StackConfig, model_path: str, base: Path | None):
    """The online learner (predictor.online), bound once for the whole application."""
    from transformers import AutoConfig

    spec = config.predictor.online
    options = {**spec.deployment, "name": "length-learner"}
    return LengthLearner.options(**options).bind(
        state_dir=str(REPO_ROOT / spec.state_dir), feature_dim=AutoConfig.from_pretrained(model_path).hidden_size,
        model_id=config.model.id, model_hash=model_weights_hash(model_path),
        base_checkpoint=None if base is None else str(base), capacity=spec.capacity,
        floor=config.router.live_quality.floor, max_tokens=spec.max_tokens,
        policy={"min_samples": spec.min_samples, "min_new_labels": spec.min_new_labels,
                "min_interval_s": spec.min_interval_s},
    )


def _build_predictor(spec: PredictorSpec, checkpoints: dict[str, Path], model_path: str, learner,
                     learned: tuple[str, PoolingConfig] | None = None):
    options = {**spec.deployment, "name": "length-predictor"}
    # Below the batch size, Serve would never let a batch fill (its default is 5 per replica).
    options.setdefault("max_ongoing_requests", 4 * spec.max_batch_size)
    # The router sends at most `predictor.max_concurrent` at once: this bound is never reached
    # unless several router replicas share the predictor.
    options.setdefault("max_queued_requests", 4 * spec.max_batch_size)
    if spec.gpus:
        options["ray_actor_options"] = {**options.get("ray_actor_options", {}), "num_gpus": spec.gpus}
    return LengthPredictor.options(**options).bind(
        model_path=model_path, checkpoints={name: str(path) for name, path in checkpoints.items()},
        device="cuda" if spec.gpus else "cpu", dtype=spec.dtype, max_batch_size=spec.max_batch_size,
        batch_wait_timeout_s=spec.batch_wait_timeout_s, max_batch_tokens=spec.max_batch_tokens,
        max_prompt_tokens=spec.max_prompt_tokens, truncate_prompt_tokens=spec.truncate_prompt_tokens,
        learner=learner,
        learned_head=None if learned is None else learned[0], learned_pooling=None if learned is None else learned[1],
    )


def build_app(args: dict) -> Application:
    config = StackConfig.model_validate(args or {})
    model_path = resolve_model_source(config.model.source)
    predictor, learner, heads, predictor_name = None, None, {}, None
    spec = config.predictor
    if spec is not None:
        checkpoints = spec.heads(config.router.policy, config.router.benchmark_headers)
        metas = {name: _checkpoint_meta(path, model_path) for name, path in checkpoints.items()}
        heads = {name: meta.bins for name, meta in metas.items()}  # the router's default head first
        learned = None
        if spec.online is not None:
            name = head_of(config.router.policy) or DEFAULT_HEAD
            # The learner refits the head it was given (or the "last" recipe from nothing), so the
            # features the predictor sends it are pooled as that head reads them.
            learned = (name, metas[name].pooling if name in metas else RECIPE.pooling)
            learner = _build_learner(config, model_path, spec.checkpoint_path(config.router.policy))
            if spec.cold:  # the learner's bins, fixed for its life (predictor.online.learner.online_bins)
                heads = {name: online_bins(spec.online.max_tokens), **heads}
        predictor_name = next(iter(metas.values())).pooling.method if metas else RECIPE.pooling.method
        predictor = _build_predictor(spec, checkpoints, model_path, learner, learned)
    plan = RoutingPlan.of(config, model_path, heads, predictor_name)
    pools = {pool.name: build_pool(config.model, pool, config.router) for pool in config.pools}
    return Router.options(**router_options(config)).bind(pools=pools, predictor=predictor, config=config, plan=plan,
                                                         learner=learner)


# The router's share of the 30 s `serve run` gives a shutdown (deployments.engine_pool.POOL_DRAIN_S).
ROUTER_DRAIN_S = 10


def router_options(config: StackConfig) -> dict:
    """Ray Serve's options for the router deployment.

    The router answers overload itself (429/503 in OpenAI's format, with Retry-After) long before
    its max_ongoing_requests, but Ray's proxy queues what it has not yet handed to the router
    replica, and a replica whose event loop is busy takes them late: at 2.5x capacity a queue of
    64 filled in a burst (benchmarks/results/reliability.md). So Ray's queue is bounded at 256,
    and what it refuses past that carries Retry-After too (in Ray's own plain-text 503).

    A stopped router lets its requests finish for at most ROUTER_DRAIN_S: Serve stops it before the
    pools, and both drains must end before `serve run` gives up on the shutdown (30 s).
    """
    return {"max_queued_requests": 256, "backpressure_config": BackpressureConfig(status_code=503, retry_after_s=2),
            "graceful_shutdown_timeout_s": ROUTER_DRAIN_S, **config.router.deployment}
