"""Markdown tables and plots from the benchmark's JSON, shaped like the paper's Tables 2, 3, 6 and
Figures 5, 6, with the comparison against EGTP written from the numbers, wins and losses alike.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from benchmarks.accuracy.metrics import CLASSES, LONG_ABOVE, SHORT_BELOW
from benchmarks.parts import noted

STEM = "predictor_accuracy"
MAE_COLUMNS = (("mae", "MAE"), ("rmse", "RMSE"))
GROUP_TITLES = {"ablations": "Table 6: ablations",
                "lambda_sweep": "Table 8: lambda sensitivity (lambda on attention S, 1 - lambda on entropy H)",
                "toward_ceiling": "Training toward the ceiling: multi-sample targets, regularisation, views, ensembles"}
# Issue targets: ESTP within this factor of each scenario's noise floor, and at least this share of
# the ceiling pool accuracy.
FLOOR_FACTOR = 1.15
CEILING_SHARE = 0.85
SIGNIFICANCE = 0.05


def _num(value, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _pct(value) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _pm(m: dict, key: str = "mae") -> str:
    """A MAE with its standard error."""
    se = m.get(f"{key}_se")
    return _num(m[key]) + (f" ± {se:.1f}" if se is not None else "")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def scenarios_of(result: dict) -> list[str]:
    groups = {**result["methods"], **result["ablations"], **result["lambda_sweep"], **result["toward_ceiling"]}
    first = next(iter(groups.values()))
    return [s for s in first if s != "avg"] + ["avg"]


def _floor_rows(result: dict, cols: list[str], keys) -> list[list[str]]:
    """The prompt-free reference and the noise floors, in a table of (metric, title) columns."""
    reference = result["scenario_median"]
    rows = [["scenario median (no prompt)", *(_num(reference[s][key]) for s in cols for key, _ in keys)]]
    for name, floor in (("noise floor, in-sample median", result["noise_floor_mae"]),
                        ("noise floor, leave-one-out median", result["noise_floor_mae_leave_one_out"])):
        values = {**floor, "avg": _mean([floor.get(s) for s in cols if s != "avg"])}
        rows.append([name, *(_num(values.get(s)) if key.startswith("mae") else "" for s in cols for key, _ in keys)])
    return rows


def _mean(values: list) -> float | None:
    return None if not values or None in values else float(np.mean(values))


def _error_table(result: dict, group: dict[str, dict], first_column: str, floor_rows: bool = False,
                 keys=MAE_COLUMNS) -> list[str]:
    """Table 2's shape: MAE (± its standard error) and RMSE per scenario and their average."""
    cols = scenarios_of(result)
    header = [first_column, *(f"{s} {title}" for s in cols for _, title in keys)]
    rows = [[result["labels"].get(name, name), *(_pm(m[s], key) if key.startswith("mae") else _num(m[s][key])
                                                 for s in cols for key, _ in keys)]
            for name, m in group.items()]
    if floor_rows:
        rows += _floor_rows(result, cols, keys)
    return _table(header, rows)


def _accuracy_tables(result: dict) -> list[str]:
    cols = scenarios_of(result)
    by_class = _table(["method", *(f"{c.capitalize()} acc" for c in CLASSES), "overall acc"], [
        [result["labels"][n], *(_num(m["avg"][f"acc_{c}"], 3) for c in CLASSES), _num(m["avg"]["acc"], 3)]
        for n, m in result["methods"].items()])
    by_scenario = _table(["method", *(f"{s} acc" for s in cols)], [
        [result["labels"][n], *(_num(m[s]["acc"], 3) for s in cols)] for n, m in result["methods"].items()])
    return [*by_class, "", *by_scenario]


def _ceiling(result: dict, scenario: str, kind: str) -> float | None:
    return result["ceiling_pool_accuracy"].get(scenario, {}).get(kind)


