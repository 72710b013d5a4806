"""Length-predictor accuracy by k-fold cross-validation: the paper's Tables 2, 3, 6, 8, Figures 5, 6.

Every method (ESTP, EGTP, average pooling, last token, TRAIL, SSJF-Reg, SSJF-MC, LTR-C, and the
TF-IDF text baselines), ESTP's ablations, its lambda sweep and the attempts to train it toward the
ceiling are cross-validated the same way over the whole dataset: 5 folds of prompts stratified by
scenario, each fold predicted by a head trained on the others (predictor/fit.py: early stopping
and calibration on an inner validation part). Scores per scenario and averaged: MAE of the
expected length and of the predicted median (p50), each with its standard error, RMSE,
Short/Medium/Long accuracy, pool accuracy with the router's pools, coverage of [p10, p90]; beside
them the noise floor and the ceiling pool accuracy (benchmarks/forelen/datasheet.py), and a paired
per-prompt test of ESTP against every other method. Then ESTP's per-request latency and peak
memory against a plain prefill, and ESTP's vs EGTP's per-token weights.

    python -m benchmarks.predictor_accuracy                          # everything, full dataset
    python -m benchmarks.predictor_accuracy --limit 400 --seeds 1 --methods estp egtp

Writes benchmarks/results/predictor_accuracy.{json,md} and predictor_accuracy_*.png. Prefill
features are cached per prompt (predictor/cache/, shared with predictor.train) and the
out-of-fold predictions per variant and seed (predictor/cache/cv/), so a stopped run resumes and
a rerun only pays for what changed.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from benchmarks.accuracy import overhead, report
from benchmarks.accuracy.corpus import Inputs, limit_examples, round_robin
from benchmarks.accuracy.crossval import Corpus, run_variants
from benchmarks.accuracy.folds import INNER_VAL_FRACTION, prompt_folds
from benchmarks.accuracy.scoring import paired_test, sample_errors, scenario_median, score
from benchmarks.accuracy.variants import VARIANTS, Variant, refit, select
from benchmarks.forelen.build import DEFAULT_OUT
from benchmarks.forelen.datasheet import ESTP_CHECKPOINT, RESULTS, ceiling, router_pools
from predictor.dataset import load_samples
from predictor.estimator import LengthEstimator, encode_prompt
from predictor.features import FeatureConfig
from predictor.pooling import pooling_weights
from predictor.train import (CACHE_DIR, DEFAULT_TRAIL_LAYER, FeatureCache, cached_features, data_version,
                             open_dataset, train_method)

SPLITS = ("train", "val", "test")
# Figure 6 shows every token of a prompt, so it picks prompts of at most this many tokens.
FIGURE_MAX_TOKENS = 96
OVERHEAD_PROMPTS = 8


def _figure_prompts(test, scenario: dict[str, str]) -> list:
    """Per scenario, the longest test prompt that still fits the figure."""
    longest = {}
    for e in sorted(test, key=lambda e: len(e.ids)):
        if len(e.ids) <= FIGURE_MAX_TOKENS:
            longest[scenario[e.prompt_id]] = e
    return [longest[s] for s in sorted(longest)]


def token_weights(cache: FeatureCache, tokenizer, examples) -> list[dict]:
    """Per-token pooling weights of ESTP and EGTP (Figure 6)."""
    out = []
    for e in examples:
        features = cached_features(cache.load(e.ids), debias=True)
        out.append({"prompt_id": e.prompt_id, "tokens": [tokenizer.decode([i]) for i in e.ids],
                    **{m: pooling_weights(features, VARIANTS[m].recipe.pooling)[0].tolist() for m in ("estp", "egtp")}})
    return out


def template_parts(tokenizer) -> tuple[int, int]:
    """(tokens before the user's text, tokens after it) of the chat template: the system prompt
    before it is the same for every prompt, and under causal attention so are its hidden states."""
    marker = "lengthserve"
    ids = encode_prompt(tokenizer, marker)
    inner = tokenizer(marker, add_special_tokens=False)["input_ids"]
    start = next(i for i in range(len(ids)) if ids[i:i + len(inner)] == inner)
    return start, len(ids) - start - len(inner)


def weight_shares(cache: FeatureCache, tokenizer, examples) -> dict:
    """Where ESTP's and EGTP's pooling weight goes, median over prompts: the shared template
    prefix, the template's closing tokens, the last token, and the effective number of tokens
    pooled (1 / sum w^2)."""
    prefix, suffix = template_parts(tokenizer)
    out: dict = {"prefix_tokens": prefix, "suffix_tokens": suffix,
                 "prompt_tokens_median": float(np.median([len(e.ids) for e in examples]))}
    for method in ("estp", "egtp"):
        rows = []
        for e in examples:
            w = pooling_weights(cached_features(cache.load(e.ids), debias=True), VARIANTS[method].recipe.pooling)[0]
            rows.append([w[:prefix].sum().item(), w[-suffix:].sum().item(), w[-1].item(), 1 / (w ** 2).sum().item()])
        out[method] = dict(zip(("prefix", "suffix", "last", "effective_tokens"), np.median(rows, axis=0).tolist()))
    return out


def _overhead_prompts(splits, scenario: dict[str, str]) -> list[list[int]]:
    """Prompts of typical length (closest to the median), round-robin over scenarios; from the
    test split, or from all splits when it has too few prompts."""
    pool = splits["test"] if len(splits["test"]) >= OVERHEAD_PROMPTS else [e for s in SPLITS for e in splits[s]]
    median = float(np.median([len(e.ids) for e in pool]))
    typical = sorted(pool, key=lambda e: abs(len(e.ids) - median))
    return [e.ids for e in round_robin(typical, scenario)[:OVERHEAD_PROMPTS]]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", type=Path, default=DEFAULT_OUT)
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    p.add_argument("--samples", type=int, help="only the first N samples built (a snapshot of a growing dataset)")
    p.add_argument("--limit", type=int, help="samples in all (whole prompts, round-robin over scenarios)")
    p.add_argument("--methods", nargs="+", default=["all"],
                   help=f"variants or groups: {', '.join(VARIANTS)}, methods, ablations, lambda_sweep, all")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 when sharing the CPU)")
    p.add_argument("--seeds", type=int, default=3, help="training seeds per method; metrics are their mean")
    p.add_argument("--folds", type=int, default=5, help="cross-validation folds (by prompt, stratified by scenario)")
    p.add_argument("--epochs", type=int, help="override every head's maximum epochs (quick runs)")
    p.add_argument("--patience", type=int, help="override every head's early-stopping patience")
    p.add_argument("--checkpoint", type=Path, default=ESTP_CHECKPOINT, help="head whose bins give the router's pools")
    p.add_argument("--repeats", type=int, default=5, help="timing repeats for the overhead (0 skips it)")
    p.add_argument("--model", default="embedded", help="'embedded' or a Hugging Face model folder")
    p.add_argument("--cache-dir", type=Path, default=CACHE_DIR)
    p.add_argument("--max-batch-tokens", type=int, default=4096)
    return p.parse_args(argv)


def _with_fit(variants: dict[str, Variant], **changes) -> dict[str, Variant]:
    """The variants with fitting settings overridden (None: unchanged)."""
    changes = {k: v for k, v in changes.items() if v is not None}
    if not changes:
        return variants
    return {n: replace(v, recipe=refit(v.recipe, **changes)) for n, v in variants.items()}


def paired_tests(reference: str, preds: dict, corpus: Corpus) -> dict:
    """`reference` against every other method: the paired test on expected-length MAE, and the
    same on p50 MAE under "p50"."""
    errors = {field: {n: sample_errors(p, corpus, field) for n, p in preds.items()} for field in ("expected", "p50")}
    return {f"{reference}_vs_{name}": {**paired_test(errors["expected"][reference], errors["expected"][name], corpus),
                                       "p50": paired_test(errors["p50"][reference], errors["p50"][name], corpus)}
            for name in preds if name != reference}


def evaluate(variants: dict[str, Variant], corpus: Corpus, inputs: Inputs, pools, seeds: int, cache_dir: Path) -> dict:
    """Scores of every variant under its group, the prompt-free reference, and the paired tests."""
    runs = run_variants(variants, inputs, corpus, pools, seeds, cache_dir)
    result: dict = {"methods": {}, "ablations": {}, "lambda_sweep": {}, "toward_ceiling": {}, "labels": {},
                    "training": {}}
    for name, (pred, metrics) in runs.items():
        v = variants[name]
        slot = f"{v.recipe.pooling.lam:g}" if v.group == "lambda_sweep" else name
        result[v.group][slot] = score(pred, corpus, pools)
        result["labels"][slot] = v.label
        result["training"][name] = metrics
    result["scenario_median"] = score(scenario_median(corpus, pools), corpus, pools)
    candidates = {**result["methods"], **result["toward_ceiling"]}
    best = min(candidates, key=lambda n: candidates[n]["avg"]["mae"])
    preds = {n: runs[n][0] for n in candidates}
    tests = paired_tests("estp", {n: preds[n] for n in result["methods"]}, corpus) if "estp" in result["methods"] else {}
    if best != "estp":
        tests.update(paired_tests(best, preds, corpus))
    result["evaluation"] = {"folds": int(corpus.folds.max()) + 1, "seeds": seeds, "inner_val_fraction": INNER_VAL_FRACTION,
                            "prompts": len(corpus.examples), "best": best, "paired_tests": tests}
    return result


def ceiling_pool_accuracy(limits: dict) -> dict:
    """Per scenario and averaged over them (unweighted, as the methods' avg), routing on the
    in-sample and on the leave-one-out median."""
    out = {s: {k: c[f"ceiling_pool_accuracy_{k}"] for k in ("in_sample", "leave_one_out")} for s, c in limits.items()}
    values = list(out.values())
    out["avg"] = {k: None if any(v[k] is None for v in values) else float(np.mean([v[k] for v in values]))
                  for k in ("in_sample", "leave_one_out")}
    return out


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    variants = _with_fit(select(args.methods), epochs=args.epochs, patience=args.patience)
    model_dir, model_hash, tokenizer, settings, splits = open_dataset(args.model, args.dataset, SPLITS, args.samples)
    rows = load_samples(args.dataset, first=args.samples)
    scenario = {r["prompt_id"]: r["scenario"] for r in rows}
    text = {r["prompt_id"]: r["prompt"] for r in rows}
    examples = limit_examples([e for s in SPLITS for e in splits[s]], args.limit, scenario)
    kept = {e.prompt_id for e in examples}
    splits = {s: [e for e in splits[s] if e.prompt_id in kept] for s in SPLITS}

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    cache = FeatureCache(args.cache_dir, model_hash, FeatureConfig(aux_layer=DEFAULT_TRAIL_LAYER))
    cache.fill(model, examples, tokenizer.pad_token_id, args.max_batch_tokens)

    def proxy_encoder():
        from predictor.proxy_encoder import ProxyEncoder

        return ProxyEncoder()

    pools = router_pools(args.checkpoint)
    scenarios = [scenario[e.prompt_id] for e in examples]
    corpus = Corpus(examples, scenarios, [text[e.prompt_id] for e in examples], prompt_folds(scenarios, args.folds),
                    int(settings["max_tokens"]))
    inputs = Inputs(examples, corpus.texts, cache, proxy_encoder)
    result = evaluate(variants, corpus, inputs, pools, args.seeds, args.cache_dir / "cv")
    limits = ceiling([r for r in rows if r["prompt_id"] in kept], pools)
    result.update(
        noise_floor_mae={s: c["noise_floor_mae_in_sample"] for s, c in limits.items()},
        noise_floor_mae_leave_one_out={s: c["noise_floor_mae_leave_one_out"] for s, c in limits.items()},
        ceiling_pool_accuracy=ceiling_pool_accuracy(limits),
        ceiling=limits, pools={"names": list(pools.names), "edges": list(pools.edges), "checkpoint": str(args.checkpoint)},
    )
    result["token_weights"] = token_weights(cache, tokenizer, _figure_prompts(splits["test"], scenario))
    result["weight_shares"] = weight_shares(cache, tokenizer, examples)
    n_samples = len(rows)
    result["dataset"] = {
        "path": str(args.dataset), "version": data_version(args.dataset, settings, n_samples), "samples": n_samples,
        "limit": args.limit, "prompts": len(examples), "evaluated_samples": sum(len(e.lengths) for e in examples),
        "splits": {s: {"prompts": len(splits[s]), "samples": sum(len(e.lengths) for e in splits[s])} for s in SPLITS},
    }
    result["settings"] = {"seeds": args.seeds, "folds": args.folds, "threads": args.threads,
                          "trail_layer": DEFAULT_TRAIL_LAYER, "epochs": args.epochs, "patience": args.patience}
    if args.repeats > 0:
        # Last: the memory probe changes how the C allocator returns memory for the rest of the process.
        # ESTP, and the best head by the folds beside it: each alone, as a deployment would serve it.
        timed = {name: {**VARIANTS, **variants}[name].recipe for name in dict.fromkeys(["estp", result["evaluation"]["best"]])}
        predictors = {}
        for name, recipe in timed.items():
            head, meta, _ = train_method(cache, splits, settings, recipe, model_hash=model_hash, dataset_dir=args.dataset)
            predictors[name] = LengthEstimator(model, tokenizer, {name: (head, meta)}, max_batch_tokens=args.max_batch_tokens)
        prompts = _overhead_prompts(splits, scenario)
        result["overhead"] = overhead.measure(predictors, prompts, (1, len(prompts)), args.repeats)

    report.write(result, args.out_dir)
    print(json.dumps({n: m["avg"]["mae"] for n, m in result["methods"].items()}))
    return result


if __name__ == "__main__":
    main()
