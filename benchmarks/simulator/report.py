"""simulator.json, simulator.md and the figures, from the validation and the scale runs."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.simulator.scale import POLICY_ORDER

RESULTS = Path(__file__).resolve().parents[1] / "results"
TARGETS = "ESTP vs round-robin at the same offered load: mean JCT -20% or better, batch-mode padding " \
          "ratio -40% or better, throughput not lower; ESTP reaches >= 70% of the oracle's JCT gain."


def _f(x, fmt="{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def _predictions_md(quality: dict, edges: list[float]) -> list[str]:
    truth = quality.get("true_share", {})
    lines = ["## The predictions routed on (test split)", "",
             f"Pools by output tokens, edges {edges}; true share of the test samples per pool: "
             + ", ".join(f"{p} {v:.0%}" for p, v in truth.items()) + ".", "",
             "| head | samples | MAE (tokens) | pool accuracy | routed share |", "|---|---|---|---|---|"]
    for head, q in quality.items():
        if head == "true_share":
            continue
        shares = ", ".join(f"{p} {v:.0%}" for p, v in q["routed_share"].items())
        lines.append(f"| {head} | {q['samples']} | {q['mae_tokens']:.1f} | {q['pool_accuracy']:.1%} | {shares} |")
    return lines + [""]


def _validation_md(validation: dict) -> list[str]:
    lines = ["## Validation against real runs", ""]
    for source, runs in validation.items():
        lines += [f"### {source}", ""]
        if "fitted_slowdown" in runs:
            lines += [f"Step times as calibrated; x{runs['shared_cores_slowdown']:.2f} for engines sharing cores; "
                      f"x{_f(runs['fitted_slowdown'])} fitted to all runs' mean JCTs (what the model leaves out).", ""]
        lines += ["| run | requests (failed in real) | metric | real | simulated | error | error, shared cores "
                  "| error, fitted |", "|---|---|---|---|---|---|---|---|"]
        items = runs["runs"].items() if "runs" in runs else [("engine", runs)]
        for name, run in items:
            shared, fitted = run.get("errors_shared_cores", {}), run.get("errors_fitted", {})
            for metric, e in run["errors"].items():
                s, f = shared.get(metric), fitted.get(metric)
                lines.append(f"| {name} | {run['requests']} ({run.get('failed_in_real', 0)}) | {metric} "
                             f"| {_f(e['real'])} | {_f(e['sim'])} | {_pct(e['rel_error'])} "
                             f"| {_pct(s['rel_error']) if s else '-'} | {_pct(f['rel_error']) if f else '-'} |")
        lines.append("")
    return lines


def _scale_md(scale: dict) -> list[str]:
    lines = ["## Scale runs", ""]
    for sizing, by_size in scale["results"].items():
        for mode in scale["modes"]:
            lines += [f"### {mode} mode, pools sized {sizing}", "",
                      "| replicas | policy | mean JCT s | p99 JCT s | short p99 s | TTFT s | tok/s | padding | "
                      "JCT vs RR | padding vs RR | tok/s vs RR | share of oracle gain |",
                      "|---|---|---|---|---|---|---|---|---|---|---|---|"]
            for r, by_mode in by_size.items():
                block = by_mode[mode]
                for policy in POLICY_ORDER:
                    m, g = block["policies"].get(policy), block["gains"].get(policy, {})
                    if m is None:
                        continue
                    lines.append(
                        f"| {r} | {policy} | {_f(m['mean_jct_s'])} | {_f(m['p99_jct_s'])} | {_f(m['short_p99_jct_s'])} "
                        f"| {_f(m['mean_ttft_s'])} | {_f(m['throughput_tok_s'], '{:.0f}')} | {_f(m['padding_ratio'])} "
                        f"| {_pct(-g['jct_mean_reduction'])} | {_pct(-g['padding_reduction']) if 'padding_reduction' in g else '-'} "
                        f"| {_pct(g['throughput_ratio'] - 1)} | {_f(g.get('share_of_oracle_gain'))} |")
            lines.append("")
    return lines


def _targets_md(scale: dict) -> list[str]:
    lines = ["## Against the targets", "", TARGETS, "",
             "Also against ray_default (power of two choices over all replicas: length-blind but weighted by "
             "pool size), the fair length-blind baseline when pools are sized by work: round-robin then sends a "
             "third of all requests to the small short pool.", "",
             "| pools | replicas | baseline | ESTP mean JCT (open) | ESTP padding (batch) | ESTP tok/s (open) "
             "| ESTP share of oracle gain (open) | oracle mean JCT (open) | met |",
             "|---|---|---|---|---|---|---|---|---|"]
    for sizing, by_size in scale["results"].items():
        for r, by_mode in by_size.items():
            for key, baseline in (("gains", "round_robin"), ("gains_vs_ray_default", "ray_default")):
                g_open = by_mode.get("open", {}).get(key, {}).get("estp", {})
                g_batch = by_mode.get("batch", {}).get(key, {}).get("estp", {})
                oracle = by_mode.get("open", {}).get(key, {}).get("oracle", {})
                checks = [g_open.get("jct_mean_reduction", 0) >= 0.2, g_batch.get("padding_reduction", 0) >= 0.4,
                          g_open.get("throughput_ratio", 0) >= 0.99, (g_open.get("share_of_oracle_gain") or 0) >= 0.7]
                lines.append(
                    f"| {sizing} | {r} | {baseline} | {_pct(-g_open['jct_mean_reduction']) if g_open else '-'} "
                    f"| {_pct(-g_batch['padding_reduction']) if 'padding_reduction' in g_batch else '-'} "
                    f"| {_pct(g_open['throughput_ratio'] - 1) if g_open else '-'} "
                    f"| {_f(g_open.get('share_of_oracle_gain'))} "
                    f"| {_pct(-oracle['jct_mean_reduction']) if oracle else '-'} | {sum(checks)}/4 |")
    return lines + [""]


def plots(scale: dict, out: Path = RESULTS) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for sizing, by_size in scale["results"].items():
        sizes = sorted(by_size, key=int)
        for mode, metric, label in (("open", "mean_jct_s", "mean JCT (s)"), ("batch", "mean_jct_s", "mean JCT (s)"),
                                    ("batch", "padding_ratio", "padding ratio")):
            if mode not in scale["modes"]:
                continue
            fig, ax = plt.subplots(figsize=(6, 4))
            for policy in POLICY_ORDER:
                ys = [by_size[s][mode]["policies"].get(policy, {}).get(metric) for s in sizes]
                ax.plot([int(s) for s in sizes], ys, marker="o", label=policy)
            ax.set_xscale("log")
            if mode == "batch" and metric == "mean_jct_s":
                ax.set_yscale("log")  # the whole trace queues at t = 0: JCT spans the cluster sizes' makespans
            ax.set_xlabel("replicas")
            ax.set_ylabel(label)
            ax.set_title(f"{label}, {mode} mode, pools sized {sizing}")
            ax.legend(fontsize=8)
            fig.tight_layout()
            name = f"simulator_{metric.replace('_s', '').replace('mean_', '')}_{mode}_{sizing}.png"
            fig.savefig(out / name, dpi=120)
            plt.close(fig)
            written.append(name)
    return written


def write(result: dict, out: Path = RESULTS) -> None:
    result["figures"] = plots(result["scale"], out) if result.get("scale") else []
    (out / "simulator.json").write_text(json.dumps(result, indent=1) + "\n")
    cal = result["calibration"]
    lines = [
        "# Discrete-event simulator: validation and scale", "",
        "Generated by `python -m benchmarks.simulator run`. Routing by the router's own policy classes and "
        "PoolLoad spillover, on real ESTP/EGTP predictions of the committed checkpoints; engine "
        "steps timed by the model fitted in step_time_calibration.json.", "",
        "## Step-time model", "",
        f"t_step = {cal['model']['const']:.4g} s + {cal['model']['decode_seqs']:.4g} s x decode_seqs + "
        f"{cal['model']['prefill_tokens']:.4g} s x prefill_tokens + {cal['model']['kv_tokens']:.4g} s x kv_tokens", "",
        f"Fit over {cal['fit']['steps']} measured engine steps: R^2 {cal['fit']['r2']:.3f}, median relative error "
        f"{100 * cal['fit']['median_rel_error']:.1f}%, p90 {100 * cal['fit']['p90_rel_error']:.1f}%. Engine limits: "
        f"{json.dumps(cal['limits'])}.", "",
    ]
    lines += _predictions_md(result["prediction_quality_test_split"], result["pool_edges"])
    lines += _validation_md(result["validation"])
    if result.get("scale"):
        s = result["scale"]
        lines += [f"Scale runs: {s['requests']} requests per cluster size (test split, resampled), Poisson arrivals "
                  f"at {s['rps_per_replica']} req/s per replica ({s['load']:.0%} of a full replica's "
                  f"{s['replica_capacity_rps']:.3f} req/s by the step-time model), batch size {s['batch_size']} "
                  "(batch mode: every request present at t = 0, as in the replay).", ""]
        lines += _targets_md(s) + _scale_md(s)
        lines += [f"![{f}]({f})" for f in result["figures"]] + [""]
    lines += result.get("notes", [])
    (out / "simulator.md").write_text("\n".join(lines) + "\n")
