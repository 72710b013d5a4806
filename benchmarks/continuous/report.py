"""continuous.json -> continuous.md and plots: every figure beside its limits (oracle, ceiling, bare vLLM)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

BASELINE = "ray_default"
SHOWN = ("round_robin", "input_length", "egtp", "estp", "last", "oracle", "egtp_work", "estp_work", "last_work",
         "oracle_work", "ceiling")
TARGET_SIZES = ("100", "1000")


def _load(workload: str) -> float:
    return float(workload.split("@")[1])


def queues_there(workload: str) -> bool:
    """Where requests wait: at or over capacity, or bursty arrivals from 80% up (the issue's split)."""
    arrival, load = workload.split("@")[0], _load(workload)
    return load >= 1.0 or (arrival != "poisson" and load >= 0.8)


def calm(workload: str) -> bool:
    """Where nothing should queue: Poisson up to 95% of capacity."""
    return workload.startswith("poisson@") and _load(workload) <= 0.95


def change(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b - 1


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def targets(simulated: dict, policy: str = "estp_work") -> list[dict]:
    """The issue's targets per (size, workload), against Ray's default."""
    rows = []
    for size in TARGET_SIZES:
        for workload, by_policy in simulated.get(size, {}).items():
            if policy not in by_policy or BASELINE not in by_policy:
                continue
            m, b = by_policy[policy], by_policy[BASELINE]
            d = {k: change(m[k], b[k]) for k in ("mean_jct_s", "p99_jct_s", "short_p99_jct_s", "throughput_tok_s")}
            if queues_there(workload):
                held = (d["mean_jct_s"] <= -0.20 and d["short_p99_jct_s"] <= -0.40 and d["p99_jct_s"] <= 0.25
                        and d["throughput_tok_s"] >= -0.005)
                kind = "queues"
            elif calm(workload):
                held = abs(d["mean_jct_s"]) <= 0.02 and abs(d["p99_jct_s"]) <= 0.02
                kind = "calm"
            else:
                continue
            rows.append({"size": size, "workload": workload, "kind": kind, "held": held, **d})
    return rows


def _matrix(simulated: dict, size: str, metric: str) -> list[str]:
    workloads = sorted(simulated[size], key=lambda w: (w.split("@")[0], _load(w)))
    lines = ["| policy | " + " | ".join(workloads) + " |", "|---|" + "---|" * len(workloads)]
    base = {w: simulated[size][w][BASELINE][metric] for w in workloads}
    lines.append(f"| {BASELINE} (s) | " + " | ".join(f"{base[w]:.1f}" for w in workloads) + " |")
    for p in SHOWN:
        cells = [_pct(change(simulated[size][w].get(p, {}).get(metric), base[w])) for w in workloads]
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    return lines


def _design_lines(design: dict) -> list[str]:
    lines = [f"## How the defaults were chosen (simulated, {design['replicas']} replicas, "
             f"{design['requests']} requests)", ""]
    for where, by_policy in design["aging"].items():
        base = design["baseline"][where]
        lines += [f"Aging bound `router.queue.max_overtake_s` at {where}, against {BASELINE} "
                  f"(mean JCT {base['mean_jct_s']:.1f} s, p99 {base['p99_jct_s']:.1f} s):", "",
                  "| policy | max_overtake_s | mean JCT | p99 JCT | short p99 | reordered |", "|---|---|---|---|---|---|"]
        for policy, by_s in by_policy.items():
            for s, m in sorted(by_s.items(), key=lambda kv: float(kv[0])):
                label = "FIFO" if float(s) == 0 else ("no aging" if float(s) >= 1e8 else f"{float(s):g} s")
                lines.append(f"| {policy} | {label} | {_pct(change(m['mean_jct_s'], base['mean_jct_s']))} "
                             f"| {_pct(change(m['p99_jct_s'], base['p99_jct_s']))} "
                             f"| {_pct(change(m['short_p99_jct_s'], base['short_p99_jct_s']))} "
                             f"| {m['reordered_share']:.0%} |")
        lines.append("")
    lines += ["Ranking statistic `router.rank_by` (last_work):", "", "| workload | mean | p50 | p90 |", "|---|---|---|---|"]
    for where, by_policy in design["rank_by"].items():
        base = design["baseline"][where]["mean_jct_s"]
        cells = [_pct(change(by_policy["last_work"][s]["mean_jct_s"], base)) for s in ("mean", "p50", "p90")]
        lines.append(f"| {where} (mean JCT vs {BASELINE}) | " + " | ".join(cells) + " |")
    lines += ["", "Replica choice inside the pool (mean JCT / p99 against Ray's power of two choices, same policy):", "",
              "| workload | policy | least_inflight |", "|---|---|---|"]
    for where, by_policy in design["replica_choice"].items():
        for policy, by_choice in by_policy.items():
            ref, m = by_choice["power_of_two"], by_choice["least_inflight"]
            lines.append(f"| {where} | {policy} | {_pct(change(m['mean_jct_s'], ref['mean_jct_s']))} / "
                         f"{_pct(change(m['p99_jct_s'], ref['p99_jct_s']))} |")
    return lines + [""]


def _spread(values: list[float]) -> str:
    return f"{np.mean(values):.1f} (min {min(values):.1f}, max {max(values):.1f})"


def _real_lines(real: dict) -> list[str]:
    s = real["settings"]["queueing"]
    repeats = real["repeats"]
    policies = list(repeats[0])
    lines = ["## Real stack: a queue forms (ray_config.yaml on this machine)", "",
             f"{s['requests']} test-split requests, Poisson at {s['rate_rps']} req/s, max_tokens {s['max_tokens']}, "
             f"{len(repeats)} repeats, policies interleaved in each; lost requests: {real['lost_requests']}.", "",
             "| policy | mean JCT (s) | p99 JCT (s) | short p99 (s) | mean TTFT (s) | throughput (tok/s) | queued |",
             "|---|---|---|---|---|---|---|"]
    for p in policies:
        col = lambda k: [r[p][k] for r in repeats if r[p].get(k) is not None]
        lines.append(f"| {p} | {_spread(col('mean_jct_s'))} | {_spread(col('p99_jct_s'))} | "
                     f"{_spread(col('short_p99_jct_s'))} | {_spread(col('mean_ttft_s'))} | "
                     f"{_spread(col('throughput_tok_s'))} | {np.mean(col('queued_share')):.0%} |")
    for policy in [p for p in policies if p != BASELINE and BASELINE in policies]:
        wins = [r[policy]["mean_jct_s"] < r[BASELINE]["mean_jct_s"] for r in repeats]
        deltas = [change(r[policy]["mean_jct_s"], r[BASELINE]["mean_jct_s"]) for r in repeats]
        p99 = [change(r[policy]["p99_jct_s"], r[BASELINE]["p99_jct_s"]) for r in repeats]
        lines += ["", f"{policy} beats {BASELINE}'s mean JCT in {sum(wins)} of {len(wins)} repeats "
                  f"({', '.join(_pct(d) for d in deltas)}; p99 {', '.join(_pct(d) for d in p99)}): "
                  f"target {'held' if all(wins) else 'missed'}."]
    return lines + [""]


def _burst_lines(burst: dict, bare: dict) -> list[str]:
    st, al, bv = burst["stack"], burst.get("stack_predict_all", {}), burst["bare_vllm"]
    rows = [("throughput (tok/s)", "throughput_tok_s"), ("p50 TTFT (s)", "p50_ttft_s"),
            ("mean JCT (s)", "mean_jct_s"), ("p99 JCT (s)", "p99_jct_s"),
            ("predicted before dispatch", "predicted_share")]
    lines = ["## Burst: held-out ShareGPT prompts, a fixed number in flight, against bare vLLM", "",
             f"{burst['requests']} prompts the dataset never used, max_tokens 1024. The stack twice: predicting only "
             "the requests that wait (`predictor.predict: waiting`, the default) and predicting every request "
             "(`all`: the prefill's CPU cost on this machine).", "",
             "| | stack (waiting) | stack (all) | bare vLLM | waiting / bare |", "|---|---|---|---|---|"]
    fmt = lambda v: "-" if v is None else f"{v:.2f}"
    for label, key in rows:
        a, c, b = st.get(key), al.get(key), bv.get(key)
        lines.append(f"| {label} | {fmt(a)} | {fmt(c)} | {fmt(b)} | {f'{a / b:.2f}x' if a and b else '-'} |")
    fr, tr = burst["fallback_rate"], burst["p50_ttft_ratio_vs_bare"]
    lines += ["", f"- {burst['requests']} requests, {st['waited']} of them waited for a slot: a request that finds a free "
              "slot goes at once and needs no prediction; under `all` its prediction runs beside it (after its "
              "headers), so the row above counts only predictions made before dispatch.",
              f"- Requests that waited and left the queue without a prediction, or fell back: {fr:.1%} "
              f"(target <= 5%: {'held' if fr <= 0.05 else 'missed'}); {st['waited']} of {st['completed']} waited.",
              f"- p50 TTFT {tr:.2f}x bare vLLM (target <= 1.10x: {'held' if tr <= 1.10 else 'missed'}).",
              f"- Throughput {bare['throughput_ratio']:.2f}x bare vLLM "
              f"(target >= 0.9x: {'held' if bare['throughput_ratio'] >= 0.9 else 'missed'})."]
    return lines + [""]


def markdown(result: dict) -> str:
    lines = ["# Length predictions under continuous batching", "",
             "Generated by `python -m benchmarks.continuous sim|design|real`. Limits beside every figure: "
             "`oracle_work` ranks on the true length, `ceiling` on each prompt's median over its other samples "
             "(the limit of any prompt-only predictor), bare vLLM is the stack with nothing added.", ""]
    sim = result.get("simulated")
    if sim:
        st = result.get("simulated_settings", {})
        q = st.get("prediction_quality_test_split", {})
        quality = ", ".join(f"{h} MAE {v['mae_tokens']:.0f} tokens, pool accuracy {v['pool_accuracy']:.0%}"
                            for h, v in q.items() if isinstance(v, dict) and "mae_tokens" in v)
        for policy in ("estp_work", "last_work"):
            lines += _target_lines(sim, policy, quality, st)
        for size in sim:
            for metric, label in (("mean_jct_s", "mean JCT"), ("short_p99_jct_s", "short-request p99"),
                                  ("p99_jct_s", "p99 JCT")):
                lines += [f"### {size} replicas: {label} against {BASELINE}", ""] + _matrix(sim, size, metric) + [""]
    if result.get("design"):
        lines += _design_lines(result["design"])
    if result.get("real"):
        lines += _real_lines(result["real"])
    if result.get("burst"):
        lines += _burst_lines(result["burst"], result["bare_vllm"])
    return "\n".join(lines) + "\n"


def _target_lines(sim: dict, policy: str, quality: str, st: dict) -> list[str]:
    rows = targets(sim, policy)
    if not rows:
        return []
    held = sum(r["held"] for r in rows)
    lines = [f"## Targets: {policy} against ray_default (simulated)", "",
             f"Predictions on the test split: {quality}. Queue order: {st.get('queue_order')}; "
             f"max_ongoing_requests {st.get('max_ongoing_requests')} per replica. {held} of {len(rows)} "
             "workloads meet their target (queues: mean JCT -20% or better, short p99 -40% or better, p99 at "
             "most +25%, throughput not lower; calm: mean and p99 within 2%).", "",
             "| replicas | workload | kind | mean JCT | short p99 | p99 JCT | throughput | held |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['size']} | {r['workload']} | {r['kind']} | {_pct(r['mean_jct_s'])} | "
                     f"{_pct(r['short_p99_jct_s'])} | {_pct(r['p99_jct_s'])} | {_pct(r['throughput_tok_s'])} | "
                     f"{'yes' if r['held'] else 'no'} |")
    return lines + [""]


def plot(result: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sim = result.get("simulated") or {}
    size = next((s for s in ("100", "1000", "10") if s in sim), None)
    if size is None:
        return
    workloads = sorted(sim[size], key=lambda w: (w.split("@")[0], _load(w)))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2), sharey=False)
    for ax, metric, title in ((axes[0], "mean_jct_s", "mean JCT"), (axes[1], "short_p99_jct_s", "short-request p99")):
        x = np.arange(len(workloads))
        shown = ("estp", "oracle", "estp_work", "last_work", "oracle_work", "ceiling")
        width = 0.8 / len(shown)
        for k, p in enumerate(shown):
            ys = [100 * (change(sim[size][w].get(p, {}).get(metric), sim[size][w][BASELINE][metric]) or 0)
                  for w in workloads]
            ax.bar(x + k * width, ys, width, label=p)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xticks(x + 0.4 - width / 2, workloads, rotation=60, ha="right", fontsize=7)
        ax.set(title=f"{size} replicas: {title} vs {BASELINE} (%)", ylabel="change (%)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "continuous_jct.png", dpi=110)
    plt.close(fig)
