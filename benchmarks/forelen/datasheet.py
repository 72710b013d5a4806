"""Datasheet of a built dataset: counts, length quantiles, truncation share, and the noise floor.

The noise floor answers "how good can a prompt-only predictor get?": for prompts sampled several
times (the RL scenario), predicting each prompt's sample median is the best constant per prompt
under absolute error, so its MAE is the floor under every MAE table.

    python -m benchmarks.forelen.datasheet            # writes benchmarks/results/forelen_dataset.*
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from benchmarks.forelen.build import DEFAULT_OUT
from predictor.dataset import load_meta, load_samples
from benchmarks.forelen.sources import SCENARIOS

RESULTS = Path(__file__).resolve().parents[1] / "results"
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9, 0.99)


def noise_floor_mae(rows: list[dict]) -> float | None:
    by_prompt: dict[str, list[int]] = defaultdict(list)
    for r in rows:
        by_prompt[r["prompt_id"]].append(r["output_tokens"])
    errors = [
        abs(x - np.median(lengths))
        for lengths in by_prompt.values() if len(lengths) > 1
        for x in lengths
    ]
    return float(np.mean(errors)) if errors else None


def summarize(rows: list[dict], meta: dict) -> dict:
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
        target = settings["prompts"][name] * settings["samples"][name]
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
    floors = {n: noise_floor_mae([r for r in rows if r["scenario"] == n]) for n in scenarios}
    return {
        "dataset": {"settings": settings, "samples": len(rows)},
        "scenarios": scenarios,
        "noise_floor_mae": {k: round(v, 2) for k, v in floors.items() if v is not None},
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
    lines += ["", "Noise floor (MAE of predicting each prompt's sample median, prompts with several samples):", ""]
    for name, v in sheet["noise_floor_mae"].items():
        lines.append(f"- {name}: {v:.1f} tokens")
    return "\n".join(lines) + "\n"


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


def write_datasheet(root: Path = DEFAULT_OUT, out_dir: Path = RESULTS, stem: str = "forelen_dataset") -> dict:
    rows, meta = load_samples(root), load_meta(root)
    sheet = summarize(rows, meta)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(json.dumps(sheet, indent=2) + "\n")
    (out_dir / f"{stem}.md").write_text(_markdown(sheet))
    _histograms(rows, out_dir, meta["settings"]["max_tokens"])
    return sheet


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", type=Path, default=DEFAULT_OUT)
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    a = p.parse_args()
    sheet = write_datasheet(a.dataset, a.out_dir)
    print(json.dumps({k: v["samples"] for k, v in sheet["scenarios"].items()}), sheet["noise_floor_mae"])


if __name__ == "__main__":
    main()
