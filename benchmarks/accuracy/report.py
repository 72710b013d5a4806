"""Markdown tables and plots from the benchmark's JSON, shaped like the paper's Tables 2, 3, 6 and
Figures 5, 6, with the comparison against EGTP written from the numbers, wins and losses alike.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from benchmarks.accuracy.metrics import CLASSES, LONG_ABOVE, SHORT_BELOW

STEM = "predictor_accuracy"
MAE_COLUMNS = (("mae", "MAE"), ("rmse", "RMSE"))


def _num(value, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _mae(m: dict) -> str:
    spread = f" ± {m['mae_std']:.1f}" if m.get("mae_std") is not None else ""
    return _num(m["mae"]) + spread


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def scenarios_of(result: dict) -> list[str]:
    first = next(iter({**result["methods"], **result["ablations"], **result["lambda_sweep"]}.values()))
    return [s for s in first if s != "avg"] + ["avg"]


def _error_table(result: dict, group: dict[str, dict], first_column: str, floor_row: bool = False) -> list[str]:
    """Table 2's shape: MAE and RMSE per scenario and their average, one row per entry."""
    cols = scenarios_of(result)
    header = [first_column, *(f"{s} {title}" for s in cols for _, title in MAE_COLUMNS)]
    rows = [[result["labels"].get(name, name), *(_mae(m[s]) if key == "mae" else _num(m[s][key])
                                                 for s in cols for key, _ in MAE_COLUMNS)]
            for name, m in group.items()]
    if floor_row:
        reference = result["scenario_median"]
        rows.append(["scenario median (no prompt)", *(_num(reference[s][key]) for s in cols for key, _ in MAE_COLUMNS)])
        floor = result["noise_floor_mae"]
        rows.append(["noise floor", *(_num(floor.get(s)) if key == "mae" else "" for s in cols for key, _ in MAE_COLUMNS)])
    return _table(header, rows)


def _accuracy_tables(result: dict) -> list[str]:
    cols = scenarios_of(result)
    by_class = _table(["method", *(f"{c.capitalize()} acc" for c in CLASSES), "overall acc"], [
        [result["labels"][n], *(_num(m["avg"][f"acc_{c}"], 3) for c in CLASSES), _num(m["avg"]["acc"], 3)]
        for n, m in result["methods"].items()])
    by_scenario = _table(["method", *(f"{s} acc" for s in cols)], [
        [result["labels"][n], *(_num(m[s]["acc"], 3) for s in cols)] for n, m in result["methods"].items()])
    return [*by_class, "", *by_scenario]


def _overhead_table(overhead: dict) -> list[str]:
    rows = []
    for key, row in overhead.items():
        if key.startswith("batch_"):
            rows.append([key.removeprefix("batch_"), f"{row['prefill_ms_per_request']:.1f}",
                         f"{row['estp_ms_per_request']:.1f}", f"{row['latency_ratio']:.2f}",
                         f"{row['prefill_peak_mib']:.0f}", f"{row['estp_peak_mib']:.0f}", f"{row['memory_ratio']:.2f}"])
    return _table(["batch", "prefill ms/request", "ESTP ms/request", "latency ratio", "prefill peak MiB",
                   "ESTP peak MiB", "memory ratio"], rows)


def _sampling_note(a: dict, b: dict) -> str:
    """Whether two MAEs on the same test set differ by more than twice their combined sampling error."""
    se = [x.get("mae_se") for x in (a, b)]
    if None in se:
        return ", too few samples to judge"
    return "" if abs(a["mae"] - b["mae"]) > 2 * float(np.hypot(*se)) else ", within sampling error"


