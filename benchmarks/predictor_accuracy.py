"""Length-predictor accuracy on the dataset's test split: the paper's Tables 2, 3, 6, Figures 5, 6.

Every method (ESTP, EGTP, average pooling, last token, TRAIL, SSJF-Reg, SSJF-MC, LTR-C), ESTP's
ablations and its lambda sweep are trained the same way (predictor/train.py: train split, early
stop on val) on the same data and scored on test: MAE, RMSE, Short/Medium/Long accuracy per
scenario and averaged, beside the noise floor. Then ESTP's per-request latency and peak memory
against a plain prefill of the same prompts, and ESTP's vs EGTP's per-token weights.

    python -m benchmarks.predictor_accuracy                          # everything, full dataset
    python -m benchmarks.predictor_accuracy --limit 200 --seeds 1 --methods estp egtp

Writes benchmarks/results/predictor_accuracy.{json,md} and predictor_accuracy_*.png. Prefill
features are cached per prompt (predictor/cache/, shared with predictor.train), so a rerun or a
grown dataset only pays for new prompts.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from benchmarks.accuracy import overhead, report
from benchmarks.accuracy.evaluate import (SPLITS, limit_examples, noise_floors, round_robin, scenario_median,
                                          score_variants)
from benchmarks.accuracy.variants import VARIANTS, select
from benchmarks.forelen.build import DEFAULT_OUT
from predictor.dataset import load_samples
from benchmarks.forelen.datasheet import RESULTS
from predictor.estimator import LengthEstimator
from predictor.features import FeatureConfig
from predictor.pooling import pooling_weights
from predictor.train import (CACHE_DIR, DEFAULT_TRAIL_LAYER, FeatureCache, cached_features, data_version,
                             open_dataset, train_method)

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
    p.add_argument("--limit", type=int, help="samples per split (whole prompts, round-robin over scenarios)")
    p.add_argument("--methods", nargs="+", default=["all"],
                   help=f"variants or groups: {', '.join(VARIANTS)}, methods, ablations, lambda_sweep, all")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 when sharing the CPU)")
    p.add_argument("--seeds", type=int, default=3, help="training seeds per method; metrics are their mean")
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--patience", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5, help="timing repeats for the overhead (0 skips it)")
    p.add_argument("--model", default="embedded", help="'embedded' or a Hugging Face model folder")
    p.add_argument("--cache-dir", type=Path, default=CACHE_DIR)
    p.add_argument("--max-batch-tokens", type=int, default=4096)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    variants = select(args.methods)
    model_dir, model_hash, tokenizer, settings, splits = open_dataset(args.model, args.dataset, SPLITS, args.samples)
    rows = load_samples(args.dataset, first=args.samples)
    scenario = {r["prompt_id"]: r["scenario"] for r in rows}
    text = {r["prompt_id"]: r["prompt"] for r in rows}
    splits = {s: limit_examples(splits[s], args.limit, scenario) for s in SPLITS}

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    cache = FeatureCache(args.cache_dir, model_hash, FeatureConfig(aux_layer=DEFAULT_TRAIL_LAYER))
    cache.fill(model, [e for s in SPLITS for e in splits[s]], tokenizer.pad_token_id, args.max_batch_tokens)
    proxy = None
    if any(v.proxy for v in variants.values()):
        from predictor.proxy_encoder import ProxyEncoder

        encoder = ProxyEncoder()
        proxy = {s: encoder.encode([text[e.prompt_id] for e in splits[s]]) for s in tqdm(SPLITS, desc="proxy encoder")}

    fit = dict(epochs=args.epochs, patience=args.patience)
    result = score_variants(variants, splits, cache, proxy, scenario, int(settings["max_tokens"]), args.seeds, **fit)
    floors, sources = noise_floors(args.dataset, sorted({scenario[e.prompt_id] for e in splits["test"]}),
                                   args.samples)
    result.update(noise_floor_mae=floors, noise_floor_source=sources, scenario_median=scenario_median(splits, scenario))
    result["token_weights"] = token_weights(cache, tokenizer, _figure_prompts(splits["test"], scenario))
    n_samples = len(rows)
    result["dataset"] = {
        "path": str(args.dataset), "version": data_version(args.dataset, settings, n_samples), "samples": n_samples,
        "limit": args.limit,
        "splits": {s: {"prompts": len(splits[s]), "samples": sum(len(e.lengths) for e in splits[s])} for s in SPLITS},
    }
    result["settings"] = {"seeds": args.seeds, "threads": args.threads, "trail_layer": DEFAULT_TRAIL_LAYER, **fit}
    if args.repeats > 0:
        # Last: the memory probe changes how the C allocator returns memory for the rest of the process.
        head, meta, _ = train_method(cache, splits, settings, VARIANTS["estp"].recipe, model_hash=model_hash,
                                     dataset_dir=args.dataset, **fit)
        estimator = LengthEstimator(model, tokenizer, {"estp": (head, meta)}, max_batch_tokens=args.max_batch_tokens)
        prompts = _overhead_prompts(splits, scenario)
        result["overhead"] = overhead.measure(estimator, prompts, (1, len(prompts)), args.repeats)

    report.write(result, args.out_dir)
    print(json.dumps({n: m["avg"]["mae"] for n, m in result["methods"].items()}))
    return result


if __name__ == "__main__":
    main()
