"""Results files and the README's results table, rebuilt from the per-request records on disk.

`write(report)` reads every run of the scenarios that report into (benchmarks.scenarios), and
writes benchmarks/results/<report>.json, .md and .png: per scenario, each repeat's figures per
side, every side's change against the baseline (median, min, max over the repeats: the same
trace, run back to back), the targets held or missed, and the requests lost. Then it rebuilds the
README's results table, whose every number comes from a results JSON, so the front page cannot
drift from the runs. Nothing here is measured: a report can be rebuilt at any time, by
`python -m benchmarks report`.

Definitions, once: JCT is arrival to last token; throughput is completed output tokens over the
first arrival to the last finish; short requests are those whose true length (the dataset's; a
ShareGPT request's own generated length) is at or below the trace's 25th percentile.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from benchmarks import rollouts
from benchmarks.replay.probe import read_probe
from benchmarks.replay.runs import RunRecord, read_run, run_path, runs_of, summary
from benchmarks.replay.stack import REPO
from benchmarks.scenarios import SCENARIOS, Scenario, Target

RESULTS = REPO / "benchmarks" / "results"
README = REPO / "README.md"
KEPT = ("mean_jct_s", "p50_jct_s", "p99_jct_s", "short_p99_jct_s", "short_answer_mean_jct_s", "mean_ttft_s",
        "throughput_tok_s", "output_tokens", "makespan_s", "queued_share", "ranked_share", "predictor_latency_p50_s",
        "arrival_order_kept", "completed", "failed")
CHANGED = ("mean_jct_s", "p99_jct_s", "short_p99_jct_s", "short_answer_mean_jct_s", "mean_ttft_s", "throughput_tok_s",
           "makespan_s")
REPEATS_KEY = {"pays_live": "pairs"}  # the name for the repeats of a stock-against-stack comparison


def side_figures(scenario: Scenario, run: str) -> dict:
    """One run's figures: an online run's serving metrics, a rollout's batch figures."""
    if scenario.kind == "rollout":
        samples = [json.loads(line) for line in run_path(run).read_text().splitlines() if line.strip()]
        batch = scenario.workload
        meta = run_path(run).with_suffix(".meta.json")
        return {**rollouts.batch_metrics(samples), **(json.loads(meta.read_text()) if meta.exists() else {}),
                "lost": batch.prompts * batch.n - sum(s.get("call", 1) == 1 for s in samples)}
    records = read_run(run)
    if scenario.workload.trace == "sharegpt":  # no true lengths: what each run generated stands for them
        records = [r.model_copy(update={"true_output_tokens": r.completion_tokens or 0}) for r in records]
    probe = read_probe(run_path(run))
    return {**{k: summary(records).get(k) for k in KEPT}, "probe_step_s": probe.run_step_s if probe else None,
            **budget_figures(records)}


def budget_figures(records: list[RunRecord]) -> dict:
    """How the router's predictor budget decided for the requests that waited (none on the stock
    app): the shares of all its verdicts, and of those it priced (a cheap signal's skip is not
    the budget's), the share it skipped."""
    decisions = [r.prediction_decision for r in records if r.prediction_decision is not None]
    predicted = sum(r.predicted_tokens is not None for r in records)
    if not decisions:
        return {"budget_verdicts": 0, "predicted_requests": predicted}
    priced = [d for d in decisions if d != "skipped_by_signal"]
    return {"budget_verdicts": len(decisions), "predicted_requests": predicted,
            **{f"{d}_share": sum(x == d for x in decisions) / len(decisions) for d in ("predicted", "skipped_by_signal")},
            "skipped_by_budget_share": sum(d == "skipped_by_budget" for d in priced) / len(priced) if priced else None}


def repeats(scenario: Scenario) -> list[dict[str, dict]]:
    """Per repeat on disk, each side's figures (a side without that repeat is left out)."""
    by_repeat: dict[int, dict] = {}
    for side in scenario.sides:
        for run in runs_of(f"{scenario.name}/{side.name}"):
            by_repeat.setdefault(int(run.rsplit("/r", 1)[1]), {})[side.name] = side_figures(scenario, run)
    return [by_repeat[k] for k in sorted(by_repeat)]


