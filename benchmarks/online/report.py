"""online.md and its plots from online.json."""

from __future__ import annotations

from pathlib import Path

TARGETS = ((300, 0.20), (1000, 0.10))  # (observed requests, allowed excess over the offline CV MAE)
DRIFT_TARGET = 300  # requests after a switch


def _f(x, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:,.{digits}f}"


def _point(points: list[dict], observed: int) -> dict | None:
    return next((p for p in points if p["observed"] == observed), None)


def target_lines(curve: dict) -> list[str]:
    lines = []
    refs = (("traffic-weighted", "mae", curve["offline_cv_mae_traffic_weighted"]),
            ("scenario-averaged", "scenario_avg_mae", curve["offline_cv_mae"]))
    for observed, slack in TARGETS:
        p = _point(curve["points"], observed)
        for name, key, ref in refs:
            value = p.get(key) if p else None
            if value is None:
                lines.append(f"- After {observed:,} requests, {name} MAE within {slack:.0%} of the offline "
                             f"{_f(ref)}: missed (no head served)")
                continue
            excess = value / ref - 1
            verdict = "met" if excess <= slack else f"missed by {(excess - slack) * 100:.1f} points"
            spread = f"; seeds {_f(p['mae_range'][0])}-{_f(p['mae_range'][1])}" if key == "mae" else ""
            lines.append(f"- After {observed:,} requests, {name} MAE within {slack:.0%} of the offline {_f(ref)}: "
                         f"{verdict} ({_f(value)}, {excess:+.1%}{spread})")
    return lines


def drift_lines(drift: dict) -> list[str]:
    lines = []
    for name, d in drift.items():
        after = d.get("recovered_after")
        verdict = ("missed (never stayed within 10%)" if after is None else
                   "met" if after <= DRIFT_TARGET else f"missed by {after - DRIFT_TARGET} requests")
        lines.append(f"- {name.replace('_', ' ')}: back within 10% of the steady {_f(d.get('steady_mae'))} for good "
                     f"after {after if after is not None else 'n/a'} requests (first within after "
                     f"{d.get('first_within')}): {verdict} (target {DRIFT_TARGET})")
    return lines


def _curve_table(points: list[dict]) -> list[str]:
    rows = ["| observed | MAE (sd) | scenario-avg MAE | concordance (sd) | candidate MAE | seeds serving | "
            "samples | refit s |", "|---|---|---|---|---|---|---|---|"]
    for p in points:
        rows.append(f"| {p['observed']:,} | {_f(p['mae'])} ({_f(p.get('mae_sd'))}) | {_f(p.get('scenario_avg_mae'))} | "
                    f"{_f(p['concordance'], 3)} ({_f(p.get('concordance_sd'), 3)}) | {_f(p['candidate_mae'])} | "
                    f"{p['seeds_serving']}/{p['seeds']} | {_f(p['samples'], 0)} | {_f(p['refit_seconds'])} |")
    return rows


