"""The real stack where a backlog forms: bursts, and continuous load near capacity.

Length-awareness can only pay where requests wait, so these runs make them wait: a burst of 128
requests onto the default stack's 32 slots (4x), and Poisson or bursty (Azure-like) arrivals at
95% of the capacity a burst measured. Every run is a `benchmarks.replay.runs` run: its per-request
records (the client's and the router's, joined) are kept under benchmarks/results/runs/, a run
already there is not run again, and the policies of one repeat run back to back (interleaved), so
a slow spell of the machine hits them alike.

- dataset burst: 128 of the dataset's val and test prompts (every scenario), max_tokens 1024, so
  the same trace carries the known limits: `ceiling` (each prompt's median over its other
  samples) and `oracle_work` (the dataset's own length of the sample) beside `ray_default` and
  `last_work`;
- the dataset burst again with the lean predictor (`last_work`), and with the early-exit head
  (`early_work`);
- the dataset burst at fixed lengths: every answer held to its sample's length, the router not
  told (X-Fixed-Output-Tokens), so the policies of one repeat serve the same workload; once with
  the last token's head, once with ESTP's (`estp_work`);
- Ray Serve LLM's own OpenAI app (`build_openai_app`) on the same burst, with the same two engines
  and settings, behind Ray's default router: what a user would pick instead;
- ShareGPT burst: 128 of the developers' ShareGPT first turns the dataset never used;
- continuous load: Poisson and Azure-like arrivals at a share of the measured capacity, every
  answer held to its sample's length; the capacity is the session's own (a probe of the machine
  scales the fixed-length bursts' capacity), kept beside the runs so each repeat replays one trace.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks.replay.probe import read_probe
from benchmarks.replay.runs import RUNS, RunRecord, read_run, run_path
from benchmarks.replay.trace import TraceRequest, arrival_times, build_trace
from deployments.engine_pool import llm_config
from router.scheduling.policies import head_of
from router.serving.config import StackConfig

BURST = 128
BURST_MAX_TOKENS = 1024
RUN_TIMEOUT_S = 3600  # the replay clients' timeout (spawn_actors), and the run stacks' queue bound
DATASET_POLICIES = ("ray_default", "last_work", "ceiling", "oracle_work")
STOCK = "ray_serve_llm"  # the stock app's label among the burst's policies
# last_work's order with its predictions told up front (the `ceiling` policy's told-length path):
# what the head's ranking buys when its prefill does not share the engines' cores.
HEAD_TOLD = "last_told"
# The dataset burst again, ray_default against last_work, after the predictor's prefill was made
# lean (benchmarks/results/predictor_levers.md): the `dataset_burst` runs of last_work predate it.
LEAN = "dataset_burst_lean"
LEAN_POLICIES = ("ray_default", "last_work")
# The same burst, ray_default against early_work: the last token's head at layer 4 of 30, whose
# prefill stops there, on a stack that serves that head alone (the runs above served every head:
# ESTP's entropy and attention made each prediction 1.55x as costly as the last token's alone).
EARLY = "dataset_burst_early"
EARLY_SHAREGPT = "sharegpt_burst_early"  # the ShareGPT burst, the same two policies
EARLY_POLICIES = ("ray_default", "early_work")
TOLD_AS = {HEAD_TOLD: "ceiling"}  # a run label -> the router policy it runs as
# The dataset burst with every answer held to the length the dataset's sample of it had (the
# engines told, the router not): unseeded answers of one trace differ by up to 20% in tokens
# between runs (56k to 68k), which moved the mean JCT of two policies as much as their order did.
FIXED = "dataset_burst_fixed"
# The fixed-length burst, ray_default against estp_work: the paper's own head (the hidden states
# pooled by entropy and final-layer attention) on a stack that serves it alone; its prefill reads
# attention, so it costs more than the last token's head (predictor_levers.md).
FIXED_ESTP = "dataset_burst_fixed_estp"
ESTP_POLICIES = ("ray_default", "estp_work")
# Continuous load at fixed lengths (workloads load_fixed_<arrivals>@<share>[_<requests>]): the same
# workload for every policy, and a capacity the fixed bursts measured.
LOAD_FIXED = "load_fixed"
LOAD_UNCOUNTED = 150


def load_name(process: str, share: float, requests: int) -> str:
    """The first load workloads sent 150 requests and are named without a count; a load of any other
    size carries it, since a workload's trace (and the capacity kept beside it) must never change."""
    count = "" if requests == LOAD_UNCOUNTED else f"_{requests}"
    return f"{LOAD_FIXED}_{process}@{share:g}{count}"