def _pool_table(result: dict, group: dict[str, dict]) -> list[str]:
    """Pool accuracy on all samples and on the multi-sample prompts, beside the ceiling."""
    cols = scenarios_of(result)
    rows = [[result["labels"].get(n, n), *(f"{_pct(m[s]['pool_acc'])} / {_pct(m[s]['pool_acc_multi'])}" for s in cols)]
            for n, m in group.items()]
    rows.append(["scenario median (no prompt)", *(f"{_pct(result['scenario_median'][s]['pool_acc'])} / "
                                                   f"{_pct(result['scenario_median'][s]['pool_acc_multi'])}" for s in cols)])
    for kind in ("in_sample", "leave_one_out"):
        rows.append([f"ceiling, {kind.replace('_', '-')} median", *("– / " + _pct(_ceiling(result, s, kind)) for s in cols)])
    return _table(["method", *(f"{s} all / multi" for s in cols)], rows)


def _coverage_table(result: dict, group: dict[str, dict]) -> list[str]:
    cols = scenarios_of(result)
    return _table(["method", *cols], [[result["labels"].get(n, n), *(_pct(m[s]["coverage_p10_p90"]) for s in cols)]
                                      for n, m in group.items() if m["avg"]["coverage_p10_p90"] is not None])


def _paired_table(result: dict, reference: str) -> list[str]:
    rows = []
    for key, t in result["evaluation"]["paired_tests"].items():
        if not key.startswith(f"{reference}_vs_"):
            continue
        other = key.removeprefix(f"{reference}_vs_")
        rows.append([result["labels"].get(other, other), f"{t['mae_difference']:+.1f} ± {t['se']:.1f}",
                     f"{t['p_value']:.3g}", f"{t['wilcoxon_p_value']:.3g}",
                     f"{t['p50']['mae_difference']:+.1f} ± {t['p50']['se']:.1f}", f"{t['p50']['p_value']:.3g}"])
    return _table([f"{result['labels'].get(reference, reference)} vs", "avg MAE difference", "p (paired t)",
                   "p (Wilcoxon)", "p50 MAE difference", "p (p50, paired t)"], rows)


def _overhead_table(overhead: dict, labels: dict) -> list[str]:
    rows = []
    for key, row in overhead.items():
        if key.startswith("batch_"):
            for name in overhead["predictors"]:
                rows.append([key.removeprefix("batch_"), labels.get(name, name), f"{row['prefill_ms_per_request']:.1f}",
                             f"{row[f'{name}_ms_per_request']:.1f}", f"{row[f'{name}_latency_ratio']:.2f}",
                             f"{row['prefill_peak_mib']:.0f}", f"{row[f'{name}_peak_mib']:.0f}",
                             f"{row[f'{name}_memory_ratio']:.2f}"])
    return _table(["batch", "predictor", "prefill ms/request", "predictor ms/request", "latency ratio",
                   "prefill peak MiB", "predictor peak MiB", "memory ratio"], rows)


def _test(result: dict, a: str, b: str) -> dict | None:
    return result["evaluation"]["paired_tests"].get(f"{a}_vs_{b}")


