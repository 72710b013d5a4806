"""replay.json, the Table-5-style Markdown and the plots, from the replay's records."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from benchmarks.replay.metrics import summarise
from benchmarks.replay.records import RequestRecord

POLICY_ORDER = ["round_robin", "ray_default", "input_length", "egtp", "estp", "oracle"]


def _runs(records: list[RequestRecord]) -> dict[tuple[str, str, float | None], list[RequestRecord]]:
    runs: dict[tuple, list[RequestRecord]] = defaultdict(list)
    for r in records:
        runs[(r.policy, r.mode, r.load_rps)].append(r)
    return runs


def _ordered(policies) -> list[str]:
    return sorted(policies, key=lambda p: (POLICY_ORDER.index(p) if p in POLICY_ORDER else len(POLICY_ORDER), p))


def _change(new: float | None, base: float | None) -> float | None:
    return None if new is None or not base else (new - base) / base


def targets(policies: dict[str, dict], base: str = "round_robin", method: str = "estp") -> dict:
    """The issue's targets, ESTP against round-robin at the same offered load, as measured."""
    b, m, o = policies.get(base), policies.get(method), policies.get("oracle")
    if not b or not m:
        return {}
    jct = _change(m.get("mean_jct_s"), b.get("mean_jct_s"))
    padding = _change(m.get("batch_padding_ratio"), b.get("batch_padding_ratio"))
    tput = _change(m.get("throughput_tok_s"), b.get("throughput_tok_s"))
    share = None
    if o and None not in (b.get("mean_jct_s"), m.get("mean_jct_s"), o.get("mean_jct_s")):
        gain = b["mean_jct_s"] - o["mean_jct_s"]
        share = (b["mean_jct_s"] - m["mean_jct_s"]) / gain if gain > 0 else None
    return {
        "mean_jct_change": jct, "mean_jct_target_met": jct is not None and jct <= -0.20,
        "batch_padding_change": padding, "batch_padding_target_met": padding is not None and padding <= -0.40,
        "throughput_change": tput, "throughput_target_met": tput is not None and tput >= 0,
        "share_of_oracle_jct_gain": share, "oracle_share_target_met": share is not None and share >= 0.70,
    }


def build_report(records: list[RequestRecord], batch_size: int, settings: dict, lost: int) -> dict:
    runs = [
        {"policy": p, "mode": mode, "load_rps": load, **summarise(recs, batch_size)}
        for (p, mode, load), recs in sorted(_runs(records).items(), key=lambda kv: (kv[0][1], kv[0][2] or 0, kv[0][0]))
    ]
    open_loads = sorted({r["load_rps"] for r in runs if r["mode"] == "open"})
    main_load = open_loads[-1] if open_loads else None  # the highest: where routing matters most
    policies: dict[str, dict] = {}
    for p in _ordered({r["policy"] for r in runs}):
        open_run = next((r for r in runs if (r["policy"], r["mode"], r["load_rps"]) == (p, "open", main_load)), {})
        batch_run = next((r for r in runs if (r["policy"], r["mode"]) == (p, "batch")), {})
        policies[p] = {
            "mean_jct_s": open_run.get("mean_jct_s"), "p50_jct_s": open_run.get("p50_jct_s"),
            "p99_jct_s": open_run.get("p99_jct_s"), "short_p99_jct_s": open_run.get("short_p99_jct_s"),
            "mean_ttft_s": open_run.get("mean_ttft_s"), "throughput_tok_s": open_run.get("throughput_tok_s"),
            "throughput_req_s": open_run.get("throughput_req_s"), "padding_ratio": open_run.get("padding_ratio"),
            "batch_padding_ratio": batch_run.get("padding_ratio"), "batch_mean_jct_s": batch_run.get("mean_jct_s"),
            "batch_throughput_tok_s": batch_run.get("throughput_tok_s"),
        }
    return {
        "policies": policies, "main_load_rps": main_load, "lost_requests": lost,
        "targets": targets(policies), "runs": runs, "settings": settings,
    }


def _fmt(value, digits: int = 2) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}"


def _pct(value) -> str:
    return "-" if value is None else f"{value * 100:+.0f}%"


