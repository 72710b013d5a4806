"""Train a length head on a generated dataset (benchmarks/forelen): features once, then the head.

Prefill features are the expensive part (a forward pass of the serving model per prompt), while
the head trains in seconds, so per-token features are cached per prompt under `predictor/cache/`
(git-ignored), keyed by model weights, feature settings and the prompt's token ids. Every method,
lambda/alpha setting and ablation then reuses the same cache, and a growing dataset only costs
the new prompts.

    python -m predictor.train --dataset benchmarks/datasets/smollm2-135m-instruct --method estp
    python -m predictor.train --dataset ... --method estp --lam 0 --out predictor/checkpoints/estp-entropy-only

Train split fits the head, val drives early stopping (on MAE in tokens) and the calibration of its
distribution; test is left untouched for the benchmark.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from predictor.dataset import load_meta, load_samples
from predictor.model_files import model_weights_hash
from predictor.checkpoint import CheckpointMeta, save_checkpoint
from predictor.estimator import encode_prompt
from predictor.features import FeatureConfig, PrefillFeatures, extract_features, micro_batches, pad_left, receiver_counts
from predictor.fit import FitConfig, train_on_inputs
from predictor.head import LengthHead
from predictor.losses import LossConfig
from predictor.pooling import PoolingConfig, pool

CACHE_DIR = Path(__file__).resolve().parent / "cache"
CHECKPOINT_DIR = Path(__file__).resolve().parent / "checkpoints"
# TRAIL probes an intermediate layer; about a third of the depth (10 of SmolLM2's 30 layers).
DEFAULT_TRAIL_LAYER = 10


def cached_layer(layer: int, trail_layer: int = DEFAULT_TRAIL_LAYER) -> FeatureConfig:
    """What the feature cache extracts for heads reading `layer`: every final-layer method shares
    one cache (with TRAIL's intermediate state beside it); an early exit gets its own, without the
    final layer's entropy and attention."""
    if layer == -1:
        return FeatureConfig(aux_layer=trail_layer)
    return FeatureConfig(layer=layer, entropy=False, attention=False)


@dataclass(frozen=True)
class Recipe:
    """A method as the paper compares it: pooling, bin count, loss, which layer is pooled, and how
    the head is fitted."""

    pooling: PoolingConfig
    loss: str
    bins: int = 20
    trail: bool = False  # pools the intermediate layer's last token instead of the final layer
    fit: FitConfig = field(default_factory=FitConfig)
    # The hidden layer pooled (FeatureConfig.layer). Below the final one the prefill stops there
    # (early exit), so only poolings that need neither entropy nor final-layer attention can use it.
    layer: int = -1

    def __post_init__(self):
        if self.layer != -1 and any(self.pooling.needs()):
            raise ValueError(f"layer {self.layer}: {self.pooling.method} reads the final layer's entropy or attention")



RECIPES = {
    "estp": Recipe(PoolingConfig(method="estp"), "crps+smoothl1"),
    "egtp": Recipe(PoolingConfig(method="egtp"), "ce+mse"),
    "avg": Recipe(PoolingConfig(method="avg"), "crps+smoothl1"),
    "last": Recipe(PoolingConfig(method="last"), "crps+smoothl1"),
    "trail": Recipe(PoolingConfig(method="last"), "ce", bins=10, trail=True),
    # The best head by the accuracy benchmark's folds on the embedded model: the last prompt
    # token's final-layer state, an ensemble of 5 seeds (benchmarks/results/predictor_accuracy.md).
    "last_ens5": Recipe(PoolingConfig(method="last"), "crps+smoothl1", fit=FitConfig(members=5)),
    # The same head on layer 4 of 30: the prefill stops there, at about a seventh of its cost
    # (docs/benchmarks.md, round 3), for a CPU where the prefill competes with decoding.
    "early4_ens5": Recipe(PoolingConfig(method="last"), "crps+smoothl1", fit=FitConfig(members=5), layer=4),
}


@dataclass
class Example:
    """One prompt with all its sampled output lengths (RL prompts are sampled several times)."""

    prompt_id: str
    ids: list[int]
    lengths: list[int] = field(default_factory=list)


def _sha16(data) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def read_dataset(dataset_dir: Path, tokenizer, first: int | None = None) -> tuple[dict, dict[str, list[Example]]]:
    """Dataset settings and examples per split (of the first N samples built, if given); prompts
    wrapped exactly as at generation time."""
    settings = load_meta(dataset_dir)["settings"]
    splits: dict[str, dict[str, Example]] = {}
    for r in load_samples(dataset_dir, first=first):
        examples = splits.setdefault(r["split"], {})
        if r["prompt_id"] not in examples:
            ids = encode_prompt(tokenizer, r["prompt"])
            if len(ids) != r["prompt_tokens"]:
                raise ValueError(f"{r['prompt_id']}: {len(ids)} prompt tokens here, "
                                 f"{r['prompt_tokens']} at generation: chat template differs")
            examples[r["prompt_id"]] = Example(r["prompt_id"], ids)
        examples[r["prompt_id"]].lengths.append(int(r["output_tokens"]))
    return settings, {name: list(ex.values()) for name, ex in splits.items()}


class FeatureCache:
    """Per-prompt features of valid tokens only; hidden states stored as float16 to halve the disk."""

    def __init__(self, root: Path, model_hash: str, config: FeatureConfig):
        key = _sha16(config.model_dump(include={"layer", "aux_layer", "debias"}))
        self.dir = Path(root) / f"{model_hash}-{key}"
        self.config = config

    def _path(self, ids: list[int]) -> Path:
        return self.dir / f"{_sha16(ids)}.safetensors"

    def missing(self, examples: list[Example]) -> list[Example]:
        unique = {self._path(e.ids): e for e in examples}
        return [e for path, e in unique.items() if not path.exists()]

    def fill(self, model, examples: list[Example], pad_id: int, max_batch_tokens: int = 4096) -> int:
        """Extract whatever is missing; returns how many prompts were extracted."""
        todo = self.missing(examples)
        self.dir.mkdir(parents=True, exist_ok=True)
        for n, group in enumerate(micro_batches([len(e.ids) for e in todo], max_batch_tokens, 32), 1):
            f = extract_features(model, *pad_left([todo[i].ids for i in group], pad_id), self.config)
            for row, i in enumerate(group):
                keep = f.mask[row]
                tensors = {"hidden": f.hidden[row, keep].half()}
                for name in ("entropy", "attention_received"):
                    if getattr(f, name) is not None:
                        tensors[name] = getattr(f, name)[row, keep]
                if f.aux_last is not None:
                    tensors["aux_last"] = f.aux_last[row]
                tmp = self._path(todo[i].ids).with_suffix(".partial")
                save_file({k: v.contiguous().cpu() for k, v in tensors.items()}, str(tmp))
                tmp.rename(self._path(todo[i].ids))
            print(f"features: batch {n}, {sum(len(todo[i].ids) for i in group)} tokens", flush=True)
        return len(todo)

    def load(self, ids: list[int]) -> dict[str, torch.Tensor]:
        return load_file(str(self._path(ids)))


def cached_features(tensors: dict[str, torch.Tensor], debias: bool) -> PrefillFeatures:
    """A batch of one prompt's cached features, as `extract_features` would return them."""
    mask = torch.ones(1, len(tensors["hidden"]), dtype=torch.bool)
    entropy, received = tensors.get("entropy"), tensors.get("attention_received")
    if received is not None:
        received = received[None]
        if not debias:  # the cache holds debiased values; undo it for the ablation
            received = received * receiver_counts(mask)
    return PrefillFeatures(hidden=tensors["hidden"].float()[None], mask=mask,
                           entropy=None if entropy is None else entropy[None], attention_received=received)


def pooled_inputs(cache: FeatureCache, examples: list[Example], recipe: Recipe, debias: bool) -> torch.Tensor:
    """[P, d] head inputs, one per prompt, pooled as the estimator will pool at inference."""
    rows = []
    for e in examples:
        t = cache.load(e.ids)
        rows.append(t["aux_last"].float() if recipe.trail else pool(cached_features(t, debias), recipe.pooling)[0])
    return torch.stack(rows)


def data_version(dataset_dir: Path, settings: dict, n_samples: int) -> str:
    """Names the data a head saw: the dataset folder, its generation settings, how many samples."""
    return f"{Path(dataset_dir).name}@{_sha16(settings)}:{n_samples}"


def train_method(
    cache: FeatureCache, splits: dict[str, list[Example]], settings: dict, recipe: Recipe, *, model_hash: str,
    dataset_dir: Path, debias: bool = True, tau: float = 1.0,
) -> tuple[LengthHead, CheckpointMeta, dict[str, float]]:
    """Train one method on cached prefill features (train split, early stop and calibration on
    val): head, its checkpoint settings, and the val metrics. The cache must already hold every
    train/val prompt."""
    loss = LossConfig(name=recipe.loss, tau=tau)
    x_train = pooled_inputs(cache, splits["train"], recipe, debias)
    head, bins, metrics = train_on_inputs(x_train, pooled_inputs(cache, splits["val"], recipe, debias),
                                          [e.lengths for e in splits["train"]], [e.lengths for e in splits["val"]],
                                          recipe.bins, loss, int(settings["max_tokens"]), recipe.fit)
    n_samples = sum(len(e.lengths) for e in splits["train"] + splits["val"])
    meta = CheckpointMeta(
        base_model_id=settings["model_id"],
        base_model_hash=model_hash,
        feature_layer=cache.config.aux_layer if recipe.trail else recipe.layer,
        feature_dim=x_train.shape[1],
        debias=debias,
        pooling=recipe.pooling,
        bins=bins,
        loss=loss,
        fit=recipe.fit,
        temperature=head.temperature,
        cdf_map=None if head.cdf_map is None else head.cdf_map.tolist(),
        training_data_version=data_version(dataset_dir, settings, n_samples),
        metrics=metrics,
    )
    return head, meta, metrics


def open_dataset(model: str, dataset_dir: Path, needed: tuple[str, ...] = ("train", "val"), first: int | None = None):
    """(model folder, weights hash, tokenizer, dataset settings, examples per split) for 'embedded'
    or a model folder; refuses a dataset generated by other weights or lacking a needed split."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    from predictor.model_files import resolve_model_source

    model_dir = resolve_model_source(model)
    model_hash = model_weights_hash(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    settings, splits = read_dataset(dataset_dir, tokenizer, first)
    if settings["weights_hash"] != model_hash:
        raise SystemExit(f"dataset was generated by weights {settings['weights_hash']}, model is {model_hash}")
    if any(not splits.get(s) for s in needed):
        raise SystemExit(f"need {', '.join(needed)} prompts; have {({k: len(v) for k, v in splits.items()})}")
    return model_dir, model_hash, tokenizer, settings, splits


def main(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", type=Path, required=True)
    p.add_argument("--samples", type=int, help="only the first N samples built (a snapshot of a growing dataset)")
    p.add_argument("--method", choices=sorted(RECIPES), default="estp")
    p.add_argument("--out", type=Path, help="checkpoint path (default predictor/checkpoints/<method>)")
    p.add_argument("--model", default="embedded", help="'embedded' or a Hugging Face model folder")
    p.add_argument("--cache-dir", type=Path, default=CACHE_DIR)
    p.add_argument("--lam", type=float, help="ESTP lambda (weight of attention vs entropy)")
    p.add_argument("--alpha", type=float, help="ESTP softmax temperature")
    p.add_argument("--normalisation", choices=["zscore", "minmax", "none"])
    p.add_argument("--no-sink-mask", action="store_true", help="ablation: let the attention sink be pooled")
    p.add_argument("--no-debias", action="store_true", help="ablation: no positional debiasing of attention")
    p.add_argument("--loss", help="override the method's loss (see predictor.losses.LOSSES)")
    p.add_argument("--bins", type=int, help="override the method's number of bins")
    p.add_argument("--tau", type=float, default=1.0, help="soft-label width in bins")
    p.add_argument("--trail-layer", type=int, default=DEFAULT_TRAIL_LAYER)
    for name, spec in FitConfig.model_fields.items():
        if spec.annotation is bool:
            continue
        kind = float if spec.annotation is float else int if spec.annotation in (int, int | None) else str
        p.add_argument(f"--{name.replace('_', '-')}", type=kind, help=f"head fitting (default: the method's, {spec.default})")
    p.add_argument("--standardise", action="store_true", default=None, help="z-score the head's inputs")

    p.add_argument("--max-batch-tokens", type=int, default=4096)
    p.add_argument("--threads", type=int, help="torch CPU threads (1 when sharing the CPU with an engine)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    model_dir, model_hash, tokenizer, settings, splits = open_dataset(args.model, args.dataset, first=args.samples)
    recipe = RECIPES[args.method]
    overrides = {k: v for k, v in dict(lam=args.lam, alpha=args.alpha, normalisation=args.normalisation).items()
                 if v is not None}
    if args.no_sink_mask:
        overrides["mask_sink"] = False
    fit = {k: getattr(args, k) for k in FitConfig.model_fields if getattr(args, k) is not None}
    recipe = Recipe(recipe.pooling.model_copy(update=overrides), args.loss or recipe.loss,
                    args.bins or recipe.bins, recipe.trail, FitConfig.model_validate({**recipe.fit.model_dump(), **fit}),
                    recipe.layer)
    debias = not args.no_debias

    cache = FeatureCache(args.cache_dir, model_hash, cached_layer(recipe.layer, args.trail_layer))
    examples = splits["train"] + splits["val"]
    if cache.missing(examples):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        cache.fill(model, examples, tokenizer.pad_token_id, args.max_batch_tokens)

    head, meta, _ = train_method(cache, splits, settings, recipe, model_hash=model_hash, dataset_dir=args.dataset,
                                 debias=debias, tau=args.tau)
    path = save_checkpoint(args.out or CHECKPOINT_DIR / args.method, head, meta)
    print(json.dumps({"checkpoint": str(path), "method": args.method, **meta.metrics}))
    return path


if __name__ == "__main__":
    main()
