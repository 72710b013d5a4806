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


def _load_lines(real: dict) -> list[str]:
    lines = []
    for workload, block in real.items():
        arrival, share = workload.split("@")
        share = share.split("_")[0]  # a load's size follows its share (bursts.load_name)
        fixed = arrival.startswith("fixed_")
        measured = (f"the session's capacity: the fixed-length bursts' capacity scaled by a probe of the machine "
                    f"(step {block['probe_step_s']:.3f} s)" if block.get("capacity_from") == "probe"
                    else "the capacity the length-blind bursts measured, in their sessions")
        held = ", every answer held to its sample's length" if fixed else ""
        lines += [f"## Continuous load on the real stack: {arrival.removeprefix('fixed_')} arrivals at "
                  f"{float(share):.0%} of capacity{', fixed lengths' if fixed else ''}, {block['requests']} requests", "",
                  f"{block['requests']} of the dataset's val and test requests{held}, arriving at "
                  f"{float(share):.0%} of {measured} ({block['capacity_rps']:.3f} requests/s); "
                  f"{len(block['repeats'])} repeats, policies back to back; failed or lost: {block['lost_requests']}.",
                  ""] + _burst_table(block) + _changes(block) + [""]
    return lines


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
    if burst.get("note"):
        lines[2:2] = [f"**{burst['note']}**", ""]
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


BURST_COLUMNS = (("mean JCT s", "mean_jct_s"), ("p50 JCT s", "p50_jct_s"), ("p99 JCT s", "p99_jct_s"),
                 ("short p99 s", "short_p99_jct_s"), ("p50 TTFT s", "p50_ttft_s"), ("p99 TTFT s", "p99_ttft_s"),
                 ("tok/s", "throughput_tok_s"), ("ranked share", "ranked_share"),
                 ("predictor p50 / p99 s", None), ("probe step s", "probe_step_s"))
# The independent simulation the targets came from (2 replicas x 16 slots, 10 seeds): last_work, the
# ceiling and true lengths against FIFO, mean JCT / short-request p99.
SIMULATED_LIMITS = {"last_work": (-0.14, -0.24), "ceiling": (-0.18, -0.37), "true lengths": (-0.21, -0.74)}


def _cell(values: list[float], fmt: str = "{:.1f}") -> str:
    if not values:
        return "-"
    return f"{fmt.format(np.mean(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def _burst_table(block: dict) -> list[str]:
    """Every policy that ran, with how many runs its cells summarise: a limit run once beside a
    three-repeat comparison is still the limit, but not a spread."""
    repeats = block["repeats"]
    policies = list(dict.fromkeys(p for rep in repeats for p in rep))
    lines = ["| policy | runs | " + " | ".join(label for label, _ in BURST_COLUMNS) + " |",
             "|---|---|" + "---|" * len(BURST_COLUMNS)]
    for p in policies:
        cells = [str(sum(p in rep for rep in repeats))]
        for _, key in BURST_COLUMNS:
            if key is None:
                p50 = [r[p]["predictor_latency_p50_s"] for r in repeats if r.get(p, {}).get("predictor_latency_p50_s")]
                p99 = [r[p]["predictor_latency_p99_s"] for r in repeats if r.get(p, {}).get("predictor_latency_p99_s")]
                cells.append(f"{np.mean(p50):.1f} / {np.mean(p99):.1f}" if p50 else "-")
                continue
            values = [r[p][key] for r in repeats if p in r and r[p].get(key) is not None]
            cells.append(_cell(values, {"ranked_share": "{:.0%}", "probe_step_s": "{:.3f}"}.get(key, "{:.1f}")))
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    return lines


def _changes(block: dict) -> list[str]:
    lines = ["", "Against ray_default in each repeat (same trace, run back to back): median [min, max].", "",
             "| policy | mean JCT | short p99 | p99 JCT | mean TTFT | throughput |", "|---|---|---|---|---|---|"]
    for p, by_metric in block["changes_vs_ray_default"].items():
        cells = []
        for m in ("mean_jct_s", "short_p99_jct_s", "p99_jct_s", "mean_ttft_s", "throughput_tok_s"):
            c = by_metric.get(m)
            cells.append("-" if c is None else f"{_pct(c['median'])} [{_pct(c['min'])}, {_pct(c['max'])}]")
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    return lines


