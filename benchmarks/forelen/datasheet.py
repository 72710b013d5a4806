"""Datasheet of a built dataset: counts, length quantiles, truncation share, and the noise floor.

The noise floor answers "how good can a prompt-only predictor get?": for prompts sampled several
times, predicting each prompt's sample median is the best constant per prompt under absolute
error, so its MAE is the floor under every MAE table. With few samples per prompt the in-sample
median is optimistic (the sample it is scored on helped choose it; with 4 samples, half the
errors are the smallest possible), while the median of the prompt's *other* samples
(leave-one-out, what the simulator's and replay's "ceiling" policy routes on) is pessimistic (a
median of 3 is noisy): the true floor lies between the two, so both are reported.

The ceiling pool accuracy is the same question for routing: the share of samples whose true
length falls in the pool that the prompt's sample median picks, with the router's pool edges
(equal shares of the ESTP head's training lengths, `Pools.from_quantiles`).

    python -m benchmarks.forelen.datasheet            # writes benchmarks/results/forelen_dataset.*
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from benchmarks.forelen.build import DEFAULT_OUT
from benchmarks.forelen.sources import SCENARIOS, SPLIT_FRACTIONS
from predictor.checkpoint import read_meta
from predictor.dataset import load_meta, load_samples
from router.scheduling.pools import Pools

RESULTS = Path(__file__).resolve().parents[1] / "results"
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9, 0.99)
ESTP_CHECKPOINT = Path(__file__).resolve().parents[2] / "predictor" / "checkpoints" / "estp" / "head"
POOLS = ("short", "medium", "long")


def prompt_lengths(rows: list[dict]) -> dict[str, np.ndarray]:
    """Every prompt's sampled lengths."""
    by_prompt: dict[str, list[int]] = defaultdict(list)
    for r in rows:
        by_prompt[r["prompt_id"]].append(r["output_tokens"])
    return {p: np.asarray(v, dtype=float) for p, v in by_prompt.items()}


def in_sample_medians(lengths: np.ndarray) -> np.ndarray | None:
    """Per sample, its prompt's median over all samples; None below 2 samples (no spread)."""
    return np.full(len(lengths), np.median(lengths)) if len(lengths) >= 2 else None


def leave_one_out_medians(lengths: np.ndarray) -> np.ndarray | None:
    """Per sample, the median of the prompt's other samples; None below 3 samples (a median of
    one other sample is that sample, not a median)."""
    if len(lengths) < 3:
        return None
    return np.array([np.median(np.delete(lengths, i)) for i in range(len(lengths))])


def _reference_pairs(rows: list[dict], reference) -> tuple[np.ndarray, np.ndarray]:
    """(true lengths, reference predictions) over the prompts that have a reference."""
    pairs = [(x, ref) for x in prompt_lengths(rows).values() if (ref := reference(x)) is not None]
    if not pairs:
        return np.empty(0), np.empty(0)
    return np.concatenate([t for t, _ in pairs]), np.concatenate([r for _, r in pairs])


def noise_floor_mae(rows: list[dict], reference=in_sample_medians) -> float | None:
    truth, predicted = _reference_pairs(rows, reference)
    return float(np.abs(truth - predicted).mean()) if truth.size else None


def within_prompt_variance_share(rows: list[dict]) -> float | None:
    """Share of the length variance (sum of squares) of prompts sampled more than once that lies
    within prompts: the part no prompt-only predictor can explain."""
    groups = [x for x in prompt_lengths(rows).values() if len(x) >= 2]
    if not groups:
        return None
    every = np.concatenate(groups)
    total = ((every - every.mean()) ** 2).sum()
    return float(sum(((x - x.mean()) ** 2).sum() for x in groups) / total) if total > 0 else None


def pool_accuracy(predicted, truth, pools: Pools) -> float:
    """Share of samples routed to the pool their true length falls in."""
    return float(np.mean([pools.pool_of(p) == pools.pool_of(t) for p, t in zip(predicted, truth)]))


