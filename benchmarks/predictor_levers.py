"""What the predictor's prefill costs in a burst, and what each lever buys and gives up.

    python -m benchmarks.predictor_levers

On a CPU the predictor's prefill runs on the cores the engines decode on, so in a burst every
second it spends predicting the waiting requests is taken from the engines
(benchmarks/results/continuous.md). This measures the levers on that cost offline, one torch
thread (as the deployment runs), on the idle machine:

1. Cost: the prompts that wait when the dataset burst (benchmarks.continuous.bursts) meets the
   default 32 slots (96, of which the 93 within max_prompt_tokens are predicted), predicted as the
   deployment receives them (`@serve.batch` groups of the
   batch size, in arrival order), per lever: the padding bound of the micro-batches (off: as
   before this benchmark), the batch size, and prompt truncation (predict from the last N tokens).
   Concurrency is not a lever here: a second prefill thread against busy cores was measured
   3-9x slower per thread (deployments/predictor_deployment.py), so the deployment keeps one.
   Two more levers are the heads served: every head at once (as benchmark stacks served them
   until this was measured: ESTP's entropy and attention ride on every prediction), and the
   early-exit head (`early`: the last token's state at layer 4 of 30, the prefill stops there).
2. Accuracy: the `last` and `early` heads on the dataset's val and test prompts, whole against
   truncated: MAE per sample (mean over scenarios) and the rank concordance that shortest-first
   acts on (the share of prompt pairs with different mean lengths that the predictions order
   correctly).

Writes benchmarks/results/predictor_levers.{json,md,png}.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from benchmarks import parts as parts_file
from predictor.features import MAX_PADDING

RESULTS = Path(__file__).resolve().parent / "results"
STEM = "predictor_levers"
SLOTS = 32  # the default stack's: the burst's first 32 requests never wait
TRUNCATIONS = (None, 512, 256, 128)
LAST, EVERY, EARLY = ("last",), ("last", "estp", "egtp"), ("early",)
ACCURACY_HEADS = ("last", "early")
# (label, heads served, batch size, padding bound, truncation): the deployment's batching as it
# was, then one lever changed at a time.
COST_CASES = (
    ("before: batch 8, padding unbounded", LAST, 8, math.inf, None),
    ("batch 8, padding <= 12.5%", LAST, 8, MAX_PADDING, None),
    ("batch 1", LAST, 1, MAX_PADDING, None),
    ("batch 32, padding <= 12.5%", LAST, 32, MAX_PADDING, None),
    *((f"batch 8, padding <= 12.5%, last {k} tokens", LAST, 8, MAX_PADDING, k) for k in TRUNCATIONS[1:]),
    ("every head (ESTP, EGTP, last), last 256 tokens", EVERY, 8, MAX_PADDING, 256),
    ("early exit at layer 4 (early head), last 256 tokens", EARLY, 8, MAX_PADDING, 256),
)


def _estimators() -> dict:
    """An estimator per set of heads served, all on one copy of the model."""
    import torch

    from predictor.checkpoint import load_checkpoint
    from predictor.estimator import LengthEstimator
    from predictor.model_files import model_weights_hash, resolve_model_source
    from router.serving.config import head_checkpoint

    source = resolve_model_source("embedded")
    base = LengthEstimator.load(source, {"last": head_checkpoint("last")}, dtype=torch.float32, max_batch_size=8,
                                max_prompt_tokens=2048)
    weights = model_weights_hash(source)
    out = {LAST: base}
    for heads in {case[1] for case in COST_CASES} | {(h,) for h in ACCURACY_HEADS}:
        if heads not in out:
            out[heads] = LengthEstimator(base.model, base.tokenizer,
                                         {h: load_checkpoint(head_checkpoint(h), weights) for h in heads},
                                         max_batch_size=8, max_prompt_tokens=2048)
    return out


def cost(estimators: dict, repeats: int) -> list[dict]:
    """Seconds to predict the burst's waiting prompts, per case; cases interleaved repeat by repeat."""
    from benchmarks.continuous.bursts import dataset_burst

    first = estimators[LAST]
    waiting = [first.encode(r.messages) for r in dataset_burst()[SLOTS:]]
    waiting = [ids for ids in waiting if len(ids) <= first.max_prompt_tokens]  # longer ones fall back
    seconds = defaultdict(list)
    for _ in range(repeats):
        for label, heads, batch, padding, truncate in COST_CASES:
            estimator = estimators[heads]
            estimator.max_batch_size, estimator.max_padding, estimator.truncate_prompt_tokens = batch, padding, truncate
            start = time.perf_counter()
            for i in range(0, len(waiting), batch):
                estimator.predict_each(waiting[i:i + batch])
            seconds[label].append(time.perf_counter() - start)
            estimator.max_batch_size, estimator.max_padding, estimator.truncate_prompt_tokens = 8, MAX_PADDING, None
    tokens = sum(len(ids) for ids in waiting)
    return [{"case": label, "heads": list(heads), "batch": batch, "max_padding": None if math.isinf(padding) else padding,
             "truncate_prompt_tokens": truncate, "prompts": len(waiting), "prompt_tokens": tokens,
             "seconds": seconds[label], "median_s": float(np.median(seconds[label]))}
            for label, heads, batch, padding, truncate in COST_CASES]