def comparison(result: dict) -> list[str]:
    """Where ESTP does and does not beat EGTP (and the other methods), from the numbers."""
    methods = result["methods"]
    if "estp" not in methods or "egtp" not in methods:
        return ["ESTP and EGTP were not both run: no comparison."]
    estp, egtp = methods["estp"], methods["egtp"]
    outcome = {"loses to": [], "ties with": [], "beats": []}
    for s in scenarios_of(result):
        for key, sign in (("mae", -1), ("rmse", -1), ("acc", 1)):  # sign: +1 where higher is better
            a, b = estp[s][key], egtp[s][key]
            digits = 3 if key == "acc" else 1
            note = _sampling_note(estp[s], egtp[s]) if key == "mae" else ""
            verdict = "ties with" if a == b else "beats" if sign * (a - b) > 0 else "loses to"
            outcome[verdict].append(f"{s} {key.upper()} ({_num(a, digits)} vs {_num(b, digits)}{note})")
    lines = [f"ESTP {verdict} EGTP on: " + "; ".join(items) + "." for verdict, items in outcome.items() if items]
    if not outcome["loses to"] and not outcome["ties with"]:
        lines.append("ESTP beats EGTP on every scenario and metric here.")
    best = min(methods, key=lambda n: methods[n]["avg"]["mae"])
    if best != "estp":
        lines.append(f"Lowest average MAE: {result['labels'][best]} ({_num(methods[best]['avg']['mae'])}), "
                     f"not ESTP ({_num(estp['avg']['mae'])}).")
    reference = result["scenario_median"]["avg"]["mae"]
    learned = [result["labels"][n] for n, m in methods.items() if m["avg"]["mae"] < reference]
    lines.append(f"Predicting each scenario's median training length without reading the prompt gives an average "
                 f"MAE of {_num(reference)}; " + (f"only {', '.join(learned)} beat{'s' if len(learned) == 1 else ''} it."
                                                  if learned else "no method beats it: on this data none predicts "
                                                  "better than a scenario's typical length."))
    floor = {s: v for s, v in result["noise_floor_mae"].items() if v is not None and s in estp}
    for s, v in floor.items():
        lines.append(f"On {s}, ESTP's MAE is {estp[s]['mae'] / v:.2f}x the noise floor ({_num(v)} tokens).")
    n = estp["avg"]["n"]
    lines.append(f"The test split has {n} samples; differences below about twice the standard error of the MAE "
                 f"(mae_se in the JSON) are not evidence either way.")
    return [" ".join(lines)]