def spread(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"median": float(np.median(values)), "min": float(min(values)), "max": float(max(values)),
            "each": [float(v) for v in values]}


def change_of(reps: list[dict], side: str, baseline: str, metric: str) -> dict | None:
    """`side`'s change against `baseline` in each repeat that has both: the same trace back to back."""
    return spread([rep[side][metric] / rep[baseline][metric] - 1 for rep in reps
                   if side in rep and baseline in rep and rep[side].get(metric) and rep[baseline].get(metric)])


def judge(target: Target, changes: dict) -> dict:
    c = changes.get(target.side, {}).get(target.metric)
    values = [] if c is None else c["each"] if target.each else [c["median"]]
    eps = 1e-9  # a change computed as a ratio of floats may miss its bound by the last bit
    held = bool(values) and all(v >= target.bound - eps if target.at_least else v <= target.bound + eps for v in values)
    worst = (min if target.at_least else max)(values) if values else None  # the median, or the worst repeat
    return {"target": target.text(), "value": worst, "held": held}


def scenario_result(scenario: Scenario) -> dict | None:
    reps = repeats(scenario)
    if not reps:
        return None
    metrics = CHANGED if scenario.kind == "online" else ("makespan_s", "mean_jct_s", "throughput_tok_s")
    changes = {s.name: {m: change_of(reps, s.name, scenario.baseline, m) for m in metrics}
               for s in scenario.sides if s.name != scenario.baseline}
    if scenario.report in REPEATS_KEY:  # a pair also names each side's generated tokens: the draw it served
        reps = [{**rep, "generated_tokens": {s: m.get("output_tokens") for s, m in rep.items()}} for rep in reps]
    out = {"question": scenario.question, "workload": vars(scenario.workload), "baseline": scenario.baseline,
           REPEATS_KEY.get(scenario.report, "repeats"): reps, "changes": changes,
           "targets": [judge(t, changes) for t in scenario.targets],
           "lost_requests": sum(rep[s.name].get("lost", 0) for rep in reps for s in scenario.sides if s.name in rep)}
    if scenario.name == "hints":
        hints, ceiling = (changes[s]["mean_jct_s"] for s in ("hints", "ceiling"))
        gain = lambda c: -c["median"] if c else None  # noqa: E731
        out["share_of_ceiling_gain"] = (gain(hints) / gain(ceiling)
                                        if gain(hints) is not None and gain(ceiling) and gain(ceiling) > 0 else None)
    if scenario.name == "calm":
        sides = [rep["default"] for rep in reps if "default" in rep]
        priced = sum(m["budget_verdicts"] * (1 - m.get("skipped_by_signal_share", 0)) for m in sides)
        skipped = sum(m["budget_verdicts"] * (1 - m.get("skipped_by_signal_share", 0)) * m["skipped_by_budget_share"]
                      for m in sides if m.get("skipped_by_budget_share") is not None)
        out["budget_priced_requests"] = round(priced)  # the waiting requests the budget weighed, all repeats
        out["budget_skipped_share"] = skipped / priced if priced else None
        # Where nothing waits the budget is never asked: the share of all requests served with no
        # prediction made is what the calm run saved of the predictor's prefills.
        requests = sum(m["completed"] + m["failed"] for m in sides)
        out["unpredicted_share"] = 1 - sum(m.get("predicted_requests", 0) for m in sides) / requests if requests else None
    return out


def write(report: str) -> dict:
    """Rebuild benchmarks/results/<report>.{json,md,png} and the README's table."""
    scenarios = [s for s in SCENARIOS.values() if s.report == report]
    result = {s.name: r for s in scenarios if (r := scenario_result(s)) is not None}
    if report == "pays_live":
        from benchmarks.apps import default_policy

        result["default_policy"] = {profile: default_policy(profile) for profile in ("cpu", "gpu")}
    if report == "rollout":
        result.update(rollout_summary(result))
    result["lost_requests"] = sum(v.get("lost_requests", 0) for v in result.values() if isinstance(v, dict))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{report}.json").write_text(json.dumps(result, indent=1) + "\n")
    (RESULTS / f"{report}.md").write_text(markdown(report, scenarios, result))
    plot(report, scenarios, result)
    update_readme()
    return result