def ceiling_pool_accuracy(rows: list[dict], pools: Pools, reference=in_sample_medians) -> float | None:
    truth, predicted = _reference_pairs(rows, reference)
    return pool_accuracy(predicted, truth, pools) if truth.size else None


def router_pools(checkpoint: Path = ESTP_CHECKPOINT) -> Pools:
    """The router's default pools: equal shares of the ESTP head's training lengths."""
    return Pools.from_quantiles(list(POOLS), read_meta(checkpoint).bins)


REFERENCES = {"in_sample": in_sample_medians, "leave_one_out": leave_one_out_medians}


def ceiling(rows: list[dict], pools: Pools) -> dict:
    """Per scenario: noise-floor MAE, within-prompt variance share and ceiling pool accuracy,
    for the in-sample and the leave-one-out median; the prompts and samples each covers."""
    out = {}
    for name in SCENARIOS:
        sub = [r for r in rows if r["scenario"] == name]
        if not sub:
            continue
        counts = [len(x) for x in prompt_lengths(sub).values()]
        out[name] = {
            "prompts_2plus": sum(c >= 2 for c in counts), "samples_2plus": sum(c for c in counts if c >= 2),
            "prompts_3plus": sum(c >= 3 for c in counts), "samples_3plus": sum(c for c in counts if c >= 3),
            "within_prompt_variance_share": within_prompt_variance_share(sub),
            **{f"noise_floor_mae_{k}": noise_floor_mae(sub, ref) for k, ref in REFERENCES.items()},
            **{f"ceiling_pool_accuracy_{k}": ceiling_pool_accuracy(sub, pools, ref) for k, ref in REFERENCES.items()},
        }
    return out


def target_samples(settings: dict, scenario: str) -> int:
    """Samples a complete build holds: train prompts get `samples`, val and test prompts at least
    `heldout_samples` (sources.SPLIT_FRACTIONS; the train share is rounded as the splits are)."""
    n, each = settings["prompts"][scenario], settings["samples"][scenario]
    held_out = n - round(dict(SPLIT_FRACTIONS)["train"] * n)
    return (n - held_out) * each + held_out * max(each, settings.get("heldout_samples", {}).get(scenario, 0))


def summarize(rows: list[dict], meta: dict, pools: Pools) -> dict:
    settings = meta["settings"]
    scenarios = {}
    for name in SCENARIOS:
        sub = [r for r in rows if r["scenario"] == name]
        if not sub:
            continue
        lengths = np.array([r["output_tokens"] for r in sub])
        splits = defaultdict(lambda: {"prompts": set(), "samples": 0})
        for r in sub:
            splits[r["split"]]["prompts"].add(r["prompt_id"])
            splits[r["split"]]["samples"] += 1
        target = target_samples(settings, name)
        scenarios[name] = {
            "prompts": len({r["prompt_id"] for r in sub}),
            "samples": len(sub),
            "target_samples": target,
            "splits": {k: {"prompts": len(v["prompts"]), "samples": v["samples"]} for k, v in sorted(splits.items())},
            "output_tokens": {
                "mean": round(float(lengths.mean()), 1),
                **{f"p{int(q * 100)}": float(np.quantile(lengths, q)) for q in QUANTILES},
                "max": int(lengths.max()),
            },
            "prompt_tokens_mean": round(float(np.mean([r["prompt_tokens"] for r in sub])), 1),
            "hit_max_tokens_share": round(float(np.mean([r["finish_reason"] == "length" for r in sub])), 4),
        }
    limits = ceiling(rows, pools)
    return {
        "dataset": {"settings": settings, "samples": len(rows)},
        "scenarios": scenarios,
        "noise_floor_mae": {k: round(v["noise_floor_mae_in_sample"], 2) for k, v in limits.items()
                            if v["noise_floor_mae_in_sample"] is not None},
        "pools": {"names": list(pools.names), "edges": list(pools.edges)},
        "ceiling": limits,
    }