def comparison(result: dict) -> list[str]:
    """Where ESTP does and does not beat EGTP (and the other methods), from the numbers."""
    methods = result["methods"]
    if "estp" not in methods or "egtp" not in methods:
        return ["ESTP and EGTP were not both run: no comparison."]
    estp, egtp = methods["estp"], methods["egtp"]
    outcome = {"loses to": [], "ties with": [], "beats": []}
    for s in scenarios_of(result):
        for key, sign in (("mae", -1), ("mae_p50", -1), ("acc", 1), ("pool_acc", 1)):  # +1: higher is better
            a, b = estp[s][key], egtp[s][key]
            digits = 3 if "acc" in key else 1
            verdict = "ties with" if a == b else "beats" if sign * (a - b) > 0 else "loses to"
            outcome[verdict].append(f"{s} {key.upper()} ({_num(a, digits)} vs {_num(b, digits)})")
    lines = [f"ESTP {verdict} EGTP on: " + "; ".join(items) + "." for verdict, items in outcome.items() if items]
    test = _test(result, "estp", "egtp")
    lines.append(f"Paired over prompts, ESTP's average MAE differs from EGTP's by {test['mae_difference']:+.1f} ± "
                 f"{test['se']:.1f} tokens (p = {test['p_value']:.3g})"
                 + ("." if test["p_value"] < SIGNIFICANCE else ": not a significant difference."))
    best = min(methods, key=lambda n: methods[n]["avg"]["mae"])
    if best != "estp":
        lines.append(f"Lowest average MAE of the methods: {result['labels'][best]} ({_pm(methods[best]['avg'])}), "
                     f"not ESTP ({_pm(estp['avg'])}).")
    reference = result["scenario_median"]["avg"]["mae"]
    learned = [result["labels"][n] for n, m in methods.items() if m["avg"]["mae"] < reference]
    lines.append(f"Predicting each scenario's median training length without reading the prompt gives an average "
                 f"MAE of {_num(reference)}; " + (f"{', '.join(learned)} beat{'s' if len(learned) == 1 else ''} it."
                                                  if learned else "no method beats it."))
    return [" ".join(lines)]


def targets(result: dict, name: str) -> list[str]:
    """The issue's targets for one head (ESTP, or the best head by the folds), each met or
    missed, from the numbers."""
    candidates = {**result["methods"], **result["toward_ceiling"]}
    if name not in candidates:
        return [f"{name} was not run."]
    m, label = candidates[name], result["labels"].get(name, name)
    best = min(candidates, key=lambda n: candidates[n]["avg"]["mae"])
    lines = [f"- Lowest average MAE of all methods and variants: {'met' if best == name else 'missed'} "
             f"({label} {_pm(m['avg'])}; lowest {result['labels'].get(best, best)} {_pm(candidates[best]['avg'])})."]
    for other in ("egtp", "avg"):
        t = _test(result, name, other)
        if t:
            met = t["p_value"] < SIGNIFICANCE and t["mae_difference"] < 0
            lines.append(f"- Better than {result['labels'][other]} with p < {SIGNIFICANCE}: {'met' if met else 'missed'} "
                         f"(difference {t['mae_difference']:+.1f} ± {t['se']:.1f}, p = {t['p_value']:.3g}).")
    ratios = []
    for s, floor in result["noise_floor_mae"].items():
        if floor is not None and s in m:
            ratios.append(f"{s} {m[s]['mae'] / floor:.2f}x ({m[s]['mae_multi'] / floor:.2f}x on its multi-sample prompts; "
                          f"floor {_num(floor)}, leave-one-out {_num(result['noise_floor_mae_leave_one_out'].get(s))})")
    met = all(m[s]["mae"] / f <= FLOOR_FACTOR for s, f in result["noise_floor_mae"].items() if f is not None and s in m)
    lines.append(f"- Every scenario within {FLOOR_FACTOR}x of its (in-sample) noise floor: {'met' if met else 'missed'}: "
                 + "; ".join(ratios) + ".")
    ceiling, loo = _ceiling(result, "avg", "in_sample"), _ceiling(result, "avg", "leave_one_out")
    if ceiling:
        share = m["avg"]["pool_acc_multi"] / ceiling
        lines.append(f"- Pool accuracy at least {CEILING_SHARE:.0%} of the ceiling's: {'met' if share >= CEILING_SHARE else 'missed'} "
                     f"({_pct(m['avg']['pool_acc_multi'])} on the multi-sample prompts = {share:.0%} of the "
                     f"in-sample ceiling {_pct(ceiling)}; {m['avg']['pool_acc_multi'] / loo:.0%} of the "
                     f"leave-one-out ceiling {_pct(loo)}).")
    if m["avg"]["coverage_p10_p90"] is not None:
        lines.append(f"- [p10, p90] coverage: {_pct(m['avg']['coverage_p10_p90'])} (target 80%).")
    return lines


