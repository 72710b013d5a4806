"""Everything a simulation run takes from the real stack: config, calibration, heads, predictions.

One place reads ray_config.yaml (pools, per-replica limits, router settings), the step-time
calibration (the model and the engine's scheduler limits), and the predictor heads with their
cached predictions, so every run simulates the stack a user would start.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from benchmarks.forelen.build import DEFAULT_OUT
from benchmarks.simulator.calibrate import CALIBRATION, stack_model
from benchmarks.simulator.cluster import ClusterSpec
from benchmarks.simulator.engine import EngineLimits
from benchmarks.simulator.predictions import CHECKPOINTS, load_cache
from benchmarks.simulator.step_time import StepTimeModel
from deployments.config import StackConfig, head_checkpoint
from predictor.checkpoint import load_checkpoint
from predictor.dataset import load_samples
from predictor.head import LengthBins, LengthPrediction
from router.admission import QueueOrder
from router.length_bins import PoolBins, training_quantile
from router.policies import DEFAULT_HEAD

SINGLE_POOL = "default"
# The paper's length pools, for the pool policies when ray_config.yaml runs a single pool, and the
# prompt-token edges of input_length between them (tertiles of the training prompts).
LENGTH_POOLS = ("short", "medium", "long")
LENGTH_INPUT_EDGES = [64, 100]


@dataclass
class Setup:
    config: StackConfig
    model: StepTimeModel
    limits: EngineLimits
    pool_bins: PoolBins  # the length pools' output edges: from the default head, as the stack sets them
    head_bins: dict[str, LengthBins]
    predictions: dict[str, dict[str, LengthPrediction]]  # head -> prompt_id -> prediction
    calibration: dict
    queue_order: QueueOrder = QueueOrder()  # the router's admission queue (router.queue)
    input_edges: list[int] | None = None  # input_length's prompt-token edges between the length pools

    @property
    def pools(self) -> list[str]:
        """The length pools the pool policies route over (ray_config.yaml's, if it lists several)."""
        return list(self.pool_bins.names)

    @property
    def max_prompt_tokens(self) -> int:
        """Longer prompts get no prediction (the router's predictor.max_prompt_tokens); 0 without a predictor."""
        return self.config.predictor.max_prompt_tokens if self.config.predictor else 0

    def prediction_quality(self, split: str = "test") -> dict:
        """Per head on `split`: MAE of the expected length and how often its pool (`bin`) is the
        true length's pool; the predictions the simulator routes on, judged where the heads
        never trained."""

        cap = max(self.head_bins[DEFAULT_HEAD].max_tokens, 1)
        out = {}
        for head, predictions in self.predictions.items():
            rows = [r for r in load_samples(DEFAULT_OUT, split=split) if r["prompt_id"] in predictions]
            if not rows:
                continue
            described = [self.pool_bins.describe(predictions[r["prompt_id"]], self.head_bins[head], cap) for r in rows]
            errors = [abs(d["expected_tokens"] - r["output_tokens"]) for d, r in zip(described, rows)]
            hits = [d["bin"] == self.pool_bins.pool_of(r["output_tokens"]) for d, r in zip(described, rows)]
            routed = {p: sum(d["bin"] == p for d in described) / len(rows) for p in self.pools}
            out[head] = {"samples": len(rows), "mae_tokens": sum(errors) / len(rows),
                         "pool_accuracy": sum(hits) / len(rows), "routed_share": routed}
        truth = [self.pool_bins.pool_of(r["output_tokens"]) for r in load_samples(DEFAULT_OUT, split=split)]
        out["true_share"] = {p: truth.count(p) / len(truth) for p in self.pools} if truth else {}
        return out

    def work_shares(self) -> dict[str, float]:
        """Each pool's share of the decode work (output tokens) of the training split under the
        pools' output edges: what a deployer who knows their traffic would size the pools by."""

        tokens = dict.fromkeys(self.pools, 0)
        for row in load_samples(DEFAULT_OUT, split="train"):
            tokens[self.pool_bins.pool_of(row["output_tokens"])] += row["output_tokens"]
        total = sum(tokens.values())
        return {name: t / total for name, t in tokens.items()}

    def bins_for(self, pools: list[str]) -> PoolBins:
        """The configured pools' output edges, or one open-ended pool for a single-pool layout."""
        return self.pool_bins if pools == self.pools else PoolBins(tuple(pools), ())

    def cluster(self, replicas: int, mode: str, batch_size: int, sizing: str = "even") -> ClusterSpec:
        """`replicas` over the pools: evenly (as ray_config.yaml's one replica each) or by work share,
        at least one each, largest remainders first; "single": all in one pool (Ray Serve's default
        deployment, the layout the work policies need)."""
        per_replica = self.config.pools[0].deployment.get("max_ongoing_requests", 16)
        if sizing == "single":
            return ClusterSpec(pools=[SINGLE_POOL], replicas={SINGLE_POOL: replicas}, max_ongoing_requests=per_replica,
                               mode=mode, batch_size=batch_size)
        names = self.pools
        shares = dict.fromkeys(names, 1 / len(names)) if sizing == "even" else self.work_shares()
        spare = replicas - len(names)
        exact = {name: spare * shares[name] for name in names}
        counts = {name: 1 + int(exact[name]) for name in names}
        by_remainder = sorted(names, key=lambda n: (exact[n] - int(exact[n]), names.index(n)), reverse=True)
        for name in by_remainder[: replicas - sum(counts.values())]:
            counts[name] += 1
        return ClusterSpec(pools=names, replicas=counts, max_ongoing_requests=per_replica, mode=mode,
                           batch_size=batch_size)


def load_setup(calibration: Path = CALIBRATION) -> Setup:
    config, _ = stack_model()
    cal = json.loads(Path(calibration).read_text())
    lim = cal["limits"]
    limits = EngineLimits(max_num_seqs=lim["max_num_seqs"], max_num_batched_tokens=lim["max_num_batched_tokens"],
                          kv_cache_tokens=lim["kv_cache_tokens"], shortest_first=config.router.shortest_first)
    metas = {name: load_checkpoint(head_checkpoint(name))[1] for name in CHECKPOINTS}
    several = len(config.pools) > 1
    names = [p.name for p in config.pools] if several else list(LENGTH_POOLS)
    edges = config.router.output_edges if several else None
    pool_bins = PoolBins(tuple(names), tuple(edges)) if edges is not None else \
        PoolBins.from_quantiles(names, metas[DEFAULT_HEAD].bins)
    return Setup(
        config=config, model=StepTimeModel(**cal["model"]), limits=limits, pool_bins=pool_bins,
        head_bins={name: meta.bins for name, meta in metas.items()},
        predictions={name: load_cache(name) for name in CHECKPOINTS}, calibration=cal,
        queue_order=config.router.queue.order(training_quantile(metas[DEFAULT_HEAD].bins, 0.5)),
        input_edges=(config.router.input_edges if several else None) or LENGTH_INPUT_EDGES,
    )