def real_lines(real: dict) -> list[str]:
    """The cold start on the real stack, with its targets."""
    trusted = real["trusted_after_requests"]
    cost = None if real["throughput_ratio_vs_off"] is None else 1 - real["throughput_ratio_vs_off"]
    growth = real.get("rss_growth") or {}
    untrusted = (f"not within the run's {real['requests']}" if real["requests"] < 500 else "never")
    checks = [
        ("trusted within 500 requests", trusted is not None and trusted <= 500,
         untrusted if trusted is None else f"after {trusted}"),
        ("no failed request", real["failed"] == 0, f"{real['failed']} failed"),
        ("no request delayed by learning: p50 TTFT within 10% of learning off",
         real["p50_ttft_ratio_vs_off"] is not None and real["p50_ttft_ratio_vs_off"] <= 1.10,
         f"{_f(real['p50_ttft_ratio_vs_off'], 2)}x"),
        ("throughput cost <= 5% against learning off", cost is not None and cost <= 0.05,
         "-" if cost is None else f"{100 * cost:+.1f}%"),
        ("router and predictor memory growth < 10% after warm-up",
         bool(growth) and all(v is not None and v < 0.10 for v in growth.values()),
         ", ".join(f"{k} {'-' if v is None else f'{100 * v:+.1f}%'}" for k, v in growth.items())),
    ]
    lines = ["## A cold start on the real stack", "",
             f"`predictor.checkpoint: online`, an empty state directory: {real['requests']} held-out ShareGPT prompts "
             f"(never in the dataset), Poisson at {real['rate_rps']:.3f} requests/s (a calm load), max_tokens "
             f"{real['max_tokens']} (answers cut there are censored labels), {real['dispatched_share']:.0%} of the "
             "requests dispatched at once predicted for learning. Then the trace's first "
             f"{real.get('compared_requests', real['requests'])} requests on the default stack with learning off (the "
             "offline head), compared with the same requests of the learning run (on: "
             f"{_f(real['on']['throughput_tok_s'])} tok/s, p50 TTFT {_f(real['on']['p50_ttft_s'], 2)} s; off: "
             f"{_f(real['off']['throughput_tok_s'])} tok/s, {_f(real['off']['p50_ttft_s'], 2)} s). The learner's "
             f"first head after {_f(real['first_head_after_s'])} s.", "",
             "| target | held | measured |", "|---|---|---|",
             *[f"| {name} | {'yes' if ok else 'MISSED'} | {value} |" for name, ok, value in checks],
             f"| p50 time per output token against learning off | - | {_f(real.get('p50_tpot_ratio_vs_off'), 2)}x |",
             "", "At this calm load throughput follows the arrivals and the sampled lengths (on: "
             f"{real['on'].get('completion_tokens', '-')} tokens, off: {real['off'].get('completion_tokens', '-')}); "
             "the time per output token is what learning's CPU would slow.", "",
             "Live predictions (shadow ones while the learned head is not trusted yet) per 100 finished requests: "
             "MAE and rank concordance over those whose length is exact (answers cut at max_tokens left out).", "",
             "| finished requests | predicted | MAE (tokens) | concordance |", "|---|---|---|---|",
             *[f"| {b['requests']} | {b['predicted']} | {_f(b['mae'])} | {_f(b['concordance'], 3)} |"
               for b in real["live"]], ""]
    return lines