def rollout_summary(result: dict) -> dict:
    """The rollout results in the shape issue 43 asks for, each repeat flat, beside the simulator's
    makespan error on these scenarios' runs (simulator_validation.json)."""
    def flat(name: str, fields: dict[str, tuple[str, str]]) -> list[dict]:
        return [{key: rep.get(side, {}).get(metric) for key, (side, metric) in fields.items()}
                for rep in result.get(name, {}).get("repeats", [])]

    out = {
        "history": {"repeats": flat("rollout_history", {"fifo_makespan_s": ("fifo", "makespan_s"),
                                                        "history_makespan_s": ("history", "makespan_s"),
                                                        "ceiling_makespan_s": ("ceiling", "makespan_s")})},
        "first_k": {"k": SCENARIOS["rollout_first_k"].side("first_k").k, "n": SCENARIOS["rollout_first_k"].workload.n,
                    "repeats": flat("rollout_first_k", {"full_fifo_makespan_s": ("fifo", "makespan_s"),
                                                        "first_k_makespan_s": ("first_k", "makespan_s"),
                                                        "inflight_zero_after_s": ("first_k", "inflight_zero_after_s")})},
        "partial": {"repeats": [{"full_makespan_s": rep.get("fifo", {}).get("makespan_s"),
                                 "partial_makespan_s": (rep.get("partial", {}).get("calls") or [None])[0],
                                 "continued_makespan_s": ((rep.get("partial", {}).get("calls") or [None, None]) + [None])[1],
                                 "tokens_full": rep.get("fifo", {}).get("output_tokens"),
                                 "tokens_partial_plus_continued": rep.get("partial", {}).get("output_tokens")}
                                for rep in result.get("rollout_partial", {}).get("repeats", [])]},
    }
    gains = [(1 - h / f, 1 - c / f) for r in out["history"]["repeats"]
             if None not in (f := r["fifo_makespan_s"], h := r["history_makespan_s"], c := r["ceiling_makespan_s"])]
    ceiling_gain = float(np.median([c for _, c in gains])) if gains else None
    out["history"]["share_of_ceiling_gain"] = (float(np.median([h for h, _ in gains])) / ceiling_gain
                                               if ceiling_gain and ceiling_gain > 0 else None)
    validation = RESULTS / "simulator_validation.json"
    if validation.exists():
        runs = json.loads(validation.read_text())["runs"]
        errors = [abs(r["error"]["makespan_s"]) for name, r in runs.items()
                  if name.startswith("rollout_") and r["set"] == "held out"]
        out["simulator_makespan_error"] = float(np.mean(errors)) if errors else None
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def _range(c: dict | None) -> str:
    return "-" if c is None else f"{_pct(c['median'])} [{_pct(c['min'])}, {_pct(c['max'])}]"


def _num(x) -> str:
    return "-" if x is None else f"{x:.3g}" if isinstance(x, float) else str(x)


def markdown(report: str, scenarios: list[Scenario], result: dict) -> str:
    lines = [f"# {report}", "", f"Generated by `python -m benchmarks report {report}` from the per-request records "
             "under `runs/` (benchmarks/scenarios.py has each scenario's definition; docs/benchmarks.md how to rerun "
             "it). Changes are against the scenario's baseline, median [min, max] over the repeats. Bursts run "
             "before 2026-12-06 went out at one instant (their stack runs show `arrival_order_kept` as -): the "
             "order each run served was a coin flip worth about 10% of mean JCT (docs/benchmarks.md, How to read "
             "a result).", ""]
    for scenario in scenarios:
        block = result.get(scenario.name)
        lines += [f"## {scenario.name}", "", scenario.question + ".", "",
                  "Workload: " + ", ".join(f"{k} {v}" for k, v in vars(scenario.workload).items()) + "."]
        if block is None:
            lines += ["", "Not run yet.", ""]
            continue
        sides = [s.name for s in scenario.sides]
        reps = [{s: rep[s] for s in sides if s in rep} for rep in block[REPEATS_KEY.get(report, "repeats")]]
        shown = [m for m in KEPT + ("probe_step_s", "skipped_by_budget_share") if any(m in r[s] for r in reps for s in r)]
        lines += ["", f"{len(reps)} repeats; lost requests: {block['lost_requests']}.", "",
                  "| repeat | side | " + " | ".join(shown) + " |", "|---|---|" + "---|" * len(shown)]
        for k, rep in enumerate(reps):
            lines += [f"| {k} | {side} | " + " | ".join(_num(m.get(c)) for c in shown) + " |" for side, m in rep.items()]
        lines += ["", "| side | " + " | ".join(CHANGED) + " |", "|---|" + "---|" * len(CHANGED)]
        lines += [f"| {side} | " + " | ".join(_range(c.get(m)) for m in CHANGED) + " |"
                  for side, c in block["changes"].items()]
        lines += [""] + [f"- {t['target']}: {_pct(t['value'])}, **{'held' if t['held'] else 'missed'}**"
                         for t in block["targets"]]
        for key in ("share_of_ceiling_gain", "budget_skipped_share", "unpredicted_share"):
            if key in block:
                lines.append(f"- {key}: {_num(block[key])}")
        lines.append("")
    return "\n".join(lines) + "\n"