def stack_overrides(policies: list[str], request_log: Path) -> dict:
    """The stack a run's policies need: benchmark headers, the request log, a queue bound no run
    reaches, and the heads those policies read and no other (an unread head's features would be
    computed for every prediction)."""
    policies = [TOLD_AS.get(p, p) for p in policies]
    heads = list(dict.fromkeys(head for p in policies if (head := head_of(p))))
    # The queue bound raised to the client's own timeout: a burst onto a slower machine (they differ
    # 2-3x between sessions) would otherwise become a test of the 503s at 600 s, not of the order.
    router = {"benchmark_headers": True, "request_log": str(request_log), "request_timeout_s": RUN_TIMEOUT_S}
    if heads:
        router["policy"] = next(p for p in policies if head_of(p) == heads[0])
    return {"router": router, "predictor": {"extra_heads": heads[1:]}}


def dataset_burst(n: int = BURST, seed: int = 0) -> list[TraceRequest]:
    """n val/test requests, every one arriving at once."""
    trace = build_trace(split=("val", "test"), n=n, arrival="poisson", rate=1.0, seed=seed,
                        max_tokens=BURST_MAX_TOKENS)
    return [r.model_copy(update={"arrival_s": 0.0}) for r in trace]


def fixed_lengths(trace: list[TraceRequest]) -> list[TraceRequest]:
    """Each answer held to its true length: the same workload whatever the order."""
    return [r.model_copy(update={"fixed_tokens": max(1, r.true_output_tokens)}) for r in trace]


def told_head(trace: list[TraceRequest], head: str = "last") -> list[TraceRequest]:
    """The burst with each prompt's `head` prediction (made offline by the same estimator path,
    benchmarks.simulator.predictions) as the length the told-length policy ranks by; prompts the
    predictor never takes (over max_prompt_tokens) rank on the prior, as they do live."""
    from benchmarks.simulator.predictions import load_cache

    cached = load_cache(head)
    return [r.model_copy(update={"ceiling_tokens": round(cached[r.prompt_id].expected_tokens)
                                 if r.prompt_id in cached else None}) for r in trace]


def arrivals(trace: list[TraceRequest], process: str, rate: float, seed: int = 0) -> list[TraceRequest]:
    """The same requests, re-timed by an arrival process at `rate` requests/s."""
    times = arrival_times(len(trace), process, rate, random.Random(seed))
    return [r.model_copy(update={"arrival_s": t}) for r, t in zip(trace, times)]


def capacity_rps(records: list[RunRecord]) -> float:
    """Requests/s the stack completes with every slot busy: completions over the middle 80% of a
    burst (the start fills the slots, the tail drains them)."""
    finishes = sorted(r.finish_s for r in records if r.status == "ok")
    lo, hi = len(finishes) // 10, 9 * len(finishes) // 10
    return (hi - lo) / (finishes[hi] - finishes[lo])


def measured_capacity() -> float:
    """The default stack's capacity on the dataset's mix: the mean over the length-blind bursts run."""
    runs = [f"dataset_burst/ray_default/r{k}" for k in range(repeats_on_disk("dataset_burst"))
            if run_path(f"dataset_burst/ray_default/r{k}").exists()]
    if not runs:
        raise FileNotFoundError("no dataset burst of ray_default yet: run `python -m benchmarks.continuous burst` first")
    return float(np.mean([capacity_rps(read_run(run)) for run in runs]))


def capacity_per_step() -> float:
    """The fixed-length burst's capacity of `ray_default` times its probe's step time (requests/s x
    s): the capacity of a machine whose probe steps in 1 s. The median over the probed runs: on this
    workload a 2-3x slower machine's capacity follows its probe to within 15% (0.034-0.046)."""
    values = [capacity_rps(read_run(run)) * probe.step_s
              for k in range(repeats_on_disk(FIXED))
              if (path := run_path(run := f"{FIXED}/ray_default/r{k}")).exists() and (probe := read_probe(path))]
    if not values:
        raise FileNotFoundError(f"no probed {FIXED} run of ray_default yet: run `python -m benchmarks.continuous fixed`")
    return float(np.median(values))


def load_capacity(name: str, requests: int, step_s: float) -> dict:
    """The capacity (requests/s) a load workload's arrivals were first scaled to, and the probe it
    was measured at: the workload's first session sets it (runs/<name>.capacity.json)."""
    path = _capacity_path(name)
    if path.exists():
        kept = json.loads(path.read_text())
        if kept["requests"] != requests:
            raise ValueError(f"{name} ran with {kept['requests']} requests, not {requests}: its trace must not change")
        return kept
    kept = {"capacity_rps": capacity_per_step() / step_s, "probe_step_s": step_s, "requests": requests}
    path.write_text(json.dumps(kept) + "\n")
    return kept