def markdown(result: dict) -> str:
    curve, drift = result.get("learning_curve"), result.get("drift")
    settings = result.get("settings", {})
    lines = ["# Online learning: a length head learned from the traffic it serves", "",
             "Regenerate with `python -m benchmarks.online offline` (the offline replay below); "
             "`python -m benchmarks.online report` rebuilds this file from online.json.", ""]
    if result.get("real"):
        lines += real_lines(result["real"])
    if curve:
        lines += ["## Targets", "", *target_lines(curve), *(drift_lines(drift) if drift else []), ""]
        if result.get("notes"):
            lines += ["## Reading", "", *[f"- {n}" for n in result["notes"]], ""]
        floor = curve["noise_floor_traffic_weighted"]
        lines += ["## Learning curve", "",
                  f"The whole dataset replayed in {len(curve['seeds'])} seeded arrival orders (prompts shuffled, a "
                  "prompt's samples together), samples that hit max_tokens given to the learner as censored labels. "
                  f"After each checkpoint the learner refits (recipe {settings.get('recipe')}, bins "
                  f"{settings.get('bins')}) and applies its install rule; the head it then serves is scored on the "
                  f"next {settings.get('window')} requests. MAE = mean over seeds of the traffic-weighted MAE of "
                  "that window; scenario-avg = the mean over scenarios, as the offline figure is averaged. "
                  "Concordance = Harrell's C on the same window.", "",
                  f"Offline reference (`last_ens5`, 5-fold CV, benchmarks/results/predictor_accuracy.json): "
                  f"{_f(curve['offline_cv_mae'])} averaged over scenarios, "
                  f"{_f(curve['offline_cv_mae_traffic_weighted'])} weighted by the dataset's traffic mix. Noise floors "
                  f"(forelen_dataset.json, same mix): in-sample {_f(floor['in_sample'])}, "
                  f"leave-one-out {_f(floor['leave_one_out'])}.", "",
                  *_curve_table(curve["points"]), "", "![learning curve](online_learning_curve.png)", ""]
    if drift:
        by_scenario = (curve or {}).get("offline_cv_mae_by_scenario", {})
        lines += ["## Drift", "",
                  "All of one scenario's traffic first (refit every "
                  f"{settings.get('drift_warmup_every')} requests, scored on the next {settings.get('drift_window')} "
                  "requests of it), then only the other's; after each checkpoint the learner refits and the served "
                  "head is scored on the same requests of the new traffic, the last quarter of its arrival order, "
                  "which the learner never sees (windows of the next requests differ in difficulty by more than the "
                  "10% to be detected). Steady value: mean of the last three checkpoints after the switch; "
                  "recovered = within 10% of it from then on.", ""]
        for name, d in drift.items():
            new = name.split("_to_")[-1]
            lines += [f"### {name.replace('_', ' ')}", "",
                      f"Steady MAE before the switch (old traffic) {_f(d.get('steady_before'))}, after it (new "
                      f"traffic, from {d.get('steady_from')}) {_f(d.get('steady_mae'))}; the offline head's CV MAE "
                      f"on {new} is {_f(by_scenario.get(new))}.", "",
                      *_curve_table(d["points"]), ""]
        plain = result.get("recency", {}).get("chat_to_rl")
        if plain:
            weighted = drift["chat_to_rl"]
            lines += ["### The install rule without recency weights", "",
                      "The chat-to-RL switch again, with candidates compared on the plain mean of the held-out MAE "
                      f"instead of the recency-weighted one (half-life {settings.get('recency_half_life')} requests): "
                      f"recovered after {plain.get('recovered_after')} requests (steady {_f(plain.get('steady_mae'))}) "
                      f"against {weighted.get('recovered_after')} (steady {_f(weighted.get('steady_mae'))}).", "",
                      "| after the switch | served MAE, recency-weighted rule | served MAE, plain mean | "
                      "candidate MAE, plain mean |", "|---|---|---|---|"]
            for a, b in zip(weighted["points"], plain["points"]):
                lines.append(f"| {a['observed']:,} | {_f(a['mae'])} | {_f(b['mae'])} | {_f(b['candidate_mae'])} |")
            lines.append("")
        lines += ["![drift](online_drift.png)", ""]
    ablations = result.get("ablation")
    if ablations:
        sizes = list(next(iter(ablations.values())))
        lines += ["## Design choices", "",
                  "Candidates of learner variants trained on the first N requests of an arrival order and scored on "
                  "its last 800 requests (the same rows for every variant and N; mean of 2 seeds): MAE / "
                  "concordance.", "",
                  "| variant | " + " | ".join(f"N = {int(n):,}" for n in sizes) + " |",
                  "|---|" + "---|" * len(sizes)]
        for name, by_size in ablations.items():
            lines.append(f"| {name} | " + " | ".join(
                f"{_f(by_size[n]['mae'])} / {_f(by_size[n]['concordance'], 3)}" for n in sizes) + " |")
        lines.append("")
    extraction = result.get("feature_extraction")
    if extraction:
        lines += ["## Cost", "",
                  f"Features: {extraction['extracted']:,} of {extraction['prompts']:,} prompts were missing from the "
                  f"shared cache and extracted on {extraction['threads']} thread in {_f(extraction['seconds'] / 60)} "
                  f"min ({extraction.get('tokens', 0):,} prompt tokens; the cache keeps all prefill features, not "
                  "only the last token's)."]
    timing = result.get("refit_seconds")
    if timing:
        lines += ["", "Refit time on one thread (fit_candidate, the learner's recipe), by reservoir size: " +
                  ", ".join(f"{int(n):,} samples {_f(s)} s" for n, s in timing.items()) +
                  f" (the last: a full reservoir of {settings.get('capacity', 0):,}). Replay time: " +
                  ", ".join(f"{part.replace('_', ' ')} {_f(m)} min" for part, m in result.get("run_minutes", {}).items())
                  + "."]
    return "\n".join(lines) + "\n"