def markdown(result: dict) -> str:
    d = result["dataset"]
    splits = ", ".join(f"{k} {v['prompts']} prompts / {v['samples']} samples" for k, v in d["splits"].items())
    seeds = result["settings"]["seeds"]
    rerun = f"python -m benchmarks.predictor_accuracy --samples {d['samples']}" + (f" --limit {d['limit']}" if d.get("limit") else "")
    lines = [
        "# Length predictor accuracy (the paper's Tables 2, 3, 6 and Figures 5, 6)",
        "",
        f"Dataset `{d['version']}`: {splits}{' (limited with --limit)' if d.get('limit') else ''}. "
        f"Heads trained on train, early-stopped on val, scored on test; metrics are means over {seeds} "
        f"training seed(s){' (± the seeds standard deviation of MAE)' if seeds > 1 else ''}. "
        f"avg = unweighted mean over scenarios. Regenerate with `{rerun}` (the first {d['samples']} samples built).",
        "",
        "## Table 2: MAE and RMSE (tokens) on the test split",
        "",
        *_error_table(result, result["methods"], "method", floor_row=True),
        "",
        "Noise floor: MAE of predicting each prompt's sample median, the best any prompt-only predictor can do; "
        "only prompts sampled more than once have one. Where it comes from: "
        + "; ".join(f"{s}: {src}" for s, src in result["noise_floor_source"].items()) + ".",
        "",
        f"## Table 3: Short (< {SHORT_BELOW}) / Medium ({SHORT_BELOW}-{LONG_ABOVE}) / Long (> {LONG_ABOVE}) accuracy",
        "",
        "The predicted class comes from the expected tokens; per-class accuracy is the share of that true class "
        "predicted in it, averaged over scenarios (n/a: no test sample of that class).",
        "",
        *_accuracy_tables(result),
        "",
        "## Where ESTP does not beat EGTP",
        "",
        *comparison(result),
    ]
    if result["ablations"]:
        reference = {"estp": result["methods"]["estp"]} if "estp" in result["methods"] else {}
        lines += ["", "## Table 6: ablations", "", *_error_table(result, {**reference, **result["ablations"]}, "variant")]
    if result["lambda_sweep"]:
        lines += ["", "## Lambda sensitivity (lambda on attention S, 1 - lambda on entropy H)", "",
                  *_error_table(result, result["lambda_sweep"], "lambda")]
    if "overhead" in result:
        o = result["overhead"]
        prompts = ", ".join(f"{k}: {v['prompt_tokens']} tokens" for k, v in o.items() if k.startswith("batch_"))
        lines += ["", "## Figure 5: predictor overhead against a plain prefill", "",
                  f"Median of {o['repeats']} repeats, {o['threads']} CPU thread(s), the same prompts side by side "
                  f"({prompts}). "
                  "Plain prefill computes last-position logits only; ESTP runs its own forward with "
                  "full-vocabulary entropy and final-layer attention, then pooling and the head. Peak memory is the "
                  f"process's resident peak above its size before the call, so it leaves out the model's weights "
                  f"({o['model_weights_mib']:.0f} MiB), the same for both.", "",
                  *_overhead_table(o)]
    lines += ["", f"Figures: `{STEM}_mae.png` (MAE by scenario), `{STEM}_lambda.png`, "
              f"`{STEM}_weights.png` (Figure 6: per-token pooling weights, ESTP vs EGTP)."]
    return "\n".join(lines) + "\n"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_mae(result: dict, path: Path) -> None:
    plt = _pyplot()
    cols, methods = scenarios_of(result), result["methods"]
    width = 0.8 / max(len(methods), 1)
    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(cols), 3.6))
    for i, (name, m) in enumerate(methods.items()):
        ax.bar(np.arange(len(cols)) + i * width, [m[s]["mae"] for s in cols], width, label=result["labels"][name])
    floor = [(c + 0.4 - width / 2, result["noise_floor_mae"].get(s)) for c, s in enumerate(cols)]
    floor = [(x, v) for x, v in floor if v is not None]
    if floor:
        ax.scatter(*zip(*floor), marker="_", s=600, color="black", label="noise floor", zorder=3)
    ax.set_xticks(np.arange(len(cols)) + 0.4 - width / 2, cols)
    ax.set(ylabel="MAE (tokens)", title="Test MAE by scenario")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_lambda(result: dict, path: Path) -> None:
    plt = _pyplot()
    sweep = result["lambda_sweep"]
    lams = [float(k) for k in sweep]
    fig, ax = plt.subplots(figsize=(4.8, 3.2))
    for s in scenarios_of(result):
        ax.plot(lams, [m[s]["mae"] for m in sweep.values()], marker="o", label=s, lw=2.5 if s == "avg" else 1)
    ax.set(xlabel="lambda (weight of attention S)", ylabel="MAE (tokens)", title="ESTP lambda sensitivity")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_weights(examples: list[dict], path: Path) -> None:
    """Figure 6: per-token weights of each pooling, one panel per prompt, tokens on the x axis."""
    plt = _pyplot()
    methods = [k for k in examples[0] if k not in ("prompt_id", "tokens")]
    widest = max(len(e["tokens"]) for e in examples)
    fig, axes = plt.subplots(len(examples), 1, figsize=(max(6.0, 0.16 * widest), 2.6 * len(examples)), squeeze=False)
    width = 0.8 / len(methods)
    for ax, e in zip(axes[:, 0], examples):
        x = np.arange(len(e["tokens"]))
        for i, m in enumerate(methods):
            ax.bar(x + i * width, e[m], width, label=m.upper())
        ax.set_xticks(x + 0.4 - width / 2, [repr(t)[1:-1] for t in e["tokens"]], rotation=90, fontsize=6)
        ax.set(ylabel="weight", title=e["prompt_id"])
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(result: dict, out_dir: Path) -> list[Path]:
    """The JSON, the .md beside it, and the plots whose data the run has."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{STEM}.json", out_dir / f"{STEM}.md"]
    paths[0].write_text(json.dumps(result, indent=2) + "\n")
    paths[1].write_text(markdown(result))
    plots = ((plot_mae, result["methods"], "mae"), (plot_lambda, result["lambda_sweep"], "lambda"))
    for plot, data, name in plots:
        if data:
            paths.append(out_dir / f"{STEM}_{name}.png")
            plot(result, paths[-1])
    if result.get("token_weights"):
        paths.append(out_dir / f"{STEM}_weights.png")
        plot_weights(result["token_weights"], paths[-1])
    return paths