def load_trace(name: str, process: str, share: float, requests: int, probe_step_s: Callable[[], float]) -> list[TraceRequest]:
    """`requests` val/test requests at fixed lengths, arriving at `share` of the session's capacity.

    Machines differ 2-3x between sessions, so one rate would make 95% an overload in one session and a
    calm in another (a 105% repeat probed 1.9x faster than the session that set its rate). Every
    session replays the same requests in the same arrival pattern, its times stretched by the
    session's probe against the first session's."""
    step = probe_step_s()
    kept = load_capacity(name, requests, step)
    pattern = arrivals(dataset_burst(requests), process, share * kept["capacity_rps"])
    stretch = step / kept["probe_step_s"]
    return fixed_lengths([r.model_copy(update={"arrival_s": r.arrival_s * stretch}) for r in pattern])


def kept_capacity(name: str) -> dict:
    """A load workload's capacity: its own (fixed-length loads), else the older loads' mean over the
    length-blind bursts (those ran unprobed, in the bursts' sessions)."""
    path = _capacity_path(name)
    if path.exists():
        return {**json.loads(path.read_text()), "capacity_from": "probe"}
    return {"capacity_rps": measured_capacity(), "capacity_from": "bursts"}


def _capacity_path(name: str) -> Path:
    return RUNS / f"{name}.capacity.json"


def repeats_on_disk(name: str) -> int:
    """How many repeat slots a workload's runs span (one past the highest r<k> of any policy): tables
    read every repeat on disk, so a command run with fewer `--repeats` never drops older ones."""
    return max((int(path.stem.rsplit("__r", 1)[1]) + 1 for path in RUNS.glob(f"{name}__*__r*.jsonl")), default=0)


def run_names(prefix: str) -> list[str]:
    """The workloads whose runs are on disk (run files are named <workload>__<policy>__r<k>)."""
    return sorted({path.name.split("__")[0] for path in RUNS.glob(f"{prefix}*.jsonl")})


def stock_application(config: StackConfig, runtime_env: dict) -> dict:
    """Ray Serve LLM's own OpenAI app with the stack's engines (same model, engine settings, slots),
    its own ingress and Ray's default request router: no length prediction, no router queue."""
    pool = config.pools[0]
    fifo = config.router.model_copy(update={"shortest_first": False})  # the stock app sends no priority
    llm = llm_config(config.model, pool, fifo).model_dump(mode="json", exclude_unset=True)
    for ours in ("request_router_config", "max_queued_requests", "name"):  # Ray's own router, unbounded queue
        llm["deployment_config"].pop(ours, None)
    return {"name": "ray-serve-llm", "route_prefix": "/", "import_path": "ray.serve.llm:build_openai_app",
            "runtime_env": runtime_env,
            "args": {"llm_configs": [llm],
                     # Ray counts logical CPUs: its ingress's default whole CPU would not fit beside the engines.
                     "ingress_deployment_config": {"ray_actor_options": {"num_cpus": 0.1}}}}


def observed_lengths(records: list[RunRecord]) -> list[RunRecord]:
    """Records of a trace whose true lengths are unknown (ShareGPT): the length generated stands for it."""
    return [r.model_copy(update={"true_output_tokens": r.completion_tokens or 0}) for r in records]


KEPT = ("mean_jct_s", "p50_jct_s", "p99_jct_s", "short_p99_jct_s", "mean_ttft_s", "p50_ttft_s", "p99_ttft_s",
        "throughput_tok_s", "makespan_s", "ranked_share", "queued_share", "predictor_latency_p50_s",
        "predictor_latency_p99_s", "completed", "failed")


def keep(summary: dict) -> dict:
    return {k: summary.get(k) for k in KEPT}


def spread(repeats: list[dict], policy: str, metric: str, baseline: str = "ray_default") -> dict | None:
    """A policy's change against the baseline in each repeat (the same trace, run back to back)."""
    changes = [rep[policy][metric] / rep[baseline][metric] - 1 for rep in repeats
               if policy in rep and baseline in rep and rep[policy].get(metric) and rep[baseline].get(metric)]
    if not changes:
        return None
    return {"median": float(np.median(changes)), "min": float(min(changes)), "max": float(max(changes)),
            "each": changes}
