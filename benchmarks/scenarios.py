"""The benchmark suite: one table of named scenarios, each a question about the serving stack.

A scenario is a workload (which prompts, how they arrive, how long their answers run), the sides
it compares (an application, this stack or Ray Serve LLM's stock app, and the policy and settings
the side serves with), the side every change is taken against, how many interleaved repeats, and
the targets it is judged by. Everything else is held fixed for all sides: the engines and their
settings (ray_config.yaml's), the seeded trace, the machine (probed before and after each run).
`python -m benchmarks run <name>` runs one (benchmarks.runner); its per-request records land under
benchmarks/results/runs/<name>/ and its figures in the results file its `report` names
(benchmarks.report), which also rebuilds the README's results table.

The variants of earlier rounds are parameters here: the predictor head a side serves (`heads`),
natural or fixed lengths, the trace, the arrival process and its share of the capacity.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from router.scheduling.budget import Mode

Metric = Literal["mean_jct_s", "p99_jct_s", "short_p99_jct_s", "short_answer_mean_jct_s", "mean_ttft_s",
                 "throughput_tok_s", "makespan_s"]


@dataclass(frozen=True)
class Workload:
    """What every side of a scenario is sent.

    `lengths`: `natural` lets the model end its answers (every run a fresh draw: a trace's tokens
    differ up to 20% between runs); `fixed` holds each answer to the length the dataset's sample of
    it had, the router not told (X-Fixed-Output-Tokens; the stock app gets `ignore_eos`), so every
    side serves one workload. `share`: arrivals at that share of the stack's probed capacity
    (poisson or azure); a burst sends everything in trace order, 20 ms apart (benchmarks.workloads:
    sent at one instant, the order was a coin flip per side). `hints`: the share of requests (seeded)
    that carry a client's output-length hint, the prompt's median over its other samples.
    """

    trace: Literal["dataset", "sharegpt"] = "dataset"
    requests: int = 128
    arrivals: Literal["burst", "poisson", "azure"] = "burst"
    share: float | None = None
    lengths: Literal["natural", "fixed"] = "natural"
    max_tokens: int = 1024
    seed: int = 0


@dataclass(frozen=True)
class Rollout:
    """A /v1/rollout batch: the dataset's RL test prompts, n samples each. `history`: the stack keeps
    each prompt's last n lengths (a fresh file per session), so a side's epoch 2 is ranked by its
    epoch 1."""

    prompts: int = 13
    n: int = 8
    max_tokens: int = 512
    history: bool = False


@dataclass(frozen=True)
class Side:
    """One side of a comparison. `policy`: the stack's routing policy (None: ray_config.yaml's
    default, whatever it is); `heads`: the predictor heads its stack serves (None: the policy's
    own), since each head served adds its features to every prediction; `budget`: the predictor
    budget its requests name (X-Predictor-Budget), so two budgets share one stack; `hints`: the share of
    requests sending the ceiling as a client hint; `repeats`: fewer repeats for a reference
    (a limit such as the oracle), None: the scenario's. Rollout sides name a `schedule` and where
    its lengths come from (`lengths_from`: the head, `ceiling`, or the prompts' `history` of the
    epoch run before it)."""

    name: str
    app: Literal["stack", "stock"] = "stack"
    policy: str | None = None
    heads: tuple[str, ...] | None = None
    hints: float = 0.0
    repeats: int | None = None
    schedule: Literal["fifo", "makespan"] | None = None
    lengths_from: Literal["head", "ceiling", "history"] | None = None
    k: int | None = None  # first k of each prompt's n samples, the rest cut
    budget_quantile: float | None = None  # partial: a token budget at this quantile of the batch's lengths
    budget: Mode | None = None  # the predictor budget its requests ask for (None: the stack's)


@dataclass(frozen=True)
class Target:
    """`side`'s change against the baseline in `metric` (median over repeats, or `each` repeat),
    at most `bound` (a fraction: -0.05 is 5% lower), or at least it with `at_least`."""

    side: str
    metric: Metric
    bound: float
    at_least: bool = False
    each: bool = False

    def text(self) -> str:
        which = "every repeat" if self.each else "median"
        return f"{self.side} {self.metric} {'>=' if self.at_least else '<='} {100 * self.bound:+.0f}% ({which})"


@dataclass(frozen=True)
class Scenario:
    name: str
    report: str  # the results file (benchmarks/results/<report>.{json,md,png}) it writes into
    question: str
    sides: tuple[Side, ...]
    baseline: str
    repeats: int
    workload: Workload | Rollout = field(default_factory=Workload)
    targets: tuple[Target, ...] = ()

    @property
    def kind(self) -> str:
        return "rollout" if isinstance(self.workload, Rollout) else "online"

    def side(self, name: str) -> Side:
        return next(s for s in self.sides if s.name == name)

    def repeats_of(self, side: Side) -> int:
        return self.repeats if side.repeats is None else min(side.repeats, self.repeats)


STOCK = Side("stock", app="stock")  # Ray Serve LLM's build_openai_app with the same engines
DEFAULT = Side("default")  # this stack as ray_config.yaml serves it
RAY_DEFAULT = Side("ray_default", policy="ray_default")
LAST_WORK = Side("last_work", policy="last_work")
FIFO = Side("fifo", schedule="fifo")
CEILING_MAKESPAN = Side("ceiling", schedule="makespan", lengths_from="ceiling")
BURST = Workload()
FIXED_BURST = Workload(lengths="fixed")
LOAD = "What the order does under continuous arrivals at fixed lengths, where few requests wait"

SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    # Against the app a user would run instead (issue 42): stock, then ours, interleaved.
    Scenario("overhead", "pays_live", "What the stack's router costs against Ray Serve LLM's own app, "
             "on an identical fixed-length burst (Ray's default policy on ours)",
             (STOCK, RAY_DEFAULT), "stock", 3, FIXED_BURST,
             (Target("ray_default", "throughput_tok_s", -0.02, at_least=True), Target("ray_default", "mean_jct_s", 0.03))),
    Scenario("natural", "pays_live", "What the default stack buys against the stock app at natural lengths, "
             "where max_tokens (1024) tells nothing", (STOCK, DEFAULT, RAY_DEFAULT), "stock", 5, BURST,
             (Target("default", "mean_jct_s", -0.05), Target("default", "short_p99_jct_s", -0.15),
              Target("default", "mean_jct_s", 0.05, each=True), Target("default", "p99_jct_s", 0.10, each=True))),
    Scenario("hints", "pays_live", "How much of the ceiling's gain client hints recover, sent for a seeded half "
             "of the requests (the hint: the prompt's median over its other samples)",
             (STOCK, Side("hints", hints=0.5), Side("ceiling", hints=1.0)), "stock", 5, BURST),
    Scenario("natural_budget", "pays_live", "Whether the predictor budget's auto (the default stack) pays at natural "
             "lengths against predicting nothing (never: free signals only), the stock app beside them",
             (STOCK, DEFAULT, Side("never", budget="never")), "never", 3, BURST),
    Scenario("calm", "pays_live", "Whether the default stack does no harm where nothing queues (Poisson at 80% "
             "of capacity), and how many predictions its budget skips there",
             (STOCK, DEFAULT), "stock", 3, Workload(requests=200, arrivals="poisson", share=0.8)),
    # Where requests queue, the order against Ray's default (earlier rounds).
    Scenario("fixed_burst", "queueing", "What ranking waiting requests by the last-token head buys where every "
             "side serves the same lengths", (RAY_DEFAULT, LAST_WORK, Side("ceiling", policy="ceiling", repeats=1),
                                              Side("oracle_work", policy="oracle_work", repeats=1)),
             "ray_default", 4, FIXED_BURST,
             (Target("last_work", "mean_jct_s", -0.10), Target("last_work", "short_p99_jct_s", -0.15),
              Target("last_work", "p99_jct_s", 0.10))),
    # `always`: the question is ESTP's rank; under `auto` the budget prices its attention-reading
    # prefill above the gain on CPU and predicts nothing (measured: runs/legacy/fixed_burst_estp_auto).
    Scenario("fixed_burst_estp", "queueing", "The same with ESTP's own head, on a stack serving it alone",
             (RAY_DEFAULT, Side("estp_work", policy="estp_work", heads=("estp",), budget="always")), "ray_default", 3,
             FIXED_BURST,
             (Target("estp_work", "mean_jct_s", -0.10),)),
    Scenario("natural_burst", "queueing", "The last-token head at natural lengths, predicted live on the "
             "engines' cores", (RAY_DEFAULT, LAST_WORK), "ray_default", 3, BURST, (Target("last_work", "mean_jct_s", -0.10),)),
    Scenario("natural_burst_early", "queueing", "The layer-4 head (a seventh of the prefill) at natural lengths",
             (RAY_DEFAULT, Side("early_work", policy="early_work", heads=("early",))), "ray_default", 5, BURST,
             (Target("early_work", "mean_jct_s", -0.10), Target("early_work", "p99_jct_s", 0.10))),
    Scenario("sharegpt_burst_early", "queueing", "The layer-4 head on 128 held-out ShareGPT prompts",
             (RAY_DEFAULT, Side("early_work", policy="early_work", heads=("early",))), "ray_default", 2,
             Workload(trace="sharegpt")),
    *(Scenario(f"load{round(100 * share)}_{arrivals}_{requests}", "queueing", LOAD,
               (RAY_DEFAULT, LAST_WORK), "ray_default", repeats,
               Workload(requests=requests, arrivals=arrivals, share=share, lengths="fixed"))
      for share, arrivals, requests, repeats in ((0.8, "poisson", 100, 3), (0.95, "poisson", 150, 3),
                                                 (0.95, "azure", 150, 3), (0.95, "poisson", 300, 3),
                                                 (0.95, "azure", 300, 3), (1.05, "poisson", 150, 3),
                                                 (1.1, "poisson", 150, 3))),
    # RL rollouts: a batch waits for its longest sample.
    Scenario("rollout_schedules", "rollout", "Longest-first (makespan) against the batch's order on one RL batch",
             (FIFO, Side("estp", schedule="makespan", lengths_from="head"), CEILING_MAKESPAN),
             "fifo", 3, Rollout(max_tokens=256)),
    Scenario("rollout_history", "rollout", "Epoch 2 of an RL batch ranked longest-first by each prompt's lengths in "
             "epoch 1, against the batch's order and the ceiling",
             (FIFO, Side("history", schedule="makespan", lengths_from="history"), CEILING_MAKESPAN), "fifo", 3,
             Rollout(history=True), (Target("history", "makespan_s", 0.0, each=True),)),
    Scenario("rollout_first_k", "rollout", "The first 6 of each prompt's 8 samples, the rest cut in the engines",
             (FIFO, Side("first_k", schedule="fifo", k=6)), "fifo", 3, Rollout(),
             (Target("first_k", "makespan_s", -0.30),)),
    Scenario("rollout_partial", "rollout", "Samples stopped at the 75th percentile of lengths as partial, "
             "continued in a second call, against one full call",
             (FIFO, Side("partial", schedule="fifo", budget_quantile=0.75)), "fifo", 3, Rollout()),
)}
