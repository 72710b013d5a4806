"""The simulator against the real stack: real runs replayed through the same scheduling code.

Each real run left its per-request records (benchmarks.replay.runs; rollouts: their samples).
A replay gives the simulator the same requests: the same arrivals (when each was sent), prompts,
lengths (what the engine really generated), the same policy deciding through the router's
scheduling core, ranking each request by what the real router knew when it dispatched it (a
told length, or a prediction that landed in time; otherwise the prior), and the stack's replica
choice. Only the engines' timing is the model's: the step-time model calibrated on one engine
in-process, scaled by what the deployed serving path adds, fitted on some runs:
- `const`, `decode`, `prefill`, `kv`: factors on the calibrated step terms (two engines, the
  router, the predictor and the clients share two cores; the deployed engines run out of
  process). Attention over the KV cache has its own factor: tied to the per-sequence work, the
  fit made long-context steps as slow as bursts need and timed half-full batches 38% slow;
- the HTTP and Ray hops before the router sees a request and after the engine emits a token
  (benchmarks.simulator.hops), measured on the fit runs (the router's request log against the
  client's clock);
- `predictor`: how much longer the engines' steps take while the predictor prefills on the same
  cores (when it did is each run's record: from a request reaching the router to its prediction
  landing). Set, not fitted: three busy threads on two cores make it 1.5. Fitted on the one fit
  run that has the predictor it came out 2.43 and doubled the held-out runs' last_work loss;
- the machine: sessions get machines up to 2-3x apart in speed. A probed run (benchmarks.replay.probe:
  before it started, and after it in later runs) is timed at its probed step time (the mean of
  its readings) against the same probe (as many
  requests at once) simulated with the fitted factors (what the probe would have measured on the
  fit runs' machines); runs made before runs were probed are timed at the fit's speed.
Prefix-cache hits are the engine model's (a rollout's samples share their prompt).

Runs are split into fit runs and held-out runs; the errors reported (per request: JCT, TTFT and
time per output token, median and p90 of the relative error; aggregate: mean and p99 JCT, mean
TTFT, throughput, makespan, relative and signed) are the held-out runs', with the fit's beside
them. Where the real runs resolve a policy difference beyond their repeats' spread, the
simulator must get its sign right.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from benchmarks.replay.probe import Probe
from benchmarks.replay.runs import RunRecord
from benchmarks.simulator.cluster import ClusterSpec, simulate, simulate_rollout
from benchmarks.simulator.fit import Fit
from benchmarks.simulator.hops import WINDOW_S, Hops, measure
from benchmarks.simulator.setup import SINGLE_POOL, Setup
from benchmarks.simulator.step_time import StepTimeModel
from benchmarks.simulator.workload import Workload
from router.scheduling.request import Prediction, Request

PREDICTOR_SLOWDOWN = 1.5  # two engines and the predictor, one thread each, on two cores
AGGREGATES = ("mean_jct_s", "p99_jct_s", "mean_ttft_s", "throughput_tok_s", "makespan_s")
FULL_BATCH = 12  # requests decoding per engine (of 16 slots) from which a run counts as a full-batch run


@dataclass
class Run:
    """A real run to replay: its name, kind, requests, and what the client measured."""

    name: str
    kind: str  # "online" (router or stock app) or a rollout schedule ("fifo", "makespan")
    policy: str  # the routing policy the router decided by (the stock app: ray_default)
    choice: str  # the replica choice in front of the engines
    requests: list[Request]
    output: np.ndarray  # tokens each really generated
    arrival: np.ndarray  # client clock: when the trace says it arrived (a rollout: 0)
    first_token: np.ndarray  # client clock
    finish: np.ndarray
    predictor_busy: list[tuple[float, float]]  # client clock: when the predictor was prefilling
    probe: Probe | None = None  # the machine's speed just before the run (None: not probed)
    k: int | None = None  # a first-k rollout's k

    def workload(self, hops: Hops) -> Workload:
        """Fresh records (a simulation fills them), reaching the router when the hops bring them."""
        arrivals = hops.router_arrivals(np.array([r.arrival for r in self.requests]))
        return Workload([replace(r, arrival=float(a)) for r, a in zip(self.requests, arrivals)], self.output)


def online_run(name: str, records: list[RunRecord]) -> Run:
    """A burst or load run of the router (or the stock app, whose records have no router side),
    each request with what the router knew of it: its told length, the client's hint, and the
    prediction where it landed before the request left the queue."""
    ok = sorted((r for r in records if r.status == "ok"), key=lambda r: (r.sent_s, r.request_id))
    policy = ok[0].decided_by or "ray_default"
    requests = []
    for r in ok:
        told = {"ceiling": r.ceiling_tokens, "oracle_work": r.true_output_tokens, "oracle": r.true_output_tokens}
        landed = r.prediction_landed == "before_dispatch" and r.predicted_tokens is not None
        requests.append(Request(
            r.request_id, policy, arrival=r.sent_s, prompt_tokens=r.prompt_tokens, max_tokens=1024,
            told_tokens=told.get(policy), hint_tokens=r.hint_tokens, family=r.request_id,
            prediction=Prediction("last", float(r.predicted_tokens), {}, SINGLE_POOL, {}) if landed else None))
    stock = ok[0].decided_by is None
    return Run(name, "online", policy, "power_of_two" if stock else "least_inflight", requests,
               np.array([r.completion_tokens for r in ok]), np.array([r.arrival_s for r in ok]),
               np.array([r.first_token_s for r in ok]), np.array([r.finish_s for r in ok]),
               merged([(r.router_arrival_s, r.predicted_s) for r in ok if r.predicted_s is not None]))


def merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, disjoint: the union of the intervals."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def rollout_run(name: str, samples: list[dict], schedule: str, prompt_tokens: list[int], max_tokens: int = 1024,
                k: int | None = None) -> Run:
    """A /v1/rollout call: every sample there at the start, each with the estimate its plan used.
    A continued sample's prompt is its prompt and what it had generated; a sample cut by first-k
    (`k`) is given its cap as its length, since it would have run on had the simulation not cut it."""
    ok = [s for s in samples if s["error"] is None]
    requests = [Request(f"{s['prompt_index']}/{s['sample_index']}", "rollout",
                        prompt_tokens=prompt_tokens[s["prompt_index"]] + s.get("resumed_tokens", 0),
                        max_tokens=max_tokens - s.get("resumed_tokens", 0), family=s["prompt_index"],
                        told_tokens=None if s["estimated_tokens"] is None else round(s["estimated_tokens"]))
                for s in ok]
    output = [max_tokens - s.get("resumed_tokens", 0) if s.get("status") == "cut" else s["completion_tokens"] for s in ok]
    return Run(name, schedule, "ray_default", "least_inflight", requests, np.array(output), np.zeros(len(ok)),
               np.array([s["first_token_s"] for s in ok], float), np.array([s["finished_s"] for s in ok], float), [], k=k)


def simulated(run: Run, setup: Setup, fit: Fit, replicas: int, per_replica: int) -> tuple[np.ndarray, np.ndarray]:
    """(first token, finish) per request on the client's clock, as the simulator has them."""
    spec = ClusterSpec(pools=[SINGLE_POOL], replicas={SINGLE_POOL: replicas}, max_ongoing_requests=per_replica,
                       replica_choice=run.choice, predictor_busy=run.predictor_busy, predictor_slowdown=fit.predictor)
    model = fit.model(setup.model, run.probe)
    workload = run.workload(fit.hops if run.kind == "online" else Hops())
    if run.kind != "online":  # a rollout's times are the router's own, from the batch's start
        out = simulate_rollout(workload, run.kind, spec, setup.limits, model, k=run.k)
        return out.first_token, out.finish
    scheduler = setup.scheduler(run.policy, spec, bounded=False)
    out = simulate(workload, scheduler, spec, setup.limits, model, setup.config.model.max_model_len)
    return out.first_token + fit.delay_out_s, out.finish + fit.delay_out_s