def burst_verdict(block: dict, policy: str = "last_work") -> dict | None:
    """The issue's targets for the real dataset burst."""
    c = block["changes_vs_ray_default"].get(policy)
    if not c or not c.get("mean_jct_s") or not c.get("short_p99_jct_s"):
        return None
    mean, short, p99 = c["mean_jct_s"], c["short_p99_jct_s"], c["p99_jct_s"]
    checks = {
        "better mean JCT and short p99 in every repeat": max(mean["each"]) < 0 and max(short["each"]) < 0,
        "median mean JCT -10% or better": mean["median"] <= -0.10,
        "median short p99 -15% or better": short["median"] <= -0.15,
        "p99 no worse than +10%": p99 is not None and p99["median"] <= 0.10,
        "lost 0": block["lost_requests"] == 0,
    }
    return {"repeats": len(mean["each"]), "checks": checks}


def _verdict_lines(block: dict, policy: str = "last_work") -> list[str]:
    verdict = burst_verdict(block, policy)
    if not verdict:
        return []
    return ["", f"Targets for {policy} ({verdict['repeats']} repeats): " + "; ".join(
        f"{name}: {'held' if ok else 'MISSED'}" for name, ok in verdict["checks"].items()) + "."]


def _rerun_lines(title: str, block: dict | None, policy: str, intro: str, targets: bool = True) -> list[str]:
    """A rerun of a burst: ray_default against one policy, with its table (and the dataset burst's targets)."""
    if not block:
        return []
    return ([f"## {title}", "", f"{intro} {len(block['repeats'])} repeats; failed or lost: {block['lost_requests']}.", ""]
            + _burst_table(block) + _changes(block) + (_verdict_lines(block, policy) if targets else []) + [""])