def write_markdown(path: Path, report: dict) -> None:
    s, pol = report["settings"], report["policies"]
    lines = [
        "# Trace replay: routing policies side by side (cf. the paper's Table 5)", "",
        f"Machine: {s['machine']}. Stack: `ray_config.yaml` (3 pools x 1 vLLM CPU replica of SmolLM2-135M-Instruct, "
        "ESTP predictor) with `router.benchmark_headers: true`; every policy on the same trace in one run.",
        f"Trace: {s['n']} requests from the `{s['split']}` split of `{s['dataset']}`, {s['arrival']} arrivals, "
        f"seed {s['seed']}, max_tokens {s['max_tokens']} (only prompts whose dataset answer ended within "
        f"{s.get('max_true_tokens')} tokens), pool output edges {s['output_edges']}; "
        f"{s['actors']} replay actors (SPREAD). Open loop at {s['loads']} req/s; batch mode: groups of "
        f"{s['batch_size']} per pool, all requests present at t = 0.",
        "",
        "**Provisional**: the ESTP/EGTP heads were trained on the partial dataset (a few hundred samples); "
        "a CPU stack at this scale is noisy (one run per policy, no repetitions).", "",
        f"## Open loop at {report['main_load_rps']} req/s, and batch-synchronous", "",
        "| policy | tok/s | req/s | mean JCT s | p50 JCT s | p99 JCT s | short p99 s | mean TTFT s "
        "| padding (open) | padding (batch) | batch tok/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p, m in pol.items():
        lines.append(
            f"| {p} | {_fmt(m['throughput_tok_s'], 1)} | {_fmt(m['throughput_req_s'], 3)} | {_fmt(m['mean_jct_s'])} "
            f"| {_fmt(m['p50_jct_s'])} | {_fmt(m['p99_jct_s'])} | {_fmt(m['short_p99_jct_s'])} "
            f"| {_fmt(m['mean_ttft_s'])} | {_fmt(m['padding_ratio'])} | {_fmt(m['batch_padding_ratio'])} "
            f"| {_fmt(m['batch_throughput_tok_s'], 1)} |"
        )
    t = report["targets"]
    if t:
        def met(ok: bool) -> str:
            return "met" if ok else "**not met**"

        lines += [
            "", "## Targets (ESTP against round-robin, same trace and load)", "",
            f"- mean JCT: {_pct(t['mean_jct_change'])} (target <= -20%): {met(t['mean_jct_target_met'])}",
            f"- batch padding ratio: {_pct(t['batch_padding_change'])} (target <= -40%): "
            f"{met(t['batch_padding_target_met'])}",
            f"- throughput: {_pct(t['throughput_change'])} (target >= 0): {met(t['throughput_target_met'])}",
            f"- share of the oracle's mean-JCT gain: {_fmt(t['share_of_oracle_jct_gain'])} (target >= 0.70): "
            f"{met(t['oracle_share_target_met'])}",
        ]
    lines += ["", "## Caveats read from this run's own numbers", ""] + caveats(report) + ["", "## Every run", "",
              "| policy | mode | load req/s | done | failed | tok/s | mean JCT s | p99 JCT s | padding | pools | pred. MAE |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in report["runs"]:
        pools = ", ".join(f"{k} {v}" for k, v in r["pools"].items())
        lines.append(
            f"| {r['policy']} | {r['mode']} | {_fmt(r['load_rps'])} | {r['completed']} | {r['failed']} "
            f"| {_fmt(r['throughput_tok_s'], 1)} | {_fmt(r['mean_jct_s'])} | {_fmt(r['p99_jct_s'])} "
            f"| {_fmt(r['padding_ratio'])} | {pools} | {_fmt(r['prediction_mae'], 0)} |"
        )
    missing = s.get("runs_not_done")
    lines += ["", f"Lost requests (sent - completed - failed): **{report['lost_requests']}**."
              + (f" Runs not done (the run was stopped early): {', '.join(missing)}." if missing else ""), "",
              "Definitions (benchmarks/replay/metrics.py): JCT = arrival to last token; throughput = completed "
              "output tokens over first arrival to last finish; short = the trace's shortest third by true "
              "length; padding ratio = sum(n x max - sum) / sum over groups decoded together (batch mode: its "
              "groups; open loop: each pool's requests in arrival order, in groups of the batch size). "
              "Length-blind policies still get ESTP priorities inside a pool (`shortest_first`), as configured.",
              "", "![JCT CDF](replay_jct_cdf.png) ![Throughput vs load](replay_throughput.png)", ""]
    Path(path).write_text("\n".join(lines), encoding="utf-8")


def caveats(report: dict) -> list[str]:
    """What makes a number here mean less than it seems: one pool taking most requests, an ESTP
    share of the oracle's gain outside [0, 1]."""
    notes = []
    for r in report["runs"]:
        top = max(r["pools"].values(), default=0)
        if r["completed"] and top >= 0.8 * r["completed"]:
            notes.append(
                f"- {r['policy']} ({r['mode']}) sent {top} of {r['completed']} requests to one pool: its JCT and "
                "throughput reflect one engine batching nearly everything (on 2 shared cores an idle engine frees "
                "CPU for the busy one), not length-homogeneous pools."
            )
    share = report["targets"].get("share_of_oracle_jct_gain")
    if share is not None and not 0 <= share <= 1:
        notes.append(f"- ESTP's share of the oracle's mean-JCT gain is {share:.2f}: outside [0, 1], so the oracle "
                     "is no upper bound in this run and the share target says nothing.")
    return notes or ["- none detected"]


def write_plots(out: Path, records: list[RequestRecord], report: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    runs = _runs(records)
    fig, ax = plt.subplots(figsize=(6, 4))
    for p in report["policies"]:
        jct = np.sort([r.jct_s for r in runs.get((p, "open", report["main_load_rps"]), []) if r.status == "ok"])
        if len(jct):
            ax.step(jct, np.arange(1, len(jct) + 1) / len(jct), where="post", label=p)
    ax.set(xlabel="job completion time (s)", ylabel="fraction of requests",
           title=f"JCT CDF, open loop at {report['main_load_rps']} req/s")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "replay_jct_cdf.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for p in report["policies"]:
        points = sorted((r["load_rps"], r["throughput_tok_s"]) for r in report["runs"]
                        if r["policy"] == p and r["mode"] == "open" and r["throughput_tok_s"] is not None)
        if points:
            ax.plot(*zip(*points), marker="o", label=p)
    ax.set(xlabel="offered load (req/s)", ylabel="output tokens/s", title="Throughput vs offered load")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "replay_throughput.png", dpi=120)
    plt.close(fig)


def write_report(out: Path, records: list[RequestRecord], batch_size: int, settings: dict, lost: int) -> dict:
    report = build_report(records, batch_size, settings, lost)
    (out / "replay.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    write_markdown(out / "replay.md", report)
    write_plots(out, records, report)
    return report