def plot(report: str, scenarios: list[Scenario], result: dict) -> None:
    """Each scenario's mean-JCT change per side against its baseline, the repeats' range as whiskers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [(f"{s.name}\n{side}", c["mean_jct_s"]) for s in scenarios if s.name in result
            for side, c in result[s.name]["changes"].items() if c.get("mean_jct_s")]
    if not bars:
        return
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(bars)), 4.2))
    medians = np.array([100 * c["median"] for _, c in bars])
    errors = np.array([[100 * (c["median"] - c["min"]) for _, c in bars], [100 * (c["max"] - c["median"]) for _, c in bars]])
    ax.bar(range(len(bars)), medians, yerr=errors, capsize=3, color=["tab:green" if m < 0 else "tab:red" for m in medians])
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(range(len(bars)), [label for label, _ in bars], rotation=60, ha="right", fontsize=7)
    ax.set(ylabel="mean JCT change vs baseline (%)", title=f"{report}: median and range over repeats")
    fig.tight_layout()
    fig.savefig(RESULTS / f"{report}.png", dpi=110)
    plt.close(fig)


# -- the README's results table ---------------------------------------------------------------

ROWS = (  # (what, scenario, side, metric): a scenario row's figure is that side's change in that metric
    ("Router cost: throughput against the stock app (fixed lengths)", "overhead", "ray_default", "throughput_tok_s"),
    ("Router cost: mean JCT against the stock app (fixed lengths)", "overhead", "ray_default", "mean_jct_s"),
    ("Default stack at natural lengths: mean JCT", "natural", "default", "mean_jct_s"),
    ("Default stack at natural lengths: short-request p99", "natural", "default", "short_p99_jct_s"),
    ("Predictions where the budget finds they pay, against none (natural lengths): mean JCT", "natural_budget",
     "default", "mean_jct_s"),
    ("Client hints for half the requests: mean JCT", "hints", "hints", "mean_jct_s"),
    ("Client hints for half the requests: the short answers' mean JCT", "hints", "hints", "short_answer_mean_jct_s"),
    ("Ranking by the head, fixed lengths: mean JCT", "fixed_burst", "last_work", "mean_jct_s"),
    ("RL epoch 2 ranked by epoch 1's lengths: makespan", "rollout_history", "history", "makespan_s"),
    ("First 6 of 8 samples per prompt: makespan", "rollout_first_k", "first_k", "makespan_s"),
    ("Partial rollouts, both calls: makespan", "rollout_partial", "partial", "makespan_s"),
    # last, so that the budget's row (below, not a change against stock) follows it
    ("Calm load (80%): mean JCT, do no harm", "calm", "default", "mean_jct_s"),
)
BEGIN, END = "<!-- results:begin (python -m benchmarks report) -->", "<!-- results:end -->"


def _row(what: str, name: str, side: str, metric: str) -> str | None:
    scenario = SCENARIOS[name]
    path = RESULTS / f"{scenario.report}.json"
    block = json.loads(path.read_text()).get(name) if path.exists() else None
    c = None if block is None else block["changes"].get(side, {}).get(metric)
    if c is None:  # not run yet
        return None
    verdicts = [t["held"] for t in block["targets"] if t["target"].startswith(f"{side} {metric} ")]
    verdict = "-" if not verdicts else "held" if all(verdicts) else "missed"
    n = len(c["each"])
    return (f"| {what} | {scenario.baseline} | {_range(c)}, {n} repeat{'' if n == 1 else 's'} | {verdict} | "
            f"[{scenario.report}.md](benchmarks/results/{scenario.report}.md#{name}) |")


def _simulator_row(v: dict) -> str:
    a, floor = v["aggregate"], v["noise_floor"]
    return (f"| Simulator against {len(v['held_out_runs'])} held-out real runs: mean-JCT error | one real run's spread "
            f"({100 * floor['mean_jct_s']:.1f}%) | {100 * a['mean_jct_s']['absolute']:.1f}% (throughput "
            f"{100 * a['throughput_tok_s']['absolute']:.1f}%) | {'held' if a['mean_jct_s']['absolute'] <= 0.10 else 'missed'}"
            " (10%) | [simulator_validation.md](benchmarks/results/simulator_validation.md) |")


def _accuracy_row(a: dict) -> str | None:
    mae = {m: a["methods"][m]["avg"]["mae"] for m in ("estp", "last") if "avg" in a["methods"].get(m, {})}
    if len(mae) < 2:
        return None
    return (f"| ESTP's MAE (tokens, cross-validated) | the last token's head ({mae['last']:.1f}) | {mae['estp']:.1f} | "
            f"{'held' if mae['estp'] < mae['last'] else 'missed'} (beat it) | "
            "[predictor_accuracy.md](benchmarks/results/predictor_accuracy.md) |")


def _overload_row(r: dict) -> str:
    o = r["overload"]
    ok = o["lost"] == 0 and o["failed"] == 0 and o["rejections_with_retry_after"] == o["rejected"]
    return (f"| Overload at {r['target_over_capacity']}x capacity: lost, failed | nothing lost "
            f"| {o['lost']} lost, {o['failed']} failed, {o['rejected']} of {o['sent']} got 429 + Retry-After | "
            f"{'held' if ok else 'missed'} | [reliability.md](benchmarks/results/reliability.md) |")


CALM_SKIP_TARGET = 0.90  # issue 42: at calm load the budget skips at least this share of predictions


def _budget_row(p: dict) -> str | None:
    """The calm run's second question is a share of decisions, not a change against stock."""
    c = p.get("calm")
    if c is None or c.get("budget_skipped_share") is None:  # nothing waited: the budget was never asked
        return None
    share, priced = c["budget_skipped_share"], c["budget_priced_requests"]
    return (f"| Calm load (80%): waiting requests the budget left unpredicted | every one predicted | "
            f"{100 * share:.1f}% of {priced} ({100 * c['unpredicted_share']:.1f}% of all requests served without one) | "
            f"{'held' if share >= CALM_SKIP_TARGET else 'missed'} ({100 * CALM_SKIP_TARGET:.0f}%) | [pays_live.md](benchmarks/results/pays_live.md#calm) |")


OTHER_ROWS = (("pays_live", _budget_row), ("simulator_validation", _simulator_row), ("predictor_accuracy", _accuracy_row),
              ("reliability", _overload_row))


def readme_table() -> str:
    rows = [_row(*row) for row in ROWS] + [row(json.loads(path.read_text())) for stem, row in OTHER_ROWS
                                           if (path := RESULTS / f"{stem}.json").exists()]
    return "\n".join(["| scenario | baseline | figure: median [min, max] | target | results |",
                      "|---|---|---|---|---|", *(r for r in rows if r)])


def update_readme(readme: Path = README) -> None:
    text = readme.read_text()
    if BEGIN not in text:
        return
    head, rest = text.split(BEGIN, 1)
    readme.write_text(head + BEGIN + "\n" + readme_table() + "\n" + END + rest.split(END, 1)[1])


def all_reports() -> list[str]:
    return sorted({s.report for s in SCENARIOS.values()})

