"""`serve run ray_config.yaml` enters here: config -> predictor + vLLM pools -> router ingress."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from ray.serve import Application
from ray.serve.config import BackpressureConfig

from deployments.config import PredictorSpec, StackConfig
from deployments.engine_pool import build_pool
from deployments.predictor_deployment import LengthPredictor
from predictor.checkpoint import CheckpointMeta, load_checkpoint
from predictor.model_files import model_weights_hash, resolve_model_source
from router.ingress import Router
from router.length_bins import PoolBins, training_quantile


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


def _build_predictor(spec: PredictorSpec, checkpoints: dict[str, Path], model_path: str):
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
        max_prompt_tokens=spec.max_prompt_tokens,
    )


def build_app(args: dict) -> Application:
    config = StackConfig.model_validate(args or {})
    model_path = resolve_model_source(config.model.source)
    names = [pool.name for pool in config.pools]
    predictor, predictor_name, head_bins, edges, median = None, None, {}, config.router.output_edges, None
    if config.predictor is not None:
        checkpoints = config.predictor.heads(config.router.policy, every_predicted=config.router.benchmark_headers)
        metas = {name: _checkpoint_meta(path, model_path) for name, path in checkpoints.items()}
        # The first head names the predictor and, by default, sets the pools' output edges.
        first = next(iter(metas.values()))
        bins = PoolBins(tuple(names), tuple(edges)) if edges is not None else PoolBins.from_quantiles(names, first.bins)
        predictor = _build_predictor(config.predictor, checkpoints, model_path)
        predictor_name, median = first.pooling.method, training_quantile(first.bins, 0.5)
        head_bins = {name: meta.bins.model_dump() for name, meta in metas.items()}
    else:
        bins = PoolBins(tuple(names), tuple(edges or ()))
    pools = {pool.name: build_pool(config.model, pool, config.router.shortest_first) for pool in config.pools}
    routing = {
        "model_path": model_path,
        "output_bins": asdict(bins),
        "predictor_name": predictor_name,
        "head_bins": head_bins,  # the router's default head first
        "predictor_concurrency": config.predictor.concurrency() if config.predictor else 0,
        "queue_order": asdict(config.router.queue.order(median)),
        "capacities": {pool.name: pool.saturation() for pool in config.pools},
        "replicas": {pool.name: pool.replicas() for pool in config.pools},
        "per_replica": {pool.name: pool.deployment.get("max_ongoing_requests") for pool in config.pools},
    }
    return Router.options(**router_options(config)).bind(
        pools=pools, predictor=predictor, config=config.model_dump(), routing=routing
    )


def router_options(config: StackConfig) -> dict:
    """Ray Serve's options for the router deployment.

    The router answers overload itself (429/503 in OpenAI's format, with Retry-After) long before
    its max_ongoing_requests, but Ray's proxy queues what it has not yet handed to the router
    replica, and a replica whose event loop is busy takes them late: at 2.5x capacity a queue of
    64 filled in a burst (benchmarks/results/reliability.md). So Ray's queue is bounded at 256,
    and what it refuses past that carries Retry-After too (in Ray's own plain-text 503).
    """
    return {"max_queued_requests": 256, "backpressure_config": BackpressureConfig(status_code=503, retry_after_s=2),
            **config.router.deployment}