def metrics(arrival: np.ndarray, first: np.ndarray, finish: np.ndarray, tokens: np.ndarray) -> dict:
    """Over the requests that ran: a first-k sample cut before it started has no times (NaN)."""
    jct, ttft = finish - arrival, first - arrival
    span = np.nanmax(finish) - arrival.min()
    return {"mean_jct_s": float(np.nanmean(jct)), "p99_jct_s": float(np.nanpercentile(jct, 99)),
            "mean_ttft_s": float(np.nanmean(ttft)), "throughput_tok_s": float(tokens.sum() / span),
            "makespan_s": float(span)}


def _tpot(first: np.ndarray, finish: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    return (finish - first) / np.maximum(tokens - 1, 1)


def compare(run: Run, setup: Setup, fit: Fit, replicas: int = 2, per_replica: int = 16) -> dict:
    """Real against simulated: per-request relative errors and the aggregates' signed errors."""
    first, finish = simulated(run, setup, fit, replicas, per_replica)
    real = metrics(run.arrival, run.first_token, run.finish, run.output)
    sim = metrics(run.arrival, first, finish, run.output)
    per_request = {}
    for name, r, s in (("jct", run.finish - run.arrival, finish - run.arrival),
                       ("ttft", run.first_token - run.arrival, first - run.arrival),
                       ("tpot", _tpot(run.first_token, run.finish, run.output), _tpot(first, finish, run.output))):
        ran = np.isfinite(s) & np.isfinite(r)  # started in both: the others have no time to compare
        signed = (s[ran] - r[ran]) / np.maximum(r[ran], 1e-3)
        per_request[name] = {"median": float(np.median(np.abs(signed))), "p90": float(np.percentile(np.abs(signed), 90)),
                             "signed_median": float(np.median(signed))}
    fixed, work = fit.machine(setup.model, run.probe)
    return {"requests": len(run.requests), "real": real, "simulated": sim,
            "error": {k: sim[k] / real[k] - 1 for k in AGGREGATES}, "per_request": per_request,
            "decoding_per_engine": decoding_per_engine(run.first_token, run.finish, replicas),
            "machine": {"fixed": fixed, "work": work}}


def decoding_per_engine(first: np.ndarray, finish: np.ndarray, replicas: int) -> float:
    """How many requests an engine decoded at once on average over the run (Little's law on the
    decode phase): where the step-time model errs depends on it, since the factors are global."""
    return float(np.nansum(finish - first) / (np.nanmax(finish) - np.nanmin(first)) / replicas)


def probe_step_s(setup: Setup, fit: Fit, prompt_tokens: int, size: int) -> float:
    """The speed probe simulated: `size` requests at once on the two engines, the median time
    between a request's tokens, as the fit's factors time them (unscaled: the fit's machines)."""
    from benchmarks.replay.probe import PROBE_TOKENS

    requests = [Request(f"probe{i}", "ray_default", arrival=0.0, prompt_tokens=prompt_tokens, max_tokens=PROBE_TOKENS)
                for i in range(size)]
    zeros = np.zeros(size)
    probe = Run("probe", "online", "ray_default", "least_inflight", requests, np.full(size, PROBE_TOKENS),
                zeros, zeros, zeros, [])
    first, finish = simulated(probe, setup, replace(fit, references={}), 2, 16)
    return float(np.median((finish - first) / (PROBE_TOKENS - 1)))


def fit_scales(runs: list[Run], setup: Setup, hops: Hops, probe_tokens: int, probe_sizes: set[int]) -> Fit:
    """The step-time factors that make the fit runs' requests finish when they really did
    (least squares on log JCT and log TTFT per request), the hops' delays measured. The reference
    speed is the probe as the factors time it, not the fit runs' own probes: so runs made before
    runs were probed can still be the fit, and a probed fit run's overall speed is its probe's
    (the factors then set only how a step's time splits over its terms)."""
    from scipy.optimize import minimize

    def fitted(x: np.ndarray) -> Fit:
        const, decode, prefill, kv = np.exp(x)
        fit = Fit(const, decode, prefill, kv, hops.in_s, hops.in_per_request_s, hops.out_s,
                  predictor=PREDICTOR_SLOWDOWN, probe_prompt_tokens=probe_tokens)
        return replace(fit, references={n: probe_step_s(setup, fit, probe_tokens, n) for n in sorted(probe_sizes)})

    def loss(x: np.ndarray) -> float:
        fit = fitted(x)
        total = 0.0
        for run in runs:
            first, finish = simulated(run, setup, fit, 2, 16)
            total += np.mean(np.log((finish - run.arrival) / (run.finish - run.arrival)) ** 2)
            total += 0.5 * np.mean(np.log(np.maximum(first - run.arrival, 1e-3)
                                          / np.maximum(run.first_token - run.arrival, 1e-3)) ** 2)
        return total / len(runs)

    # Scipy's default first simplex around 0 is 0.00025 wide, where the loss barely moves: the
    # search stopped at once. Half a unit of log factor each way instead.
    simplex = np.vstack([np.zeros(4), 0.5 * np.eye(4)])
    best = minimize(loss, np.zeros(4), method="Nelder-Mead",
                    options={"initial_simplex": simplex, "xatol": 1e-2, "fatol": 1e-4, "maxiter": 300})
    return fitted(best.x)


def measured_hops(records: list[list[RunRecord]]) -> Hops:
    """The fit runs' client send -> router, and router's first token -> client's."""
    arrived = [[r for r in rs if r.router_arrival_s is not None] for rs in records]
    out = [r.first_token_s - r.router_first_token_s for rs in records for r in rs
           if r.router_first_token_s is not None and r.first_token_s is not None]
    return measure([np.array([r.sent_s for r in rs]) for rs in arrived],
                   [np.array([r.router_arrival_s for r in rs]) for rs in arrived], np.array(out))


def same_workload(runs: dict[str, Run], setup: Setup, fit: Fit) -> dict[str, list[float]]:
    """Per "<workload>/<policy>": the policy's change against its baseline on each of its runs' own
    realized workload, that run (its lengths, predictions, predictor time) simulated both ways: an
    online policy's mean JCT against ray_default, a longest-first rollout's makespan against fifo.
    Unseeded runs of one trace generate different lengths (the dataset burst 56k to 68k tokens, an
    RL batch 26k to 29k), which moves the figures as much as the order does; vLLM's CPU engines
    cannot seed a request, so only the simulator can pair two policies on one workload. Both sides
    are simulated here, on one machine model: set against a replay timed another way (the two-size
    probe split beside the full probe) the pair differed by up to 10% where nothing queued."""
    out: dict[str, list[float]] = defaultdict(list)
    for name, run in runs.items():
        if run.kind == "online" and run.policy != "ray_default" and run.choice == "least_inflight":
            blind = replace(run, policy="ray_default", predictor_busy=[],
                            requests=[replace(r, policy="ray_default", prediction=None) for r in run.requests])
            metric = "mean_jct_s"
        elif run.kind == "makespan":
            blind, metric = replace(run, kind="fifo"), "makespan_s"
        else:
            continue
        as_run, as_blind = (metrics(run.arrival, *simulated(r, setup, fit, 2, 16), run.output)[metric]
                            for r in (run, blind))
        out[name.rsplit("/", 1)[0]].append(as_run / as_blind - 1)
    return dict(out)


def sign_agreement(real: dict[str, list[dict]], sim: dict[str, list[dict]], baseline: str = "ray_default",
                   metric: str = "mean_jct_s") -> dict:
    """Per (workload, policy): the real change against the baseline over repeats, and whether the
    simulator's change has the same sign wherever the real one exceeds the repeats' spread."""
    rows, agree, resolved = [], 0, 0
    by_workload = defaultdict(dict)
    for key, values in real.items():
        workload, policy = key.rsplit("/", 1)
        by_workload[workload][policy] = values
    for workload, policies in by_workload.items():
        if baseline not in policies:
            continue
        base_real = np.array([v[metric] for v in policies[baseline]])
        base_sim = np.array([v[metric] for v in sim[f"{workload}/{baseline}"]])
        for policy, values in policies.items():
            if policy == baseline:
                continue
            n = min(len(values), len(base_real))
            changes = np.array([v[metric] for v in values[:n]]) / base_real[:n] - 1
            sim_change = float(np.mean(np.array([v[metric] for v in sim[f"{workload}/{policy}"][:n]]) / base_sim[:n] - 1))
            beyond = bool(np.all(changes > 0) or np.all(changes < 0)) and n > 1
            same = np.sign(sim_change) == np.sign(np.mean(changes))
            rows.append({"workload": workload, "policy": policy, "real_changes": changes.tolist(),
                         "simulated_change": sim_change, "resolved": beyond, "same_sign": bool(same)})
            resolved += beyond
            agree += bool(beyond and same)
    return {"agree": agree, "of": resolved, "rows": rows}


def write(result: dict, out: Path) -> None:
    (out / "simulator_validation.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "simulator_validation.md").write_text(markdown(result))


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def markdown(result: dict) -> str:
    fit = result["fit"]
    lines = ["# The simulator against the real stack", "",
             "Generated by `python -m benchmarks.simulator validate`. Real runs' per-request records replayed through "
             "the router's own scheduling code (the same arrivals, prompts, generated lengths and policies; ranks as "
             "the real router knew them at dispatch; the stack's replica choice); only the engines' timing is the "
             "model's. Fitted on the fit runs: step-time factors const x{const:.2f}, decode x{decode:.2f}, prefill "
             "x{prefill:.2f}, attention over the KV cache x{kv:.2f} on the single-engine calibration; x{predictor:.2f} "
             "while the predictor prefills on the engines' cores (set: three busy threads on two cores); measured "
             "hops: in, {delay_in_s:.3f} s plus {per_ms:.1f} ms for each other request sent within {window:.0f} s of "
             "it (a burst of 128: {burst:.2f} s); out, {delay_out_s:.3f} s.".format(
                 **fit, per_ms=1000 * fit["delay_in_per_request_s"], window=WINDOW_S,
                 burst=fit["delay_in_s"] + 127 * fit["delay_in_per_request_s"]) + (
                 " The fitted model times the speed probe (benchmarks.replay.probe) at "
                 + ", ".join(f"{step:.3f} s per step with {size} requests at once" for size, step in fit["references"].items())
                 + ": the fit runs' machines. A probed run is timed at its own probe against the probe of its size; "
                 "runs made before runs were probed at the fit's speed." if fit.get("references") else ""), "",
             f"Fit runs: {', '.join(result['fit_runs'])}.", "",
             f"Held-out runs: {', '.join(result['held_out_runs'])}.", "",
             "## Aggregate error on the held-out runs (simulated / real - 1)", "",
             "Noise floor: how far one real run lands from the mean of its own repeats (same trace and policy), "
             "averaged; a simulator that predicted every mean exactly would still err this much on single runs.", "",
             "| metric | mean signed error | mean absolute error | worst | noise floor | target |",
             "|---|---|---|---|---|---|"]
    noise = result.get("noise_floor", {})
    for metric, e in result["aggregate"].items():
        floor = noise.get(metric)
        lines.append(f"| {metric} | {_pct(e['signed'])} | {100 * e['absolute']:.1f}% | {_pct(e['worst'])} | "
                     f"{'-' if floor is None else f'{100 * floor:.1f}%'} | "
                     f"{'held' if e['absolute'] <= 0.10 else 'MISSED'} (<= 10%) |")
    if result.get("aggregate_probed"):
        lines += ["", f"The {len(result['probed_held_out_runs'])} probed held-out runs alone "
                  f"({', '.join(result['probed_held_out_runs'])}), timed at their probe and at the fit's speed "
                  "(mean absolute error):", "", "| metric | at their probe | at the fit's speed |", "|---|---|---|"]
        for metric, e in result["aggregate_probed"].items():
            lines.append(f"| {metric} | {100 * e['absolute']:.1f}% ({_pct(e['signed'])}) | "
                         f"{100 * result['aggregate_probed_unscaled'][metric]['absolute']:.1f}% "
                         f"({_pct(result['aggregate_probed_unscaled'][metric]['signed'])}) |")
    if result.get("aggregate_two_size"):
        split_jct = result["aggregate_two_size"]["mean_jct_s"]["absolute"]
        full_jct = result["aggregate_two_size_full_probe"]["mean_jct_s"]["absolute"]
        lines += ["", f"The {len(result['two_size_held_out_runs'])} held-out runs probed at two batch sizes "
                  f"({', '.join(result['two_size_held_out_runs'])}), timed as above (one factor from the full "
                  "probe) and with their machine split by both readings into a slowdown of the step's fixed cost "
                  f"and one of its per-sequence work (mean absolute error; not used: most probed runs have one size; "
                  f"here it errs {'less' if split_jct < full_jct else 'more'} on mean JCT). The split "
                  "(fixed / work): " + ", ".join(f"{n} x{m['fixed']:.2f} / x{m['work']:.2f}"
                                                 for n, m in result["two_size_machines"].items()) + ".", "",
                  "| metric | full probe only | split |", "|---|---|---|"]
        for metric, e in result["aggregate_two_size"].items():
            one = result["aggregate_two_size_full_probe"][metric]
            lines.append(f"| {metric} | {100 * one['absolute']:.1f}% ({_pct(one['signed'])}) | "
                         f"{100 * e['absolute']:.1f}% ({_pct(e['signed'])}) |")
    sa = result["sign_agreement"]
    lines += ["", f"Sign of every policy difference the real runs resolve beyond their repeats' spread (all "
              f"repeats, fit runs too: the fit sets four global factors, no policy's difference): "
              f"{sa['agree']} of {sa['of']} agree.", ""]
    full, partial = result["tpot_by_batch"]["full"], result["tpot_by_batch"]["partial"]
    lines += [f"Time per output token by batch, held-out runs (median of each run's median signed error): "
              f"{full['runs']} runs decoding {FULL_BATCH} or more requests per engine {_pct(full['signed_median'])}, "
              f"{partial['runs']} runs decoding fewer {_pct(partial['signed_median'])}.", "",
              "## Per run", "",
              "| run | set | requests | mean JCT real / sim | p99 JCT | mean TTFT | tok/s | makespan | "
              "JCT error p50 / p90 | TTFT error p50 / p90 | TPOT error p50 / p90 | decoding per engine | "
              "TPOT signed p50 | machine: fixed / work |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, c in result["runs"].items():
        r, s, pr = c["real"], c["simulated"], c["per_request"]
        pair = lambda k: f"{r[k]:.1f} / {s[k]:.1f}"
        lines.append(f"| {name} | {c['set']} | {c['requests']} | {pair('mean_jct_s')} | {pair('p99_jct_s')} | "
                     f"{pair('mean_ttft_s')} | {pair('throughput_tok_s')} | {pair('makespan_s')} | "
                     + " | ".join(f"{100 * pr[k]['median']:.0f}% / {100 * pr[k]['p90']:.0f}%" for k in ("jct", "ttft", "tpot"))
                     + f" | {c['decoding_per_engine']:.1f} | {_pct(pr['tpot']['signed_median'])} | "
                     f"x{c['machine']['fixed']:.2f} / x{c['machine']['work']:.2f} |")
    lines += ["", "## Policy differences (mean JCT against ray_default)", "",
              "Real and simulated: each policy's runs against ray_default's runs of the same repeat (two "
              "workloads: every generation is a fresh draw). Same workload: each of the policy's runs "
              "simulated as it ran and as ray_default, on its own generated lengths: the order's effect alone.", "",
              "| workload | policy | real, each repeat | simulated | same workload, simulated | resolved | same sign |",
              "|---|---|---|---|---|---|---|"]
    for row in sa["rows"]:
        paired = row.get("same_workload_changes") or []
        lines.append(f"| {row['workload']} | {row['policy']} | {', '.join(_pct(c) for c in row['real_changes'])} | "
                     f"{_pct(row['simulated_change'])} | {', '.join(_pct(c) for c in paired) or '-'} | "
                     f"{'yes' if row['resolved'] else 'no'} | {'yes' if row['same_sign'] else 'no'} |")
    lines += _paired_table("Rollout schedules on their own lengths (makespan against fifo)",
                           "Each longest-first rollout run simulated as it ran and in the batch's order, on its own "
                           "generated lengths.", sa.get("rollouts_same_workload", {}))
    lines += _paired_table("Sides against the stock app on their own lengths (mean JCT against ray_default)",
                           "Each run of a side compared with Ray Serve LLM's app simulated as it ran and as "
                           "ray_default on our stack, on its own generated lengths: the order's part of its change.",
                           sa.get("stock_comparisons_same_workload", {}))
    return "\n".join(lines) + "\n"


def _paired_table(title: str, text: str, paired: dict[str, list[float]]) -> list[str]:
    """A section of same-workload changes, one row per scenario/side."""
    return (["", f"## {title}", "", text, "", "| scenario/side | each run |", "|---|---|"]
            + [f"| {key} | {', '.join(_pct(c) for c in changes)} |" for key, changes in paired.items()])


def aggregate(compared: dict[str, dict], names: list[str]) -> dict:
    out = {}
    for metric in AGGREGATES:
        errors = [compared[n]["error"][metric] for n in names]
        out[metric] = {"signed": float(np.mean(errors)), "absolute": float(np.mean(np.abs(errors))),
                       "worst": float(max(errors, key=abs))}
    return out


def summary_json(fit: Fit, fit_runs: list[str], held_out: list[str], compared: dict, agreement: dict,
                 noise: dict, probed: list[str], unscaled: dict[str, dict], split: list[str],
                 with_split: dict[str, dict]) -> dict:
    return {"fit": asdict(fit), "fit_runs": fit_runs, "held_out_runs": held_out,
            "aggregate": aggregate(compared, held_out), "aggregate_fit": aggregate(compared, fit_runs),
            # The held-out runs timed at their own machine's probe, alone, and as if on the fit's
            # machines: what the probe buys.
            "probed_held_out_runs": probed, "aggregate_probed": aggregate(compared, probed) if probed else None,
            "aggregate_probed_unscaled": aggregate(unscaled, probed) if probed else None,
            # The held-out runs probed at two sizes, timed with their machine split by both readings.
            "two_size_held_out_runs": split, "aggregate_two_size": aggregate(with_split, split) if split else None,
            "aggregate_two_size_full_probe": aggregate(compared, split) if split else None,
            "two_size_machines": {n: with_split[n]["machine"] for n in split},
            "sign_agreement": agreement, "noise_floor": noise, "tpot_by_batch": tpot_by_batch(compared, held_out),
            "runs": {n: {**c, "set": "fit" if n in fit_runs else "held out"} for n, c in compared.items()}}


def tpot_by_batch(compared: dict[str, dict], names: list[str]) -> dict:
    """The held-out runs' median signed TPOT error, for runs that decoded at full batches and for
    those that did not: the step-time factors are global, so an error that depends on the batch
    shows here and not in the aggregate."""
    out = {}
    for band, keep in (("full", lambda b: b >= FULL_BATCH), ("partial", lambda b: b < FULL_BATCH)):
        errors = [compared[n]["per_request"]["tpot"]["signed_median"] for n in names
                  if keep(compared[n]["decoding_per_engine"])]
        out[band] = {"runs": len(errors), "signed_median": float(np.median(errors)) if errors else None}
    return out


def load_runs(runs_dir: Path) -> dict[str, Run]:
    """Every real run on disk (runs/<scenario>/<side>__r<k>.jsonl) that answered all its requests:
    bursts and loads (the client's records joined with the router's) and rollouts (their samples)."""
    from benchmarks.replay.probe import read_probe
    from benchmarks.replay.runs import read_run, run_name
    from benchmarks.rollouts import rl_prompt_tokens
    from benchmarks.scenarios import SCENARIOS

    runs = {}
    for path in sorted(runs_dir.rglob("*__r*.jsonl")):
        name = run_name(path, runs_dir)
        scenario = SCENARIOS.get(name.split("/")[0])
        if scenario is not None and scenario.kind == "rollout":
            samples = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            _, side_name, repeat = name.split("/")
            side, tokens = scenario.side(side_name), rl_prompt_tokens(scenario.workload.prompts)
            for call in sorted({s.get("call", 1) for s in samples}):  # a partial side's continuation is a call of its own
                called = f"{scenario.name}/{side_name}{'' if call == 1 else '_continued'}/{repeat}"
                run = rollout_run(called, [s for s in samples if s.get("call", 1) == call], side.schedule,
                                  tokens, scenario.workload.max_tokens, side.k)
                runs[called] = replace(run, probe=read_probe(path))  # taken before the first call
            continue
        records = read_run(name, runs_dir)
        # The simulator has no queue bound: replaying only the answered part of a run whose router
        # turned requests away (503 after request_timeout_s) would replay another workload.
        if any(r.status != "ok" for r in records):
            continue
        runs[name] = replace(online_run(name, records), probe=read_probe(path))
    return runs


def validate(setup: Setup, runs: dict[str, Run], fit_names: list[str], records: dict[str, list[RunRecord]],
             fit: Fit | None = None) -> dict:
    """Fit on `fit_names` (unless given the fit those runs gave before), compare every run, and
    judge the held-out ones."""
    from benchmarks.replay.probe import probe_prompt_tokens
    from benchmarks.scenarios import SCENARIOS

    if fit is None:
        hops = measured_hops([records[n] for n in fit_names if n in records])
        probe_tokens = probe_prompt_tokens(setup.config.model.source)
        probe_sizes = {size for run in runs.values() if run.probe
                       for size in (run.probe.requests, run.probe.small_requests) if size}
        fit = fit_scales([runs[n] for n in fit_names], setup, hops, probe_tokens, probe_sizes)
    # Timed at the full probe alone, as every probed run can be: the two-size split (Fit.machine),
    # which only the later runs can have, is reported beside (docs/benchmarks.md).
    timed = {name: full_probe_only(run) for name, run in runs.items()}
    compared = {name: compare(run, setup, fit) for name, run in timed.items()}
    held_out = [n for n in runs if n not in fit_names]
    real, sim = defaultdict(list), defaultdict(list)
    # Every repeat of a workload and policy, fit runs too: the fit sets four global step-time
    # factors, never a policy's difference, and one held-out repeat alone resolves nothing.
    for name in runs:
        workload_policy = name.rsplit("/", 1)[0]
        real[workload_policy].append(compared[name]["real"])
        sim[workload_policy].append(compared[name]["simulated"])
    agreement = sign_agreement(real, sim)
    paired = same_workload(timed, setup, fit)
    for row in agreement["rows"]:
        row["same_workload_changes"] = paired.get(f"{row['workload']}/{row['policy']}", [])
    kinds = {name.rsplit("/", 1)[0]: run.kind for name, run in timed.items()}
    agreement["rollouts_same_workload"] = {k: v for k, v in paired.items() if kinds[k] == "makespan"}
    # Sides run beside the stock app have no ray_default run to pair with: their order's part alone.
    against_stock = {name for name, scenario in SCENARIOS.items() if any(s.app == "stock" for s in scenario.sides)}
    agreement["stock_comparisons_same_workload"] = {
        k: v for k, v in paired.items() if kinds[k] == "online" and k.split("/")[0] in against_stock}
    probed = [n for n in held_out if runs[n].probe]
    unscaled = {n: compare(replace(runs[n], probe=None), setup, fit) for n in probed}
    split = [n for n in probed if runs[n].probe.small_requests]
    with_split = {n: compare(runs[n], setup, fit) for n in split}
    return summary_json(fit, fit_names, held_out, compared, agreement, noise_floor(real), probed, unscaled,
                        split, with_split)


def full_probe_only(run: Run) -> Run:
    return run if run.probe is None else replace(run, probe=replace(run.probe, small_requests=None))


def noise_floor(real: dict[str, list[dict]]) -> dict:
    """How far one real run lands from the mean of its repeats (same workload, policy and trace),
    averaged over the pairs with repeats: the error a simulator that predicted each mean exactly
    would still show against single runs."""
    out = {}
    for metric in AGGREGATES:
        deviations = [abs(run[metric] / np.mean([r[metric] for r in runs]) - 1)
                      for runs in real.values() if len(runs) > 1 for run in runs]
        out[metric] = float(np.mean(deviations)) if deviations else None
    return out