def concordance(predicted: np.ndarray, truth: np.ndarray) -> float:
    """Share of pairs with different true lengths that the predictions order the same way (ties
    in the prediction count half)."""
    i, j = np.triu_indices(len(truth), 1)
    differ = truth[i] != truth[j]
    dp, dt = np.sign(predicted[i] - predicted[j])[differ], np.sign(truth[i] - truth[j])[differ]
    return float(((dp == dt).sum() + 0.5 * (dp == 0).sum()) / differ.sum())


def accuracy(estimator, head: str) -> list[dict]:
    """`head` on every val/test prompt (up to max_prompt_tokens), whole and per truncation."""
    from tqdm import tqdm

    from benchmarks.accuracy.metrics import by_scenario
    from benchmarks.forelen.build import DEFAULT_OUT
    from predictor.dataset import load_samples

    samples = [r for split in ("val", "test") for r in load_samples(DEFAULT_OUT, split=split)]
    prompts = {r["prompt_id"]: r["prompt"] for r in samples}
    ids = {pid: estimator.encode(text) for pid, text in prompts.items()}
    ids = {pid: seq for pid, seq in ids.items() if len(seq) <= estimator.max_prompt_tokens}
    samples = [r for r in samples if r["prompt_id"] in ids]
    order = sorted(ids)
    lengths = defaultdict(list)
    for r in samples:
        lengths[r["prompt_id"]].append(r["output_tokens"])
    means = np.array([np.mean(lengths[pid]) for pid in order])
    out, whole = [], None
    for truncate in TRUNCATIONS:
        estimator.truncate_prompt_tokens = truncate
        # Only prompts the truncation shortens change: the rest keep the whole prompt's prediction.
        todo = [pid for pid in order if whole is None or len(ids[pid]) > truncate]
        predicted = dict(whole or {})
        for chunk in tqdm([todo[i:i + 8] for i in range(0, len(todo), 8)], desc=f"truncate {truncate}", leave=False):
            for pid, result in zip(chunk, estimator.predict_each([ids[pid] for pid in chunk])):
                predicted[pid] = result[head].expected_tokens
        whole = whole or predicted
        scores = by_scenario([predicted[r["prompt_id"]] for r in samples], [r["output_tokens"] for r in samples],
                             [r["scenario"] for r in samples], [r["prompt_id"] for r in samples])
        out.append({"head": head, "truncate_prompt_tokens": truncate, "prompts": len(order),
                    "prompts_shortened": 0 if truncate is None else sum(len(ids[p]) > truncate for p in order),
                    "mae": scores["avg"]["mae"], "mae_by_scenario": {k: v["mae"] for k, v in scores.items() if k != "avg"},
                    "rank_concordance": concordance(np.array([predicted[p] for p in order]), means)})
    estimator.truncate_prompt_tokens = None
    return out