def markdown(result: dict) -> str:
    d, e = result["dataset"], result["evaluation"]
    rerun = f"python -m benchmarks.predictor_accuracy --samples {d['samples']}" + (f" --limit {d['limit']}" if d.get("limit") else "")
    best = e["best"]
    lines = [
        "# Length predictor accuracy (the paper's Tables 2, 3, 6, 8 and Figures 5, 6), cross-validated",
        "",
        f"Dataset `{d['version']}`: {d['prompts']} prompts, {d['evaluated_samples']} samples"
        f"{' (limited with --limit)' if d.get('limit') else ''}, all splits. {e['folds']}-fold cross-validation by "
        f"prompt, stratified by scenario: every prompt is predicted by heads trained on the other folds (early "
        f"stopping and calibration on {e['inner_val_fraction']:.0%} of the training folds), "
        f"{e['seeds']} training seed(s) per method; MAE is the mean over seeds, ± its standard error clustered by "
        f"prompt. avg = unweighted mean over scenarios. Regenerate with `{rerun}` (the first {d['samples']} samples built).",
        "",
        "## Targets",
        "",
        "ESTP:",
        "",
        *targets(result, "estp"),
        "",
        *([f"The best head by the folds, {result['labels'].get(best, best)} (`{best}`):", "", *targets(result, best), ""]
          if best != "estp" else []),
        "## Table 2: MAE (± standard error) and RMSE (tokens), expected length",
        "",
        *_error_table(result, result["methods"], "method", floor_rows=True),
        "",
        "Noise floor: MAE of predicting each prompt's sample median (prompts sampled more than once). With 4 samples "
        "per prompt the in-sample median is optimistic and the leave-one-out median (of the other samples) is "
        "pessimistic; the true floor lies between them (benchmarks/results/forelen_dataset.md).",
        "",
        "## MAE of the predicted median (p50)",
        "",
        *_error_table(result, result["methods"], "method", floor_rows=True, keys=(("mae_p50", "p50 MAE"),)),
        "",
        "## Paired tests (per prompt)",
        "",
        *_paired_table(result, "estp"),
    ]
    if best != "estp":
        lines += ["", *_paired_table(result, best)]
    lines += [
        "",
        f"## Table 3: Short (< {SHORT_BELOW}) / Medium ({SHORT_BELOW}-{LONG_ABOVE}) / Long (> {LONG_ABOVE}) accuracy",
        "",
        "The predicted class comes from the expected tokens; per-class accuracy is the share of that true class "
        "predicted in it, averaged over scenarios (n/a: no sample of that class).",
        "",
        *_accuracy_tables(result),
        "",
        "## Pool accuracy (the router's pools) against the ceiling",
        "",
        f"Pools {', '.join(result['pools']['names'])} with edges {', '.join(f'{x:.0f}' for x in result['pools']['edges'])} "
        "tokens (equal shares of the ESTP head's training lengths, as the router sets them); a head's pool is the one "
        "its distribution puts the most mass on. all: every sample; multi: the prompts sampled more than once, the "
        "samples the ceiling (routing on the prompt's sample median) is measured on.",
        "",
        *_pool_table(result, {**result["methods"], **result["toward_ceiling"]}),
        "",
        "## Coverage of [p10, p90] (target 80%)",
        "",
        *_coverage_table(result, {**result["methods"], **result["toward_ceiling"]}),
        "",
        "## Where ESTP does not beat EGTP",
        "",
        *comparison(result),
    ]
    for group, title in GROUP_TITLES.items():
        if result[group]:
            reference = {"estp": result["methods"]["estp"]} if "estp" in result["methods"] else {}
            lines += ["", f"## {title}", "", *_error_table(result, {**reference, **result[group]}, "variant",
                                                            keys=(("mae", "MAE"), ("mae_p50", "p50 MAE")))]
    if "overhead" in result:
        o = result["overhead"]
        prompts = ", ".join(f"{k}: {v['prompt_tokens']} tokens" for k, v in o.items() if k.startswith("batch_"))
        lines += ["", "## Figure 5: predictor overhead against a plain prefill", "",
                  f"Median of {o['repeats']} repeats, {o['threads']} CPU thread(s), the same prompts side by side "
                  f"({prompts}). "
                  "Plain prefill computes last-position logits only; a predictor runs its own forward with the "
                  "features its head reads (ESTP: full-vocabulary entropy and final-layer attention; a last-token "
                  "head: the hidden states only), then pooling and the head. Peak memory is the process's resident "
                  f"peak above its size before the call, so it leaves out the model's weights "
                  f"({o['model_weights_mib']:.0f} MiB), the same for all.", "",
                  *_overhead_table(o, result["labels"])]
    if "weight_shares" in result:
        w = result["weight_shares"]
        lines += ["", "## Figure 6: where the pooling weight goes", "",
                  f"Median over the {d['prompts']} prompts ({w['prompt_tokens_median']:.0f} tokens each at the median): "
                  f"the {w['prefix_tokens']} tokens of the chat template's system prompt before the user's text, the same "
                  f"for every prompt (so, under causal attention, are their hidden states); the {w['suffix_tokens']} "
                  "template tokens after it, which end in the state the model decodes from; the last token alone; and "
                  "the effective number of tokens pooled (1 / sum w^2).", "",
                  *_table(["pooling", "system prompt", "template end", "last token", "effective tokens"],
                          [[m.upper(), _pct(w[m]["prefix"]), _pct(w[m]["suffix"]), _pct(w[m]["last"]),
                            f"{w[m]['effective_tokens']:.0f}"] for m in ("estp", "egtp")])]
    lines += ["", f"Figures: `{STEM}_mae.png` (MAE by scenario), `{STEM}_lambda.png`, "
              f"`{STEM}_weights.png` (Figure 6: per-token pooling weights, ESTP vs EGTP)."]
    return "\n".join(lines) + "\n"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_mae(result: dict, path: Path) -> None:
    """Every method's MAE per scenario, and the best head by the folds where it is no method."""
    plt = _pyplot()
    best = result["evaluation"]["best"]
    cols, methods = scenarios_of(result), {**result["methods"], best: {**result["methods"], **result["toward_ceiling"]}[best]}
    width = 0.8 / max(len(methods), 1)
    fig, ax = plt.subplots(figsize=(4.0 + 1.4 * len(cols), 3.6))
    for i, (name, m) in enumerate(methods.items()):
        ax.bar(np.arange(len(cols)) + i * width, [m[s]["mae"] for s in cols], width, label=result["labels"][name],
               color=plt.cm.tab20(i % 20))
    for key, label, colour in (("noise_floor_mae", "noise floor (in-sample)", "black"),
                               ("noise_floor_mae_leave_one_out", "noise floor (leave-one-out)", "grey")):
        floor = [(c + 0.4 - width / 2, result[key].get(s)) for c, s in enumerate(cols)]
        floor = [(x, v) for x, v in floor if v is not None]
        if floor:
            ax.scatter(*zip(*floor), marker="_", s=600, color=colour, label=label, zorder=3)
    ax.set_xticks(np.arange(len(cols)) + 0.4 - width / 2, cols)
    ax.set(ylabel="MAE (tokens)", title="Cross-validated MAE by scenario")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
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
    paths[1].write_text(noted(markdown(result), result))
    plots = ((plot_mae, result["methods"], "mae"), (plot_lambda, result["lambda_sweep"], "lambda"))
    for plot, data, name in plots:
        if data:
            paths.append(out_dir / f"{STEM}_{name}.png")
            plot(result, paths[-1])
    if result.get("token_weights"):
        paths.append(out_dir / f"{STEM}_weights.png")
        plot_weights(result["token_weights"], paths[-1])
    return paths