def _markdown(sheet: dict) -> str:
    s = sheet["dataset"]["settings"]
    lines = [
        "# ForeLen-style dataset: datasheet",
        "",
        f"Model `{s['model_id']}` (weights `{s['weights_hash']}`), chat template with its default system "
        f"prompt, temperature {s['temperature']}, top_p {s['top_p']}, max_tokens {s['max_tokens']}, "
        f"{s['dtype']}, vLLM. Built by `python -m benchmarks.forelen.build`.",
        "",
        "| scenario | prompts | samples (built/target) | train/val/test prompts | mean | p50 | p90 | p99 | hit max_tokens |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, d in sheet["scenarios"].items():
        sp = d["splits"]
        split_txt = "/".join(str(sp.get(k, {}).get("prompts", 0)) for k in ("train", "val", "test"))
        o = d["output_tokens"]
        lines.append(
            f"| {name} | {d['prompts']} | {d['samples']}/{d['target_samples']} | {split_txt} | {o['mean']} | "
            f"{o['p50']:.0f} | {o['p90']:.0f} | {o['p99']:.0f} | {d['hit_max_tokens_share']:.1%} |"
        )
    edges = sheet["pools"]["edges"]
    lines += [
        "", "## Noise floor and ceiling", "",
        "What a predictor that knew each prompt's sample median would score: the noise-floor MAE, and the "
        f"ceiling pool accuracy when it routes on that median to the router's pools ({', '.join(sheet['pools']['names'])}; "
        f"edges {', '.join(f'{e:.0f}' for e in edges)} tokens). In-sample: the median of all of a prompt's samples "
        "(prompts with >= 2 samples; optimistic with few samples). Leave-one-out: the median of the prompt's other "
        "samples (prompts with >= 3; pessimistic), what the simulator's ceiling policy routes on. Within-prompt "
        "share: the part of those prompts' length variance that is sampling noise.", "",
        "| scenario | prompts (>=2 / >=3 samples) | within-prompt variance share | noise floor MAE in-sample | "
        "leave-one-out | ceiling pool acc. in-sample | leave-one-out |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, c in sheet["ceiling"].items():
        lines.append(
            f"| {name} | {c['prompts_2plus']} / {c['prompts_3plus']} | {_fmt(c['within_prompt_variance_share'], '.1%')} | "
            f"{_fmt(c['noise_floor_mae_in_sample'], '.1f')} | {_fmt(c['noise_floor_mae_leave_one_out'], '.1f')} | "
            f"{_fmt(c['ceiling_pool_accuracy_in_sample'], '.1%')} | {_fmt(c['ceiling_pool_accuracy_leave_one_out'], '.1%')} |"
        )
    return "\n".join(lines) + "\n"


def _fmt(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _histograms(rows: list[dict], out_dir: Path, max_tokens: int) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for name in SCENARIOS:
        lengths = [r["output_tokens"] for r in rows if r["scenario"] == name]
        if not lengths:
            continue
        fig, ax = plt.subplots(figsize=(5, 3.2))
        ax.hist(lengths, bins=np.linspace(0, max_tokens, 33), color="#3b75af")
        ax.set(title=f"{name}: output tokens (n={len(lengths)})", xlabel="output tokens", ylabel="samples")
        fig.tight_layout()
        path = out_dir / f"forelen_hist_{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def write_datasheet(root: Path = DEFAULT_OUT, out_dir: Path = RESULTS, stem: str = "forelen_dataset",
                    checkpoint: Path = ESTP_CHECKPOINT) -> dict:
    rows, meta = load_samples(root), load_meta(root)
    sheet = summarize(rows, meta, router_pools(checkpoint))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(json.dumps(sheet, indent=2) + "\n")
    (out_dir / f"{stem}.md").write_text(_markdown(sheet))
    _histograms(rows, out_dir, meta["settings"]["max_tokens"])
    return sheet


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", type=Path, default=DEFAULT_OUT)
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    p.add_argument("--checkpoint", type=Path, default=ESTP_CHECKPOINT, help="head whose bins give the pool edges")
    a = p.parse_args()
    sheet = write_datasheet(a.dataset, a.out_dir, checkpoint=a.checkpoint)
    print(json.dumps({k: v["samples"] for k, v in sheet["scenarios"].items()}), sheet["noise_floor_mae"])


if __name__ == "__main__":
    main()