def markdown(result: dict) -> str:
    lines = ["# Predictor levers: what its prefill costs in a burst, and what truncation and an early exit give up", "",
             "Made by `python -m benchmarks.predictor_levers`, one torch thread, the idle 2-core machine, "
             f"{result['repeats']} repeat(s) per case, interleaved.", ""]
    cost_rows = result["cost"]
    if cost_rows:
        base = cost_rows[0]["median_s"]
        lines += [f"## Cost: the {cost_rows[0]['prompts']} prompts ({cost_rows[0]['prompt_tokens']} tokens) that wait "
                  "in the dataset burst, as the deployment receives them", "",
                  "| case | seconds (median) | runs | tokens/s | vs before |", "|---|---|---|---|---|"]
        for row in cost_rows:
            lines.append(f"| {row['case']} | {row['median_s']:.1f} | {', '.join(f'{s:.1f}' for s in row['seconds'])} "
                         f"| {row['prompt_tokens'] / row['median_s']:.0f} (whole prompts) | {row['median_s'] / base:.2f}x |")
        lines += ["", "In the real burst the predictor shares the 2 cores with both engines (3 busy threads on "
                  "2 cores), so its wall time there is about 1.5x these and each second of it slows the "
                  "engines' decoding. The real bursts' predictor latency (continuous.md): 54 s p50 with the "
                  "last head at 256 tokens on a stack that served every head, 5 s with the early exit alone.", ""]
    acc = result["accuracy"]
    if acc:
        lines += [f"## Accuracy on {acc[0]['prompts']} val/test prompts", "",
                  "| head | prompt given to the predictor | prompts shortened | MAE (tokens, mean over scenarios) "
                  "| rank concordance |", "|---|---|---|---|---|"]
        for row in acc:
            what = "whole" if row["truncate_prompt_tokens"] is None else f"last {row['truncate_prompt_tokens']} tokens"
            lines.append(f"| {row.get('head', 'last')} | {what} | {row['prompts_shortened']} | {row['mae']:.1f} "
                         f"| {row['rank_concordance']:.3f} |")
        lines.append("")
    lines += _default_lines(result)
    return "\n".join(lines)


def _default_lines(result: dict) -> list[str]:
    """What the stack's defaults (router.serving.config.PredictorSpec) get of the measured levers."""
    from router.serving.config import PredictorSpec

    spec = PredictorSpec()
    cost = next((r for r in result["cost"] if r["truncate_prompt_tokens"] == spec.truncate_prompt_tokens
                 and r["batch"] == spec.max_batch_size and r["max_padding"] == MAX_PADDING
                 and r.get("heads", list(LAST)) == list(LAST)), None)
    acc = {r["truncate_prompt_tokens"]: r for r in result["accuracy"] if r.get("head", "last") == "last"}
    if cost is None or spec.truncate_prompt_tokens not in acc or None not in acc:
        return []
    chosen, whole = acc[spec.truncate_prompt_tokens], acc[None]
    return ["## The stack's default", "",
            f"Batch {spec.max_batch_size} with padding bounded, the last {spec.truncate_prompt_tokens} tokens of "
            f"longer prompts: {cost['median_s'] / result['cost'][0]['median_s']:.2f}x the prefill time of before, "
            f"MAE {chosen['mae']:.1f} against {whole['mae']:.1f} tokens whole, rank concordance "
            f"{chosen['rank_concordance']:.3f} against {whole['rank_concordance']:.3f}.", ""]


def plot(result: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    rows = result["cost"]
    a.barh([r["case"] for r in rows][::-1], [r["median_s"] for r in rows][::-1], color="tab:blue")
    a.set_xlabel("seconds to predict the burst's waiting prompts (1 thread)")
    twin = b.twinx()
    for head, style in zip(ACCURACY_HEADS, ("-", ":")):
        acc = [r for r in result["accuracy"] if r.get("head", "last") == head]
        labels = ["whole" if r["truncate_prompt_tokens"] is None else f"last {r['truncate_prompt_tokens']}" for r in acc]
        b.plot(labels, [r["mae"] for r in acc], "o" + style, color="tab:red", label=f"{head}: MAE")
        twin.plot(labels, [r["rank_concordance"] for r in acc], "s" + style, color="tab:green",
                  label=f"{head}: concordance")
    b.set_ylabel("MAE (tokens)", color="tab:red")
    twin.set_ylabel("rank concordance", color="tab:green")
    b.legend(loc="upper left", fontsize=8)
    twin.legend(loc="upper right", fontsize=8)
    b.set_title("accuracy against prompt truncation")
    fig.tight_layout()
    fig.savefig(out / f"{STEM}.png", dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    p = argparse.ArgumentParser(prog="python -m benchmarks.predictor_levers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    estimators = _estimators()
    rows = cost(estimators, args.repeats)
    parts_file.update(args.out, STEM, markdown, plot, repeats=args.repeats, cost=rows, accuracy=[])
    parts_file.update(args.out, STEM, markdown, plot,
                      accuracy=[row for head in ACCURACY_HEADS for row in accuracy(estimators[(head,)], head)])


if __name__ == "__main__":
    main()