def _bursts_lines(bursts: dict) -> list[str]:
    lines = []
    real = bursts.get("real")
    if real:
        lines += ["## A burst onto the real stack: where the queue's order pays", "",
                  f"{real['requests']} of the dataset's val and test prompts (every scenario) at once onto the default "
                  "stack's 32 slots (4x), max_tokens 1024, "
                  f"{len(real['repeats'])} repeats with the policies run back to back; failed or lost: "
                  f"{real['lost_requests']}. Mean (min-max) over the repeats. Limits beside `last_work`: `ceiling` ranks "
                  "on each prompt's median length over its other samples (the most a prompt-only predictor can "
                  "know), `oracle_work` on the dataset's own length of the sample (one earlier draw: on the real "
                  "stack every generation is a fresh draw). `ray_serve_llm` is Ray Serve LLM's own OpenAI app "
                  "(`build_openai_app`) with the same two engines and settings, behind Ray's default router: what a "
                  "user would pick instead. Ranked share: of the requests that waited, those whose rank at dispatch "
                  "rested on their own length (a landed prediction, or a told length) rather than the prior.", ""]
        lines += _burst_table(real) + _changes(real)
        lines += _verdict_lines(real)
        limits = ", ".join(f"{k} {_pct(a)} / {_pct(b)}" for k, (a, b) in SIMULATED_LIMITS.items())
        lines += ["", f"The limits the issue's independent simulation gives for this burst (mean JCT / short p99 "
                  f"against FIFO, predictions never late): {limits}.", ""]
    lean, early = bursts.get("real_lean"), bursts.get("real_early")
    lines += _rerun_lines(
        "The same burst with the lean predictor", lean, "last_work",
        "The dataset burst again, ray_default against last_work back to back, after the predictor's prefill "
        "stopped padding its batches and (predictor.truncate_prompt_tokens) reads long prompts' last 256 tokens "
        "only: the last_work runs above were made with the predictor as it was, whose prefill of the burst's "
        "waiting prompts took 3x as long (predictor_levers.md).")
    lines += _rerun_lines(
        "The same burst at fixed lengths", bursts.get("real_fixed"), "last_work",
        "The dataset burst again, with every answer held to the length the dataset's sample of it had "
        "(X-Fixed-Output-Tokens: the engines are told, the router is not, so last_work ranks each request as its "
        "client sent it): the policies of a repeat serve one workload, where unseeded answers of the same trace "
        "generated 56k to 68k tokens from run to run. The lean predictor serves the last head alone; "
        "`oracle_work` is told the exact length. `oracle_work` and `ceiling` ran once, in a later session than "
        "the `ray_default` run set against them: their changes carry the machine's drift too (each run's speed "
        "probe is in runs/<run>.probe.json).")
    lines += _rerun_lines(
        "The same burst at fixed lengths with ESTP's head", bursts.get("real_fixed_estp"), "estp_work",
        "The fixed-length burst again, ray_default against estp_work back to back, on a stack that serves ESTP's "
        "head alone: the paper's own predictor, the hidden states pooled by the tokens' entropy and the final "
        "layer's attention, whose prefill reads attention and so costs more than the last token's head.")
    lines += _rerun_lines(
        "The same burst with the early-exit head", early, "early_work",
        "The dataset burst again, ray_default against early_work back to back: the last prompt token's state at "
        "layer 4 of the model's 30, so the predictor's prefill stops there (a seventh of its cost, "
        "predictor_levers.md), on a stack that serves that head alone. The runs above served every head at once "
        "(benchmark stacks did, so that a request could name any policy), and ESTP's entropy and attention made "
        "each of their predictions 1.55x as costly as the last token's alone.")
    lines += _rerun_lines(
        "The ShareGPT burst with the early-exit head", bursts.get("sharegpt_early"), "early_work",
        "128 held-out ShareGPT first turns at once, ray_default against early_work back to back on a stack serving "
        "the early head alone; the short third is the shortest third of what each run generated.", targets=False)
    simulated = bursts.get("simulated")
    if simulated:
        st = bursts.get("simulated_settings", {})
        basis = ("the step-time model with the factors the validation fitted on real runs "
                 "(simulator_validation.md)" if st.get("validated") else
                 "the single-engine calibration only: NOT yet validated against the real stack")
        lines += ["## The same burst in the simulator, 2 to 100 replicas", "",
                  f"A burst of {st.get('requests_per_slot', 4)}x the slots of the dataset's val and test prompts, "
                  f"{st.get('seeds')} seeds (each its own draw), on {basis}. Change against ray_default: median "
                  "over seeds [min, max]. At 2 replicas the real burst's medians stand beside it.", "",
                  "| replicas | policy | mean JCT s | mean JCT | short p99 | p99 JCT | real: mean JCT | real: short p99 |",
                  "|---|---|---|---|---|---|---|---|"]
        real_changes = {**(real or {}).get("changes_vs_ray_default", {}),
                        **(early or {}).get("changes_vs_ray_default", {})}
        for size, by_policy in simulated.items():
            for policy, m in by_policy.items():
                cells = [f"{_pct(m[f'{k}_change'])} [{_pct(m[f'{k}_change_range'][0])}, {_pct(m[f'{k}_change_range'][1])}]"
                         if policy != "ray_default" else "-" for k in ("mean_jct_s", "short_p99_jct_s", "p99_jct_s")]
                rc = real_changes.get(policy, {}) if size == "2" else {}
                real_cells = [_pct(rc[k]["median"]) if rc.get(k) else "-" for k in ("mean_jct_s", "short_p99_jct_s")]
                lines.append(f"| {size} | {policy} | {m['mean_jct_s']:.1f} | " + " | ".join(cells + real_cells) + " |")
        lines.append("")
    sharegpt = bursts.get("sharegpt")
    if sharegpt:
        lines += ["## A burst of held-out ShareGPT prompts", "",
                  f"{sharegpt['requests']} ShareGPT first turns the dataset never used, at once, max_tokens 1024; "
                  "their true lengths are unknown, so the short third is the shortest third of what each run "
                  "generated.", ""] + _burst_table(sharegpt) + _changes(sharegpt) + [""]
    return lines


def markdown(result: dict) -> str:
    lines = ["# Length predictions under continuous batching", "",
             "Generated by `python -m benchmarks.continuous sim|design|real|burst|lean|stock|sharegpt|simburst`. "
             "Limits beside every figure: `oracle_work` ranks on the true length, `ceiling` on each prompt's median over its other "
             "samples (the limit of any prompt-only predictor), bare vLLM is the stack with nothing added.", ""]
    if result.get("bursts"):
        lines += _bursts_lines(result["bursts"])
    sim = result.get("simulated")
    if sim:
        st = result.get("simulated_settings", {})
        if st.get("note"):
            lines += [f"**Simulated results below: {st['note']}**", ""]
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
        lines += _load_lines(result["real"])
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