def plot(result: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve, drift = result.get("learning_curve"), result.get("drift")
    if curve:
        fig, (ax_mae, ax_c) = plt.subplots(1, 2, figsize=(12, 4.5))
        pts = [p for p in curve["points"] if p["mae"] is not None]
        x = [p["observed"] for p in pts]
        for key, label in (("mae", "traffic-weighted"), ("scenario_avg_mae", "scenario-averaged")):
            ax_mae.plot(x, [p.get(key) for p in pts], marker="o", label=f"online, {label}")
        ax_mae.fill_between(x, [p["mae_range"][0] for p in pts], [p["mae_range"][1] for p in pts], alpha=0.2,
                            label="seed range")
        ax_mae.axhline(curve["offline_cv_mae_traffic_weighted"], color="k", ls="--",
                       label="offline CV, traffic-weighted")
        ax_mae.axhline(curve["offline_cv_mae"], color="k", ls=":", label="offline CV, scenario-averaged")
        floor = curve["noise_floor_traffic_weighted"]
        ax_mae.axhspan(floor["in_sample"], floor["leave_one_out"], color="grey", alpha=0.15, label="noise floor")
        ax_mae.set(xscale="log", xlabel="observed requests", ylabel="MAE on the next requests (tokens)")
        ax_mae.legend(fontsize=7)
        ax_c.plot(x, [p["concordance"] for p in pts], marker="o")
        ax_c.fill_between(x, [p["concordance"] - p["concordance_sd"] for p in pts],
                          [p["concordance"] + p["concordance_sd"] for p in pts], alpha=0.2)
        ax_c.axhline(result.get("settings", {}).get("floor", 0.55), color="r", ls=":", label="install floor")
        ax_c.set(xscale="log", xlabel="observed requests", ylabel="concordance on the next requests")
        ax_c.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "online_learning_curve.png", dpi=110)
        plt.close(fig)
    if drift:
        fig, axes = plt.subplots(1, len(drift), figsize=(6 * len(drift), 4.2), squeeze=False)
        by_scenario = (curve or {}).get("offline_cv_mae_by_scenario", {})
        for ax, (name, d) in zip(axes[0], drift.items()):
            pts = [p for p in d["points"] if p["mae"] is not None]
            x = [p["observed"] for p in pts]
            ax.plot(x, [p["mae"] for p in pts], marker="o", label="served head")
            plain = result.get("recency", {}).get(name)
            if plain:
                ax.plot([p["observed"] for p in plain["points"]], [p["mae"] for p in plain["points"]], marker=".",
                        color="grey", label="served head, plain-mean install rule")
            if name.split("_to_")[-1] in by_scenario:
                ax.axhline(by_scenario[name.split("_to_")[-1]], color="purple", ls="-.", label="offline CV")
            ax.fill_between(x, [p["mae_range"][0] for p in pts], [p["mae_range"][1] for p in pts], alpha=0.2)
            if d.get("steady_mae"):
                ax.axhline(d["steady_mae"], color="k", ls="--", label="steady")
                ax.axhline(1.1 * d["steady_mae"], color="k", ls=":", label="steady + 10%")
            if d.get("recovered_after") is not None:
                ax.axvline(d["recovered_after"], color="g", ls=":", label="recovered")
            ax.set(title=name.replace("_", " "), xlabel="requests after the switch",
                   ylabel="MAE on held-back requests of the new traffic")
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "online_drift.png", dpi=110)
        plt.close(fig)
