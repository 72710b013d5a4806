"""Everything a simulation run takes from the real stack: config, calibration, heads, predictions.

One place reads ray_config.yaml (pools, per-replica limits, router settings), the step-time
calibration (the model and the engine's scheduler limits), and the predictor heads with their
cached predictions, so every run simulates the stack a user would start. A simulated cluster is
described as the stack's own config with its pools resized (`Setup.stack_for`), and its
scheduler is built by the stack's own builder (router.serving.config.build_scheduler): the simulator's
defaults are ray_config.yaml's.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from pathlib import Path

from benchmarks.forelen.build import DEFAULT_OUT
from benchmarks.simulator.calibrate import CALIBRATION, stack_model
from benchmarks.simulator.cluster import ClusterSpec
from benchmarks.simulator.engine import EngineLimits
from benchmarks.simulator.fit import Fit
from benchmarks.simulator.hops import Hops
from benchmarks.simulator.predictions import CHECKPOINTS, load_cache
from benchmarks.simulator.step_time import StepTimeModel
from predictor.checkpoint import load_checkpoint
from predictor.dataset import load_samples
from predictor.head import LengthBins, LengthPrediction
from router.scheduling.policies import POLICIES
from router.scheduling.pools import Pools
from router.scheduling.scheduler import Scheduler
from router.serving.config import PoolSpec, RoutingPlan, StackConfig, build_scheduler, head_checkpoint

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
    plan: RoutingPlan  # the stack's plan over the length pools (their edges from the default head)
    predictions: dict[str, dict[str, LengthPrediction]]  # head -> prompt_id -> prediction
    calibration: dict
    # The hops the deployed path adds before the router sees a request and after the engine
    # emits a token (benchmarks.simulator.validation measures them; none: the engines alone).
    hops: Hops = Hops()
    validated: bool = False  # the step-time model carries the validation's fitted factors

    @property
    def pools(self) -> list[str]:
        """The length pools the pool policies route over (ray_config.yaml's, if it lists several)."""
        return list(self.plan.pools.names)

    @property
    def head_bins(self) -> dict[str, LengthBins]:
        return self.plan.heads

    @property
    def max_prompt_tokens(self) -> int:
        """Longer prompts get no prediction (the router's predictor.max_prompt_tokens); 0 without a predictor."""
        return self.config.predictor.max_prompt_tokens if self.config.predictor else 0

    def stack_for(self, spec: ClusterSpec, bounded: bool = True, max_overtake_s: float | None = None,
                  rank_by: str | None = None) -> StackConfig:
        """ray_config.yaml's stack with the cluster's pools; `bounded` False: queues without bound
        (a backlog that runs its course instead of 429s); the rest override one router setting."""
        router = self.config.router
        queue = router.queue.model_copy(update={
            **({} if bounded else {"max_waiting_per_slot": 1e12}),
            **({} if max_overtake_s is None else {"max_overtake_s": max_overtake_s})})
        several = len(spec.pools) > 1
        router = router.model_copy(update={
            "queue": queue, "rank_by": rank_by or router.rank_by, "replica_choice": spec.replica_choice,
            "input_edges": (router.input_edges or LENGTH_INPUT_EDGES) if several else None,
            "output_edges": list(self.plan.pools.edges) if several else None})
        pools = [PoolSpec(name=name, deployment={"num_replicas": spec.replicas[name],
                                                 "max_ongoing_requests": spec.per_replica()})
                 for name in spec.pools]
        return self.config.model_copy(update={"pools": pools, "router": router})

    def scheduler(self, policy: str, spec: ClusterSpec, seed: int = 0, **router) -> Scheduler:
        """The router's scheduling core for `policy` on the cluster (router: Setup.stack_for's overrides)."""
        config = self.stack_for(spec, **router)
        pools = self.plan.pools if len(spec.pools) > 1 else Pools((SINGLE_POOL,), ())
        return build_scheduler(config, replace(self.plan, pools=pools), [policy], rng=random.Random(seed))

    def prediction_quality(self, split: str = "test") -> dict:
        """Per head on `split`: MAE of the expected length and how often its pool is the true
        length's pool; the predictions the simulator routes on, judged where the heads never
        trained."""
        pools = self.plan.pools
        cap = max(self.head_bins[next(iter(self.head_bins))].max_tokens, 1)
        rows_all = load_samples(DEFAULT_OUT, split=split)
        out = {}
        for head, predictions in self.predictions.items():
            rows = [r for r in rows_all if r["prompt_id"] in predictions]
            if not rows:
                continue
            described = [pools.describe(head, predictions[r["prompt_id"]], self.head_bins[head], cap) for r in rows]
            errors = [abs(d.expected_tokens - r["output_tokens"]) for d, r in zip(described, rows)]
            hits = [d.pool == pools.pool_of(r["output_tokens"]) for d, r in zip(described, rows)]
            routed = {p: sum(d.pool == p for d in described) / len(rows) for p in self.pools}
            out[head] = {"samples": len(rows), "mae_tokens": sum(errors) / len(rows),
                         "pool_accuracy": sum(hits) / len(rows), "routed_share": routed}
        truth = [pools.pool_of(r["output_tokens"]) for r in rows_all]
        out["true_share"] = {p: truth.count(p) / len(truth) for p in self.pools} if truth else {}
        return out

    def work_shares(self) -> dict[str, float]:
        """Each pool's share of the decode work (output tokens) of the training split under the
        pools' output edges: what a deployer who knows their traffic would size the pools by."""
        tokens = dict.fromkeys(self.pools, 0)
        for row in load_samples(DEFAULT_OUT, split="train"):
            tokens[self.plan.pools.pool_of(row["output_tokens"])] += row["output_tokens"]
        total = sum(tokens.values())
        return {name: t / total for name, t in tokens.items()}

    def cluster(self, replicas: int, mode: str, batch_size: int, sizing: str = "even") -> ClusterSpec:
        """`replicas` over the pools: evenly (as ray_config.yaml's one replica each) or by work share,
        at least one each, largest remainders first; "single": all in one pool (Ray Serve's default
        deployment, the layout the work policies need). The replica choice is the stack's."""
        per_replica = self.config.pools[0].deployment.get("max_ongoing_requests", 16)
        choice = self.config.router.replica_choice
        if sizing == "single":
            return ClusterSpec(pools=[SINGLE_POOL], replicas={SINGLE_POOL: replicas}, max_ongoing_requests=per_replica,
                               mode=mode, batch_size=batch_size, replica_choice=choice)
        names = self.pools
        shares = dict.fromkeys(names, 1 / len(names)) if sizing == "even" else self.work_shares()
        spare = replicas - len(names)
        exact = {name: spare * shares[name] for name in names}
        counts = {name: 1 + int(exact[name]) for name in names}
        by_remainder = sorted(names, key=lambda n: (exact[n] - int(exact[n]), names.index(n)), reverse=True)
        for name in by_remainder[: replicas - sum(counts.values())]:
            counts[name] += 1
        return ClusterSpec(pools=names, replicas=counts, max_ongoing_requests=per_replica, mode=mode,
                           batch_size=batch_size, replica_choice=choice)


VALIDATION = Path(__file__).resolve().parents[1] / "results" / "simulator_validation.json"


def validated_setup(calibration: Path = CALIBRATION, validation: Path = VALIDATION) -> Setup:
    """The setup with the factors and hops the validation against the real stack fitted (the
    calibration alone if no validation has run yet)."""
    setup = load_setup(calibration)
    if not validation.exists():
        return setup
    fit = saved_fit(validation)
    return replace(setup, model=fit.model(setup.model), hops=fit.hops,
                   validated=True)


def saved_fit(validation: Path = VALIDATION) -> Fit:
    """The step-time factors and hops the last validation fitted."""
    saved = json.loads(validation.read_text())["fit"]
    return Fit(**{**saved, "references": {int(size): step for size, step in saved.get("references", {}).items()}})


def load_setup(calibration: Path = CALIBRATION) -> Setup:
    config, _ = stack_model()
    cal = json.loads(Path(calibration).read_text())
    lim = cal["limits"]
    limits = EngineLimits(max_num_seqs=lim["max_num_seqs"], max_num_batched_tokens=lim["max_num_batched_tokens"],
                          kv_cache_tokens=lim["kv_cache_tokens"], shortest_first=config.router.shortest_first,
                          block_size=lim["block_size"])
    default = POLICIES[config.router.policy].head or "last"
    heads = {name: load_checkpoint(head_checkpoint(name))[1].bins
             for name in sorted(CHECKPOINTS, key=lambda name: name != default)}  # the stack's default first
    several = len(config.pools) > 1
    layout = config if several else config.model_copy(update={"pools": [PoolSpec(name=n) for n in LENGTH_POOLS]})
    plan = RoutingPlan.of(layout, "", heads, None)
    return Setup(config=config, model=StepTimeModel(**cal["model"]), limits=limits, plan=plan,
                 predictions={name: load_cache(name) for name in CHECKPOINTS}, calibration=cal)
